"""Lowering of register computations: fill, elementwise, reductions, conversions, atomics.

Elementwise ops compute each distinct register of the output from the registers of the
inputs that hold the same (or, for broadcast inputs, the projected) element — found with
`match_values`, so any pair of agreeing layouts works, not only identical ones.

A reduction along an axis runs in three levels, each read off the layouts' structure:
inside a thread (registers of one row), across lanes (butterfly shuffles over the lane
bits that move along the reduced axis), and across warps (through a shared scratch row
per warp, for warp bits that move along it). Thread bits that only replicate data are left
alone, so broadcast layouts are never double counted.
"""
from __future__ import annotations

import numpy as np

from tegula.dtypes import DType, bool_, f32
from tegula.errors import SynthesisError
from tegula.ir.ops import (AtomicAdd, Bitcast, Elementwise, Fill, Indices, Rearrange, Reduce,
                           Reshape)
from tegula.ir.scalar import Scalar
from tegula.ir.values import GlobalTile, RegisterTile, describe
from tegula.layout.reshape import reshape_sources
from tegula.layout.tv import (distinct_values, match_values, project_flat_indices,
                              tile_size, tile_strides, tv_table)
from tegula.lower.addressing import (global_address, replica_predicate, scalar_expr,
                                     split_index)
from tegula.lower.context import LoweringContext, reg
from tegula.lower.thread_ir import (Assign, Barrier, Binary, Bits, Cast, Comment, Const,
                                    GlobalAtomicAdd, IndexValue, Literal, RegRead, SharedLoad,
                                    SharedStore, Shuffle, TID, Unary, Where, all_of, as_expr)

_COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
_REDUCE_OP = {"sum": "add", "max": "max", "min": "min"}
_REDUCE_IDENTITY = {"sum": 0.0, "max": -float("inf"), "min": float("inf")}


def lower_fill(ctx: LoweringContext, op: Fill) -> list:
    array = ctx.regs_of(op.dst)
    value = Literal(float(op.value), op.dst.dtype)
    return [Comment(f"fill {describe(op.dst)} with {op.value}")] + [
        Assign(reg(array, v), value) for v in range(array.size)]


def operand_registers(ctx: LoweringContext, tile: RegisterTile, out: RegisterTile) -> np.ndarray:
    """For each register of `out`, the register of `tile` holding its (projected) element."""
    wanted = project_flat_indices(tv_table(out.layout), tuple(out.shape), tuple(tile.shape))
    found = match_values(tile.layout, wanted)
    if found is None:
        raise SynthesisError(f"internal: {describe(tile)} does not hold the elements "
                             f"{describe(out)} needs (layouts {tile.layout} vs {out.layout})",
                             loc=out.loc)
    return found


def _value_expr(op: Elementwise, operands: list, out_dtype: DType):
    """The Value computing one output element from the operands' Values."""
    if op.op == "cast":
        return Cast(operands[0], out_dtype)
    if op.op == "where":
        return Where(operands[0], operands[1], operands[2], out_dtype)
    if len(operands) == 1:
        return Unary(op.op, operands[0], out_dtype)
    return Binary(op.op, operands[0], operands[1], bool_ if op.op in _COMPARISONS else out_dtype)


def lower_elementwise(ctx: LoweringContext, op: Elementwise) -> list:
    out_regs = ctx.regs_of(op.out)
    # op.inputs holds the tile operands only; op.scalars the numbers, by operand position.
    sources = [(ctx.regs_of(tile), operand_registers(ctx, tile, op.out)) for tile in op.inputs]
    n_inputs = len(op.inputs) + len(op.scalars)
    stmts: list = [Comment(f"{op.op} -> {describe(op.out)}")]
    number_type = _number_dtype(op)
    for v in distinct_values(op.out.layout):
        operands, tiles = [], iter(sources)
        for position in range(n_inputs):
            if position in op.scalars:
                operands.append(_scalar_operand(op.scalars[position], number_type))
            else:
                array, registers = next(tiles)
                operands.append(RegRead(reg(array, int(registers[v]))))
        stmts.append(Assign(reg(out_regs, v), _value_expr(op, operands, op.out.dtype)))
    return stmts + _fill_repeats(out_regs, op.out.layout)


def _number_dtype(op: Elementwise) -> DType:
    """The type a Python number operand takes: that of the op's value operands. For
    `where` those are the two values (the result's type), not the bool condition."""
    if op.op == "where":
        return op.out.dtype
    return op.inputs[0].dtype


def _scalar_operand(value, dtype: DType):
    """A number operand as a literal; a kernel scalar (block index, loop index, extent, int
    parameter) as its index expression converted to `dtype` when the kernel runs."""
    if isinstance(value, Scalar):
        return IndexValue(scalar_expr(value), dtype)
    return Literal(float(value), dtype)


