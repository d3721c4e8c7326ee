"""Lowering `tg.copy` between every pair of scopes.

Each copy was given a distribution of its elements over threads (a register tile's own
TV layout, or a coalesced partition for copies that do not involve registers) and vector
widths by synthesis; lowering walks the registers in vector-sized steps and emits one
memory instruction per step with its address and bounds predicate. Threads that hold
copies of the same elements (broadcast layouts) are predicated off for writes, so every
memory location has exactly one writer.
"""
from __future__ import annotations

import dataclasses
import math

from tegula.arch.catalogue import ldmatrix
from tegula.errors import SynthesisError
from tegula.ir.ops import Copy
from tegula.ir.values import GlobalTile, RegisterTile, SharedTile, describe
from tegula.lower.addressing import global_address, replica_predicate, shared_offset
from tegula.lower.context import LoweringContext, reg
from tegula.lower.thread_ir import (Assign, Comment, CpAsync, CpAsyncCommit, GlobalLoad,
                                    GlobalStore, If, LdMatrix, Literal, RegRead, SharedLoad,
                                    SharedStore, TID, all_of)
from tegula.layout.tv import distinct_values, match_values, tv_table


def _where(loc) -> str:
    return f" (line {loc.lineno})" if loc is not None else ""


def lower_copy(ctx: LoweringContext, op: Copy) -> list:
    """Thread IR for one copy."""
    src, dst = op.src, op.dst
    header = [Comment(f"copy {describe(src)} -> {describe(dst)}{_where(op.loc)}: "
                      f"{op.choices.get('instr', 'mov')}, {op.choices.get('vector', 1)}-element vectors")]
    if isinstance(src, GlobalTile) and isinstance(dst, RegisterTile):
        return header + _global_to_registers(ctx, op)
    if isinstance(src, RegisterTile) and isinstance(dst, GlobalTile):
        if "tma_store" in op.choices:  # sm_90a: staged in shared memory, TMA-stored
            from tegula.lower.hopper import lower_tma_store
            return header + lower_tma_store(ctx, op)
        return header + _registers_to_global(ctx, op)
    if isinstance(src, GlobalTile) and isinstance(dst, SharedTile):
        return header + _global_to_shared(ctx, op)
    if isinstance(src, SharedTile) and isinstance(dst, RegisterTile):
        return header + load_shared_to_registers(ctx, src, dst.layout, ctx.regs_of(dst),
                                                 op.choices["src_shared"])
    if isinstance(src, RegisterTile) and isinstance(dst, SharedTile):
        return header + _registers_to_shared(ctx, op)
    if isinstance(src, SharedTile) and isinstance(dst, GlobalTile):
        return header + _shared_to_global(ctx, op)
    if isinstance(src, RegisterTile) and isinstance(dst, RegisterTile):
        return header + copy_registers(ctx, src, dst)
    if isinstance(src, SharedTile) and isinstance(dst, SharedTile):
        return header + _shared_to_shared(ctx, op)
    raise SynthesisError(f"copy from {describe(src)} to {describe(dst)} is not supported",
                         loc=op.loc)


def _contiguous_dim(ctx: LoweringContext, view: GlobalTile) -> int | None:
    return ctx.facts[view.arg.name].contiguous_dim


def _vector_starts(tv, width: int, skip_repeats: bool) -> list[int]:
    """First register of each vector; with skip_repeats, vectors whose elements an
    earlier register of the same thread already holds are left out (written once)."""
    values = tv[1].size
    if not skip_repeats:
        return list(range(0, values, width))
    keep = set(distinct_values(tv))
    return [v for v in range(0, values, width) if v in keep]


def _edge_split(view: GlobalTile, coords: list, contiguous: int | None, width: int,
                tail: bool, dim: int | None, vector, element) -> list:
    """The statements for one vector access of `width` elements at tile coordinate `coords`.

    Without a possible tail: `vector(index, in_bounds)`. With one (the extent along the
    contiguous dim is not a multiple of the vector): the whole vector where its last
    element is in bounds, else element by element, each with its own predicate —
    `element(e, index, in_bounds)` — so only the vector straddling the edge is split."""
    index, pred = global_address(view, coords, contiguous)
    if not tail or dim is None or width == 1:
        return [vector(index, pred)]
    last = list(coords)
    last[dim] = last[dim] + (width - 1)
    _, whole = global_address(view, last, contiguous)
    elements = []
    for e in range(width):
        shifted = list(coords)
        shifted[dim] = shifted[dim] + e
        elements.append(element(e, *global_address(view, shifted, contiguous)))
    return [If(whole, [vector(index, None)], elements)]


