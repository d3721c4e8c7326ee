"""matmul's persistent candidates on sm_90a come from the search (`tg.recommend` over the
tile width, stages and cluster shape, scored by the cost model), not from a fixed list:
a change in what the model predicts changes what the entry point times."""
from __future__ import annotations

import pytest

from tegula.kernels import api as _api
from tegula.kernels.api_matmul import PERSISTENT, gemm_candidates, searched_persistent
from tegula.synth import cost


@pytest.fixture
def fresh_search():
    searched_persistent.cache_clear()
    _api._configs.cache_clear()          # the tuner's candidate lists, built from it
    yield
    searched_persistent.cache_clear()
    _api._configs.cache_clear()


def test_the_search_reproduces_the_measured_best_at_large_shapes(fresh_search):
    # 128x256x64 in 4 stages, alone and in 2-block clusters: the H100's best measured
    # (session 8), found by the cost model.
    assert searched_persistent(4096, 4096, 4096) == PERSISTENT
    large = gemm_candidates(4096, 4096, 4096, hopper=True)
    assert large[:len(PERSISTENT)] == PERSISTENT


def test_narrower_tiles_where_wide_ones_leave_sms_idle(fresh_search):
    # 512 x 4096 in 128x256 tiles is 64 tiles for 132 SMs; 128x128 makes 128.
    found = searched_persistent(512, 4096, 4096)
    assert [c["BN"] for c in found] == [128, 128]
    assert gemm_candidates(512, 4096, 4096, hopper=True)[:2] == found


def test_the_entry_point_follows_the_cluster_decision(fresh_search, monkeypatch):
    # Were a cluster's coupling far dearer, the search would drop clusters of 2, and so
    # would the configurations matmul times.
    monkeypatch.setattr(cost, "CLUSTER_COUPLING_CYCLES", 5000)
    found = gemm_candidates(4096, 4096, 4096, hopper=True)
    persistent = [c for c in found if c["kernel"] == "persistent"]
    assert persistent[0] == PERSISTENT[0]
    assert not any(c.get("CLUSTER", 1) > 1 for c in persistent)
    assert persistent[1] == dict(PERSISTENT[0], STAGES=3)