def lower_indices(ctx: LoweringContext, op: Indices) -> list:
    """Each register gets its element's coordinate along the axis (from the thread's
    coordinate base, see `ThreadCoords`) plus the offset."""
    out = op.out
    out_regs = ctx.regs_of(out)
    offset = scalar_expr(op.offset)
    stmts: list = [Comment(f"indices along axis {op.axis} + {op.offset} -> {describe(out)}")]
    for v in distinct_values(out.layout):
        coord = ctx.coords.coords(out.layout, tuple(out.shape), v)[op.axis]
        stmts.append(Assign(reg(out_regs, v), IndexValue(as_expr(coord) + offset, out.dtype)))
    return stmts + _fill_repeats(out_regs, out.layout)


def lower_reshape(ctx: LoweringContext, op: Reshape) -> list:
    """Each register of the result copies the register of `x` holding the same element
    (its flat index renamed by the reshape, `layout/reshape.py`): register copies the
    CUDA compiler removes."""
    sources = reshape_sources(tuple(op.x.shape), op.order, tuple(op.out.shape))
    found = match_values(op.x.layout, sources[tv_table(op.out.layout)])
    if found is None:
        raise SynthesisError(f"internal: reshape {describe(op.x)} -> {describe(op.out)} with "
                             f"layouts {op.x.layout} vs {op.out.layout}", loc=op.loc)
    src, dst = ctx.regs_of(op.x), ctx.regs_of(op.out)
    return [Comment(f"reshape {describe(op.x)} -> {describe(op.out)}")] + [
        Assign(reg(dst, v), RegRead(reg(src, int(found[v])))) for v in range(dst.size)]


def lower_bitcast(ctx: LoweringContext, op: Bitcast) -> list:
    """Each register of the result reads the bits of the register of `x` holding its word
    (32 to 16 bits: the half its last coordinate names)."""
    table = tv_table(op.out.layout)
    size = tile_size(tuple(op.x.shape))
    found = match_values(op.x.layout, table % size)
    parts = table // size
    if found is None or (parts != parts[:1]).any():
        raise SynthesisError(f"internal: bitcast {describe(op.x)} -> {describe(op.out)} with "
                             f"layouts {op.x.layout} vs {op.out.layout}", loc=op.loc)
    src, dst = ctx.regs_of(op.x), ctx.regs_of(op.out)
    return [Comment(f"bitcast {describe(op.x)} -> {describe(op.out)}")] + [
        Assign(reg(dst, v), Bits(RegRead(reg(src, int(found[v]))), op.out.dtype,
                                 int(parts[0, v]))) for v in range(dst.size)]


def _fill_repeats(array, tv) -> list:
    """Registers that repeat an earlier register's element get its value."""
    table = tv_table(tv)
    first: dict[bytes, int] = {}
    stmts = []
    for v in range(table.shape[1]):
        key = table[:, v].tobytes()
        if key in first:
            stmts.append(Assign(reg(array, v), RegRead(reg(array, first[key]))))
        else:
            first[key] = v
    return stmts


def lower_rearrange(ctx: LoweringContext, op: Rearrange) -> list:
    """A layout conversion by the mechanism synthesis chose (see `synth.convert`)."""
    choice = op.choices.get("conversion")
    kind = choice.kind if choice is not None else "shared"
    header = Comment(f"convert {describe(op.x)} -> {describe(op.out)}: "
                     f"{choice.describe() if choice is not None else 'shared-memory round trip'}")
    src_regs, dst_regs = ctx.regs_of(op.x), ctx.regs_of(op.out)
    if kind == "registers":
        return [header] + [Assign(reg(dst_regs, r), RegRead(reg(src_regs, int(s))))
                           for r, s in enumerate(choice.register_map)]
    if kind == "shuffle":
        lane = TID % 32
        stmts: list = [header]
        for step in choice.steps:
            source = Const(step.base)
            for b, column in enumerate(step.columns):
                if column:
                    source = source ^ (((lane >> b) & 1) * column)
            stmts.append(Shuffle(reg(dst_regs, step.receive), reg(src_regs, step.send), "idx",
                                 source))
        return stmts + [Assign(reg(dst_regs, r), RegRead(reg(dst_regs, frm)))
                        for r, frm in choice.copies]
    return [header] + _convert_through_shared(ctx, op)


