"""Gemm chains: choosing two gemms' warp grids together when one feeds the other.

In attention, `s` (the accumulator of `tg.gemm(s, q, k)`) becomes `p = exp(s - m)` and
`p.to(f16)` is the A operand of the next gemm, in registers. Chosen one gemm at a time, each
takes the warp grid that is cheapest for itself — for a 64x64 tile on four warps a 2x2 grid
— and then the first gemm's C fragments are spread over warps differently from the second
gemm's A fragments, so P makes a shared-memory round trip every key block. With both gemms
on a grid that keeps whole rows in one warp (4x1), each thread already holds, in its C
fragments, exactly the A fragment elements it needs (the m16n8 C fragment of two adjacent
n8 tiles is the k16 A fragment), and the conversion is a renaming of registers.

So a *chain* — a gemm whose register A operand is computed, element by element, from
another gemm's accumulator (`gemm_chains`) — is planned as a pair: every (plan, plan)
combination is scored as the sum of the two gemms' own costs and the cost of converting
the first one's C layout into the second one's A layout (`conversion_cycles`, from the
conversion the planner of `synth/convert.py` would pick), and the cheapest pair wins. A
wgmma plan is taken as it is (its warpgroup grid is fixed by the instruction); its
accumulator's warp-by-rows layout is what the mma.sync A operand on a 4x1 grid needs.
"""
from __future__ import annotations

import dataclasses

from tegula.arch.targets import Target
from tegula.ir.ops import Elementwise, Gemm, walk_ops
from tegula.ir.values import RegisterTile
from tegula.synth.convert import choose_conversion
from tegula.synth.gemm import GemmPlan, mma_sync_plans

#: A shared-memory round trip's fixed cost in cycles: the barrier between the stores and
#: the loads, and one shared-memory latency (both are paid once per conversion).
ROUND_TRIP_LATENCY = 60

#: How many (plan, plan) pairs the search of one chain may score (planning the conversion
#: between them is the costly part). Past it, the best pair found so far is kept and the
#: truncation is recorded (`ChainSearch`, which `tegula explain` prints under the gemm).
CHAIN_SEARCH_BUDGET = 256


@dataclasses.dataclass(frozen=True)
class ChainSearch:
    """What the branch-and-bound search of one chain did: pairs scored, pairs pruned by
    the bound (their own costs alone already exceed the best pair's total, and a
    conversion costs nothing or more), of `pairs` in all, under `budget`."""

    pairs: int
    scored: int
    pruned: int
    budget: int

    @property
    def truncated(self) -> int:
        """Pairs neither scored nor pruned: the budget ran out before them."""
        return self.pairs - self.scored - self.pruned

    def describe(self) -> str:
        text = (f"chain search: {self.scored} of {self.pairs} warp-grid pairs scored, "
                f"{self.pruned} pruned by the bound")
        if self.truncated:
            text += (f"; TRUNCATED at the budget of {self.budget} pairs: {self.truncated} "
                     f"not considered, the best pair found so far kept "
                     f"(synth.chains.CHAIN_SEARCH_BUDGET)")
        return text


def gemm_chains(gemms: list[Gemm], body: list) -> list[tuple[Gemm, Gemm]]:
    """(first, second) pairs where `second.a` is a register tile computed element by
    element (casts, unary ops, binary ops with broadcast row/column tiles) from the
    accumulator of `first`."""
    producer: dict[int, Elementwise] = {}
    for op in walk_ops(body):
        if isinstance(op, Elementwise):
            producer[op.out.id] = op
    accumulated_by = {g.c.id: g for g in gemms}
    chains = []
    for second in gemms:
        tile, seen = second.a, set()
        if not isinstance(tile, RegisterTile):
            continue
        while tile.id not in accumulated_by and tile.id in producer and tile.id not in seen:
            seen.add(tile.id)
            op = producer[tile.id]
            full = [x for x in op.inputs
                    if isinstance(x, RegisterTile) and tuple(x.shape) == tuple(op.out.shape)]
            if len(full) != 1:  # two full-size inputs: which layout wins is not ours to say
                break
            tile = full[0]
        first = accumulated_by.get(tile.id)
        if first is not None and first is not second:
            chains.append((first, second))
    return chains


