"""RMSNorm in the emulator against a float64 numpy reference."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f32
from tegula.kernels.common import random_input
from tegula.kernels.norm import RMS_NORM_DTYPES, rms_norm_emulated


def reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    xf = x.astype(np.float64)
    return xf / np.sqrt((xf * xf).mean(axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def check_close(out: np.ndarray, ref: np.ndarray, dtype) -> None:
    """Every element within two ulps of `dtype` (one for the f32 math, one for rounding)."""
    assert not np.isnan(out).any(), "some outputs were never written"
    rtol = 2 * max(2.0 ** -dtype.mantissa_bits, 2.0 ** -21)
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= 1e-6 + rtol * np.abs(ref)), f"max error {err.max()}"


@pytest.mark.parametrize("dtype", RMS_NORM_DTYPES, ids=str)
@pytest.mark.parametrize("shape,seed", [((37, 300), 1), ((5, 1000), 2), ((64, 64), 3)])
def test_rms_norm_matches_numpy(dtype, shape, seed):
    rng = np.random.default_rng(seed + 5 * RMS_NORM_DTYPES.index(dtype))
    x, w = random_input(rng, shape, dtype, 3.0), random_input(rng, shape[1:], dtype)
    check_close(rms_norm_emulated(x, w, 1e-5, dtype), reference(x, w, 1e-5), dtype)


def test_rms_norm_eps_matters_for_small_rows():
    """Rows of tiny values: eps dominates the mean square, so a dropped eps shows."""
    rng = np.random.default_rng(9)
    x, w = random_input(rng, (6, 130), f32, 1e-3), random_input(rng, (130,), f32)
    check_close(rms_norm_emulated(x, w, eps=1e-4), reference(x, w, 1e-4), f32)
    assert not np.allclose(reference(x, w, 1e-4), reference(x, w, 0.0), rtol=1e-2)


def test_rms_norm_one_row_per_block_and_rank_3():
    rng = np.random.default_rng(10)
    x, w = random_input(rng, (2, 3, 700), bf16, 2.0), random_input(rng, (700,), bf16)
    out = rms_norm_emulated(x, w, 1e-6, bf16, BM=1)
    assert out.shape == x.shape
    check_close(out, reference(x, w, 1e-6), bf16)


@pytest.mark.parametrize("dtype", RMS_NORM_DTYPES, ids=str)
@pytest.mark.parametrize("shape,tiles,seed", [
    ((5, 3000), {}, 21),                          # two chunks, the last one ragged
    ((3, 20000), {"BM": 2, "BN": 4096}, 22),      # rows past the one-tile limit
    ((37, 100), {"BM": 4, "BN": 256}, 23),        # one chunk, ragged rows and columns
])
def test_looped_rms_norm_matches_numpy_on_rows_of_any_length(dtype, shape, tiles, seed):
    rng = np.random.default_rng(seed)
    x = random_input(rng, shape, dtype, 2.0)
    w = random_input(rng, (shape[1],), dtype, 1.0)
    out = rms_norm_emulated(x, w, 1e-5, dtype, looped=True, **tiles)
    check_close(out, reference(x, w, 1e-5), dtype)