def _global_to_registers(ctx: LoweringContext, op: Copy) -> list:
    """One load per distinct element a thread holds: a vector whose registers all repeat
    elements earlier registers hold (a broadcast tile, e.g. a (BM, 1) scale column in an
    accumulator's layout, holds each row's value once per column register) copies them
    from those registers instead of loading again."""
    view, tile = op.src, op.dst
    tv, width = tile.layout, op.choices["vector"]
    array = ctx.regs_of(tile)
    first = _first_holders(tv)
    out = []
    repeats = []
    for v in _vector_starts(tv, width, skip_repeats=False):
        if all(first[v + e] != v + e for e in range(width)):
            repeats += [Assign(reg(array, v + e), RegRead(reg(array, first[v + e])))
                        for e in range(width)]
            continue
        coords = ctx.coords.coords(tv, tile.shape, v)
        out += _edge_split(
            view, coords, _contiguous_dim(ctx, view), width, op.choices.get("tail", False),
            op.choices.get("dim"),
            lambda index, pred, v=v: GlobalLoad(reg(array, v), view.arg.name, index, width,
                                                pred, op.fill),
            lambda e, index, pred, v=v: GlobalLoad(reg(array, v + e), view.arg.name, index, 1,
                                                   pred, op.fill))
    return out + repeats


def _first_holders(tv) -> list[int]:
    """For each register, the first register of the same thread holding its element (the
    register itself when none before it does), alike for every thread."""
    table = tv_table(tv)
    first: dict[bytes, int] = {}
    return [first.setdefault(table[:, v].tobytes(), v) for v in range(table.shape[1])]


def _registers_to_global(ctx: LoweringContext, op: Copy) -> list:
    tile, view = op.src, op.dst
    tv, width = tile.layout, op.choices["vector"]
    array = ctx.regs_of(tile)
    owner = replica_predicate(tv)
    out = []
    for v in _vector_starts(tv, width, skip_repeats=True):
        coords = ctx.coords.coords(tv, tile.shape, v)
        out += _edge_split(
            view, coords, _contiguous_dim(ctx, view), width, op.choices.get("tail", False),
            op.choices.get("dim"),
            lambda index, pred, v=v: GlobalStore(view.arg.name, index, reg(array, v), width,
                                                 all_of([pred, owner])),
            lambda e, index, pred, v=v: GlobalStore(view.arg.name, index, reg(array, v + e), 1,
                                                    all_of([pred, owner])))
    return out


def _global_to_shared(ctx: LoweringContext, op: Copy) -> list:
    view, tile = op.src, op.dst
    tv = op.choices["tv"]
    width = min(op.choices["vector"], op.choices["dst_shared"].vector)
    buffer = ctx.buffer_of(tile.alloc)
    owner = replica_predicate(tv)
    out = []
    staged = fill = None
    if op.choices["instr"] != "cp.async":
        staged = ctx.temp_regs(f"stage_{tile.alloc.name}", tile.dtype, tv[1].size)
    elif not _is_plain_zero(op.fill):
        fill = ctx.temp_regs(f"fill_{tile.alloc.name}", tile.dtype, width)
    for v in _vector_starts(tv, width, skip_repeats=True):
        coords = ctx.coords.coords(tv, tile.shape, v)
        index, pred = global_address(view, coords, _contiguous_dim(ctx, view))
        offset = shared_offset(tile, coords)
        if staged is None:
            # A replica thread must not issue at all: a cp.async with a false predicate
            # still writes (zeros) and would race with the owner's copy.
            cp = CpAsync(buffer.name, offset, view.arg.name, index, width, pred)
            out += _only_if(owner, _with_fill(cp, fill, op.fill))
        else:
            out.append(GlobalLoad(reg(staged, v), view.arg.name, index, width, pred, op.fill))
            out.append(SharedStore(buffer.name, offset, reg(staged, v), width, owner))
    if staged is None:
        out.append(CpAsyncCommit())
    return out


def _only_if(cond, stmts: list) -> list:
    return stmts if cond is None else [If(cond, stmts)]


def _with_fill(cp: CpAsync, fill_regs, fill: float) -> list:
    """`cp`, where out-of-bounds vectors get the copy's fill. cp.async can only zero-fill
    (src-size 0), so for any other fill (-0.0 and NaN included) an out-of-bounds vector
    is an ordinary shared store of the fill value instead (`fill_regs` holds it)."""
    if fill_regs is None or cp.pred is None:
        return [cp]
    set_fill = [Assign(reg(fill_regs, e), Literal(fill, fill_regs.dtype))
                for e in range(cp.count)]
    return [If(cp.pred, [dataclasses.replace(cp, pred=None)],
               set_fill + [SharedStore(cp.buffer, cp.offset, reg(fill_regs, 0), cp.count)])]


def _is_plain_zero(value: float) -> bool:
    """True for +0 (the bits cp.async's zero-fill writes), false for -0.0 and NaN."""
    return value == 0 and math.copysign(1.0, value) > 0


