"""Fused element-wise kernels: `silu_mul(x, y) = SiLU(x) * y` (the gated MLP activation).

Each block loads a (BM, BN) tile of both inputs, computes in f32 and stores the result in
the inputs' type; out-of-range elements of boundary tiles are never stored.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, bf16, f16
from tegula.kernels.common import (check_array, check_same_dtype, dtype_of_array,
                                   launch_emulated, poisoned, rows_of)

SILU_MUL_DTYPES = (f32, f16, bf16)


@lru_cache(maxsize=None)
def silu_mul_kernel(dtype: DType) -> tg.Kernel:
    """`out = x * sigmoid(x) * y` for (M, N) tensors of `dtype`, computed in f32."""

    @tg.kernel(threads=128)
    def silu_mul(x: tg.Tensor[dtype], y: tg.Tensor[dtype], out: tg.Tensor[dtype],
                 BM: tg.constexpr = 16, BN: tg.constexpr = 128):
        m, n = tg.block_id(0), tg.block_id(1)
        a = tg.load(x.tile((BM, BN), (m, n))).to(f32)
        b = tg.load(y.tile((BM, BN), (m, n))).to(f32)
        tg.copy((a * tg.sigmoid(a) * b).to(dtype), out.tile((BM, BN), (m, n)))

    return silu_mul


def silu_mul_config(shape: tuple[int, int], BM: int = 16,
                    BN: int = 128) -> tuple[tuple[int, int], dict]:
    """(grid, constexprs) for an (M, N) problem: one block per (BM, BN) tile."""
    m, n = shape
    return (tg.cdiv(m, BM), tg.cdiv(n, BN)), dict(BM=BM, BN=BN)


def silu_mul_emulated(x: np.ndarray, y: np.ndarray, dtype: DType | None = None,
                      **tiles: int) -> np.ndarray:
    """SiLU(x) * y by the emulated kernel; any shape (flattened to rows of the last dim)."""
    fn = "silu_mul_emulated"
    check_array(fn, "x", x)
    check_array(fn, "y", y)
    check_same_dtype(fn, x=x, y=y)
    dtype = dtype or dtype_of_array(x, fn, "x")
    if x.shape != y.shape:
        raise ValueError(f"tegula.kernels.{fn}: x and y must have one shape, got x of shape "
                         f"{x.shape} and y of shape {y.shape}")
    x2, y2 = (rows_of(x), rows_of(y)) if x.ndim else (x.reshape(1, 1), y.reshape(1, 1))
    out = poisoned(x2.shape, dtype)
    if out.size == 0:
        return out.reshape(x.shape)
    grid, constexprs = silu_mul_config(x2.shape, **tiles)
    launch_emulated(silu_mul_kernel(dtype), grid, x2, y2, out, **constexprs)
    return out.reshape(x.shape)


__all__ = ["silu_mul_kernel", "silu_mul_config", "silu_mul_emulated", "SILU_MUL_DTYPES"]
