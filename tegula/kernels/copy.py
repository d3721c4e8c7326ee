"""Copy and transpose of 2-D tensors, for every element type.

`copy` moves one (BM, BN) tile per block through registers: the load and the store both get
the coalesced partition synthesis picks for the contiguous dim. `transpose` stages the tile
in shared memory and reads it back through a `.T` view, so global reads *and* writes are
coalesced; synthesis picks the shared layout and swizzle that keep both sides conflict-free.

A tensor annotation fixes its element type, so each kernel is built per dtype by a small
cached factory (`copy_kernel(f16)`); the entry points pick the dtype from the array.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

import tegula as tg
from tegula.dtypes import ALL_DTYPES, DType
from tegula.kernels.common import (check_array, dtype_of_array, launch_emulated, logical_shape,
                                   poisoned)


@lru_cache(maxsize=None)
def copy_kernel(dtype: DType) -> tg.Kernel:
    """`y = x` for (M, N) tensors of `dtype`, one (BM, BN) tile per block."""

    @tg.kernel(threads=128)
    def copy(x: tg.Tensor[dtype], y: tg.Tensor[dtype],
             BM: tg.constexpr = 32, BN: tg.constexpr = 64):
        # Column tiles on grid axis 0: blocks scheduled one after another read neighbouring
        # memory of a row-major tensor (rows-first cost ~6% of DRAM bandwidth on an H200).
        n, m = tg.block_id(0), tg.block_id(1)
        tile = tg.load(x.tile((BM, BN), (m, n)))
        tg.copy(tile, y.tile((BM, BN), (m, n)))

    return copy


@lru_cache(maxsize=None)
def transpose_kernel(dtype: DType) -> tg.Kernel:
    """`y = x.T` for an (M, N) `x` and (N, M) `y` of `dtype`, through shared memory."""

    @tg.kernel(threads=128)
    def transpose(x: tg.Tensor[dtype], y: tg.Tensor[dtype],
                  BM: tg.constexpr = 32, BN: tg.constexpr = 64):
        m, n = tg.block_id(0), tg.block_id(1)
        staged = tg.shared((BM, BN), dtype)
        tg.copy(x.tile((BM, BN), (m, n)), staged)          # coalesced along x's rows
        tile = tg.load(staged.T)                           # (BN, BM), read column-wise
        tg.copy(tile, y.tile((BN, BM), (n, m)))            # coalesced along y's rows

    return transpose


def copy_config(shape: tuple[int, int], dtype: DType, BM: int = 32,
                BN: int = 64) -> tuple[tuple[int, int], dict]:
    """(grid, constexprs) for copying an (M, N) tensor: one block per (BM, BN) tile,
    column tiles along grid axis 0."""
    m, n = shape
    return (tg.cdiv(n, BN), tg.cdiv(m, BM)), dict(BM=BM, BN=BN)


def transpose_config(shape: tuple[int, int], dtype: DType, BM: int = 32,
                     BN: int = 64) -> tuple[tuple[int, int], dict]:
    """(grid, constexprs) for transposing an (M, N) tensor: tiles of x are (BM, BN)."""
    m, n = shape
    return (tg.cdiv(m, BM), tg.cdiv(n, BN)), dict(BM=BM, BN=BN)


def copy_emulated(x: np.ndarray, dtype: DType | None = None, **tiles: int) -> np.ndarray:
    """`x` (2-D) copied by the emulated kernel (bf16/f8 arrays are float32; pass `dtype`)."""
    dtype = dtype or dtype_of_array(check_array("copy_emulated", "x", x, ndim=2),
                                    "copy_emulated", "x")
    y = poisoned(x.shape, dtype)
    grid, constexprs = copy_config(logical_shape(x, dtype), dtype, **tiles)
    launch_emulated(copy_kernel(dtype), grid, x, y, **constexprs)
    return y


def transpose_emulated(x: np.ndarray, dtype: DType | None = None, **tiles: int) -> np.ndarray:
    """`x.T` (a new contiguous array) computed by the emulated kernel (not for packed
    4-bit types: see TRANSPOSE_DTYPES); `x` is 2-D."""
    dtype = dtype or dtype_of_array(check_array("transpose_emulated", "x", x, ndim=2),
                                    "transpose_emulated", "x")
    y = poisoned((x.shape[1], x.shape[0]), dtype)
    grid, constexprs = transpose_config(logical_shape(x, dtype), dtype, **tiles)
    launch_emulated(transpose_kernel(dtype), grid, x, y, **constexprs)
    return y


# Every element type copies; packed 4-bit types cannot be transposed (two elements share a
# byte, so a transpose needs nibble shuffles in registers, which the compiler lacks).
COPY_DTYPES = ALL_DTYPES
TRANSPOSE_DTYPES = tuple(d for d in ALL_DTYPES if not d.is_packed)

__all__ = ["copy_kernel", "transpose_kernel", "copy_config", "transpose_config",
           "copy_emulated", "transpose_emulated", "COPY_DTYPES", "TRANSPOSE_DTYPES"]
