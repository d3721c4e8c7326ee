"""The Hopper samples (`codegen/samples.py`: TMA round trip, warp-specialized wgmma GEMM)
are right in the emulator against numpy at shapes that do not divide their tiles — so the
GPU tests (`test_async_samples_gpu.py`) run kernels whose thread IR is known good, and a
GPU mismatch points at the emitter, the runtime or the hardware model."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.codegen.samples import tma_round_trip, warp_specialized_gemm
from tegula.emulate.machine import run_thread_kernel

RNG = np.random.default_rng(9)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_trip_case(rows: int, cols: int):
    """Inputs (with NaN, Inf and -Inf) and the poisoned output of the round trip."""
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    x.flat[RNG.integers(0, x.size, 3)] = [np.nan, np.inf, -np.inf]
    return x, np.full_like(x, np.nan), (cdiv(cols, 32), cdiv(rows, 64))


def gemm_case(m: int, n: int, k: int, block_n: int):
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float32)
    return a, b, c, (cdiv(n, block_n), cdiv(m, 64))


def gemm_tolerance(a, b) -> np.ndarray:
    """f16 products are exact in f32; summing K of them in f32 (in any order) is off by at
    most about K ulps of sum |a b|."""
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    return scale * a.shape[1] * 2.0 ** -23 + 1e-30


@pytest.mark.parametrize("rows, cols", [(64, 32), (70, 36), (1, 4), (130, 100)])
def test_tma_round_trip_in_emulator(rows, cols):
    x, y, grid = round_trip_case(rows, cols)
    run_thread_kernel(tma_round_trip(), grid, {"x": x, "y": y})
    np.testing.assert_array_equal(y, x + np.float32(1))  # NaN where x is NaN, nowhere else


@pytest.mark.parametrize("m, n, k, block_n", [(64, 64, 64, 64), (70, 100, 72, 64),
                                              (1, 9, 8, 64), (130, 200, 136, 128),
                                              (70, 300, 72, 256)])
def test_warp_specialized_gemm_in_emulator(m, n, k, block_n):
    a, b, c, grid = gemm_case(m, n, k, block_n)
    run_thread_kernel(warp_specialized_gemm(block_n), grid, {"a": a, "b": b, "c": c})
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.all(np.abs(c - ref) <= gemm_tolerance(a, b))  # every element, no NaN left
