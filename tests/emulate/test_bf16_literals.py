"""bf16 values keep their shape through the emulator's rounding (found by tegula.fuzz: a
bf16 number was a 1-element array, not a scalar, so assigning it under a per-thread
predicate — the fill of a global->shared cp.async copy at a ragged edge — crashed the
emulator with an IndexError)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import ALL_DTYPES, bf16, f8e4m3, f8e5m2, f16, f32
from tegula.emulate.values import round_to


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if not d.is_packed], ids=str)
@pytest.mark.parametrize("shape", [(), (1,), (3, 2)])
def test_rounding_keeps_the_shape(dtype, shape):
    assert round_to(np.full(shape, 1.5), dtype).shape == shape


@pytest.mark.parametrize("dtype", [bf16, f16, f32, f8e4m3, f8e5m2], ids=str)
@pytest.mark.parametrize("threads,rows", [(32, 1), (64, 3), (128, 5)])
def test_shared_copy_fill_at_a_ragged_edge(dtype, threads, rows):
    @tg.kernel(threads=threads)
    def column_sums(x: tg.Tensor[dtype], out: tg.Tensor[f32], BM: tg.constexpr = 8,
                    BN: tg.constexpr = 48):
        s = tg.shared((BM, BN), dtype)
        tg.copy(x.tile((BM, BN), (0, 0)), s, fill=2.0)   # rows past the edge read 2.0
        t = tg.load(s).to(f32)
        tg.copy(tg.sum(t, 0), out.tile((1, BN), (0, 0)))

    rng = np.random.default_rng(rows)
    x = round_to(rng.integers(-4, 5, (rows, 48)).astype(np.float32), dtype)
    out = np.zeros((1, 48), np.float32)
    tg.emulate(column_sums, (1,), x, out)
    expected = x.astype(np.float64).sum(axis=0) + 2.0 * (8 - rows)
    assert np.array_equal(out[0], expected)
