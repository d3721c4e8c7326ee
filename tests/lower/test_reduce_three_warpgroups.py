"""Reductions on a block of three warpgroups (384 threads, e.g. the attention forward's
192-row query blocks): a thread count that is not a power of two is allowed in whole
warpgroups, where the reduction combines only along thread bits every thread has a
partner on; any other reduction is refused at the user's line, not lowered wrong."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.errors import TegulaError


@tg.kernel(threads=384)
def row_max_and_sum(x: tg.Tensor[f32], top: tg.Tensor[f32], total: tg.Tensor[f32],
                    BM: tg.constexpr = 192, BN: tg.constexpr = 64):
    t = tg.load(x.tile((BM, BN), (0, 0)))
    tg.copy(tg.max(t, 1), top.tile((BM, 1), (0, 0)))
    tg.copy(tg.sum(t, 1), total.tile((BM, 1), (0, 0)))


@tg.kernel(threads=384)
def column_sum(x: tg.Tensor[f32], out: tg.Tensor[f32], BM: tg.constexpr = 192,
               BN: tg.constexpr = 64):
    t = tg.load(x.tile((BM, BN), (0, 0)))
    tg.copy(tg.sum(t, 0), out.tile((1, BN), (0, 0)))


def test_row_reductions_of_three_warpgroups_match_numpy():
    x = np.random.default_rng(3).standard_normal((190, 61)).astype(np.float32)  # ragged
    top = np.full((190, 1), np.nan, np.float32)
    total = np.full((190, 1), np.nan, np.float32)
    tg.emulate(row_max_and_sum, (1,), x, top, total)
    np.testing.assert_array_equal(top[:, 0], x.max(axis=1))
    np.testing.assert_allclose(total[:, 0], x.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_a_reduction_across_warpgroups_is_refused_at_its_line():
    x = np.ones((192, 64), np.float32)
    out = np.zeros((1, 64), np.float32)
    with pytest.raises(TegulaError, match="power-of-two thread count, not 384") as info:
        tg.emulate(column_sum, (1,), x, out)
    assert "tg.sum(t, 0)" in info.value.loc.line
