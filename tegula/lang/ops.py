"""Tile ops of the language: making tiles, copies, gemm, reductions, layout conversion.

Each function checks its operands at trace time (scopes, ranks, shapes, element types) and
records one tile IR op, so mistakes surface as a TraceError at the user's line rather than
as a synthesis or compile failure later. Element-wise arithmetic lives in `elementwise`.
"""
from __future__ import annotations

import numbers
from typing import Any

from tegula.arch.catalogue import mma_accumulators
from tegula.arch.memory import RED_ADD
from tegula.dtypes import DType, bool_, i32
from tegula.ir.ops import AtomicAdd, Copy, Fill, Gemm, Rearrange, Reduce
from tegula.ir.scalar import BlockIndex
from tegula.ir.values import (GlobalTile, RegisterTile, SharedAlloc, Tile, describe,
                              is_static_shape)
from tegula.lang.elementwise import _number, register_operand, require_written
from tegula.lang.tensors import (RegisterValue, SharedBuffer, as_tile, new_register_tile,
                                 same_shape, static_shape)
from tegula.lang.trace import current, fail, user_location

REDUCE_KINDS = ("sum", "max", "min", "argmax", "argmin")


def _dtype(dtype: Any, op: str) -> DType:
    if not isinstance(dtype, DType):
        raise fail(op, f"the element type must be a tegula dtype such as tg.f16, got {dtype!r}")
    return dtype


def _operand(x: Any, op: str, what: str) -> Tile:
    """The tile behind `x`; a multi-stage shared buffer must be indexed by stage first."""
    if isinstance(x, SharedBuffer) and x.alloc.stages != 1:
        raise fail(op, f"{what} %{x.alloc.name} is a shared buffer with {x.alloc.stages} "
                       f"stages; pick one stage with buf[k]")
    return as_tile(x, op, what)


# -- grid -----------------------------------------------------------------------------------
def block_id(axis: int) -> BlockIndex:
    """This block's index along grid axis 0, 1 or 2."""
    ctx = current("tg.block_id")
    if axis not in (0, 1, 2) or isinstance(axis, bool):
        raise fail("tg.block_id", f"the grid axis must be 0, 1 or 2, got {axis!r}")
    # One object per axis, so tools comparing scalars by identity see the same block index.
    return ctx.block_indices.setdefault(axis, BlockIndex(axis))


# -- making tiles ---------------------------------------------------------------------------
def shared(shape: Any, dtype: DType, stages: int = 1, layout: Any = None) -> SharedBuffer:
    """A shared-memory buffer of `stages` copies of a `shape` tile; `layout` pins its
    (offset ← coordinate) layout, otherwise synthesis chooses layout and swizzle."""
    op = "tg.shared"
    ctx = current(op)
    shape = static_shape(shape, op)
    dtype = _dtype(dtype, op)
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise fail(op, f"stages must be a positive integer, got {stages!r}")
    alloc = SharedAlloc(dtype=dtype, shape=shape, stages=stages, name=ctx.fresh_name("s"),
                        loc=user_location(), layout=layout, pinned=layout is not None)
    return SharedBuffer(ctx.add_shared_alloc(alloc))


def register(shape: Any, dtype: DType, layout: Any = None) -> RegisterValue:
    """An uninitialized register tile; `layout` pins its thread-value layout."""
    op = "tg.register"
    current(op)
    return RegisterValue(new_register_tile(static_shape(shape, op), _dtype(dtype, op), layout))


def full(shape: Any, value: float, dtype: DType, layout: Any = None) -> RegisterValue:
    """A register tile with every element `value`."""
    tile = register(shape, dtype, layout)
    fill(tile, value)
    return tile


def zeros(shape: Any, dtype: DType, layout: Any = None) -> RegisterValue:
    """A register tile of zeros (the usual accumulator)."""
    return full(shape, 0, dtype, layout)


def fill(tile: Any, value: float) -> None:
    """Set every element of register tile `tile` to `value`."""
    op = "tg.fill"
    ctx = current(op)
    dst = register_operand(tile, op, "target")
    if not isinstance(value, numbers.Real):
        raise fail(op, f"the fill value must be a Python number, got {value!r}")
    ctx.emit(Fill(dst=dst, value=_number(value, dst.dtype, op)))
    ctx.mark_written(dst)