def _convert_through_shared(ctx: LoweringContext, op: Rearrange) -> list:
    """Every thread stores the elements it holds at their tile index, then loads the
    elements its new layout needs (works for any pair of layouts)."""
    src, dst = op.x, op.out
    size = int(np.prod(src.shape))
    scratch = ctx.scratch(f"convert_{dst.name}", src.dtype, size)
    src_regs, dst_regs = ctx.regs_of(src), ctx.regs_of(dst)
    owner = replica_predicate(src.layout)
    stmts: list = [Barrier()]
    for v in distinct_values(src.layout):
        stmts.append(SharedStore(scratch.name, _flat(ctx, src, v), reg(src_regs, v), 1, owner))
    stmts.append(Barrier())
    for v in range(dst_regs.size):
        stmts.append(SharedLoad(reg(dst_regs, v), scratch.name, _flat(ctx, dst, v), 1))
    stmts.append(Barrier())
    return stmts


def _flat(ctx: LoweringContext, tile: RegisterTile, v: int):
    coords = ctx.coords.coords(tile.layout, tuple(tile.shape), v)
    strides = tile_strides(tuple(tile.shape))
    flat = Const(0)
    for c, s in zip(coords, strides):
        flat = flat + c * s
    return flat


def lower_atomic_add(ctx: LoweringContext, op: AtomicAdd) -> list:
    if not isinstance(op.dst, GlobalTile):
        raise SynthesisError(f"atomic_add needs a global destination, got {describe(op.dst)}",
                             loc=op.loc)
    if "bulk_add" in op.choices:  # sm_90: staged in shared memory, TMA reduce-adds
        from tegula.lower.hopper import lower_tma_store
        return [Comment(f"atomic_add {describe(op.src)} -> {describe(op.dst)}")] + \
            lower_tma_store(ctx, op)
    src = op.src
    array = ctx.regs_of(src)
    owner = replica_predicate(src.layout)
    contiguous = ctx.facts[op.dst.arg.name].contiguous_dim
    stmts: list = [Comment(f"atomic_add {describe(src)} -> {describe(op.dst)}")]
    for v in distinct_values(src.layout):
        coords = ctx.coords.coords(src.layout, tuple(src.shape), v)
        index, pred = global_address(op.dst, coords, contiguous)
        stmts.append(GlobalAtomicAdd(op.dst.arg.name, index, reg(array, v),
                                     all_of([pred, owner])))
    return stmts


# --------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------

def reduction_thread_bits(x_tv, out_tv, threads: int) -> list[int]:
    """Thread-index bits along which the reduction must combine values: flipping the bit
    keeps every register's output element but changes the input elements held."""
    if threads & (threads - 1) and threads % 128:
        raise SynthesisError(f"reductions across threads need a power-of-two thread count "
                             f"or whole warpgroups, not {threads}")
    x_table, out_table = tv_table(x_tv), tv_table(out_tv)
    bits = []
    for b in range((threads - 1).bit_length()):
        # With whole warpgroups that are not a power of two (three: 384 threads) some
        # threads have no partner along a high bit; such a bit may only separate distinct
        # outputs (rows of a wgmma accumulator live within one warp's lanes).
        tids = np.arange(threads)
        partner = tids ^ (1 << b)
        whole = bool(np.all(partner < threads))
        tids, partner = tids[partner < threads], partner[partner < threads]
        if not np.array_equal(out_table[partner], out_table[tids]):
            continue
        same_input = np.all(x_table[partner] == x_table[tids], axis=1)
        if np.all(same_input):
            continue  # the bit only replicates data
        if not whole:
            raise SynthesisError(f"reductions across threads need a power-of-two thread "
                                 f"count, not {threads}, where they combine along thread "
                                 f"bit {b}")
        if np.any(same_input):
            raise SynthesisError("internal: a reduction layout mixes replicated and "
                                 "distinct data along one thread bit")
        bits.append(b)
    return bits


