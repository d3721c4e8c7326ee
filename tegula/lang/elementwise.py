"""Element-by-element ops on register tiles: operators, math functions, `where`, casts.

Each call records one `Elementwise` op. Results are new register tiles unless an op writes
in place (`acc += x`). Operands are register tiles of one element type, or Python numbers
and block-uniform kernel scalars (`tg.block_id`, loop indices, extents, int parameters),
which take the tiles' type and go into the op's `scalars`, keyed by operand position.
Shapes broadcast as in numpy: a lower-rank tile gets size-1 dims prepended (a `Reshape`,
see `lang.indexing`), then size-1 dims broadcast against the other operands.
"""
from __future__ import annotations

import numbers
from typing import Any

from tegula.dtypes import DType, bool_
from tegula.ir.ops import Copy, Elementwise, Fill
from tegula.ir.scalar import Condition, Scalar
from tegula.lang.scalars import scalar_extremum
from tegula.ir.values import RegisterTile, Tile, describe
from tegula.lang.indexing import promote_ranks
from tegula.lang.tensors import (RegisterValue, TileHandle, new_register_tile, same_shape,
                                 shape_text)
from tegula.lang.trace import current, fail

FLOAT_UNARY = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
               "erf")
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
BITWISE = ("and", "or", "xor")
ARITHMETIC = ("add", "sub", "mul", "div", "max", "min", "pow", "floordiv", "mod")
#: Integer-only: floor semantics as torch.floor_divide / torch.remainder (and Python):
#: -7 // 2 == -4, -7 % 2 == 1, 7 % -2 == -1. A zero divisor in a tile gives x // 0 == -1
#: and x % 0 == x (torch raises on the CPU; C leaves it undefined); a number 0 is refused.
FLOOR_DIVISION = ("floordiv", "mod")

# How errors spell each op: the operator the user wrote, or the tg function.
_SPELLING = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "and": "&",
             "floordiv": "//", "mod": "%",
             "or": "|", "xor": "^", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==",
             "ne": "!=", "max": "tg.maximum", "min": "tg.minimum", "neg": "unary -",
             "abs": "abs", "not": "~"}


def spelling(op: str) -> str:
    return _SPELLING.get(op, f"tg.{op}")


# -- operands -------------------------------------------------------------------------------
def register_operand(x: Any, op: str, what: str = "operand") -> RegisterTile:
    """The register tile behind `x`, or a TraceError that says how to get one."""
    if isinstance(x, RegisterValue):
        return x.ir
    if isinstance(x, TileHandle):
        raise fail(op, f"{what} {describe(x.ir)} is in {x.ir.scope} memory; element-wise "
                       f"ops work on register tiles — load it first with tg.load(...)")
    if isinstance(x, (Scalar, Condition)):
        raise fail(op, f"{what} {x} is a block-uniform kernel scalar, not a register tile "
                       f"(kernel scalars combine with tiles through operators, e.g. "
                       f"cols < n or m * BM + tg.arange(BM))")
    raise fail(op, f"{what} must be a register tile, got {type(x).__name__} {x!r}")


def require_written(tile: Tile, op: str) -> None:
    """Reading a register tile nothing has written would read garbage registers; so would
    reading, after a loop or branch, a tile made only inside it (`require_readable`)."""
    current(op).require_readable(tile, op)


def _number(x: Any, dtype: DType, op: str):
    """A Python number operand converted for a tile of `dtype`."""
    if isinstance(x, Scalar):
        if dtype == bool_:
            raise fail(op, f"the kernel scalar {x} is an integer and cannot be combined with "
                           f"bool tiles")
        return x  # converted to the tiles' type when the kernel runs
    if isinstance(x, bool):
        if dtype != bool_:
            raise fail(op, f"the Python bool {x} can only be combined with bool tiles, not "
                           f"{dtype}")
        return x
    if not isinstance(x, numbers.Real):
        register_operand(x, op)  # raises with the right explanation
    if dtype.is_int or dtype == bool_:
        if not float(x).is_integer():
            raise fail(op, f"the number {x} is not an integer but the tile type is {dtype}")
        low, high = _int_range(dtype)
        if not low <= int(x) <= high:
            raise fail(op, f"the number {x} does not fit the tile type {dtype} "
                           f"({low}..{high}); convert the tile with .to() first")
        return int(x)
    return float(x)  # rounded to the tile's type where it is used (f16: 1e30 -> inf)


def _int_range(dtype: DType) -> tuple[int, int]:
    if dtype == bool_:
        return 0, 1
    if dtype.is_signed:
        return -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1
    return 0, (1 << dtype.bits) - 1


