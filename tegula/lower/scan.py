"""Lowering of `Scan`: an inclusive scan in three levels, in the layout `synth.scan` chose.

Each thread holds runs of `k` consecutive elements along the axis, one run per row it
holds; the `n` threads of a row are consecutive lanes (then consecutive warps). With ⊕ the
traced combine (applied to the tuple of all scanned tiles at once):

1. in registers: each run is scanned in order, `x[i] = x[i-1] ⊕ x[i]`;
2. across lanes (n > 1): the run totals go through a Kogge–Stone scan over the row's
   lanes (`shfl.sync.up` by 1, 2, 4, …; a lane combines only when its source is in its
   row), then each thread folds the total of the lanes before it (one more shuffle by 1)
   into its run: `x[i] = before ⊕ x[i]` — the earlier operand always on the left, so a
   non-commutative ⊕ (the linear recurrence) is right;
3. across warps (n > 32): lane 31 of every warp stores the warp's total for each row in a
   shared scratch row, and each thread folds the totals of the warps before it in its
   row's group (in order) into its values.

With an initial (a scan continued from an earlier chunk), the row's first thread in scan
order folds it into its first element before step 1 (`first = initial ⊕ first`), so
every step after carries it along; the carry (the row's last element in scan order) is
broadcast from the last lane by an indexed shuffle, or folded from the warps' totals.

`reverse` runs the same steps mirrored (the last element first, `shfl.down`), which is
flip, scan, flip. No identity element is needed: a thread whose rank along the row is
below the shuffle distance keeps its value (a predicated combine). Each application of ⊕
evaluates the combine's recorded element-wise ops into temporary registers, then writes
the results, so a result never overwrites an operand the other results still read.
"""
from __future__ import annotations

from tegula.ir.ops import Scan
from tegula.ir.values import describe
from tegula.lower.compute import _number_dtype, _scalar_operand, _value_expr
from tegula.lower.context import LoweringContext, reg
from tegula.lower.thread_ir import (Assign, Barrier, Comment, Const, If, Reg, RegRead,
                                    SharedLoad, SharedStore, Shuffle, TID)
from tegula.synth.scan import ScanPlan


class _Combine:
    """The traced combine as thread-IR statements on registers."""

    def __init__(self, ctx: LoweringContext, op: Scan):
        self.traced = op.combine
        self.temps = {e.out.id: ctx.temp_regs("scan_t", e.out.dtype, 1)
                      for e in self.traced.ops}
        self.results = [ctx.temp_regs("scan_r", x.dtype, 1) for x in op.xs]

    def apply(self, dsts: list[Reg], earlier: list, later: list) -> list:
        """`dsts = earlier ⊕ later` (one register or value per scanned tile)."""
        env = {t.id: v for t, v in zip(self.traced.lhs, earlier)}
        env.update({t.id: v for t, v in zip(self.traced.rhs, later)})
        stmts: list = []
        for e in self.traced.ops:
            tiles = iter(e.inputs)
            number_type = _number_dtype(e)
            operands = [_scalar_operand(e.scalars[p], number_type) if p in e.scalars
                        else env[next(tiles).id]
                        for p in range(len(e.inputs) + len(e.scalars))]
            temp = reg(self.temps[e.out.id], 0)
            stmts.append(Assign(temp, _value_expr(e, operands, e.out.dtype)))
            env[e.out.id] = RegRead(temp)
        for result, temp in zip(self.traced.results, self.results):
            stmts.append(Assign(reg(temp, 0), env[result.id]))
        stmts += [Assign(dst, RegRead(reg(temp, 0))) for dst, temp in zip(dsts, self.results)]
        return stmts


