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
                         gemms: list | None = None) -> None:
    """Replace, in `plans` (gemm id -> plan), the plans of each chain's two gemms by the
    cheapest pair counting the conversion between them; mark the changed plans' `joint`.
    Gemms updating the same accumulator as one of the pair (`gemms`: all of the kernel's)
    move with it: they must keep agreeing on its layout, so a grid is an option only if
    every one of them can take it."""
    gemms = gemms or [g for chain in chains for g in chain]
    for first, second in chains:
        groups = [[g for g in gemms if g.c.id == end.c.id] or [end] for end in (first, second)]
        options = [_options(group, plans, threads, target) for group in groups]
        if len(options[0]) == 1 and len(options[1]) == 1:
            continue
        elem_bytes = second.a.dtype.bits // 8 or 1
        best = None
        for p1, s1 in options[0]:
            for p2, s2 in options[1]:
                convert = conversion_cycles(p1[id(first)].c_tv, p2[id(second)].a_tv,
                                            tuple(second.a.shape), elem_bytes, threads, target)
                total = s1 + s2 + convert
                if best is None or total < best[0]:
                    best = (total, p1, p2, convert)
        _, p1, p2, convert = best
        how = ("its accumulator reaches the A operand by register renaming" if convert == 0
               else f"converting its accumulator costs ~{convert:.0f} cycles")
        for chosen, other in ((p1, second), (p2, first)):
            for gid, plan in chosen.items():
                alone = plans[gid]
                if isinstance(plan, GemmPlan) and (plan.atom, plan.grid) != (alone.atom, alone.grid):
                    line = other.loc.lineno if other.loc else "?"
                    plans[gid] = dataclasses.replace(
                        plan, joint=f"warp grid chosen with the gemm at line {line} ({how})")


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
