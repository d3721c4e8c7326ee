"""GEMM in the emulator against numpy: both dataflows, f16/bf16 (f32 accumulation, checked
to the rounding of the output type) and i8 (i32 output, exact)."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f16, i8
from tegula.kernels.common import random_input
from tegula.kernels.gemm import GEMM_DTYPES, gemm_emulated


def check_gemm(c: np.ndarray, a: np.ndarray, b: np.ndarray, dtype) -> None:
    """Integers: exact. Floats: within one ulp of the output type plus the worst-case
    f32 accumulation error K·2⁻²⁴·(|a| @ |b|ᵀ), so a missing or doubled k-step fails."""
    af, bf = a.astype(np.float64), b.astype(np.float64)
    ref = af @ bf.T
    if dtype == i8:
        assert c.dtype == np.int32 and np.array_equal(c, ref.astype(np.int64))
        return
    assert not np.isnan(c).any(), "some outputs were never written"
    k = a.shape[1]
    bound = 2.0 ** -dtype.mantissa_bits * np.abs(ref)
    bound += k * 2.0 ** -24 * (np.abs(af) @ np.abs(bf).T)
    err = np.abs(c.astype(np.float64) - ref)
    worst = np.argmax(err - bound)
    assert np.all(err <= bound), f"error {err.flat[worst]} > bound {bound.flat[worst]}"


def operands(seed: int, m: int, n: int, k: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return random_input(rng, (m, k), dtype), random_input(rng, (n, k), dtype)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "registers"])
@pytest.mark.parametrize("dtype", GEMM_DTYPES, ids=str)
def test_gemm_on_shapes_that_do_not_divide_the_tiles(dtype, shared):
    a, b = operands(GEMM_DTYPES.index(dtype) + 10 * shared, 97, 130, 72, dtype)
    check_gemm(gemm_emulated(a, b, dtype, shared=shared, BM=64, BN=64), a, b, dtype)


@pytest.mark.parametrize("dtype,shared", [(f16, True), (bf16, False), (i8, True), (i8, False)],
                         ids=["f16-shared", "bf16-registers", "i8-shared", "i8-registers"])
def test_gemm_256x256x512_with_default_tiles(dtype, shared):
    a, b = operands(20 + GEMM_DTYPES.index(dtype), 256, 256, 512, dtype)
    check_gemm(gemm_emulated(a, b, dtype, shared=shared), a, b, dtype)


@pytest.mark.parametrize("dtype,tiles", [
    (f16, dict(BM=64, BN=128, BK=16, STAGES=2)),
    (bf16, dict(BM=128, BN=64, BK=64, STAGES=4)),
    (i8, dict(BM=64, BN=32, BK=32, STAGES=2)),
], ids=["f16-64x128x16x2", "bf16-128x64x64x4", "i8-64x32x32x2"])
def test_gemm_other_tile_configurations(dtype, tiles):
    a, b = operands(30 + GEMM_DTYPES.index(dtype), 130, 60, 140, dtype)
    check_gemm(gemm_emulated(a, b, dtype, **tiles), a, b, dtype)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "registers"])
def test_gemm_smaller_than_one_tile(shared):
    """Every row, column and k-step is a boundary: 5x7x40 inside one 64x64 tile."""
    a, b = operands(40 + shared, 5, 7, 40, f16)
    check_gemm(gemm_emulated(a, b, f16, shared=shared, BM=64, BN=64), a, b, f16)


@pytest.mark.parametrize("dtype", GEMM_DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k,split", [(70, 130, 300, 2), (16, 128, 512, 4), (5, 200, 130, 3)])
def test_split_k_gemm_sums_every_k_tile_once(dtype, m, n, k, split):
    """K split 2-4 ways, including splits whose last k-tiles fall past K (130 = 3 tiles
    of 64 split 3 ways leaves one split a single partial tile)."""
    a, b = operands(40 + split + GEMM_DTYPES.index(dtype), m, n, k, dtype)
    check_gemm(gemm_emulated(a, b, dtype, split=split), a, b, dtype)
