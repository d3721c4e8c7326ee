"""benchmarks/cost_model_check.py's bookkeeping (no GPU): points read back from a run's
text output, and the decisions table that says whether the model's load path, cluster
shape or orientation is the GPU's."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cost_model_check",
                                               ROOT / "benchmarks" / "cost_model_check.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def _point(family, shape, config, predicted, measured, spread=0.01):
    return dict(family=family, shape=shape, config=config, predicted_us=predicted,
                measured_us=measured, spread=spread, bound="L2")


def test_points_come_back_from_the_printed_lines():
    points = [_point("gemm sm_90a load path", [64, 64, 64], {"BM": 64, "load_path": "tma"},
                     1.5, 2.5),
              dict(family="gemm sm_90a", shape=[1, 2, 3], config={"BM": 64}, dropped="why")]
    text = "precompiled 2\n" + "\n".join(check._point_line(p) for p in points) + "\ntable"
    assert check.points_from_text(text) == points


def test_decisions_compare_the_models_choice_with_the_gpus():
    cluster = "persistent gemm sm_90a cluster"
    orient = "gemm sm_90a orientation"
    points = [  # cluster: the model keeps 1 where the GPU ran 2 faster (beyond the noise)
        _point(cluster, [4096] * 3, {"BN": 256, "CLUSTER": 1}, 100, 100),
        _point(cluster, [4096] * 3, {"BN": 256, "CLUSTER": 2}, 110, 90),
        # and agrees on another config, within 1% (in the noise)
        _point(cluster, [4096] * 3, {"BN": 128, "CLUSTER": 1}, 120, 121),
        _point(cluster, [4096] * 3, {"BN": 128, "CLUSTER": 2}, 130, 120),
        # orientation: a shape and its transpose, the same config
        _point(orient, [16, 4096, 4096], {"BM": 64, "BN": 16}, 20, 30),
        _point(orient, [4096, 16, 4096], {"BM": 64, "BN": 16}, 15, 20)]
    rows = {r["decision"]: r for r in check.decision_rows(points)}
    assert rows["CLUSTER"] == dict(decision="CLUSTER", problem=[4096] * 3, compared=2,
                                   agree=0, within_noise=1, pick_choice="1",
                                   best_choice="2", pick_over_best=pytest.approx(100 / 90))
    assert rows["orientation"]["problem"] == [16, 4096, 4096]
    assert (rows["orientation"]["agree"], rows["orientation"]["pick_choice"],
            rows["orientation"]["best_choice"]) == (1, "Cᵀ", "Cᵀ")


def test_spearman_ranks_ties_by_their_mean_rank_whatever_the_order():
    """The model predicts many row-kernel configurations at one DRAM floor: tied, not
    ordered by their place in the list (session 11's fix of the statistic)."""
    predicted, measured = [1.0, 1.0, 2.0, 3.0], [4.0, 1.0, 2.0, 3.0]
    value = check.spearman(predicted, measured)
    assert value == pytest.approx(check.spearman(predicted[::-1], measured[::-1]))
    assert list(check.average_ranks([5.0, 1.0, 5.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]
    assert check.spearman([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]) == pytest.approx(1.0)
