"""Rough edges a new user hit (issue 14): each message points at the user's own line and
says what to write instead."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.errors import TraceError


@tg.kernel(threads=64)
def needs_bm(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr, BN: tg.constexpr = 64):
    t = tg.load(x.tile((BM, BN), (tg.block_id(0), 0)))
    tg.copy(t, y.tile((BM, BN), (tg.block_id(0), 0)))


@tg.kernel(threads=64)
def python_loop(x: tg.Tensor[f32], y: tg.Tensor[f32], BN: tg.constexpr = 64):
    xs = x.tile((1, BN), (tg.block_id(0), None))
    for k in range(xs.shape[2]):  # a run-time trip count: needs tg.range
        tg.copy(tg.load(xs[:, :, k]), y.tile((1, BN), (tg.block_id(0), k)))


def _arrays():
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    return x, np.full_like(x, np.nan)


def test_missing_constexpr_points_at_the_users_call():
    x, y = _arrays()
    with pytest.raises(TraceError) as info:
        tg.emulate(needs_bm, (4,), x, y)  # the line the error must name
    err = info.value
    assert "constexpr 'BM' has no default" in str(err) and "BM=..." in str(err)
    assert err.loc.filename == os.path.abspath(__file__)
    assert "tg.emulate(needs_bm" in err.loc.line


def test_unknown_constexpr_points_at_the_users_call():
    with pytest.raises(TraceError, match="'BK' is not a parameter") as info:
        needs_bm.trace(BM=1, BK=3)
    assert info.value.loc.filename == os.path.abspath(__file__)
    assert "needs_bm.trace(BM=1, BK=3)" in info.value.loc.line


def test_python_for_over_a_runtime_extent_suggests_tg_range():
    x, y = _arrays()
    with pytest.raises(TraceError, match=r"for k in tg\.range") as info:
        tg.emulate(python_loop, (4,), x, y)
    assert "for k in range(xs.shape[2])" in info.value.loc.line


def test_python_m_tegula_works_like_the_command():
    done = subprocess.run([sys.executable, "-m", "tegula", "layout", "(4,2):(2,1)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "size 8, cosize 8" in done.stdout
    done = subprocess.run([sys.executable, "-m", "tegula", "layout", "banana"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("tegula: error: ")
