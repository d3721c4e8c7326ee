"""Tile coordinates and size-1 dims: `tg.arange`, `tg.indices`, `t[None, :]`, `t[:, 0]`.

Masks and positions are written the way Triton and numpy users write them:

    cols = tg.arange(BN, offset=n * BN)        # i32 (BN,): n*BN, n*BN+1, …
    x = tg.where(cols[None, :] < N, x, 0.0)    # (1, BN) broadcast against (BM, BN)
    causal = tg.indices((BM, BN), 0) >= tg.indices((BM, BN), 1)

Coordinates are i32 register tiles computed from each thread's own position (no memory
traffic); `offset` is a Python int or a block-uniform kernel scalar (`tg.block_id(0) * BM`,
a loop index, an extent), and kernel scalars also combine with tiles through operators
(`m * BM + tg.arange(BM)`, `cols < N`).

Indexing a register tile only inserts size-1 dims (`None`) or removes them (an integer 0
on a size-1 dim, e.g. `tg.max(t, 1)[:, 0]`); the elements keep their order, so the new
tile shares its layout with the old one (a `Reshape` op: register copies the CUDA compiler
removes). Element-wise ops promote lower-rank operands the numpy way, prepending size-1
dims: a (BN,) tile combines with a (BM, BN) tile as (1, BN).
"""
from __future__ import annotations

import math
from typing import Any

from tegula.dtypes import DType, i32
from tegula.ir.ops import Bitcast, Indices, Reshape
from tegula.ir.scalar import Scalar
from tegula.ir.values import RegisterTile, describe
from tegula.layout.reshape import has_renaming
from tegula.lang.tensors import (RegisterValue, index_value, new_register_tile, shape_text,
                                 static_shape)
from tegula.lang.trace import current, fail


def indices(shape: Any, axis: int, offset: Any = 0) -> RegisterValue:
    """An i32 register tile of `shape` whose every element holds its own coordinate along
    `axis`, plus `offset` (an int or a kernel scalar such as `tg.block_id(1) * BN`)."""
    op = "tg.indices"
    ctx = current(op)
    shape = static_shape(shape, op)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
        raise fail(op, f"axis must be an integer naming a dim of the shape "
                       f"{shape_text(shape)}, got {axis!r}")
    offset = index_value(offset, op, "the offset")
    out = new_register_tile(shape, i32)
    ctx.emit(Indices(out=out, axis=axis % len(shape), offset=offset))
    ctx.mark_written(out)
    return RegisterValue(out)


def arange(n: Any, offset: Any = 0) -> RegisterValue:
    """The 1-D i32 register tile `offset, offset+1, …, offset+n-1` (`n` known at trace
    time, e.g. a constexpr tile size; `offset` an int or a kernel scalar)."""
    current("tg.arange")
    shape = static_shape(n, "tg.arange")
    if len(shape) != 1:
        raise fail("tg.arange", f"takes one extent, got {shape_text(shape)}; for a 2-D tile "
                                f"of coordinates use tg.indices(shape, axis)")
    return indices(shape, 0, offset)


def reshaped(tile: RegisterTile, shape: tuple, op: str) -> RegisterTile:
    """`tile` with size-1 dims inserted or removed to give `shape` (a new tile holding a
    copy, so later in-place updates of either leave the other alone)."""
    if tuple(shape) == tuple(tile.shape):
        return tile
    if [e for e in shape if e != 1] != [e for e in tile.shape if e != 1]:
        raise fail(op, f"cannot reshape {describe(tile)} to {shape_text(shape)}: only dims of "
                       f"extent 1 can be inserted or removed")
    ctx = current(op)
    ctx.require_readable(tile, op)
    out = new_register_tile(tuple(shape), tile.dtype)
    ctx.emit(Reshape(x=tile, out=out))
    ctx.mark_written(out)
    return out


def reshape(x: Any, shape: Any) -> RegisterValue:
    """`x` (a register tile) with the elements in the same (row-major, numpy) order in a
    new `shape` of the same size: `tg.reshape(q, (64, 2, 32))`. No data moves: each
    thread keeps its registers and synthesis renames which element each one is, so a
    tile loaded in one shape (e.g. 16-byte vectors of a pre-packed weight layout) can be
    used in another (the MMA operand's)."""
    return _relabelled(x, shape, None, "tg.reshape")


def permute(x: Any, dims: Any) -> RegisterValue:
    """`x` (a register tile) with its dims reordered: dim i of the result is dim
    `dims[i]` of x (numpy's `transpose(dims)`). No data moves, as in `tg.reshape`."""
    op = "tg.permute"
    current(op)
    tile = as_register(x, op)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if sorted(d for d in dims if isinstance(d, int) and not isinstance(d, bool)) != \
            list(range(tile.rank)) or len(dims) != tile.rank:
        raise fail(op, f"dims must order all {tile.rank} dims of {describe(tile)} "
                       f"(a permutation of 0..{tile.rank - 1}), got {dims!r}")
    return _relabelled(x, tuple(tile.shape[d] for d in dims), dims, op)


