"""Integer `//` and `%` on tiles, shared by the emulator tests (against torch) and the GPU
tests (against the emulator).

Semantics are torch's floor_divide / remainder (and Python's): -7 // 2 == -4,
-7 % 2 == 1, 7 % -2 == -1. A zero divisor in a tile gives x // 0 == -1 and x % 0 == x
(torch raises on the CPU; C leaves it undefined); results wrap to the type
(INT_MIN // -1 == INT_MIN, as torch and numpy give). `/` on integer tiles truncates, as in
C, with the same x / 0 == -1 and wrap.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

import tegula as tg
from tegula.dtypes import DType, i8, i32, u8

#: The forms, in the order the kernel stacks them: tile//tile, tile%tile, tile op number,
#: number op tile, tile op kernel scalar, kernel scalar op tile, in place, and a mask.
FORMS = ("a // b", "a % b", "a // k", "a % k", "k // b", "k % b", "a // s", "a % s",
         "s // b", "s % b", "c //= b; c %= k", "where(col % 2 == 0, a, b)", "a / b")


@lru_cache(maxsize=None)
def division_kernel(dtype: DType, number: int, threads: int):
    """Writes form i (see FORMS; k is `number`, s the scalar parameter) to row-block
    i * GM + m of `out`."""
    @tg.kernel(threads=threads)
    def division(x: tg.Tensor[dtype], y: tg.Tensor[dtype], out: tg.Tensor[dtype], s: int,
                 GM: int, BM: tg.constexpr = 16, BN: tg.constexpr = 32):
        m, n = tg.block_id(0), tg.block_id(1)
        a = tg.load(x.tile((BM, BN), (m, n)), fill=1)
        b = tg.load(y.tile((BM, BN), (m, n)), fill=1)
        c = a + 0
        c //= b
        c %= number
        col = tg.indices((BM, BN), 1, offset=n * BN)
        results = (a // b, a % b, a // number, a % number, number // b, number % b,
                   a // s, a % s, s // b, s % b, c, tg.where(col % 2 == 0, a, b), a / b)
        for i, r in enumerate(results):
            tg.copy(r, out.tile((BM, BN), (i * GM + m, n)))

    return division


def floor_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torch.floor_divide in int64, with x // 0 == -1."""
    import torch
    q = torch.floor_divide(torch.from_numpy(a), torch.from_numpy(np.where(b == 0, 1, b)))
    return np.where(b == 0, -1, q.numpy())


def trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer `/`: C's truncating division (torch rounding_mode="trunc"), x / 0 == -1."""
    import torch
    q = torch.div(torch.from_numpy(a), torch.from_numpy(np.where(b == 0, 1, b)),
                  rounding_mode="trunc")
    return np.where(b == 0, -1, q.numpy())


def floor_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torch.remainder in int64, with x % 0 == x."""
    import torch
    r = torch.remainder(torch.from_numpy(a), torch.from_numpy(np.where(b == 0, 1, b)))
    return np.where(b == 0, a, r.numpy())


def division_reference(x: np.ndarray, y: np.ndarray, number: int, s: int, dtype: DType,
                       padded: tuple) -> np.ndarray:
    """The stacked forms, each over the padded (whole-tile) extent with fill 1 outside."""
    a = np.ones(padded, np.int64)
    b = np.ones(padded, np.int64)
    a[:x.shape[0], :x.shape[1]] = x
    b[:y.shape[0], :y.shape[1]] = y
    k = np.full(padded, number, np.int64)
    sv = np.full(padded, s, np.int64).astype(np.dtype(dtype.numpy_name)).astype(np.int64)
    col = np.indices(padded)[1]
    forms = (floor_div(a, b), floor_mod(a, b), floor_div(a, k), floor_mod(a, k),
             floor_div(k, b), floor_mod(k, b), floor_div(a, sv), floor_mod(a, sv),
             floor_div(sv, b), floor_mod(sv, b),
             floor_mod(floor_div(a, b).astype(np.dtype(dtype.numpy_name)).astype(np.int64), k),
             np.where(col % 2 == 0, a, b), trunc_div(a, b))
    return np.concatenate(forms).astype(np.dtype(dtype.numpy_name))


def division_inputs(rng: np.random.Generator, shape: tuple, dtype: DType):
    """Dividends over the type (its extremes included), divisors small with 0, ±1 often."""
    info = np.iinfo(np.dtype(dtype.numpy_name))
    x = rng.integers(max(info.min, -1000), min(info.max, 1000) + 1, shape)
    y = rng.integers(max(info.min, -9), 10, shape)
    x.flat[:4] = (info.min, info.max, info.min, -7 if info.min < 0 else 7)
    y.flat[:4] = (-1 if info.min < 0 else 1, 0, 3, 2)
    y.flat[4:8] = (0, -1 if info.min < 0 else 1, 1, 0)
    return x.astype(np.dtype(dtype.numpy_name)), y.astype(np.dtype(dtype.numpy_name))


#: (dtype, the number k, the kernel scalar s): negative and positive on the signed types.
CASES = ((i32, -3, 5), (i32, 7, -4), (i8, -3, 2), (u8, 6, 5),
         (i32, 16, -5), (i8, 4, 3))  # powers of two: the CUDA shifts and masks
#: (shape, threads, BM, BN): ragged edges; a tile smaller than the thread count.
CONFIGS = (((37, 50), 64, 16, 32), ((5, 7), 128, 4, 8))


def division_case(rng, dtype, number, s, shape, threads, BM, BN):
    """(kernel, grid, x, y, out (zeros), scalars, constexprs, reference)."""
    x, y = division_inputs(rng, shape, dtype)
    gm, gn = tg.cdiv(shape[0], BM), tg.cdiv(shape[1], BN)
    padded = (gm * BM, gn * BN)
    out = np.zeros((len(FORMS) * padded[0], padded[1]), np.dtype(dtype.numpy_name))
    ref = division_reference(x.astype(np.int64), y.astype(np.int64), number, s, dtype,
                             padded)
    return (division_kernel(dtype, number, threads), (gm, gn), x, y, out, (s, gm),
            dict(BM=BM, BN=BN), ref)


# -- unary - and abs wrap too (-INT_MIN == INT_MIN; C's signed negation would be undefined) --
@lru_cache(maxsize=None)
def negation_kernel(dtype: DType):
    """neg, abs and `-x < 0` (which a compiler exploiting C's undefined -INT_MIN could fold to
    `x > 0`) of a 1-D tile of 8, stacked in that order in `out`."""
    @tg.kernel(threads=32)
    def negation(x: tg.Tensor[dtype, 1], out: tg.Tensor[dtype, 1]):
        a = tg.load(x.tile((8,), (0,)))
        tg.copy(-a, out.tile((8,), (0,)))
        tg.copy(abs(a), out.tile((8,), (1,)))
        tg.copy(tg.where(-a < 0, a, a * 0), out.tile((8,), (2,)))

    return negation


def negation_inputs(dtype: DType) -> np.ndarray:
    info = np.iinfo(np.dtype(dtype.numpy_name))
    return np.array([info.min, info.min + 1, -5, -1, 0, 1, 7, info.max],
                    np.dtype(dtype.numpy_name))


def negation_reference(x: np.ndarray, dtype: DType) -> np.ndarray:
    """By two's complement in int64, then wrapped to the type."""
    wide = x.astype(np.int64)
    neg = (-wide).astype(np.dtype(dtype.numpy_name)).astype(np.int64)
    return np.concatenate([neg, np.abs(wide), np.where(neg < 0, wide, 0)]).astype(x.dtype)
