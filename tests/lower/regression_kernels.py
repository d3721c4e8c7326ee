"""Kernels and numpy references for issue 8's silent-wrong-result regressions, shared by
the CPU tests (emulator against numpy) and the GPU tests (tests/gpu, GPU against torch).

Each factory returns a `tg.Kernel` for one configuration; each `*_reference` computes, in
numpy, what the kernel must produce. Element semantics follow the emulator's storage
rules (`tegula.emulate.values.round_to`: compute in f32 / int64, round to the type on
every write), which is what a Python number "taking the tile's type" means.
"""
from __future__ import annotations

import operator
from functools import lru_cache

import numpy as np

import tegula as tg
from tegula.dtypes import (DType, bf16, bool_, f8e4m3, f8e5m2, f16, f32, i8, i32, u8)
from tegula.emulate.values import round_to

FLOAT_TYPES = (f32, f16, bf16, f8e4m3, f8e5m2)
INT_TYPES = (i32, i8, u8)
ALL_TYPES = FLOAT_TYPES + INT_TYPES


# -- Python numbers meeting tiles (issue 8 item 1 and its class) -------------------------------
def numbers_for(dtype: DType) -> tuple:
    """Numbers that a wrong type would get wrong: none is 0, 1 or the bool True."""
    if dtype.is_float:
        return (-float("inf"), float("inf"), float("nan"), 1e30, -2.5, 0.3, -0.0)
    if dtype == u8:
        return (3, 200, 255)
    if dtype == i8:
        return (-128, -7, 5, 127)
    return (-7, 5, 2**31 - 1, -2**31)


#: (name, how the kernel writes it with tile t and number n, numpy on (x, n)).
_ARITH = {"add": operator.add, "sub": operator.sub, "mul": operator.mul}
_CMP = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
        "eq": operator.eq, "ne": operator.ne}


def number_expressions(dtype: DType) -> list[str]:
    """Every form in which a number meets a tile, as names `number_case` understands."""
    forms = [f"{op}_{side}" for op in _ARITH for side in ("right", "left")]
    forms += [f"{op}_{side}" for op in ("max", "min") for side in ("right", "left")]
    forms += [f"cmp_{op}" for op in _CMP] + ["where_false", "where_true", "fill", "full"]
    if dtype.is_float:
        forms += ["div_right", "div_left", "pow_right"]
    else:
        forms += ["and_right", "or_left", "xor_right"]
    return forms


def number_case(form: str, t, n, shape, dtype):
    """The tile expression `form` (see number_expressions) of tile t and number n."""
    op, _, side = form.partition("_")
    if op in _ARITH or op in ("div", "pow"):
        fn = {"div": operator.truediv, "pow": operator.pow, **_ARITH}[op]
        return fn(t, n) if side == "right" else fn(n, t)
    if op in ("max", "min"):
        fn = tg.maximum if op == "max" else tg.minimum
        return fn(t, n) if side == "right" else fn(n, t)
    if op in ("and", "or", "xor"):
        fn = {"and": operator.and_, "or": operator.or_, "xor": operator.xor}[op]
        return fn(t, n) if side == "right" else fn(n, t)
    if op == "cmp":
        return tg.where(_CMP[side](t, n), t, t + t)  # bool results shown through a where
    if op == "where":
        cond = t > 0
        return tg.where(cond, t, n) if side == "false" else tg.where(cond, n, t)
    if op == "fill":
        out = tg.register(shape, dtype)
        tg.fill(out, n)
        return out
    if op == "full":
        return tg.full(shape, n, dtype)
    raise ValueError(form)