def conversion_cycles(src_tv, dst_tv, shape: tuple, elem_bytes: int, threads: int,
                      target: Target) -> float:
    """Cycles one block spends converting a tile from `src_tv` to `dst_tv`: nothing for a
    register renaming, the shuffles' issue slots, or a shared-memory round trip's
    bandwidth, instructions and latency."""
    choice = choose_conversion(src_tv, dst_tv, shape, elem_bytes)
    warps = max(1, threads // 32)
    if choice.kind == "registers":
        return 0.0
    if choice.kind == "shuffle":
        return choice.instructions * warps / target.subpartitions
    elements = 1
    for extent in shape:
        elements *= extent
    per_thread = -(-elements // threads)
    bandwidth = 2 * elements * elem_bytes / target.shared_bytes_per_clk
    issue = 2 * per_thread * warps / target.subpartitions
    return bandwidth + issue + ROUND_TRIP_LATENCY


def choose_chained_plans(chains: list, plans: dict, threads: int, target: Target,
                         gemms: list | None = None, budget: int | None = None) -> None:
    """Replace, in `plans` (gemm id -> plan), the plans of each chain's two gemms by the
    cheapest pair counting the conversion between them; mark the changed plans' `joint`,
    and record the search (`ChainSearch`) in the second gemm's `choices["chain_search"]`.
    Gemms updating the same accumulator as one of the pair (`gemms`: all of the kernel's)
    move with it: they must keep agreeing on its layout, so a grid is an option only if
    every one of them can take it."""
    gemms = gemms or [g for chain in chains for g in chain]
    budget = CHAIN_SEARCH_BUDGET if budget is None else budget
    for first, second in chains:
        groups = [[g for g in gemms if g.c.id == end.c.id] or [end] for end in (first, second)]
        options = [_options(group, plans, threads, target) for group in groups]
        if len(options[0]) == 1 and len(options[1]) == 1:
            continue
        elem_bytes = second.a.dtype.bits // 8 or 1

        def convert(p1: dict, p2: dict) -> float:
            return conversion_cycles(p1[id(first)].c_tv, p2[id(second)].a_tv,
                                     tuple(second.a.shape), elem_bytes, threads, target)

        (p1, p2, convert_cost), search = search_pairs(
            [(o, s, _option_key(o, first)) for o, s in options[0]],
            [(o, s, _option_key(o, second)) for o, s in options[1]], convert, budget)
        second.choices["chain_search"] = search
        how = ("its accumulator reaches the A operand by register renaming" if convert_cost == 0
               else f"converting its accumulator costs ~{convert_cost:.0f} cycles")
        for chosen, other in ((p1, second), (p2, first)):
            for gid, plan in chosen.items():
                alone = plans[gid]
                if isinstance(plan, GemmPlan) and (plan.atom, plan.grid) != (alone.atom, alone.grid):
                    line = other.loc.lineno if other.loc else "?"
                    plans[gid] = dataclasses.replace(
                        plan, joint=f"warp grid chosen with the gemm at line {line} ({how})")


def search_pairs(firsts: list, seconds: list, convert, budget: int) -> tuple:
    """Branch and bound over (first option, second option) pairs: `firsts` and `seconds`
    are (option, own cost, key) triples, `convert(a, b)` the cost of the conversion
    between two options (never negative). Returns ((first, second, conversion cost) of
    the pair of least (total, keys), the `ChainSearch`).

    Options are visited cheapest first (ties by key), so the result does not depend on the
    order they are given in: a pair is skipped only when its own costs alone exceed the
    best total found, which no conversion can undo, so without truncation the result is
    the exact minimum; with it, the same cheapest-first prefix is scored whatever the
    input order."""
    firsts = sorted(firsts, key=lambda t: (t[1], t[2]))
    seconds = sorted(seconds, key=lambda t: (t[1], t[2]))
    best = None                       # (total, key1, key2, option1, option2, conversion)
    scored = pruned = 0
    for i, (o1, s1, k1) in enumerate(firsts):
        if best is not None and s1 + seconds[0][1] > best[0]:
            pruned += (len(firsts) - i) * len(seconds)
            break
        for j, (o2, s2, k2) in enumerate(seconds):
            if best is not None and s1 + s2 > best[0]:
                pruned += len(seconds) - j
                break
            if scored == budget:
                break
            cost = convert(o1, o2)
            scored += 1
            candidate = (s1 + s2 + cost, k1, k2)
            if best is None or candidate < best[:3]:
                best = candidate + (o1, o2, cost)
        if scored == budget:
            break
    search = ChainSearch(len(firsts) * len(seconds), scored, pruned, budget)
    return (best[3], best[4], best[5]), search


def _option_key(option: dict, gemm) -> tuple:
    """A deterministic key of one option: its plan for `gemm` (instruction, warp grid)."""
    plan = option[id(gemm)]
    grid = getattr(plan, "grid", None)
    return (getattr(plan.atom, "name", str(plan.atom)),
            (grid.wm, grid.wn) if grid is not None else ())


def _options(group: list[Gemm], plans: dict, threads: int, target: Target) -> list[tuple]:
    """({gemm id: plan} for every gemm of `group` — the gemms updating one accumulator —,
    their summed cost) for each choice: every (mma.sync atom, warp grid) all of them can
    take, or the current plans alone when one of them is on wgmma (its warpgroup grid is
    fixed by the instruction)."""
    current = {id(g): plans[id(g)] for g in group}
    if not all(isinstance(p, GemmPlan) for p in current.values()):
        return [(current, 0.0)]
    per_gemm = []
    for g in group:
        alternatives = mma_sync_plans(g, threads, target)
        per_gemm.append({(p.atom.name, p.grid): (dataclasses.replace(
            p, wgmma_skipped=plans[id(g)].wgmma_skipped), p.candidates[i][2])
            for i, p in enumerate(alternatives)})
    shared_keys = [key for key in per_gemm[0] if all(key in choices for choices in per_gemm)]
    options = []
    for key in shared_keys:
        choice = {id(g): choices[key][0] for g, choices in zip(group, per_gemm)}
        options.append((choice, sum(choices[key][1] for choices in per_gemm)))
    return options or [(current, 0.0)]