# -- data movement --------------------------------------------------------------------------
def copy(src: Any, dst: Any, fill: float = 0.0) -> None:
    """`dst[i] = src[i]` for every in-bounds i; out-of-bounds source elements read as
    `fill`, out-of-bounds destination elements are skipped. Any pair of scopes except
    global to global; shapes and element types must match (convert with .to first)."""
    op = "tg.copy"
    ctx = current(op)
    s, d = _operand(src, op, "source"), _operand(dst, op, "destination")
    if isinstance(s, GlobalTile) and isinstance(d, GlobalTile):
        raise fail(op, f"cannot copy global {describe(s)} to global {describe(d)} directly; "
                       f"stage it through registers or shared memory")
    if not same_shape(s.shape, d.shape):
        raise fail(op, f"shapes differ: source {describe(s)} vs destination {describe(d)}")
    if s.dtype != d.dtype:
        raise fail(op, f"element types differ: source {describe(s)} vs destination "
                       f"{describe(d)}; convert the source with .to({d.dtype}) first")
    if not isinstance(fill, numbers.Real):
        raise fail(op, f"fill must be a Python number, got {fill!r}")
    fill = _number(fill, d.dtype, op)  # an integer tile needs an integral fill in range
    require_written(s, op)
    ctx.emit(Copy(src=s, dst=d, fill=float(fill)))
    if isinstance(d, RegisterTile):
        ctx.mark_written(d)


def load(src: Any, fill: float = 0.0, layout: Any = None) -> RegisterValue:
    """A new register tile holding `src` (a global view or shared tile of static shape)."""
    op = "tg.load"
    current(op)
    s = _operand(src, op, "source")
    if not is_static_shape(s.shape):
        raise fail(op, f"{describe(s)} has a run-time extent; slice it to a static tile "
                       f"shape before loading")
    out = RegisterValue(new_register_tile(s.shape, s.dtype, layout))
    copy(src, out, fill)
    return out


def atomic_add(src: Any, dst: Any) -> None:
    """`dst[i] += src[i]` atomically, for a register `src` and a global `dst` (`red.global`
    per element; on sm_90 an f32 2-D tile is staged in shared memory and added by TMA
    reduce-adds where `synth/copies.py: plan_bulk_adds` allows; `atomic_path="red"`
    keeps `red`). A shared `dst` is refused: within a block, sum in registers (`tg.sum`,
    `+=`) and copy the result, or add into a global tensor."""
    op = "tg.atomic_add"
    ctx = current(op)
    s = register_operand(src, op, "source")
    d = _operand(dst, op, "destination")
    if isinstance(d, RegisterTile):
        raise fail(op, f"the destination {describe(d)} is a register tile; use += instead")
    if not isinstance(d, GlobalTile):
        raise fail(op, f"the destination {describe(d)} is in shared memory; tg.atomic_add "
                       f"adds into global memory only (sum within the block in registers "
                       f"with tg.sum or +=, then copy, or atomic_add into a global tensor)")
    if not same_shape(s.shape, d.shape) or s.dtype != d.dtype:
        raise fail(op, f"source {describe(s)} and destination {describe(d)} must have the "
                       f"same shape and element type")
    if d.dtype.name not in RED_ADD:  # what the hardware adds atomically (arch/memory.py)
        raise fail(op, f"no atomic add for {d.dtype} (destination {describe(d)}); "
                       f"red.global.add takes {', '.join(RED_ADD)}: convert with .to() and "
                       f"add into a tensor of one of those types")
    require_written(s, op)
    ctx.emit(AtomicAdd(src=s, dst=d))


# -- gemm -----------------------------------------------------------------------------------
def gemm(c: Any, a: Any, b: Any) -> None:
    """`c += a @ b.T`: c (M, N) register accumulator, a (M, K) and b (N, K) in shared
    memory or registers (use `.T` on a shared tile for the other major order)."""
    op = "tg.gemm"
    ctx = current(op)
    acc = register_operand(c, op, "accumulator c")
    ta, tb = _operand(a, op, "operand a"), _operand(b, op, "operand b")
    for name, t in (("a", ta), ("b", tb)):
        if isinstance(t, GlobalTile):
            raise fail(op, f"operand {name} {describe(t)} is in global memory; copy it into "
                           f"shared memory (tg.shared + tg.copy) or registers (tg.load) first")
    for name, t in (("c", acc), ("a", ta), ("b", tb)):
        if t.rank != 2:
            raise fail(op, f"operand {name} {describe(t)} must have rank 2")
    (m, k), (n, k2), (cm, cn) = ta.shape, tb.shape, acc.shape
    if k != k2 or (cm, cn) != (m, n):
        raise fail(op, f"shapes do not fit c[M, N] += a[M, K] @ b[N, K].T: c {describe(acc)}, "
                       f"a {describe(ta)}, b {describe(tb)}")
    # The catalogue's MMA entries (any target) say which types multiply; whether the
    # kernel's target has one is synthesis's check, which names the target.
    allowed = mma_accumulators(ta.dtype, tb.dtype)
    if not allowed:
        raise fail(op, f"no matrix instruction multiplies {ta.dtype} by {tb.dtype} "
                       f"(a {describe(ta)}, b {describe(tb)}); convert with .to() first")
    if acc.dtype not in allowed:
        names = " or ".join(str(t) for t in allowed)
        raise fail(op, f"a {ta.dtype} x {tb.dtype} gemm accumulates in {names}, but c is "
                       f"{describe(acc)}")
    for t in (acc, ta, tb):
        require_written(t, op)
    ctx.emit(Gemm(c=acc, a=ta, b=tb))
    ctx.mark_written(acc)