def number_reference(form: str, x: np.ndarray, n, dtype: DType) -> np.ndarray:
    """numpy of `number_case`: x in storage values; the number rounded to the type."""
    is_float = dtype.is_float
    wide = x.astype(np.float32) if is_float else x.astype(np.int64)
    nv = round_to(np.asarray(n), dtype).astype(wide.dtype)[()]
    op, _, side = form.partition("_")
    with np.errstate(all="ignore"):
        if op in _ARITH or op in ("div", "pow"):
            fn = {"div": _true_div if is_float else _c_div, "pow": np.power, **_ARITH}[op]
            r = fn(wide, nv) if side == "right" else fn(nv, wide)
        elif op in ("max", "min"):
            r = (np.maximum if op == "max" else np.minimum)(wide, nv)
        elif op in ("and", "or", "xor"):
            r = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op](wide, nv)
        elif op == "cmp":
            doubled = round_to(wide + wide, dtype).astype(wide.dtype)
            r = np.where(_CMP[side](wide, nv), wide, doubled)
        elif op == "where":
            r = np.where(wide > 0, wide, nv) if side == "false" else np.where(wide > 0, nv, wide)
        else:  # fill, full
            r = np.full(x.shape, nv)
    return round_to(r, dtype)


def _true_div(a, b):
    return np.true_divide(a, b)