def bitcast(x: Any, dtype: Any) -> RegisterValue:
    """The bits of register tile `x` read as `dtype`: the same shape where the widths
    match (i32 <-> f32); from 32-bit to 16-bit elements (i32 -> f16/bf16) a new last dim
    of 2, index 0 the low half (`tg.bitcast(words, f16)[..., 0]` is the low f16 of each
    word). No data moves: each thread reads its own registers' bits — e.g. f16 pairs
    built with integer masks (the magic-number dequantization of 4-bit weights)."""
    op = "tg.bitcast"
    ctx = current(op)
    tile = as_register(x, op)
    if not isinstance(dtype, DType) or dtype.is_packed or dtype.name == "bool" or \
            tile.dtype.is_packed or tile.dtype.name == "bool" or \
            tile.dtype.bits not in (dtype.bits, 2 * dtype.bits) or \
            (tile.dtype.bits != dtype.bits and tile.dtype.bits != 32):
        raise fail(op, f"{describe(tile)} cannot be read as {dtype!r}: tg.bitcast keeps "
                       f"the width (e.g. i32 <-> f32) or splits 32-bit elements into two "
                       f"16-bit ones (i32 -> f16/bf16)")
    shape = tuple(tile.shape) + ((2,) if tile.dtype.bits != dtype.bits else ())
    ctx.require_readable(tile, op)
    out = new_register_tile(shape, dtype)
    ctx.emit(Bitcast(x=tile, out=out))
    ctx.mark_written(out)
    return RegisterValue(out)


def _relabelled(x: Any, shape: Any, perm: tuple | None, op: str) -> RegisterValue:
    ctx = current(op)
    tile = as_register(x, op)
    shape = static_shape(shape, op)
    if math.prod(shape) != math.prod(tile.shape):
        raise fail(op, f"cannot reshape {describe(tile)} ({math.prod(tile.shape)} elements) "
                       f"to {shape_text(shape)} ({math.prod(shape)} elements)")
    if perm in (None, tuple(range(tile.rank))) and tuple(shape) == tuple(tile.shape):
        return RegisterValue(tile)
    ctx.require_readable(tile, op)
    perm = tuple(perm) if perm else ()
    if not has_renaming(tuple(tile.shape), perm or tuple(range(tile.rank)), tuple(shape)):
        # e.g. (2, 3) -> (3, 2): no layout renames one into the other, but both reshape
        # to and from the flat tile
        tile = _reshape_op(ctx, tile, (math.prod(shape),), perm)
        perm = ()
    return RegisterValue(_reshape_op(ctx, tile, tuple(shape), perm))


def _reshape_op(ctx: Any, tile: RegisterTile, shape: tuple, perm: tuple) -> RegisterTile:
    out = new_register_tile(shape, tile.dtype)
    ctx.emit(Reshape(x=tile, out=out, perm=perm))
    ctx.mark_written(out)
    return out


def as_register(x: Any, op: str) -> RegisterTile:
    if not isinstance(x, RegisterValue):
        raise fail(op, f"takes a register tile (a tg.load, tg.zeros or computed tile), got "
                       f"{x!r}; a global or shared view is reshaped by tiling it "
                       f"(.tile, .T, slices)")
    return x.ir


def promote_ranks(tiles: list[RegisterTile], rank: int, op: str) -> list[RegisterTile]:
    """numpy's rank promotion: every tile of lower rank than `rank` gets size-1 dims
    prepended (`(BN,)` against `(BM, BN)` acts as `(1, BN)`)."""
    return [t if t.rank == rank else reshaped(t, (1,) * (rank - t.rank) + tuple(t.shape), op)
            for t in tiles]


def index_register(value: RegisterValue, index: Any) -> RegisterValue:
    """`t[None, :]`, `t[:, None]`, `t[..., None]`, `t[:, 0]` (extent-1 dim) of a register
    tile: new size-1 dims where the index has None, dims dropped where it has 0."""
    op = "register[...]"
    current(op)
    tile = value.ir
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise fail(op, "at most one ... in an index")
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    if consumed > tile.rank:
        raise fail(op, f"{consumed} indices for {describe(tile)} of rank {tile.rank}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (tile.rank - consumed)
    items += [slice(None)] * (tile.rank - sum(1 for i in items if i is not None))
    shape, dim = [], 0
    for item in items:
        if item is None:
            shape.append(1)
            continue
        extent = tile.shape[dim]
        if isinstance(item, slice):
            if (item.start, item.stop, item.step) != (None, None, None):
                raise fail(op, f"{describe(tile)} is a register tile and cannot be sliced "
                               f"({_slice_text(item)}): only ':' and None (a new size-1 dim) "
                               f"apply; slice the global view before loading")
            shape.append(extent)
        else:
            _check_dropped_dim(tile, item, dim, op)
        dim += 1
    return RegisterValue(reshaped(tile, tuple(shape), op))


def _check_dropped_dim(tile: RegisterTile, item: Any, dim: int, op: str) -> None:
    """An integer index may only drop a dim of extent 1 (its one element, 0 or -1)."""
    if isinstance(item, (Scalar, RegisterValue)) or isinstance(item, bool) \
            or not isinstance(item, int):
        raise fail(op, f"{describe(tile)} is a register tile: its elements live in different "
                       f"threads, so it cannot be indexed by {item!r}; index dims are ':', "
                       f"None (a new size-1 dim) or 0 on a size-1 dim (use tg.where with "
                       f"tg.indices to pick elements)")
    if tile.shape[dim] != 1 or item not in (0, -1):
        raise fail(op, f"{describe(tile)} is a register tile: an integer index can only drop "
                       f"a dim of extent 1, but dim {dim} has extent {tile.shape[dim]}; "
                       f"reduce it (tg.sum/tg.max/…) or use tg.where with tg.indices to pick "
                       f"elements")


def _slice_text(s: slice) -> str:
    parts = ["" if p is None else str(p) for p in (s.start, s.stop)]
    return ":".join(parts) + (f":{s.step}" if s.step is not None else "")


__all__ = ["arange", "indices", "reshape", "permute", "bitcast", "reshaped", "promote_ranks", "index_register"]
