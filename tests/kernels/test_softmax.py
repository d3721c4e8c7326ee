"""Row softmax in the emulator against a float64 numpy reference."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import f16, f32
from tegula.kernels.common import random_input
from tegula.kernels.softmax import SOFTMAX_DTYPES, softmax_config, softmax_emulated


def reference(x: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float64)
    e = np.exp(xf - xf.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def check_close(out: np.ndarray, ref: np.ndarray, dtype) -> None:
    """Every element within two ulps of `dtype` (one for the f32 math, one for rounding)."""
    assert not np.isnan(out).any(), "some outputs were never written"
    rtol = 2 * max(2.0 ** -dtype.mantissa_bits, 2.0 ** -21)
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= 1e-7 + rtol * ref), f"max error {err.max()}"


@pytest.mark.parametrize("dtype", SOFTMAX_DTYPES, ids=str)
@pytest.mark.parametrize("shape,seed", [((37, 300), 1), ((5, 1000), 2), ((64, 64), 3)])
def test_softmax_matches_numpy(dtype, shape, seed):
    x = random_input(np.random.default_rng(seed + 7 * SOFTMAX_DTYPES.index(dtype)), shape,
                     dtype, 3.0)
    check_close(softmax_emulated(x, dtype), reference(x), dtype)


def test_softmax_of_large_values_subtracts_the_row_max():
    """exp(x) alone would overflow f32 at these magnitudes."""
    x = random_input(np.random.default_rng(4), (9, 200), f32, 200.0)
    check_close(softmax_emulated(x), reference(x), f32)


def test_softmax_with_one_row_per_block_spanning_all_warps():
    """BM=1: each row is reduced across all four warps through shared memory."""
    x = random_input(np.random.default_rng(5), (3, 2, 700), f16, 2.0)
    assert softmax_config((6, 700), BM=1)[1] == dict(BM=1, BN=1024)
    out = softmax_emulated(x, BM=1)
    assert out.shape == x.shape
    check_close(out, reference(x), f16)


@pytest.mark.parametrize("dtype", SOFTMAX_DTYPES, ids=str)
@pytest.mark.parametrize("shape,tiles,seed", [
    ((5, 3000), {}, 11),                         # three chunks, the last one ragged
    ((3, 20000), {"BM": 2, "BN": 2048}, 12),      # rows past the one-tile limit
    ((37, 100), {"BM": 4, "BN": 256}, 13),        # one chunk, ragged rows and columns
])
def test_looped_softmax_matches_numpy_on_rows_of_any_length(dtype, shape, tiles, seed):
    x = random_input(np.random.default_rng(seed), shape, dtype, 3.0)
    y = softmax_emulated(x, dtype, looped=True, **tiles)
    check_close(y, reference(x), dtype)
