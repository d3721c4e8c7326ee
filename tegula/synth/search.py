"""One search over the gemm decisions of a traced program: a deterministic branch and
bound over the decision vector of all its gemms (issue 11).

A **decision** is one accumulator's: the gemms updating one register tile must agree on
its layout, so they decide together (a *group*, `accumulator_groups`). Each group offers
its **options**, ranked: the wgmma plan (sm_90a, where every gemm of the group fits one
and their accumulator layouts agree) and every (mma.sync atom, warp grid) all of them can
take, each with its **own cost** — the cycles one block spends per call of its gemms
(`gemm.candidate_score`, `gemm._wgmma_score`: the larger of the tensor-core and the
shared-memory operand time). Groups are **coupled** where one gemm's accumulator becomes,
element by element, another's A operand in registers (`chains.gemm_chains`: P in
attention): the pair then pays the **conversion** between the first one's C layout and
the second one's A layout (`chains.conversion_cycles`: nothing for a register renaming,
shuffles, or a shared-memory round trip) — a cost, never a failure.

The search visits the groups in program order and each group's options cheapest first
(ties by a key that is a property of the option, not of its place in a list), adds the
conversions of a pair once both ends are decided, and prunes a partial vector when its
cost plus the cheapest own cost of every undecided group (conversions cost nothing or
more) exceeds the best complete vector found. So without truncation the result is the
exact minimum of (total cost, keys), whatever order the options are listed in; with it,
the same cheapest-first prefix is scored. `SEARCH_BUDGET` caps the complete vectors
scored; `JointSearch` records the work (visited, scored, pruned, truncated), and
`tegula explain` prints it under the kernel's first gemm.

Without couplings every group takes its cheapest option: the greedy per-op pick. With
them this replaces the pairwise chain search of session 8, which revisited the gemms that
share a register tile one pair at a time.
"""
from __future__ import annotations

import dataclasses
import math

from tegula.arch.targets import Target
from tegula.errors import SynthesisError
from tegula.ir.ops import Gemm
from tegula.synth.chains import conversion_cycles
from tegula.synth.gemm import (GemmPlan, WgmmaPlan, candidate_score, has_wgmma, mma_sync_plans,
                               plan_gemm, wgmma_plans)
from tegula.synth.registers import per_thread_limit

#: How many complete decision vectors the search may score. Past it the best vector found
#: so far is kept and `JointSearch.truncated` says how many were neither scored nor pruned.
SEARCH_BUDGET = 4096


@dataclasses.dataclass(frozen=True)
class Option:
    """One choice for a group: each gemm's plan (by gemm id), their summed own cost, and a
    key that orders equal costs (wgmma before mma.sync, then the per-gemm ranking)."""

    plans: dict
    cost: float
    key: tuple


@dataclasses.dataclass(frozen=True)
class JointSearch:
    """What the branch and bound did: `space` complete vectors in all (the product of the
    groups' option counts), `scored` of them scored, `pruned` cut by the bound, `visited`
    partial vectors extended, under `budget`; `couplings`: the chained pairs priced."""

    groups: int
    options: tuple
    couplings: int
    space: int
    visited: int
    scored: int
    pruned: int
    budget: int

    @property
    def truncated(self) -> int:
        """Complete vectors neither scored nor pruned: the budget ran out before them."""
        return self.space - self.scored - self.pruned

    def describe(self) -> str:
        sizes = "x".join(map(str, self.options)) or "1"
        text = (f"one search over {self.groups} gemm decision(s) ({sizes} options, "
                f"{self.couplings} chained pair(s) priced by their conversion): "
                f"{self.scored} of {self.space} vectors scored, {self.pruned} pruned by the "
                f"bound, {self.visited} partial vectors visited")
        if self.truncated:
            text += (f"; TRUNCATED at the budget of {self.budget} vectors: {self.truncated} "
                     f"not considered, the best found so far kept (synth.search.SEARCH_BUDGET)")
        return text


def accumulator_groups(gemms: list[Gemm]) -> list[list[Gemm]]:
    """The gemms grouped by the accumulator they update, in program order."""
    groups: dict[int, list[Gemm]] = {}
    for g in gemms:
        groups.setdefault(g.c.id, []).append(g)
    return list(groups.values())