def broadcast_shape(tiles: list[Tile], op: str) -> tuple[int, ...]:
    """The common shape of `tiles` under numpy's rules (lower ranks get size-1 dims in
    front, then size-1 dims broadcast); TraceError if none exists."""
    rank = max(t.rank for t in tiles)
    padded = [(1,) * (rank - t.rank) + tuple(t.shape) for t in tiles]
    shape = []
    for extents in zip(*padded):
        sizes = {e for e in extents if e != 1}
        if len(sizes) > 1:
            listing = " and ".join(describe(t) for t in tiles)
            aligned = "" if len({t.rank for t in tiles}) == 1 else (
                " (as in numpy, a lower-rank tile lines up with the trailing dims: " +
                " and ".join(shape_text(p) for p in padded) + "; use t[:, None] for a column)")
            raise fail(op, f"shapes of {listing} do not broadcast: each dim must be equal "
                           f"or 1{aligned}")
        shape.append(sizes.pop() if sizes else 1)
    return tuple(shape)


def _common_dtype(tiles: list[Tile], op: str) -> DType:
    types = {t.dtype for t in tiles}
    if len(types) > 1:
        listing = " and ".join(describe(t) for t in tiles)
        first = tiles[0].dtype
        raise fail(op, f"operands {listing} have different element types; convert one "
                       f"with .to({first}) first")
    dtype = types.pop()
    if dtype.is_packed:
        raise fail(op, f"{describe(tiles[0])} holds packed {dtype} values, which can be "
                       f"copied but not computed on; convert with .to(f16) first")
    return dtype


def emit_elementwise(op: str, operands: list, out_dtype: DType,
                     out: RegisterTile | None = None, label: str | None = None) -> RegisterValue:
    """Record `out = op(*operands)`; operands are register tiles or numbers, in order."""
    label = label or spelling(op)
    ctx = current(label)
    tiles = [o for o in operands if isinstance(o, Tile)]
    for t in tiles:
        require_written(t, label)
    shape = broadcast_shape(tiles, label)
    if any(t.rank != len(shape) for t in tiles):
        promoted = iter(promote_ranks(tiles, len(shape), label))
        operands = [next(promoted) if isinstance(o, Tile) else o for o in operands]
        tiles = [o for o in operands if isinstance(o, Tile)]
    if out is None:
        out = new_register_tile(shape, out_dtype)
    elif not same_shape(out.shape, shape) or out.dtype != out_dtype:
        raise fail(label, f"the in-place result {describe(out)} cannot hold a result of "
                          f"shape {shape_text(shape)} and type {out_dtype}")
    scalars = {i: o for i, o in enumerate(operands) if not isinstance(o, Tile)}
    ctx.emit(Elementwise(op=op, inputs=tiles, out=out, scalars=scalars))
    ctx.mark_written(out)
    return RegisterValue(out)


# -- the ops --------------------------------------------------------------------------------
def binary(op: str, a: Any, b: Any, out: RegisterValue | None = None) -> RegisterValue:
    """`a op b` for op in add sub mul div floordiv mod pow max min and or xor lt le gt ge
    eq ne."""
    label = spelling(op)
    tiles = [register_operand(x, label) for x in (a, b) if _is_tile_like(x)]
    if not tiles:
        raise fail(label, "needs at least one register tile operand")
    dtype = _common_dtype(tiles, label)
    if op in BITWISE and dtype.is_float:
        raise fail(label, f"bitwise {label} needs integer or bool tiles, not {dtype}")
    if op in ARITHMETIC and dtype == bool_:
        raise fail(label, "arithmetic on bool tiles is not defined; use & | ^ or tg.where")
    if op == "pow" and not dtype.is_float:
        raise fail(label, f"** needs floating-point tiles, not {dtype}")
    if op in FLOOR_DIVISION and dtype.is_float:
        raise fail(label, f"{label} is defined on integer tiles only, not {dtype} (for "
                          f"floats use / and compare, or convert with .to(tg.i32) first)")
    operands = [register_operand(x, label) if _is_tile_like(x) else _number(x, dtype, label)
                for x in (a, b)]
    if op in FLOOR_DIVISION and isinstance(operands[1], int) and operands[1] == 0:
        raise fail(label, f"the divisor is the number 0 (integer {label} by zero)")
    out_dtype = bool_ if op in COMPARISONS else dtype
    return emit_elementwise(op, operands, out_dtype, out.ir if out is not None else None, label)


def _is_tile_like(x: Any) -> bool:
    """Tiles (and anything that is neither a number nor a kernel scalar, so that
    `register_operand` explains what it is)."""
    return isinstance(x, (TileHandle, Tile, Condition)) or not (
        isinstance(x, (numbers.Real, Scalar)))


