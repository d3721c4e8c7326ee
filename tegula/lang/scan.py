"""Scans: `tg.cumsum` and the associative `tg.scan(x, axis, combine)`.

`combine` is a Python function of two operands (earlier, later) that the tracer calls once,
on placeholder tiles, recording the element-wise ops it makes into a `ScanCombine`; the
`Scan` op then stands for the whole inclusive scan, and lowering applies the recorded ops
to registers (in-thread, then across lanes with shuffles, then across warps through
shared memory; see `tegula.lower.scan`). A tuple of tiles scans as one value: `combine`
takes and returns tuples (the linear recurrence h = a·h + b scans (a, b) pairs with
`lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1])`).

Associativity cannot be checked (the scan's grouping differs from a left fold, as every
parallel scan's does); what can be checked is checked here, at the user's line: `combine`
uses element-wise ops only, on its operands, numbers and kernel scalars, and returns as
many tiles as were scanned, each of the scanned tile's shape and type.
"""
from __future__ import annotations

from typing import Any, Callable

from tegula.dtypes import bool_, f32
from tegula.errors import TraceError
from tegula.ir.ops import Elementwise, Scan, ScanCombine
from tegula.ir.values import RegisterTile, describe
from tegula.lang.elementwise import register_operand, require_written
from tegula.lang.tensors import RegisterValue, new_register_tile
from tegula.lang.trace import current, fail, user_location


def scan(x: Any, axis: int, combine: Callable, reverse: bool = False,
         initial: Any = None) -> Any:
    """Inclusive scan of register tile `x` (or a tuple of same-shape tiles) along `axis`:
    out[.., i, ..] = combine(… combine(x[.., 0, ..], x[.., 1, ..]) …, x[.., i, ..]).
    `combine(a, b)` must be associative (`a` the earlier operand); it is traced once and may
    use element-wise ops (operators, `tg.maximum`, `tg.where`, `tg.exp`, …) on `a`, `b`,
    numbers and kernel scalars. `reverse=True` scans from the end: out[i] =
    combine(… combine(x[n-1], x[n-2]) …, x[i]). The result has `x`'s shape and type (a
    tuple for a tuple). Elements of a loaded tile past the tensor's edge hold the load's
    `fill` and take part like any other: pick a fill that cannot change the elements
    in bounds (0 for a sum scanned forward, the identity of `combine` when reversed).

    `initial` continues a scan that came before (a sequence scanned in chunks, the state
    carried from one to the next): a tile (a tuple for a tuple) of `x`'s shape with the
    axis of extent 1, combined in front of the first element (the last when reversed):
    out[i] = combine(… combine(initial, x[0]) …, x[i]). Then the result is `(out, carry)`,
    `carry` the last element along the axis in scan order (`initial`'s shape): the next
    chunk's `initial`. Both cost a few instructions per thread, not per element."""
    op = "tg.scan"
    ctx = current(op)
    tiles, is_tuple = _scanned_tiles(x, op)
    axis = _axis(axis, tiles[0], op)
    if not isinstance(reverse, bool):
        raise fail(op, f"reverse must be True or False, got {reverse!r}")
    if not callable(combine):
        raise fail(op, f"combine must be a function of two operands (e.g. lambda a, b: a + b), "
                       f"got {combine!r}")
    initials = [] if initial is None else _initial_tiles(initial, tiles, is_tuple, axis, op)
    traced = _trace_combine(ctx, op, tiles, combine, is_tuple)
    outs = [new_register_tile(t.shape, t.dtype) for t in tiles]
    carries = [new_register_tile(t.shape, t.dtype) for t in initials]
    ctx.emit(Scan(xs=tiles, axis=axis, combine=traced, outs=outs, reverse=reverse,
                  initials=initials, carries=carries))
    for out in outs + carries:
        ctx.mark_written(out)
    values = [RegisterValue(out) for out in outs]
    result = tuple(values) if is_tuple else values[0]
    if initial is None:
        return result
    carried = [RegisterValue(c) for c in carries]
    return result, (tuple(carried) if is_tuple else carried[0])


def cumsum(x: Any, axis: int, reverse: bool = False) -> RegisterValue:
    """Inclusive cumulative sum of `x` along `axis` (`reverse=True`: sums from the end).
    16- and 8-bit floats accumulate in f32 and each result is rounded once to `x`'s type
    (as torch's cumsum on half and bfloat16 tensors); integers add in their own type and
    wrap on overflow (torch's cumsum would widen to int64)."""
    op = "tg.cumsum"
    current(op)
    tile = register_operand(x, op)
    if tile.dtype == bool_ or tile.dtype.is_packed:
        raise fail(op, f"cannot sum {describe(tile)}; convert it with .to() first")
    value = x if isinstance(x, RegisterValue) else RegisterValue(tile)
    widen = tile.dtype.is_float and tile.dtype.bits < 32
    if widen:
        value = value.to(f32)
    summed = scan(value, axis, _add, reverse=reverse)
    return summed.to(tile.dtype) if widen else summed


def _add(a: RegisterValue, b: RegisterValue) -> RegisterValue:
    return a + b


def _scanned_tiles(x: Any, op: str) -> tuple[list[RegisterTile], bool]:
    is_tuple = isinstance(x, (tuple, list))
    items = list(x) if is_tuple else [x]
    if not items:
        raise fail(op, "needs at least one tile to scan, got an empty tuple")
    tiles = [register_operand(t, op, f"scanned tile {i}" if is_tuple else "x")
             for i, t in enumerate(items)]
    for i, tile in enumerate(tiles):
        if tile.dtype == bool_ or tile.dtype.is_packed or tile.dtype.bits > 32:
            raise fail(op, f"cannot scan {describe(tile)}: scans move 8- to 32-bit values "
                           f"between threads; convert it with .to() first")
        if tuple(tile.shape) != tuple(tiles[0].shape):
            raise fail(op, f"the scanned tiles must have one shape, but tile {i} is "
                           f"{describe(tile)} and tile 0 is {describe(tiles[0])}")
        require_written(tile, op)
    return tiles, is_tuple