def lower_scan(ctx: LoweringContext, op: Scan) -> list:
    plan: ScanPlan = op.choices["scan"]
    combine = _Combine(ctx, op)
    x_regs = [ctx.regs_of(x) for x in op.xs]
    out_regs = [ctx.regs_of(out) for out in op.outs]
    order = "reversed " if op.reverse else ""
    stmts: list = [Comment(f"{order}scan of {', '.join(describe(x) for x in op.xs)} along "
                           f"axis {op.axis} -> {', '.join(describe(o) for o in op.outs)}: "
                           f"{plan.describe()}")]
    stmts += [Assign(reg(out, v), RegRead(reg(x, v)))
              for x, out in zip(x_regs, out_regs) for v in range(out.size)]
    runs = [_run(plan, r, op.reverse) for r in range(plan.rows)]
    if op.initials:
        stmts += _fold_initial(ctx, op, plan, combine, out_regs, runs)
    # 1. In registers: each run in order.
    for run in runs:
        for earlier, v in zip(run, run[1:]):
            stmts += combine.apply([reg(out, v) for out in out_regs],
                                   [RegRead(reg(out, earlier)) for out in out_regs],
                                   [RegRead(reg(out, v)) for out in out_regs])
    if plan.n > 1:
        stmts += _across_lanes(ctx, op, plan, combine, out_regs, runs)
    if plan.n > 32:
        stmts += _across_warps(ctx, op, plan, combine, out_regs, runs)
    elif op.carries:
        stmts += _carry_from_lanes(ctx, op, plan, out_regs, runs)
    return stmts


def _fold_initial(ctx: LoweringContext, op: Scan, plan: ScanPlan, combine: _Combine,
                  out_regs: list, runs: list[list[int]]) -> list:
    """`first = initial ⊕ first` for the row's first element in scan order, before any
    step: the thread first along the row folds it into its run's first register, and the
    steps after carry it to every element (one combine per row, not per element)."""
    initial_regs = [ctx.regs_of(t) for t in op.initials]
    fold: list = []
    for r, run in enumerate(runs):
        fold += combine.apply([reg(out, run[0]) for out in out_regs],
                              [RegRead(reg(init, r)) for init in initial_regs],
                              [RegRead(reg(out, run[0])) for out in out_regs])
    if plan.n == 1:
        return fold
    return [If(_rank(TID % plan.n, plan.n, op.reverse).eq(0), fold)]


def _carry_from_lanes(ctx: LoweringContext, op: Scan, plan: ScanPlan, out_regs: list,
                      runs: list[list[int]]) -> list:
    """The carry: the last element in scan order of each row (its last lane's last run
    register), broadcast to the row's lanes by an indexed shuffle."""
    carry_regs = [ctx.regs_of(t) for t in op.carries]
    if plan.n == 1:
        return [Assign(reg(carry, r), RegRead(reg(out, run[-1])))
                for r, run in enumerate(runs) for carry, out in zip(carry_regs, out_regs)]
    last_lane = (TID % 32) - TID % plan.n + (0 if op.reverse else plan.n - 1)
    return [Shuffle(reg(carry, r), reg(out, run[-1]), "idx", last_lane)
            for r, run in enumerate(runs) for carry, out in zip(carry_regs, out_regs)]


def _run(plan: ScanPlan, row: int, reverse: bool) -> list[int]:
    """The registers of one row's run in scan order (value index = i + k * row)."""
    run = [row * plan.k + i for i in range(plan.k)]
    return run[::-1] if reverse else run


def _rank(position, count: int, reverse: bool):
    """A thread's (or warp's) rank in scan order from its position along the row."""
    return (count - 1) - position if reverse else position