def _registers_to_shared(ctx: LoweringContext, op: Copy) -> list:
    tile, dst = op.src, op.dst
    tv = tile.layout
    width = op.choices["dst_shared"].vector
    array = ctx.regs_of(tile)
    buffer = ctx.buffer_of(dst.alloc)
    owner = replica_predicate(tv)
    out = []
    for v in _vector_starts(tv, width, skip_repeats=True):
        coords = ctx.coords.coords(tv, tile.shape, v)
        out.append(SharedStore(buffer.name, shared_offset(dst, coords), reg(array, v), width, owner))
    return out


def _shared_to_global(ctx: LoweringContext, op: Copy) -> list:
    tile, view = op.src, op.dst
    tv = op.choices["tv"]
    width = min(op.choices["vector"], op.choices["src_shared"].vector)
    buffer = ctx.buffer_of(tile.alloc)
    staged = ctx.temp_regs(f"stage_{tile.alloc.name}", tile.dtype, tv[1].size)
    owner = replica_predicate(tv)
    out = []
    for v in _vector_starts(tv, width, skip_repeats=True):
        coords = ctx.coords.coords(tv, tile.shape, v)
        index, pred = global_address(view, coords, _contiguous_dim(ctx, view))
        out.append(SharedLoad(reg(staged, v), buffer.name, shared_offset(tile, coords), width))
        out.append(GlobalStore(view.arg.name, index, reg(staged, v), width,
                               all_of([pred, owner])))
    return out


def _shared_to_shared(ctx: LoweringContext, op: Copy) -> list:
    """Through registers, in the partition synthesis chose; replicas do not store."""
    src, dst = op.src, op.dst
    tv = op.choices["tv"]
    width = min(op.choices["vector"], op.choices["src_shared"].vector,
                op.choices["dst_shared"].vector)
    staged = ctx.temp_regs(f"stage_{dst.alloc.name}", src.dtype, tv[1].size)
    src_buffer, dst_buffer = ctx.buffer_of(src.alloc), ctx.buffer_of(dst.alloc)
    owner = replica_predicate(tv)
    out = []
    for v in _vector_starts(tv, width, skip_repeats=True):
        coords = ctx.coords.coords(tv, src.shape, v)
        out.append(SharedLoad(reg(staged, v), src_buffer.name, shared_offset(src, coords), width))
        out.append(SharedStore(dst_buffer.name, shared_offset(dst, coords), reg(staged, v),
                               width, owner))
    return out


def load_shared_to_registers(ctx: LoweringContext, tile: SharedTile, tv, array, plan,
                             values: list[int] | None = None) -> list:
    """Load the registers `values` (default all) of a register layout `tv` from a shared
    tile, with the planned instruction (ldmatrix groups or vector loads)."""
    buffer = ctx.buffer_of(tile.alloc)
    wanted = range(tv[1].size) if values is None else values
    out = []
    if plan.instr == "ldmatrix":
        group = plan.vector
        for g in sorted({v // group for v in wanted}):
            offset = shared_offset(tile, _ldmatrix_row_coords(ctx, tv, tile.shape, g * group, plan))
            out.append(LdMatrix(reg(array, g * group), plan.ldmatrix_num, plan.trans,
                                buffer.name, offset))
        return out
    width = plan.vector
    for v in sorted({v - v % width for v in wanted}):
        coords = ctx.coords.coords(tv, tile.shape, v)
        out.append(SharedLoad(reg(array, v), buffer.name, shared_offset(tile, coords), width))
    return out


def _ldmatrix_row_coords(ctx: LoweringContext, tv, shape: tuple, first_value: int, plan) -> list:
    """Tile coordinate of the first element of the row this lane addresses for one
    ldmatrix: lane 8j + r gives row r of matrix j, whose first element is held (after the
    load) by the lane and register the entry's TV layout names (`MatrixInstr.row_holder`,
    evaluated on this thread's lane)."""
    instr = ldmatrix(plan.ldmatrix_num, plan.trans)
    holder_lane, holder_value = instr.row_holder(TID % 32)
    thread = (TID // 32) * 32 + holder_lane
    return ctx.coords.coords(tv, shape, holder_value + first_value, thread=thread)


def copy_registers(ctx: LoweringContext, src: RegisterTile, dst: RegisterTile) -> list:
    """dst = src register by register (layouts agree: synthesis checked or converted)."""
    dst_table = tv_table(dst.layout)
    sources = match_values(src.layout, dst_table)
    if sources is None:
        raise SynthesisError(f"internal: {describe(src)} and {describe(dst)} disagree in layout")
    src_regs, dst_regs = ctx.regs_of(src), ctx.regs_of(dst)
    return [Assign(reg(dst_regs, v), RegRead(reg(src_regs, int(s))))
            for v, s in enumerate(sources)]

