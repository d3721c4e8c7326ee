"""RMSNorm: `y[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) * w`.

Each block owns BM whole rows (BN ≥ the row length N; out-of-range elements load as 0 and
add nothing to the sum of squares). The weight is loaded once per block as a (1, BN) tile
that broadcasts over the rows; synthesis gives it the row layout projected from x's.
N is a constexpr: the mean divides by it, and norms run at a handful of hidden sizes.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, bf16, f16
from tegula.kernels.common import (check_array, check_same_dtype, dtype_of_array,
                                   launch_emulated, poisoned, rows_of)
from tegula.kernels.softmax import MAX_ROW

RMS_NORM_DTYPES = (f32, f16, bf16)


@lru_cache(maxsize=None)
def rms_norm_kernel(dtype: DType) -> tg.Kernel:
    """RMSNorm of the rows of an (M, N) tensor with a (1, N) weight, computed in f32."""

    @tg.kernel(threads=128)
    def rms_norm(x: tg.Tensor[dtype], w: tg.Tensor[dtype], y: tg.Tensor[dtype],
                 N: tg.constexpr, EPS: tg.constexpr = 1e-6,
                 BM: tg.constexpr = 4, BN: tg.constexpr = 512):
        m = tg.block_id(0)
        rows = tg.load(x.tile((BM, BN), (m, 0))).to(f32)
        weight = tg.load(w.tile((1, BN), (0, 0))).to(f32)
        scale = tg.rsqrt(tg.sum(rows * rows, 1) * (1.0 / N) + EPS)
        tg.copy((rows * scale * weight).to(dtype), y.tile((BM, BN), (m, 0)))

    return rms_norm


@lru_cache(maxsize=None)
def rms_norm_looped_kernel(dtype: DType) -> tg.Kernel:
    """RMSNorm of rows of any length, BN elements at a time: a first pass sums the
    squares chunk by chunk, a second scales each chunk by the weight."""

    @tg.kernel(threads=128)
    def rms_norm_looped(x: tg.Tensor[dtype], w: tg.Tensor[dtype], y: tg.Tensor[dtype],
                        N: tg.constexpr, EPS: tg.constexpr = 1e-6,
                        BM: tg.constexpr = 1, BN: tg.constexpr = 2048):
        m = tg.block_id(0)
        xs = x.tile((BM, BN), (m, None))                   # (BM, BN, chunks)
        ws = w.tile((1, BN), (0, None))
        ys = y.tile((BM, BN), (m, None))
        sum_sq = tg.zeros((BM, 1), f32)
        for k in tg.range(xs.shape[2]):
            chunk = tg.load(xs[:, :, k]).to(f32)
            sum_sq += tg.sum(chunk * chunk, 1)
        scale = tg.rsqrt(sum_sq * (1.0 / N) + EPS)
        for k in tg.range(xs.shape[2]):
            chunk = tg.load(xs[:, :, k]).to(f32)
            weight = tg.load(ws[:, :, k]).to(f32)
            tg.copy((chunk * scale * weight).to(dtype), ys[:, :, k])

    return rms_norm_looped


def rms_norm_config(shape: tuple[int, int], eps: float = 1e-6, BM: int | None = None,
                    BN: int | None = None) -> tuple[tuple[int], dict]:
    """(grid, constexprs) for an (M, N) RMSNorm: BN is N rounded up to a power of two
    (at least 128), BM keeps the tile near 2048 elements (16 per thread)."""
    m, n = shape
    if n > MAX_ROW:
        raise ValueError(f"RMSNorm rows of {n} elements exceed the one-tile limit {MAX_ROW}")
    BN = BN or max(128, 1 << (n - 1).bit_length())
    BM = BM or max(1, 2048 // BN)
    return (tg.cdiv(m, BM),), dict(N=n, EPS=float(eps), BM=BM, BN=BN)


def rms_norm_emulated(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6,
                      dtype: DType | None = None, looped: bool = False,
                      **tiles: int) -> np.ndarray:
    """RMSNorm over the last dim of `x` (any rank) with `weight` of shape (N,), emulated
    (`looped`: the chunked kernel, for rows of any length; tiles default to BM=1, BN=2048)."""
    fn = "rms_norm_emulated"
    check_array(fn, "x", x, min_ndim=1)
    check_array(fn, "weight", weight, ndim=1)
    check_same_dtype(fn, x=x, weight=weight)
    dtype = dtype or dtype_of_array(x, fn, "x")
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"tegula.kernels.{fn}: weight must have shape ({x.shape[-1]},) "
                         f"for x of shape {x.shape}, got {weight.shape}")
    rows = rows_of(x)
    y = poisoned(rows.shape, dtype)
    if y.size == 0:
        return y.reshape(x.shape)  # no rows, or rows of no elements
    if looped:
        constexprs = dict(N=rows.shape[1], EPS=float(eps), **{"BM": 1, "BN": 2048, **tiles})
        grid = (-(-rows.shape[0] // constexprs["BM"]),)
        kernel = rms_norm_looped_kernel(dtype)
    else:
        grid, constexprs = rms_norm_config(rows.shape, eps, **tiles)
        kernel = rms_norm_kernel(dtype)
    launch_emulated(kernel, grid, rows, np.ascontiguousarray(weight)[None, :], y, **constexprs)
    return y.reshape(x.shape)


__all__ = ["rms_norm_kernel", "rms_norm_looped_kernel", "rms_norm_config", "rms_norm_emulated",
           "RMS_NORM_DTYPES"]
