"""Tile recommendation (`tegula/recommend.py`): open constexprs, deterministic ranking by
the cost model independent of enumeration order, limits with reasons, a visible budget,
grid inference, `tg.constexpr(choices=)` and `tegula explain --recommend`."""
from __future__ import annotations

import os
import sys

import pytest

import tegula as tg
from tegula import f16, f32
from tegula.cli import main
from tegula.errors import TegulaError, TraceError
from tegula.recommend import DEFAULT_VALUES, combinations, infer_grid, open_constexprs, recommend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemm_fixtures import readme_gemm  # noqa: E402

SHAPES = {"a": (1000, 4096), "b": (3000, 4096), "c": (1000, 3000)}


def make_gemm(bm_choices, bn_choices):
    return readme_gemm(bm_choices=bm_choices, bn_choices=bn_choices)


@tg.kernel(threads=128)
def scale(x: tg.Tensor[f16], y: tg.Tensor[f16], BM: tg.constexpr, BN: tg.constexpr = 64):
    m, n = tg.block_id(0), tg.block_id(1)
    t = tg.load(x.tile((BM, BN), (m, n)))
    tg.copy((t.to(f32) * 2.0).to(f16), y.tile((BM, BN), (m, n)))


@pytest.fixture(scope="module")
def ranked():
    return recommend(make_gemm((64, 128), (64, 128, 256)), shapes=SHAPES, top_k=3)


def test_ranking_is_by_predicted_time_and_drops_what_does_not_fit(ranked):
    assert ranked.open_names == ("BM", "BN") and ranked.combinations == 6
    seconds = [c.seconds for c in ranked.ranked]
    assert seconds == sorted(seconds) and all(s > 0 for s in seconds)
    # 128x256 on sm_90a at 128 threads: 256 accumulator words per consumer thread.
    assert [c.config for c in ranked.dropped] == [{"BM": 128, "BN": 256}]
    assert "registers per thread estimated from liveness, over 255" in ranked.dropped[0].dropped
    assert ranked.best == ranked.ranked[0].config
    # every combination once, plus the cp.async branch of each that took TMA
    combos = [c for c in ranked.ranked + ranked.dropped
              if c.config.get("load_path") != "cp.async"]
    assert len(combos) == 6
    branches = [c for c in ranked.ranked + ranked.dropped + ranked.pruned
                if c.config.get("load_path") == "cp.async"]
    assert {tuple(sorted((k, v) for k, v in c.config.items() if k != "load_path"))
            for c in branches} == {tuple(sorted((k, v) for k, v in c.config.items()
                                               if k != "load_path"))
                                   for c in combos if c.uses_tma}


def test_report_lists_top_k_and_why_each_other_lost(ranked):
    text = str(ranked)
    assert "open BM, BN; 6 combination(s), 6 scored" in text
    for i, c in enumerate(ranked.top, 1):
        assert f"  {i}. {c.key}: {c.seconds * 1e6:.2f} us predicted" in text
    assert f"the other {len(ranked.ranked) - 3} that fit, and why they lost:" in text
    for c in ranked.ranked[3:]:
        assert c.key in text and ("slower than #1" in text or "tied with #1" in text)
    assert "dropped (1):\n    BM=128,BN=256: " in text


def test_result_is_independent_of_the_order_choices_are_listed(ranked):
    again = recommend(make_gemm((128, 64), (256, 64, 128)), shapes=SHAPES, top_k=3)
    assert [c.config for c in again.ranked] == [c.config for c in ranked.ranked]
    assert [c.seconds for c in again.ranked] == [c.seconds for c in ranked.ranked]
    assert str(again) == str(ranked)


def test_shared_memory_limit_is_a_reason():
    found = recommend(make_gemm((256,), (256,)), shapes=SHAPES, target="sm_80", BK=64)
    assert not found.ranked and len(found.dropped) == 1
    assert "more than the 166912 bytes a block may use on sm_80" in found.dropped[0].dropped
    assert "no combination fits" in str(found)