def gemm_options(group: list[Gemm], threads: int, target: Target,
                 every_width: bool = False) -> list[Option]:
    """Every option of one group (module docstring), in no particular order. Raises the
    per-op planner's `SynthesisError` where a gemm has no instruction at all. With
    `every_width` (a group chained to another: its C layout can make a conversion free or
    not) each wgmma warpgroup grid and N width the group's gemms share is an option, at its
    own cost (ties ordered as `wgmma_plans` ranks them), a plan whose operand registers
    (`operand_words`) pass a thread's limit left out; otherwise the cheapest wgmma plan is
    (without couplings no other can win)."""
    wgmma, mma = {}, {}
    for g in group:
        plans, reason = (wgmma_plans(g, threads, target, every_width) if has_wgmma(target)
                         else ([], ""))
        wgmma[id(g)] = plans or reason
        if not plans:
            plan_gemm(g, threads, target)  # raises where no mma.sync takes it either
        try:
            mma[id(g)] = mma_sync_plans(g, threads, target)
        except SynthesisError:
            if not plans:
                raise
            mma[id(g)] = []
    fits = all(isinstance(wgmma[id(g)], list) for g in group)
    best = {gid: (w[0] if isinstance(w, list) else w) for gid, w in wgmma.items()}
    options = _wgmma_options(group, wgmma, target, threads) if fits else []
    ranked = [{(p.atom.name, p.grid): (rank, p) for rank, p in enumerate(mma[id(g)])}
              for g in group]
    for shared_key in [k for k in ranked[0] if all(k in r for r in ranked)]:
        plans, cost, ranks = {}, 0.0, []
        for g, choices in zip(group, ranked):
            rank, plan = choices[shared_key]
            (bm, bn), (_, bk) = g.c.shape, g.a.shape
            cost += candidate_score(plan.atom, plan.grid, (bm, bn, bk), target)[0]
            plans[id(g)] = dataclasses.replace(plan, wgmma_skipped=_why_not_wgmma(
                g, group, best, fits))
            ranks.append(rank)
        options.append(Option(plans, cost, (1, *ranks)))
    return options


def _wgmma_options(group: list[Gemm], wgmma: dict, target: Target,
                   threads: int) -> list[Option]:
    """The wgmma options of a group whose gemms all fit wgmma: each (N width, warpgroup
    grid) every gemm has, where their accumulator layouts agree; cost the gemms' summed
    scores, key (0, their ranks, operand words). A plan whose operand registers alone pass
    a thread's limit, and the cheapest plan's, is not offered."""
    by_key = [{(p.atom.n, p.grid.wm, p.grid.wn): (rank, p) for rank, p in enumerate(wgmma[id(g)])}
              for g in group]
    # Past the limit only where the cheapest plan is not (which keeps its place, with the
    # spill warning the register estimate gives).
    limit = max(per_thread_limit(target, threads),
                max(operand_words(wgmma[id(g)][0]) for g in group))
    options = []
    for key in by_key[0]:
        if not all(key in b for b in by_key):
            continue
        chosen = [b[key] for b in by_key]
        if len({str(p.c_tv) for _, p in chosen}) != 1:
            continue
        words = max(operand_words(p) for _, p in chosen)
        if words > limit:
            continue
        options.append(Option({id(g): p for g, (_, p) in zip(group, chosen)},
                              sum(p.candidates[rank][2] for rank, p in chosen),
                              (0, *(rank for rank, _ in chosen), words)))
    return options


