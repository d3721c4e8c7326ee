"""A reduction counts each element once even where the input's layout repeats it inside
a thread (found by tegula.fuzz: a (1, BN) tile read through a transposed shared view and
also stored, summed along axis 1 and then along its size-1 axis 0, came out BN/2..4 times
too large — the in-thread fold added every repeated register)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32


def _kernel(kind: str, threads: int, bn: int):
    reduce = {"sum": tg.sum, "max": tg.max, "min": tg.min}[kind]

    @tg.kernel(threads=threads)
    def twice_reduced(x: tg.Tensor[f32], out: tg.Tensor[f32], row: tg.Tensor[f32],
                      BN: tg.constexpr = bn):
        m, n = tg.block_id(0), tg.block_id(1)
        s = tg.shared((BN, 1), f32)
        tg.copy(x.tile((BN, 1), (n, m)), s)
        t = tg.load(s.T)                     # (1, BN)
        once = reduce(t, 1)                  # (1, 1)
        twice = reduce(once, 0)              # (1, 1): a reduction over a size-1 axis
        tg.copy(twice, out.tile((1, 1), (m, n)))
        tg.copy(t, row.tile((1, BN), (m, n)))
    return twice_reduced


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("threads,bn,rows", [(32, 2, 2), (32, 8, 5), (64, 4, 4),
                                             (32, 32, 29), (128, 64, 64)])
def test_reducing_a_repeated_layout_counts_each_element_once(kind, threads, bn, rows):
    rng = np.random.default_rng(bn * threads)
    x = rng.standard_normal((rows, 1)).astype(np.float32)
    out = np.zeros((1, 1), np.float32)
    row = np.zeros((1, bn), np.float32)
    tg.emulate(_kernel(kind, threads, bn), (1, 1), x, out, row, check_coverage=False)
    padded = np.zeros(bn, np.float64)
    padded[:rows] = x[:, 0]  # out-of-bounds elements read as the fill, 0
    expected = {"sum": padded.sum(), "max": padded.max(), "min": padded.min()}[kind]
    assert out[0, 0] == pytest.approx(expected, rel=1e-6, abs=1e-6)
    assert np.array_equal(row[0, :rows], x[:, 0])
