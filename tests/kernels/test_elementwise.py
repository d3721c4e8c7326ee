"""Fused SiLU(x)·y in the emulator against numpy (float64 reference, one-ulp tolerance)."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import f32
from tegula.kernels.common import random_input
from tegula.kernels.elementwise import SILU_MUL_DTYPES, silu_mul_emulated


def reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float64)
    return xf / (1.0 + np.exp(-xf)) * y.astype(np.float64)


def check_close(out: np.ndarray, ref: np.ndarray, dtype) -> None:
    """Every element within one unit in the last place of `dtype` (f32: within 1e-6,
    a few ulps of the f32 arithmetic the kernel does)."""
    assert not np.isnan(out).any(), "some outputs were never written"
    ulp = max(2.0 ** -dtype.mantissa_bits, 1e-6)
    err = np.abs(out.astype(np.float64) - ref)
    bound = 1e-6 + ulp * np.abs(ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), f"max error {err.max()} (worst excess at {worst})"


@pytest.mark.parametrize("dtype", SILU_MUL_DTYPES, ids=str)
@pytest.mark.parametrize("shape,seed", [((37, 300), 1), ((3, 1000), 2), ((130, 17), 3)])
def test_silu_mul_matches_numpy(dtype, shape, seed):
    rng = np.random.default_rng(seed * 10 + SILU_MUL_DTYPES.index(dtype))
    x, y = random_input(rng, shape, dtype, 4.0), random_input(rng, shape, dtype)
    check_close(silu_mul_emulated(x, y, dtype), reference(x, y), dtype)


def test_silu_mul_other_tiles_and_rank_3():
    rng = np.random.default_rng(11)
    x, y = random_input(rng, (2, 21, 70), f32, 4.0), random_input(rng, (2, 21, 70), f32)
    out = silu_mul_emulated(x, y, BM=8, BN=32)
    assert out.shape == x.shape
    check_close(out, reference(x, y), f32)
