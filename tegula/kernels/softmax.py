"""Row softmax: `y[i, :] = exp(x[i, :] - max_i) / sum_i exp(x[i, :] - max_i)`.

Each block owns BM whole rows: one (BM, BN) register tile with BN ≥ the row length, read
with out-of-range elements filled with -inf (so they neither win the max nor add to the
sum). The max and the sum reduce along the row inside threads, across lanes by shuffles
and across warps through shared memory, as the synthesized layout requires.

The arithmetic per element is kept to what a memory-bound kernel can afford (an H200
moves about one f16 element in and out per 32 thread-instructions of issue capacity):
`exp(d) = exp2(d · log2 e)` is one hardware `ex2` plus a multiply where `expf` is about
ten instructions, and each row divides once (`1 / sum`) and multiplies per element where
an IEEE divide per element is about ten more. The subtraction `x - max` comes first and
is exact for f16/bf16 inputs, so the scaling rounds once, relative to the small `x - max`
(the result stays within 2 ulp of f32 for every probability above 1e-7).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, bf16, f16
from tegula.kernels.common import (check_array, dtype_of_array, launch_emulated, poisoned,
                                   rows_of)

SOFTMAX_DTYPES = (f32, f16, bf16)
LOG2E = 1.4426950408889634  # exp(d) = exp2(d * LOG2E)
MAX_ROW = 16384  # one register tile per row block: BN * BM / threads f32 values per thread


@lru_cache(maxsize=None)
def softmax_kernel(dtype: DType) -> tg.Kernel:
    """Softmax along the rows of an (M, N) tensor of `dtype` (N ≤ BN), computed in f32."""

    @tg.kernel(threads=128)
    def softmax(x: tg.Tensor[dtype], y: tg.Tensor[dtype],
                BM: tg.constexpr = 4, BN: tg.constexpr = 512):
        m = tg.block_id(0)
        rows = tg.load(x.tile((BM, BN), (m, 0)), fill=-float("inf")).to(f32)
        e = tg.exp2((rows - tg.max(rows, 1)) * LOG2E)
        tg.copy((e * (1.0 / tg.sum(e, 1))).to(dtype), y.tile((BM, BN), (m, 0)))

    return softmax


@lru_cache(maxsize=None)
def softmax_looped_kernel(dtype: DType) -> tg.Kernel:
    """Softmax of rows of any length, BN elements at a time (the online softmax): a first
    pass keeps a running max and a running sum rescaled whenever the max grows, a second
    pass writes exp(x - max) / sum. Reads x twice, but no row is too long and no thread
    idles on padding beyond the last chunk."""
    inf = float("inf")

    @tg.kernel(threads=128)
    def softmax_looped(x: tg.Tensor[dtype], y: tg.Tensor[dtype],
                       BM: tg.constexpr = 1, BN: tg.constexpr = 1024):
        m = tg.block_id(0)
        xs = x.tile((BM, BN), (m, None))                   # (BM, BN, chunks)
        ys = y.tile((BM, BN), (m, None))
        run_max = tg.full((BM, 1), -inf, f32)
        run_sum = tg.zeros((BM, 1), f32)
        for k in tg.range(xs.shape[2]):
            chunk = tg.load(xs[:, :, k], fill=-inf).to(f32)
            new_max = tg.maximum(run_max, tg.max(chunk, 1))
            run_sum.assign(run_sum * tg.exp2((run_max - new_max) * LOG2E) +
                           tg.sum(tg.exp2((chunk - new_max) * LOG2E), 1))
            run_max.assign(new_max)
        inv_sum = 1.0 / run_sum
        for k in tg.range(xs.shape[2]):
            chunk = tg.load(xs[:, :, k], fill=-inf).to(f32)
            tg.copy((tg.exp2((chunk - run_max) * LOG2E) * inv_sum).to(dtype), ys[:, :, k])

    return softmax_looped


def softmax_config(shape: tuple[int, int], BM: int | None = None,
                   BN: int | None = None) -> tuple[tuple[int], dict]:
    """(grid, constexprs) for an (M, N) softmax: BN is the row length rounded up to a
    power of two (at least 128), BM keeps the tile near 2048 elements (16 per thread)."""
    m, n = shape
    if n > MAX_ROW:
        raise ValueError(f"softmax rows of {n} elements exceed the one-tile limit {MAX_ROW}")
    BN = BN or max(128, 1 << (n - 1).bit_length())
    BM = BM or max(1, 2048 // BN)
    return (tg.cdiv(m, BM),), dict(BM=BM, BN=BN)


def softmax_emulated(x: np.ndarray, dtype: DType | None = None, looped: bool = False,
                     **tiles: int) -> np.ndarray:
    """Softmax over the last dim of `x` (any rank) by the emulated kernel (`looped`: the
    chunked kernel, for rows of any length; tiles default to BM=1, BN=1024)."""
    fn = "softmax_emulated"
    dtype = dtype or dtype_of_array(check_array(fn, "x", x, min_ndim=1), fn, "x")
    rows = rows_of(x)
    y = poisoned(rows.shape, dtype)
    if y.size == 0:
        return y.reshape(x.shape)  # no rows, or rows of no elements
    if looped:
        constexprs = {"BM": 1, "BN": 1024, **tiles}
        grid = (tg.cdiv(rows.shape[0], constexprs["BM"]),)
        launch_emulated(softmax_looped_kernel(dtype), grid, rows, y, **constexprs)
    else:
        grid, constexprs = softmax_config(rows.shape, **tiles)
        launch_emulated(softmax_kernel(dtype), grid, rows, y, **constexprs)
    return y.reshape(x.shape)


__all__ = ["softmax_kernel", "softmax_looped_kernel", "softmax_config", "softmax_emulated",
           "SOFTMAX_DTYPES"]
