"""The load path of pipelined copies into wgmma operands (TMA or cp.async) is a build
option (`load_path=`) and a decision `tg.recommend` searches by branch and bound: the
cp.async branch of a TMA build is scored only when its floor (tensor work, L2 and DRAM
bytes, which no load path can beat) is under the k-th best time so far."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.errors import TegulaError
from tegula.ir.ops import Copy, walk_ops

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from gemm import gemm  # noqa: E402  (the README GEMM)

SHAPES = {k: (4096, 4096) for k in "abc"}


def _instrs(built) -> set:
    return {op.choices.get("instr") for op in walk_ops(built.traced.body)
            if isinstance(op, Copy) and op.src.__class__.__name__ == "GlobalTile"}


def test_cp_async_load_path_keeps_the_pipeline_off_tma_and_says_why():
    default = build(gemm, dict(BM=64, BN=64, BK=64), None, "sm_90a")
    forced = build(gemm, dict(BM=64, BN=64, BK=64, load_path="cp.async"), None, "sm_90a")
    assert "tma" in _instrs(default)
    assert "tma" not in _instrs(forced) and "cp.async" in _instrs(forced)
    assert "TMA not used: the build option load_path='cp.async'" in forced.explain()


@pytest.mark.parametrize("load_path", ["tma", "cp.async"])
def test_either_load_path_computes_the_gemm(load_path):
    rng = np.random.default_rng(7)
    m, n, k = 100, 72, 200                           # no dim a multiple of its tile
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    tg.emulate(gemm, (tg.cdiv(m, 64), tg.cdiv(n, 64)), a, b, c, BM=64, BN=64, BK=64,
               load_path=load_path, target="sm_90a")
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c.astype(np.float64), ref, rtol=2e-3, atol=2e-2)


def test_a_bad_load_path_is_refused_by_name():
    with pytest.raises(TegulaError, match="load_path='vector' must be one of"):
        build(gemm, dict(load_path="vector"), None, "sm_90a")


SPACE = dict(BM=[64, 128], BN=[64, 128], BK=[64], STAGES=[2, 4])


def test_recommend_searches_the_load_path_of_tma_builds():
    result = tg.recommend(gemm, shapes=SHAPES, space=SPACE, target="sm_90a", top_k=100)
    paths = {c.config.get("load_path") for c in result.ranked}
    assert paths == {"tma", "cp.async"}                # k = 100: nothing is pruned
    assert not result.pruned
    assert "load_path='cp.async'" in str(result)


#: Visited in this order, the 128x128 tiles set a k-th best time the 256x64 tiles' floor
#: exceeds, so their cp.async branches are pruned.
PRUNED_SPACE = dict(BM=[128, 256], BN=[64, 128], BK=[64], STAGES=[2, 4])


def test_pruning_keeps_the_top_k_exact_and_is_independent_of_value_order():
    full = tg.recommend(gemm, shapes=SHAPES, space=PRUNED_SPACE, target="sm_90a", top_k=100)
    times = {c.key: c.seconds for c in full.ranked}
    runs = [tg.recommend(gemm, shapes=SHAPES, target="sm_90a", top_k=1,
                         space={name: values[::order] for name, values in PRUNED_SPACE.items()})
            for order in (1, -1)]
    for run in runs:
        assert [c.key for c in run.top] == [c.key for c in full.top[:1]]
        kth = run.top[-1].seconds
        for pruned in run.pruned:                      # could not have made the top 2
            assert pruned.config["load_path"] == "cp.async"
            assert times[pruned.key] > kth
    assert runs[0].pruned, "the bound should prune some branch of this space"
    assert [c.key for c in runs[0].pruned] == [c.key for c in runs[1].pruned]
    assert str(runs[0]) == str(runs[1])
    assert "pruned by the bound, not built" in str(runs[0])


def test_a_fixed_load_path_is_not_searched():
    result = tg.recommend(gemm, shapes=SHAPES, space=SPACE, target="sm_90a",
                          load_path="cp.async")
    assert all("load_path" not in c.config for c in result.ranked) and not result.pruned
    assert all("tma" not in _instrs(build(gemm, {**c.config, "load_path": "cp.async"},
                                          None, "sm_90a")) for c in result.top)


def _twins():
    return tg.recommend(gemm, shapes=SHAPES, target="sm_90a", top_k=100,
                        space=dict(BM=[128], BN=[256], BK=[64], STAGES=[4], threads=[256]))


def test_the_cp_async_twin_drains_its_wgmmas_and_loses():
    """Measured (H100, 2026-11-24, 4096^3): 218 us on TMA, 330 us on cp.async, whose
    k-steps wait for their wgmmas (`tests/synth/test_cost_drained.py`)."""
    result = _twins()
    twins = {c.config["load_path"]: c for c in result.ranked}
    assert set(twins) == {"tma", "cp.async"}
    assert twins["cp.async"].seconds > 1.2 * twins["tma"].seconds
    assert [c.config["load_path"] for c in result.ranked] == ["tma", "cp.async"]


def test_on_a_predicted_tie_the_tma_default_ranks_first(monkeypatch):
    from tegula.synth import cost
    monkeypatch.setattr(cost, "drained_loop_cycles", lambda *args: 0.0)  # L2-bound both
    result = _twins()
    twins = {c.config["load_path"]: c for c in result.ranked}
    assert twins["tma"].seconds == twins["cp.async"].seconds
    assert [c.config["load_path"] for c in result.ranked] == ["tma", "cp.async"]