# -- reductions and layout conversion -------------------------------------------------------
def reduce(x: Any, axis: int, kind: str) -> RegisterValue:
    """Reduce register tile `x` along `axis` with `kind` (sum, max, min, argmax, argmin);
    the result keeps the axis with extent 1 so it broadcasts back against `x`. argmax and
    argmin give i32 positions along the axis within the tile (see `argmax`)."""
    op = f"tg.{kind}" if kind in REDUCE_KINDS else "tg.reduce"
    ctx = current(op)
    if kind not in REDUCE_KINDS:
        raise fail(op, f"kind must be one of {', '.join(REDUCE_KINDS)}, got {kind!r}")
    if isinstance(axis, RegisterValue) or not isinstance(axis, int) or isinstance(axis, bool):
        hint = " (for the element-wise maximum of two tiles use tg.maximum)" \
            if kind in ("max", "min", "argmax", "argmin") else ""
        raise fail(op, f"axis must be an integer, got {axis!r}{hint}")
    tile = register_operand(x, op)
    if not -tile.rank <= axis < tile.rank:
        raise fail(op, f"axis {axis} is out of range for {describe(tile)}")
    if tile.dtype == bool_ or tile.dtype.is_packed:
        raise fail(op, f"cannot reduce {describe(tile)}; convert it with .to() first")
    require_written(tile, op)
    axis %= tile.rank
    shape = tuple(1 if d == axis else e for d, e in enumerate(tile.shape))
    out = new_register_tile(shape, i32 if kind.startswith("arg") else tile.dtype)
    ctx.emit(Reduce(x=tile, axis=axis, kind=kind, out=out))
    ctx.mark_written(out)
    return RegisterValue(out)


def reduce_sum(x: Any, axis: int) -> RegisterValue:
    """Sum of `x` along `axis` (kept with extent 1). Exported as `tg.sum`."""
    return reduce(x, axis, "sum")


def reduce_max(x: Any, axis: int) -> RegisterValue:
    """Maximum of `x` along `axis` (kept with extent 1). Exported as `tg.max`."""
    return reduce(x, axis, "max")


def reduce_min(x: Any, axis: int) -> RegisterValue:
    """Minimum of `x` along `axis` (kept with extent 1). Exported as `tg.min`."""
    return reduce(x, axis, "min")


def argmax(x: Any, axis: int) -> RegisterValue:
    """i32 position along `axis` (0 … extent-1, within the tile; kept with extent 1) of the
    largest element: the first one on ties, the first NaN if there is one (as torch and
    numpy). Out-of-bounds elements of a loaded tile hold its `fill`: load with
    `fill=-float("inf")` so that they never win."""
    return reduce(x, axis, "argmax")


def argmin(x: Any, axis: int) -> RegisterValue:
    """i32 position along `axis` of the smallest element: the first one on ties, the first
    NaN if there is one (as torch and numpy). Load with `fill=float("inf")`."""
    return reduce(x, axis, "argmin")


def rearrange(x: Any, layout: Any = None) -> RegisterValue:
    """`x` redistributed over the threads (an explicit layout conversion); `layout` pins
    the new tile's layout, otherwise synthesis picks the one its users want."""
    op = "tg.rearrange"
    ctx = current(op)
    tile = register_operand(x, op)
    require_written(tile, op)
    out = new_register_tile(tile.shape, tile.dtype, layout)
    ctx.emit(Rearrange(x=tile, out=out))
    ctx.mark_written(out)
    return RegisterValue(out)


__all__ = ["block_id", "shared", "register", "full", "zeros", "fill", "copy", "load",
           "atomic_add", "gemm", "reduce", "reduce_sum", "reduce_max", "reduce_min",
           "argmax", "argmin", "rearrange"]