def test_budget_truncates_evenly_and_says_so():
    values = {"A": (1, 2, 3), "B": (10, 20, 30, 40)}
    combos, total = combinations(values, 5)
    assert total == 12 and len(combos) == 5
    assert combos[0] == {"A": 1, "B": 10} and combos[-1]["A"] == 3   # spread over the space
    every, _ = combinations(values, 100)
    assert len(every) == 12 and len({tuple(c.values()) for c in every}) == 12
    found = recommend(scale, shapes={"x": (500, 300), "y": (500, 300)}, budget=2)
    assert found.combinations == len(DEFAULT_VALUES) and found.not_tried == 3
    assert "budget: 3 combination(s) not tried" in str(found)


def test_no_default_means_open_with_default_values():
    values, assumed = open_constexprs(scale, {})
    assert values == {"BM": DEFAULT_VALUES} and assumed == ("BM",)
    assert open_constexprs(scale, {"BM": 32}) == ({}, ())
    values, _ = open_constexprs(scale, {}, space={"BN": [128, 32], "threads": [256, 128]})
    assert values["BN"] == (32, 128) and values["threads"] == (128, 256)
    with pytest.raises(TegulaError, match="space names BX, which are not open constexprs"):
        open_constexprs(scale, {}, space={"BX": [1]})


def test_grid_is_inferred_from_the_output_tiles():
    traced = scale.trace(BM=32, BN=64)
    assert infer_grid(traced, {"x": (500, 300), "y": (500, 300)}) == (16, 5, 1)
    found = recommend(scale, shapes={"x": (500, 300), "y": (500, 300)}, BN=64)
    by_bm = {c.config["BM"]: c.estimate.blocks for c in found.ranked}
    assert by_bm[16] == 32 * 5 and by_bm[256] == 2 * 5
    explicit = recommend(scale, shapes={"x": (500, 300), "y": (500, 300)}, BN=64,
                         grid=lambda meta: (-(-500 // meta["BM"]), 5))
    assert [c.seconds for c in explicit.ranked] == [c.seconds for c in found.ranked]


def test_missing_shapes_are_named():
    with pytest.raises(TegulaError, match="no shape for y"):
        recommend(scale, shapes={"x": (64, 64)})


def test_declared_choices_are_checked():
    gemm = make_gemm((64, 128), (64,))
    with pytest.raises(TraceError, match="BM=96 is not one of its declared choices"):
        gemm.trace(BM=96)
    with pytest.raises(TraceError, match="its default 32 is not one of its choices"):
        @tg.kernel
        def bad(x: tg.Tensor[f16], BM: tg.constexpr(choices=(64, 128)) = 32):
            pass
    with pytest.raises(TraceError, match="takes a non-empty list"):
        tg.constexpr(choices=())


def test_cli_recommend(tmp_path, capsys):
    path = tmp_path / "k.py"
    path.write_text(
        "import tegula as tg\nfrom tegula import f16, f32\n\n"
        "@tg.kernel(threads=128)\n"
        "def scale(x: tg.Tensor[f16], y: tg.Tensor[f16],\n"
        "          BM: tg.constexpr(choices=(16, 64)), BN: tg.constexpr = 64):\n"
        "    m, n = tg.block_id(0), tg.block_id(1)\n"
        "    t = tg.load(x.tile((BM, BN), (m, n)))\n"
        "    tg.copy((t.to(f32) * 2.0).to(f16), y.tile((BM, BN), (m, n)))\n")
    assert main(["explain", f"{path}:scale", "--recommend", "--shape", "x=500x300",
                 "--shape", "y=500x300", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "recommendation for scale on sm_90a: open BM; 2 combination(s)" in out
    assert "  1. BM=" in out and "the other 1 that fit, and why they lost:" in out
    assert main(["explain", f"{path}:scale", "--recommend", "--shape", "x=500x300"]) == 2
    assert "no shape for y" in capsys.readouterr().err
