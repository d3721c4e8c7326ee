"""Runs without a GPU: the one GPU-vs-emulator comparison (`gpu_helpers.assert_matches_emulator`)
accepts what FMA contraction does to `x * w + b - rowmax` and nothing much larger.

The "GPU" result is simulated on the host: the product x*w is exact in float64 (24 + 24
bits), so rounding x*w + b once to f32 is what one FMA computes."""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import f32, i8

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "emulate"))
from gpu_helpers import assert_matches_emulator  # noqa: E402
from index_kernels import broadcast_case  # noqa: E402


def _emulated_and_fused():
    rng = np.random.default_rng(zlib.crc32(b"fma"))
    kernel, grid, (x, w, b), outs, constexprs, _ = broadcast_case(rng, (37, 100), 64, 8, 128)
    tg.emulate(kernel, grid, x, w, b, *outs, **constexprs)
    biggest = x.max(axis=1)[:, None]
    fused = (x.astype(np.float64) * w[None, :] + b[:, None]).astype(np.float32) - biggest
    bound = np.abs(x * w[None, :]) + np.abs(b[:, None]) + np.abs(biggest)
    return outs[0], fused.astype(np.float32), bound


def test_contracted_multiply_add_is_within_the_bound_and_nothing_else_is():
    emulated, fused, bound = _emulated_and_fused()
    assert not np.array_equal(emulated, fused)  # the simulation does contract somewhere
    with pytest.raises(AssertionError, match="differ from the emulator"):
        assert_matches_emulator(emulated, torch.from_numpy(fused), f32)  # exact by default
    assert_matches_emulator(emulated, torch.from_numpy(fused), f32, fma_scale=bound)
    off = fused.copy()
    off[3, 7] = np.nextafter(np.float32(off[3, 7] + 4 * np.spacing(bound[3, 7])),
                             np.float32(np.inf))
    with pytest.raises(AssertionError, match=r"first at \[3, 7\]"):
        assert_matches_emulator(emulated, torch.from_numpy(off), f32, fma_scale=bound)
    off = fused.copy()
    off[0, 0] = np.nan  # a NaN the emulator does not have is never within a tolerance
    with pytest.raises(AssertionError):
        assert_matches_emulator(emulated, torch.from_numpy(off), f32, fma_scale=bound)


def test_non_f32_results_stay_bit_exact_whatever_the_scale():
    values = np.arange(-8, 8, dtype=np.int8)
    shifted = values.copy()
    shifted[5] += 1
    with pytest.raises(AssertionError, match="1 of 16"):
        assert_matches_emulator(values, torch.from_numpy(shifted), i8, fma_scale=100.0)