def operand_words(plan: WgmmaPlan) -> int:
    """32-bit registers a thread holds for a wgmma plan's register operands: the
    accumulator, and A where it is read from registers (warpgroups along N hold the same
    rows of A: a grid with more of them holds more)."""
    def words(tv, bits: int) -> int:
        return 0 if tv is None else -(-tv[1].size * bits // 32)
    return words(plan.c_tv, 32) + words(plan.a_tv, plan.atom.a_dtype.bits)


def _why_not_wgmma(g: Gemm, group: list[Gemm], wgmma: dict, fits: bool) -> str:
    """What an mma.sync plan of `g` says about wgmma: its own reason, another gemm of the
    accumulator that cannot take it or takes another layout, or the search's price."""
    own = wgmma[id(g)]
    if not isinstance(own, WgmmaPlan):
        return own
    for other in group:
        theirs = wgmma[id(other)]
        if other is not g and (not isinstance(theirs, WgmmaPlan)
                               or str(theirs.c_tv) != str(own.c_tv)):
            line = other.loc.lineno if other.loc else "?"
            runs = theirs.atom.name if isinstance(theirs, WgmmaPlan) else "mma.sync"
            return (f"the accumulator is also updated by the gemm at line {line}, which "
                    f"runs on {runs}")
    return "the one search priced the wgmma plan higher with its conversions" if fits else ""


def search_plans(gemms: list[Gemm], chains: list, threads: int, target: Target,
                 budget: int | None = None, shuffle=None) -> tuple[dict, JointSearch]:
    """(gemm id -> plan, the search's record) for every gemm of a traced program: the
    option per accumulator group of least (cost, keys) over own costs and the conversions
    of `chains` ((first, second) gemm pairs). `shuffle` (tests only) reorders each group's
    option list before the search, which must not change the result."""
    groups = accumulator_groups(gemms)
    group_of = {id(g): i for i, group in enumerate(groups) for g in group}
    coupled = {group_of[id(g)] for pair in chains for g in pair}
    options = [gemm_options(group, threads, target, i in coupled)
               for i, group in enumerate(groups)]
    for group, listed in zip(groups, options):
        if not listed:  # wgmma layouts disagree and no mma.sync takes them all: say why
            for g in group:
                mma_sync_plans(g, threads, target)
            raise SynthesisError("gemm: the gemms updating this accumulator share no MMA "
                                 "instruction and warp grid", loc=group[0].loc)
    if shuffle is not None:
        for listed in options:
            shuffle(listed)
    options = [sorted(o, key=lambda x: (x.cost, x.key)) for o in options]
    couplings = [(group_of[id(a)], group_of[id(b)], a, b) for a, b in chains
                 if group_of[id(a)] != group_of[id(b)]]
    def price(o1: Option, o2: Option, first: Gemm, second: Gemm) -> float:
        return _conversion(o1, o2, first, second, threads, target)

    chosen, record = branch_and_bound(options, couplings, price,
                                      SEARCH_BUDGET if budget is None else budget)
    plans = {}
    for i, option in enumerate(chosen):
        alone = options[i][0]
        for gid, plan in option.plans.items():
            if option is not alone and isinstance(plan, (GemmPlan, WgmmaPlan)):
                plan = dataclasses.replace(plan, joint=_joint_note(i, couplings, chosen,
                                                                   threads, target, plan))
            plans[gid] = plan
    return plans, record


def _joint_note(group: int, couplings: list, chosen: list, threads: int,
                target: Target, plan=None) -> str:
    """Why a group's plan is not its cheapest alone: the chained gemm it was priced with."""
    what = ("N width and warpgroup grid" if isinstance(plan, WgmmaPlan) else "warp grid")
    for g1, g2, first, second in couplings:
        if group in (g1, g2):
            other = second if group == g1 else first
            cost = _conversion(chosen[g1], chosen[g2], first, second, threads, target)
            how = ("its accumulator reaches the A operand by register renaming" if cost == 0
                   else f"converting its accumulator costs ~{cost:.0f} cycles")
            line = other.loc.lineno if other.loc else "?"
            return f"{what} chosen with the gemm at line {line} ({how})"
    return ""


def _conversion(o1: Option, o2: Option, first: Gemm, second: Gemm, threads: int,
                target: Target) -> float:
    a_tv = o2.plans[id(second)].a_tv
    if a_tv is None:  # a wgmma reading A from shared memory: no register operand to match
        return 0.0
    return conversion_cycles(o1.plans[id(first)].c_tv, a_tv, tuple(second.a.shape),
                             second.a.dtype.bits // 8 or 1, threads, target)


def branch_and_bound(options: list, couplings: list, price, budget: int
                     ) -> tuple[list, JointSearch]:
    """The least (cost, keys) vector: one `Option` per group from `options` (per group,
    sorted by (cost, key)), where each coupling (group i, group j, first, second) adds
    `price(option of i, option of j, first, second)` (never negative). Depth-first over
    the groups in order, options cheapest first (module docstring)."""
    n = len(options)
    floor = [0.0] * (n + 1)           # the cheapest own costs of groups i.. (the bound)
    for i in range(n - 1, -1, -1):
        floor[i] = floor[i + 1] + options[i][0].cost
    below = [1] * (n + 1)             # complete vectors under one node at depth i
    for i in range(n - 1, -1, -1):
        below[i] = below[i + 1] * len(options[i])
    closing = [[c for c in couplings if max(c[0], c[1]) == i] for i in range(n)]
    cache: dict = {}
    best: list = [math.inf, (), None]  # total, keys, options
    count = dict(visited=0, scored=0, pruned=0)
    vector: list = []

    def conversions(i: int) -> float:
        total = 0.0
        for g1, g2, first, second in closing[i]:
            pair = (g1, vector[g1].key, g2, vector[g2].key, id(first), id(second))
            if pair not in cache:
                cache[pair] = price(vector[g1], vector[g2], first, second)
            total += cache[pair]
        return total

    def visit(i: int, cost: float) -> None:
        if i == n:
            count["scored"] += 1
            keys = tuple(o.key for o in vector)
            if (cost, keys) < (best[0], best[1]):
                best[:] = [cost, keys, list(vector)]
            return
        count["visited"] += 1
        for j, option in enumerate(options[i]):
            if cost + option.cost + floor[i + 1] > best[0]:
                count["pruned"] += (len(options[i]) - j) * below[i + 1]
                return
            if count["scored"] >= budget:
                return
            vector.append(option)
            visit(i + 1, cost + option.cost + conversions(i))
            vector.pop()

    visit(0, 0.0)
    record = JointSearch(n, tuple(len(o) for o in options), len(couplings), below[0],
                         count["visited"], count["scored"], count["pruned"], budget)
    return best[2], record
