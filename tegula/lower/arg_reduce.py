"""Lowering of `tg.argmax` / `tg.argmin`: a reduction of (value, position) pairs.

It runs in the three levels of every reduction (`lower.compute.lower_reduce`): inside a
thread, across the lanes of a warp (butterfly shuffles of both the value and the position),
and across warps (one shared scratch row of values and one of positions per warp). Each
step keeps the better of two pairs under one total order, so the result does not depend on
the order in which pairs meet:

* a NaN beats every number (torch and numpy return the first NaN's position);
* otherwise the larger value wins for argmax (the smaller for argmin);
* equal values (and two NaNs) go to the smaller position: the first maximum, as in torch.

Positions are coordinates along the reduced axis within the tile (i32). Each thread starts
every output row from the first element it holds of that row, so no identity value is
needed (f8 types have no infinity to start from).
"""
from __future__ import annotations

import numpy as np

from tegula.dtypes import bool_, i32
from tegula.errors import SynthesisError
from tegula.ir.ops import Reduce
from tegula.ir.values import describe
from tegula.layout.tv import distinct_values, match_values, project_flat_indices, tv_table
from tegula.lower.compute import (_fill_repeats, _flat, _lane_owner, _span, lower_reduce,
                                  reduction_thread_bits)
from tegula.lower.context import LoweringContext, reg
from tegula.lower.thread_ir import (Assign, Barrier, Binary, Comment, Const, IndexValue,
                                    RegRead, SharedLoad, SharedStore, Shuffle, TID, Unary,
                                    Value, Where, as_expr)

ARG_KINDS = ("argmax", "argmin")


def lower_any_reduce(ctx: LoweringContext, op: Reduce) -> list:
    """Every `Reduce`: arg reductions here, sum/max/min in `lower.compute`. An error that
    names no line (a thread count the reduction cannot use) gets the reduction's."""
    try:
        if op.kind in ARG_KINDS:
            return lower_arg_reduce(ctx, op)
        return lower_reduce(ctx, op)
    except SynthesisError as error:
        if error.loc is not None or op.loc is None:
            raise
        raise SynthesisError(f"tg.{op.kind} of {describe(op.x)} along axis {op.axis}: "
                             f"{error.message}", loc=op.loc) from None


class _Pairs:
    """The running (value, position) pair of every output register, and how to merge a
    candidate pair into one of them."""

    def __init__(self, ctx: LoweringContext, op: Reduce):
        self.op = op
        self.dtype = op.x.dtype
        self.positions = ctx.regs_of(op.out)
        self.values = ctx.temp_regs(f"{op.out.name}_value", self.dtype, self.positions.size)
        self.win = ctx.temp_regs(f"{op.out.name}_win", bool_, 1)

    def set(self, v: int, value: Value, position: Value) -> list:
        return [Assign(reg(self.values, v), value), Assign(reg(self.positions, v), position)]

    def merge(self, v: int, value: Value, position: Value) -> list:
        """Keep the better of the pair in register v and (value, position)."""
        mine_value = RegRead(reg(self.values, v))
        mine_position = RegRead(reg(self.positions, v))
        win = RegRead(reg(self.win, 0))
        return [Assign(reg(self.win, 0), self._wins(value, position, mine_value, mine_position)),
                Assign(reg(self.values, v), Where(win, value, mine_value, self.dtype)),
                Assign(reg(self.positions, v), Where(win, position, mine_position, i32))]

    def _wins(self, b: Value, b_pos: Value, a: Value, a_pos: Value) -> Value:
        """True when candidate (b, b_pos) beats the held (a, a_pos) (see the module doc)."""
        beats = Binary("gt" if self.op.kind == "argmax" else "lt", b, a, bool_)
        earlier_tie = _and(Binary("eq", b, a, bool_), Binary("lt", b_pos, a_pos, bool_))
        ordinary = _or(beats, earlier_tie)
        if not self.dtype.is_float:
            return ordinary
        a_nan, b_nan = Binary("ne", a, a, bool_), Binary("ne", b, b, bool_)
        a_number = Unary("not", a_nan, bool_)
        nan_wins = _and(b_nan, _or(a_number, Binary("lt", b_pos, a_pos, bool_)))
        return _or(nan_wins, _and(a_number, ordinary))


