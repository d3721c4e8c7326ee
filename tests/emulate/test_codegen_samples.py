"""The code generator's sample kernels (tegula.codegen.samples) against their numpy
references: the emulator and the CUDA emitter read the same thread IR."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f16
from tegula.emulate import round_to, run_thread_kernel

samples = pytest.importorskip("tegula.codegen.samples")
RNG = np.random.default_rng(3)


def test_vector_copy():
    x = RNG.standard_normal(1000).astype(np.float16)
    y = np.zeros_like(x)
    run_thread_kernel(samples.vector_copy(), (1,), {"x": x, "y": y})
    assert np.array_equal(x, y)


def test_shared_transpose():
    x = RNG.standard_normal((45, 70)).astype(np.float32)
    y = np.zeros((70, 45), np.float32)
    run_thread_kernel(samples.shared_transpose(), (3, 2), {"x": x, "y": y})
    assert np.array_equal(x.T, y)


def test_cp_async_pipeline():
    x = RNG.standard_normal((64, 64 * 5)).astype(np.float16)
    y = np.zeros((64, 64), np.float32)
    run_thread_kernel(samples.cp_async_pipeline(), (1,), {"x": x, "y": y})
    np.testing.assert_allclose(y, x.astype(np.float32).reshape(64, 5, 64).sum(1), atol=1e-4)


@pytest.mark.parametrize("dt", [f16, bf16])
def test_mma_ldmatrix(dt):
    a = round_to(RNG.standard_normal((16, 16)), dt)
    b = round_to(RNG.standard_normal((8, 16)), dt)
    c = np.zeros((16, 8), np.float32)
    run_thread_kernel(samples.mma_ldmatrix(dt), (1,), {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64).T, atol=1e-5)


def test_warp_sum_of_squares():
    x = RNG.standard_normal(1000).astype(np.float16)
    out = np.zeros(1, np.float32)
    run_thread_kernel(samples.warp_sum_of_squares(), (4,), {"x": x, "out": out})
    np.testing.assert_allclose(out[0], (x.astype(np.float64) ** 2).sum(), rtol=1e-5)