def _initial_tiles(initial: Any, tiles: list[RegisterTile], is_tuple: bool, axis: int,
                   op: str) -> list[RegisterTile]:
    """`initial`'s tiles, one per scanned tile, each its shape with the axis of extent 1
    and its type."""
    if is_tuple != isinstance(initial, (tuple, list)):
        want = f"a tuple of {len(tiles)} tiles" if is_tuple else "one tile"
        raise fail(op, f"initial must be {want}, like the scanned x, got "
                       f"{type(initial).__name__}")
    items = list(initial) if is_tuple else [initial]
    if len(items) != len(tiles):
        raise fail(op, f"initial has {len(items)} tiles, but {len(tiles)} are scanned")
    found = []
    for i, (item, tile) in enumerate(zip(items, tiles)):
        label = f"initial tile {i}" if is_tuple else "initial"
        got = register_operand(item, op, label)
        want = tuple(1 if d == axis else e for d, e in enumerate(tile.shape))
        if tuple(got.shape) != want or got.dtype != tile.dtype:
            raise fail(op, f"{label} must be a {tile.dtype} tile of shape {want} (the scanned "
                           f"{describe(tile)} with axis {axis} of extent 1), got "
                           f"{describe(got)}")
        require_written(got, op)
        found.append(got)
    return found


def _axis(axis: Any, tile: RegisterTile, op: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise fail(op, f"axis must be an integer, got {axis!r}")
    if not -tile.rank <= axis < tile.rank:
        raise fail(op, f"axis {axis} is out of range for {describe(tile)}")
    return axis % tile.rank


def _trace_combine(ctx, op: str, tiles: list[RegisterTile], combine: Callable,
                   is_tuple: bool) -> ScanCombine:
    """Call `combine` once on placeholder tiles, recording its ops into a private list."""
    loc = user_location()

    def placeholders(side: str) -> list[RegisterTile]:
        made = [RegisterTile(dtype=t.dtype, shape=tuple(t.shape),
                             name=ctx.fresh_name(f"scan_{side}"), loc=loc) for t in tiles]
        for tile in made:
            ctx.mark_written(tile)   # readable inside combine; never registered as a tile
        return made

    lhs, rhs = placeholders("a"), placeholders("b")
    handles = [[RegisterValue(t) for t in side] for side in (lhs, rhs)]
    args = [tuple(h) if is_tuple else h[0] for h in handles]
    ops: list = []
    registered = len(ctx.register_tiles)
    ctx.open_block(ops, "tg.scan combine", loc)
    try:
        result = combine(*args)
    except TraceError as err:
        raise TraceError(f"{op}: in combine: {err.message}", err.loc or loc) from None
    finally:
        ctx.close_block(ops)
        made = ctx.register_tiles[registered:]
        del ctx.register_tiles[registered:]
    known = {t.id for t in lhs + rhs} | {t.id for t in made}
    for recorded in ops:
        _check_combine_op(recorded, known, op)
    results = _combine_results(result, tiles, is_tuple, known, op)
    return ScanCombine(lhs=lhs, rhs=rhs, ops=ops, results=results)


def _check_combine_op(recorded, known: set, op: str) -> None:
    where = f" (line {recorded.loc.lineno})" if recorded.loc else ""
    if not isinstance(recorded, Elementwise):
        raise fail(op, f"combine may only use element-wise operations on its operands, "
                       f"but it used a {type(recorded).__name__.lower()}{where}")
    for tile in list(recorded.inputs) + [recorded.out]:
        if tile.id not in known:
            raise fail(op, f"combine may only compute from its two operands, numbers and "
                           f"kernel scalars, but it uses {describe(tile)} from outside{where}")


def _combine_results(result: Any, tiles: list[RegisterTile], is_tuple: bool, known: set,
                     op: str) -> list[RegisterTile]:
    """The tiles `combine` returned, checked against the scanned tiles."""
    want = f"a tuple of {len(tiles)} tiles" if is_tuple else "one tile"
    if is_tuple:
        if not isinstance(result, (tuple, list)) or len(result) != len(tiles):
            got = f"{len(result)} values" if isinstance(result, (tuple, list)) \
                else type(result).__name__
            raise fail(op, f"combine must return {want} (as many as were scanned), got {got}")
        items = list(result)
    else:
        if isinstance(result, (tuple, list)):
            raise fail(op, f"combine must return {want}, got a tuple of {len(result)}; to "
                           f"scan several tiles together pass them as a tuple")
        items = [result]
    found = []
    for i, (item, tile) in enumerate(zip(items, tiles)):
        label = f"combine's result {i}" if is_tuple else "combine's result"
        if not isinstance(item, RegisterValue):
            raise fail(op, f"{label} must be a register tile computed from the operands, "
                           f"got {type(item).__name__} {item!r}")
        got = item.ir
        if got.id not in known:
            raise fail(op, f"{label} is {describe(got)}, which combine did not compute from "
                           f"its operands")
        if tuple(got.shape) != tuple(tile.shape):
            raise fail(op, f"{label} has shape {tuple(got.shape)}, but the scanned tile "
                           f"has shape {tuple(tile.shape)}")
        if got.dtype != tile.dtype:
            raise fail(op, f"{label} is {got.dtype}, but the scanned tile is {tile.dtype}; "
                           f"convert with .to({tile.dtype}) inside combine or scan a "
                           f"{got.dtype} tile")
        found.append(got)
    return found


__all__ = ["scan", "cumsum"]