def unary(op: str, x: Any) -> RegisterValue:
    """`op(x)` for op in neg abs not and the float math functions."""
    label = spelling(op)
    tile = register_operand(x, label)
    dtype = _common_dtype([tile], label)
    if op in FLOAT_UNARY and not dtype.is_float:
        raise fail(label, f"needs a floating-point tile, got {describe(tile)}; convert with "
                          f".to(f32) first")
    if op == "not" and dtype != bool_ and dtype.is_float:
        raise fail(label, f"~ needs a bool or integer tile, got {describe(tile)}")
    if op in ("neg", "abs") and dtype == bool_:
        raise fail(label, f"{label} is not defined on bool tiles")
    return emit_elementwise(op, [tile], dtype)


def where(cond: Any, a: Any, b: Any) -> RegisterValue:
    """Per element: `a` where `cond` holds, else `b` (tiles or numbers, broadcast)."""
    label = "tg.where"
    if isinstance(cond, Condition):
        raise fail(label, f"the condition {cond} is block-uniform; branch on it with tg.if_ "
                          f"(tg.where takes a bool register tile, e.g. x > 0)")
    cond_tile = register_operand(cond, label, "condition")
    if cond_tile.dtype != bool_:
        raise fail(label, f"the condition {describe(cond_tile)} must be a bool tile "
                          f"(a comparison such as x > 0)")
    values = [register_operand(x, label) for x in (a, b) if _is_tile_like(x)]
    if not values:
        raise fail(label, "needs at least one register tile among the two values")
    dtype = _common_dtype(values, label)
    operands = [cond_tile] + [register_operand(x, label) if _is_tile_like(x)
                              else _number(x, dtype, label) for x in (a, b)]
    return emit_elementwise("where", operands, dtype, label=label)


def cast(x: Any, dtype: DType) -> RegisterValue:
    """`x` converted to `dtype` (round to nearest even for floats)."""
    label = "tg.cast"
    tile = register_operand(x, label)
    if not isinstance(dtype, DType):
        raise fail(label, f"the target type must be a tegula dtype such as tg.f16, got "
                          f"{dtype!r}")
    if tile.dtype == dtype:
        return x if isinstance(x, RegisterValue) else RegisterValue(tile)
    return emit_elementwise("cast", [tile], dtype, label=label)


def assign(dst: RegisterValue, value: Any) -> None:
    """`dst.assign(value)`: overwrite a register tile with a tile of its shape and type
    (a register-to-register Copy) or with a number (a Fill)."""
    label = "assign()"
    ctx = current(label)
    target = register_operand(dst, label, "target")
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        ctx.emit(Fill(dst=target, value=_number(value, target.dtype, label)))
        ctx.mark_written(target)
        return
    src = register_operand(value, label, "value")
    require_written(src, label)
    if not same_shape(src.shape, target.shape) or src.dtype != target.dtype:
        raise fail(label, f"cannot assign {describe(src)} to {describe(target)}: shape and "
                          f"element type must match (use .to(...) to convert)")
    if src is not target:
        ctx.emit(Copy(src=src, dst=target))
    ctx.mark_written(target)


def _unary_function(op: str):
    def apply(x: Any) -> RegisterValue:
        return unary(op, x)
    apply.__name__ = op
    apply.__qualname__ = op
    apply.__doc__ = f"Element-wise {op} of a register tile (a new tile)."
    return apply


exp = _unary_function("exp")
exp2 = _unary_function("exp2")
log = _unary_function("log")
log2 = _unary_function("log2")
sqrt = _unary_function("sqrt")
rsqrt = _unary_function("rsqrt")
sin = _unary_function("sin")
cos = _unary_function("cos")
tanh = _unary_function("tanh")
sigmoid = _unary_function("sigmoid")
erf = _unary_function("erf")   # the Gauss error function (exact GELU: x·(1 + erf(x/√2))/2)
abs_ = _unary_function("abs")


def maximum(a: Any, b: Any) -> RegisterValue:
    """Element-wise maximum of two tiles (or a tile and a number); of two kernel scalars
    (or a scalar and an int), the scalar maximum (tegula.lang.scalars)."""
    if not _is_tile_like(a) and not _is_tile_like(b):
        return scalar_extremum("max", a, b)
    return binary("max", a, b)


def minimum(a: Any, b: Any) -> RegisterValue:
    """Element-wise minimum of two tiles (or a tile and a number); of two kernel scalars
    (or a scalar and an int), the scalar minimum."""
    if not _is_tile_like(a) and not _is_tile_like(b):
        return scalar_extremum("min", a, b)
    return binary("min", a, b)


__all__ = ["binary", "unary", "where", "cast", "assign", "exp", "exp2", "log", "log2", "sqrt",
           "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs_", "maximum", "minimum",
           "register_operand", "require_written", "emit_elementwise", "broadcast_shape"]