def lower_reduce(ctx: LoweringContext, op: Reduce) -> list:
    x, out = op.x, op.out
    x_regs, out_regs = ctx.regs_of(x), ctx.regs_of(out)
    combine = _REDUCE_OP[op.kind]
    # Sums of 16- and 8-bit floats accumulate in f32 and round once at the end (as torch
    # and Triton do): summed in f16 or f8 every partial sum rounds, and f8e4m3 saturates
    # at 448, so the result would depend on the order of the lanes and warps.
    dtype = f32 if op.kind == "sum" and out.dtype.is_float and out.dtype.bits < 32 \
        else out.dtype
    acc_regs = out_regs if dtype == out.dtype else \
        ctx.temp_regs(f"{out.name}_sum", dtype, out.layout[1].size)
    stmts: list = [Comment(f"{op.kind} of {describe(x)} along axis {op.axis} -> {describe(out)}")]
    # 1. Inside each thread: fold every input register into the output register of its row.
    out_table = tv_table(out.layout)
    row_of_register = project_flat_indices(tv_table(x.layout), tuple(x.shape), tuple(out.shape))
    targets = match_values(out.layout, row_of_register)
    rows = distinct_values(out.layout)
    for v in rows:
        stmts.append(Assign(reg(acc_regs, v), Literal(_identity(op.kind, dtype), dtype)))
    first_of = {out_table[:, v].tobytes(): v for v in reversed(rows)}
    # Only registers holding an element no earlier register of the thread holds: a layout
    # that repeats an element in one thread (a broadcast value mode) must count it once.
    for xv in distinct_values(x.layout):
        target = first_of[out_table[:, int(targets[xv])].tobytes()]
        value = _as(RegRead(reg(x_regs, xv)), dtype)
        stmts.append(Assign(reg(acc_regs, target),
                            Binary(combine, RegRead(reg(acc_regs, target)), value, dtype)))
    bits = reduction_thread_bits(x.layout, out.layout, ctx.threads)
    # 2. Across lanes of a warp: butterfly shuffles.
    for b in (b for b in bits if b < 5):
        tmp = ctx.temp_regs("shfl", dtype, 1)
        for v in rows:
            stmts.append(Shuffle(reg(tmp, 0), reg(acc_regs, v), "xor", Const(1 << b)))
            stmts.append(Assign(reg(acc_regs, v), Binary(combine, RegRead(reg(acc_regs, v)),
                                                         RegRead(reg(tmp, 0)), dtype)))
    # 3. Across warps: one scratch row per warp, then each thread combines its group's rows.
    warp_bits = [b - 5 for b in bits if b >= 5]
    if warp_bits:
        stmts += _reduce_across_warps(ctx, op, rows, warp_bits, combine, acc_regs)
    if acc_regs is not out_regs:
        stmts += [Assign(reg(out_regs, v), Cast(RegRead(reg(acc_regs, v)), out.dtype))
                  for v in rows]
    return stmts + _fill_repeats(out_regs, out.layout)


def _as(value, dtype: DType):
    return value if value.dtype == dtype else Cast(value, dtype)


def _reduce_across_warps(ctx: LoweringContext, op: Reduce, rows: list[int], warp_bits: list[int],
                         combine: str, acc_regs) -> list:
    """Combine the warps' partial rows through shared scratch; `acc_regs` holds them (in
    the reduction's accumulation type)."""
    out = op.out
    out_regs, dtype = acc_regs, acc_regs.dtype
    warps = ctx.threads // 32
    row_count = int(np.prod(out.shape))
    scratch = ctx.scratch(f"reduce_{out.name}", dtype, warps * row_count)
    warp = TID // 32
    stmts: list = [Barrier()]
    owner = _lane_owner(out.layout)
    for v in rows:
        stmts.append(SharedStore(scratch.name, warp * row_count + _flat(ctx, out, v),
                                 reg(out_regs, v), 1, owner))
    stmts.append(Barrier())
    tmp = ctx.temp_regs("partial", dtype, 1)
    masks = _span([1 << b for b in warp_bits])
    for v in rows:
        for mask in masks:
            if mask == 0:
                continue
            stmts.append(SharedLoad(reg(tmp, 0), scratch.name,
                                    (warp ^ mask) * row_count + _flat(ctx, out, v), 1))
            stmts.append(Assign(reg(out_regs, v), Binary(combine, RegRead(reg(out_regs, v)),
                                                         RegRead(reg(tmp, 0)), dtype)))
    stmts.append(Barrier())
    return stmts


def _lane_owner(out_tv):
    """One writer per row within a warp: lanes that hold the same output elements (after
    the shuffles they hold equal values) defer to the one with those lane bits clear."""
    table = tv_table(out_tv)
    tids = np.arange(table.shape[0])
    conds = [((TID >> b) & 1).eq(0) for b in range(5)
             if np.array_equal(table[tids ^ (1 << b)], table)]
    return all_of(conds)


def _identity(kind: str, dtype: DType) -> float:
    """The value a reduction starts from (dtype limits for integers)."""
    if dtype.is_int and kind != "sum":
        bits = dtype.bits - (1 if dtype.is_signed else 0)
        low = -(1 << bits) if dtype.is_signed else 0
        return float(low if kind == "max" else (1 << bits) - 1)
    return _REDUCE_IDENTITY[kind]


def _span(vectors: list[int]) -> list[int]:
    """Every XOR combination of `vectors` (including 0)."""
    result = [0]
    for v in vectors:
        result += [r ^ v for r in result]
    return result


__all__ = ["lower_fill", "lower_elementwise", "lower_rearrange", "lower_atomic_add",
           "lower_indices", "lower_reshape",
           "lower_reduce", "reduction_thread_bits", "IndexValue", "split_index"]