def _c_div(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


@lru_cache(maxsize=None)
def numbers_kernel(dtype: DType, forms: tuple, values: tuple, shape=(8, 16), threads=64):
    """Writes form i with number j (in that order) to rows (i*len(values)+j)*R … of `y`."""
    rows, cols = shape

    @tg.kernel(threads=threads)
    def numbers(x: tg.Tensor[dtype], y: tg.Tensor[dtype]):
        t = tg.load(x.tile((rows, cols), (0, 0)))
        k = 0
        for form in forms:
            for n in values:
                tg.copy(number_case(form, t, n, (rows, cols), dtype), y.tile((rows, cols), (k, 0)))
                k += 1

    return numbers


# -- copies of tiles smaller than the block, with fills (items 3 and 4) ------------------------
def fills_for(dtype: DType) -> tuple:
    """Fill values that a zero fill cannot imitate."""
    if dtype.is_float:
        return (-float("inf"), float("nan"), -0.0, 1e30, -3.5)
    return {i32: (-7, 2**31 - 1), i8: (-128, 9), u8: (255, 17)}[dtype]


@lru_cache(maxsize=None)
def copy_paths_kernel(dtype: DType, tile: tuple, threads: int, fill: float):
    """Every copy path on one (BM, BN) tile per block: x (ragged) -> shared (fill) ->
    global; shared -> registers -> global; registers -> shared -> global; and x ->
    registers (fill) -> global. Each output is a whole number of tiles, so the fill shows."""
    bm, bn = tile

    @tg.kernel(threads=threads)
    def copy_paths(x: tg.Tensor[dtype], via_shared: tg.Tensor[dtype],
                   via_registers: tg.Tensor[dtype], via_both: tg.Tensor[dtype],
                   via_load: tg.Tensor[dtype]):
        m, n = tg.block_id(0), tg.block_id(1)
        s = tg.shared((bm, bn), dtype)
        tg.copy(x.tile((bm, bn), (m, n)), s, fill=fill)              # global -> shared
        tg.copy(s, via_shared.tile((bm, bn), (m, n)))                  # shared -> global
        r = tg.load(s)                                                  # shared -> registers
        tg.copy(r, via_registers.tile((bm, bn), (m, n)))               # registers -> global
        s2 = tg.shared((bm, bn), dtype)
        tg.copy(r, s2)                                                  # registers -> shared
        tg.copy(s2, via_both.tile((bm, bn), (m, n)))
        tg.copy(tg.load(x.tile((bm, bn), (m, n)), fill=fill),          # global -> registers
                via_load.tile((bm, bn), (m, n)))

    return copy_paths


@lru_cache(maxsize=None)
def shared_to_shared_kernel(dtype: DType, tile: tuple, threads: int, transpose: bool):
    """x -> shared -> shared (optionally into a transposed view) -> y (y is x or x.T)."""
    rows, cols = tile

    @tg.kernel(threads=threads)
    def shared_to_shared(x: tg.Tensor[dtype], y: tg.Tensor[dtype]):
        first = tg.shared((rows, cols), dtype)
        tg.copy(x.tile((rows, cols), (0, 0)), first)
        if transpose:
            second = tg.shared((cols, rows), dtype)
            tg.copy(first, second.T)                      # shared -> shared
            tg.copy(tg.load(second), y.tile((cols, rows), (0, 0)))
        else:
            second = tg.shared((rows, cols), dtype)
            tg.copy(first, second)                        # shared -> shared
            tg.copy(tg.load(second), y.tile((rows, cols), (0, 0)))

    return shared_to_shared


@lru_cache(maxsize=None)
def atomic_kernel(dtype: DType, tile: tuple, threads: int):
    """acc += x tile by tile through tg.atomic_add from a register tile (replicated when
    the tile is smaller than the block)."""
    bm, bn = tile

    @tg.kernel(threads=threads)
    def atomic(x: tg.Tensor[dtype], acc: tg.Tensor[dtype]):
        m, n = tg.block_id(0), tg.block_id(1)
        tg.atomic_add(tg.load(x.tile((bm, bn), (m, n))), acc.tile((bm, bn), (m, n)))

    return atomic


def same_values(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal element for element, NaN equal to NaN, and -0.0 told apart from +0.0."""
    if got.dtype.kind != "f":
        return np.array_equal(got, want)
    return np.array_equal(got, want, equal_nan=True) and \
        np.array_equal(np.signbit(got), np.signbit(want))


def padded(x: np.ndarray, shape: tuple, fill, dtype: DType) -> np.ndarray:
    """x placed top-left in an array of `shape`, the rest `fill` rounded to the type."""
    out = np.full(shape, round_to(np.asarray(fill), dtype)[()], dtype=x.dtype)
    out[: x.shape[0], : x.shape[1]] = x
    return out


# -- NaN in max / min (item 6) -----------------------------------------------------------------
@lru_cache(maxsize=None)
def minmax_kernel(dtype: DType, shape: tuple, threads: int):
    """Row and column max/min of x, and the element-wise maximum/minimum of x and y."""
    rows, cols = shape

    @tg.kernel(threads=threads)
    def minmax(x: tg.Tensor[dtype], y: tg.Tensor[dtype], row_max: tg.Tensor[dtype],
               row_min: tg.Tensor[dtype], col_max: tg.Tensor[dtype], col_min: tg.Tensor[dtype],
               maxi: tg.Tensor[dtype], mini: tg.Tensor[dtype]):
        t = tg.load(x.tile((rows, cols), (0, 0)))
        u = tg.load(y.tile((rows, cols), (0, 0)))
        tg.copy(tg.max(t, 1), row_max.tile((rows, 1), (0, 0)))
        tg.copy(tg.min(t, 1), row_min.tile((rows, 1), (0, 0)))
        tg.copy(tg.max(t, 0), col_max.tile((1, cols), (0, 0)))
        tg.copy(tg.min(t, 0), col_min.tile((1, cols), (0, 0)))
        tg.copy(tg.maximum(t, u), maxi.tile((rows, cols), (0, 0)))
        tg.copy(tg.minimum(t, u), mini.tile((rows, cols), (0, 0)))

    return minmax


def nan_inputs(rng: np.random.Generator, shape: tuple, dtype: DType):
    """x with an all-NaN row, an all-NaN column, scattered NaNs and ±inf; y with NaNs in
    other places (so maximum(x, y) sees NaN on either side)."""
    rows, cols = shape
    x = rng.standard_normal(shape).astype(np.float32) * 4
    x[rows // 2, :] = np.nan
    x[:, cols // 3] = np.nan
    x[rng.random(shape) < 0.1] = np.nan
    x[0, -1], x[-1, 0] = np.inf, -np.inf
    y = rng.standard_normal(shape).astype(np.float32) * 4
    y[rng.random(shape) < 0.2] = np.nan
    return round_to(x, dtype), round_to(y, dtype)


def minmax_reference(x: np.ndarray, y: np.ndarray) -> dict:
    """torch semantics: NaN propagates through max/min and maximum/minimum."""
    with np.errstate(invalid="ignore"):
        return {"row_max": x.max(1, keepdims=True), "row_min": x.min(1, keepdims=True),
                "col_max": x.max(0, keepdims=True), "col_min": x.min(0, keepdims=True),
                "maxi": np.maximum(x, y), "mini": np.minimum(x, y)}