def _across_lanes(ctx: LoweringContext, op: Scan, plan: ScanPlan, combine: _Combine,
                  out_regs: list, runs: list[list[int]]) -> list:
    lanes = min(plan.n, 32)
    rank = _rank((TID % 32) % lanes, lanes, op.reverse)
    mode = "down" if op.reverse else "up"
    received = [ctx.temp_regs("scan_shfl", out.dtype, 1) for out in out_regs]
    stmts: list = [Comment(f"scan across {lanes} lanes")]
    # With one register per run the run's value is its total: scan it in place.
    totals = out_regs if plan.k == 1 else \
        [ctx.temp_regs("scan_total", out.dtype, plan.rows) for out in out_regs]
    for r, run in enumerate(runs):
        if plan.k > 1:
            stmts += [Assign(reg(total, r), RegRead(reg(out, run[-1])))
                      for total, out in zip(totals, out_regs)]
        last = r if plan.k > 1 else run[-1]
        distance = 1
        while distance < lanes:
            stmts += [Shuffle(reg(got, 0), reg(total, last), mode, Const(distance))
                      for got, total in zip(received, totals)]
            stmts.append(If(rank.ge(distance), combine.apply(
                [reg(total, last) for total in totals],
                [RegRead(reg(got, 0)) for got in received],
                [RegRead(reg(total, last)) for total in totals])))
            distance *= 2
        if plan.k == 1:
            continue
        # The inclusive total of the lane before, folded into every register of the run.
        stmts += [Shuffle(reg(got, 0), reg(total, r), mode, Const(1))
                  for got, total in zip(received, totals)]
        fold: list = []
        for v in run:
            fold += combine.apply([reg(out, v) for out in out_regs],
                                  [RegRead(reg(got, 0)) for got in received],
                                  [RegRead(reg(out, v)) for out in out_regs])
        stmts.append(If(rank.ge(1), fold))
    return stmts


def _across_warps(ctx: LoweringContext, op: Scan, plan: ScanPlan, combine: _Combine,
                  out_regs: list, runs: list[list[int]]) -> list:
    """Lane 31 (the last in scan order: lane 0 when reversed) of each warp publishes the
    warp's inclusive total per row; each warp folds in its row group's earlier warps."""
    warps_per_row = plan.n // 32
    warp = TID // 32
    position = warp % warps_per_row
    rank = _rank(position, warps_per_row, op.reverse)
    first_warp = warp - position

    def warp_of(rank_j: int):
        return first_warp + _rank(rank_j, warps_per_row, op.reverse)

    publisher = (TID % 32).eq(0 if op.reverse else 31)
    slots = (ctx.threads // 32) * plan.rows
    scratch = [ctx.scratch(f"scan_{out.name}", out.dtype, slots) for out in out_regs]
    before = [ctx.temp_regs("scan_before", out.dtype, 1) for out in out_regs]
    loaded = [ctx.temp_regs("scan_warp", out.dtype, 1) for out in out_regs]
    stmts: list = [Comment(f"scan across {warps_per_row} warps"), Barrier()]
    for r, run in enumerate(runs):
        stmts += [SharedStore(s.name, warp * plan.rows + r, reg(out, run[-1]), 1, publisher)
                  for s, out in zip(scratch, out_regs)]
    stmts.append(Barrier())
    for r, run in enumerate(runs):
        stmts.append(If(rank.ge(1), [
            SharedLoad(reg(b, 0), s.name, warp_of(0) * plan.rows + r, 1)
            for b, s in zip(before, scratch)]))
        for j in range(1, warps_per_row - 1):
            load = [SharedLoad(reg(w, 0), s.name, warp_of(j) * plan.rows + r, 1)
                    for w, s in zip(loaded, scratch)]
            stmts.append(If(rank.ge(j + 1), load + combine.apply(
                [reg(b, 0) for b in before], [RegRead(reg(b, 0)) for b in before],
                [RegRead(reg(w, 0)) for w in loaded])))
        fold: list = []
        for v in run:
            fold += combine.apply([reg(out, v) for out in out_regs],
                                  [RegRead(reg(b, 0)) for b in before],
                                  [RegRead(reg(out, v)) for out in out_regs])
        stmts.append(If(rank.ge(1), fold))
    if op.carries:  # the row's total: every warp's total, in scan order
        carry_regs = [ctx.regs_of(t) for t in op.carries]
        for r in range(plan.rows):
            stmts += [SharedLoad(reg(c, r), s.name, warp_of(0) * plan.rows + r, 1)
                      for c, s in zip(carry_regs, scratch)]
            for j in range(1, warps_per_row):
                stmts += [SharedLoad(reg(w, 0), s.name, warp_of(j) * plan.rows + r, 1)
                          for w, s in zip(loaded, scratch)]
                stmts += combine.apply([reg(c, r) for c in carry_regs],
                                       [RegRead(reg(c, r)) for c in carry_regs],
                                       [RegRead(reg(w, 0)) for w in loaded])
    stmts.append(Barrier())
    return stmts


__all__ = ["lower_scan"]