def _and(x: Value, y: Value) -> Value:
    return Binary("and", x, y, bool_)


def _or(x: Value, y: Value) -> Value:
    return Binary("or", x, y, bool_)


def lower_arg_reduce(ctx: LoweringContext, op: Reduce) -> list:
    x, out = op.x, op.out
    pairs = _Pairs(ctx, op)
    stmts: list = [Comment(f"{op.kind} of {describe(x)} along axis {op.axis} -> "
                           f"{describe(out)}")]
    # 1. Inside each thread: fold every input register into the pair of its row.
    out_table = tv_table(out.layout)
    row_of_register = project_flat_indices(tv_table(x.layout), tuple(x.shape), tuple(out.shape))
    targets = match_values(out.layout, row_of_register)
    rows = distinct_values(out.layout)
    first_of = {out_table[:, v].tobytes(): v for v in reversed(rows)}
    started: set[int] = set()
    x_regs = ctx.regs_of(x)
    for xv in range(x_regs.size):
        target = first_of[out_table[:, int(targets[xv])].tobytes()]
        coord = ctx.coords.coords(x.layout, tuple(x.shape), xv)[op.axis]
        value, position = RegRead(reg(x_regs, xv)), IndexValue(as_expr(coord), i32)
        if target in started:
            stmts += pairs.merge(target, value, position)
        else:
            stmts += pairs.set(target, value, position)
            started.add(target)
    bits = reduction_thread_bits(x.layout, out.layout, ctx.threads)
    # 2. Across lanes of a warp: butterfly shuffles of both halves of the pair.
    for b in (b for b in bits if b < 5):
        value_tmp = ctx.temp_regs("shfl_value", pairs.dtype, 1)
        position_tmp = ctx.temp_regs("shfl_position", i32, 1)
        for v in rows:
            stmts.append(Shuffle(reg(value_tmp, 0), reg(pairs.values, v), "xor", Const(1 << b)))
            stmts.append(Shuffle(reg(position_tmp, 0), reg(pairs.positions, v), "xor",
                                 Const(1 << b)))
            stmts += pairs.merge(v, RegRead(reg(value_tmp, 0)), RegRead(reg(position_tmp, 0)))
    # 3. Across warps: a scratch row of values and one of positions per warp.
    warp_bits = [b - 5 for b in bits if b >= 5]
    if warp_bits:
        stmts += _merge_across_warps(ctx, op, pairs, rows, warp_bits)
    return stmts + _fill_repeats(pairs.positions, out.layout)


def _merge_across_warps(ctx: LoweringContext, op: Reduce, pairs: _Pairs, rows: list[int],
                        warp_bits: list[int]) -> list:
    out = op.out
    warps = ctx.threads // 32
    row_count = int(np.prod(out.shape))
    value_scratch = ctx.scratch(f"{op.kind}_{out.name}_value", pairs.dtype, warps * row_count)
    position_scratch = ctx.scratch(f"{op.kind}_{out.name}_position", i32, warps * row_count)
    warp = TID // 32
    owner = _lane_owner(out.layout)
    stmts: list = [Barrier()]
    for v in rows:
        at = warp * row_count + _flat(ctx, out, v)
        stmts.append(SharedStore(value_scratch.name, at, reg(pairs.values, v), 1, owner))
        stmts.append(SharedStore(position_scratch.name, at, reg(pairs.positions, v), 1, owner))
    stmts.append(Barrier())
    value_tmp = ctx.temp_regs("partial_value", pairs.dtype, 1)
    position_tmp = ctx.temp_regs("partial_position", i32, 1)
    for v in rows:
        for mask in _span([1 << b for b in warp_bits]):
            if mask == 0:
                continue
            at = (warp ^ mask) * row_count + _flat(ctx, out, v)
            stmts.append(SharedLoad(reg(value_tmp, 0), value_scratch.name, at, 1))
            stmts.append(SharedLoad(reg(position_tmp, 0), position_scratch.name, at, 1))
            stmts += pairs.merge(v, RegRead(reg(value_tmp, 0)), RegRead(reg(position_tmp, 0)))
    stmts.append(Barrier())
    return stmts


__all__ = ["ARG_KINDS", "lower_any_reduce", "lower_arg_reduce"]
