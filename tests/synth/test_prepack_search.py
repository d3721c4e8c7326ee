"""The pre-packed layout of a constant operand as a search coordinate
(`tegula/kernels/prepack_search.py` over `tegula.recommend.recommend_plans`): W4A16's
weights stored plain or in the MMA fragment's order, every plan of both layouts in one
ranking by the cost model, multi-launch plans scored as the sum of their launches,
deterministic, bounded, budgeted, and shown by `tegula explain --w4a16`."""
from __future__ import annotations

import pytest

from tegula.cli import main
from tegula.kernels.prepack_search import (WEIGHT_LAYOUTS, recommend_w4a16_layout,
                                           w4a16_layout_plans)
from tegula.kernels.quant import fragment_candidates, w4a16_candidates
from tegula.recommend import recommend_plans, score, shapes_of

M, N, K = 16, 1024, 1024


@pytest.fixture(scope="module")
def plans():
    return w4a16_layout_plans(M, N, K, group_size=128)


@pytest.fixture(scope="module")
def ranked(plans):
    return recommend_plans("w4a16", "w_layout", plans, top_k=100)


def test_both_layouts_are_planned_as_matmul_w4a16_times_them(plans):
    assert tuple(plans) == WEIGHT_LAYOUTS
    assert [c for c, _ in plans["plain"]] == w4a16_candidates(M, 128)
    assert [c for c, _ in plans["fragment"]] == fragment_candidates(M, N, K)
    names = {launches[0].kernel.name for _, launches in plans["fragment"]}
    assert names == {"w4a16_fragment"}
    split = [launches for config, launches in plans["fragment"] if config.get("SPLIT", 1) > 1]
    assert split and all(len(ls) == 2 and ls[1].kernel.name == "w4a16_split_sum"
                         for ls in split)


def test_one_ranking_over_both_layouts_by_predicted_time(ranked):
    layouts = {c.config["w_layout"] for c in ranked.ranked}
    assert layouts == set(WEIGHT_LAYOUTS)
    times = [c.seconds for c in ranked.ranked]
    assert times == sorted(times) and ranked.open_names == ("w_layout",)
    assert ranked.combinations == (len(w4a16_candidates(M, 128))
                                   + len(fragment_candidates(M, N, K)))
    assert "w_layout='fragment'" in str(ranked) and "w_layout='plain'" in str(ranked)


def test_a_plan_costs_the_sum_of_its_launches(plans, ranked):
    config, launches = next((c, ls) for c, ls in plans["fragment"] if len(ls) == 2)
    each = []
    for launch in launches:
        shapes, scalars = shapes_of(launch.kernel, launch.args, None)
        each.append(score(launch.kernel, launch.constexprs, {}, shapes, scalars,
                          launch.grid, "sm_90a").seconds)
    found = next(c for c in ranked.ranked if c.config == {"w_layout": "fragment", **config})
    assert found.seconds == pytest.approx(sum(each)) and min(each) > 0
    assert "+ 1 more launch(es)" in found.launches


def test_independent_of_the_order_plans_are_listed(plans, ranked):
    shuffled = {layout: list(reversed(plans[layout])) for layout in reversed(list(plans))}
    again = recommend_plans("w4a16", "w_layout", shuffled, top_k=100)
    assert [(c.key, c.seconds) for c in again.ranked] == \
        [(c.key, c.seconds) for c in ranked.ranked]


def test_the_bound_prunes_only_plans_that_could_not_be_in_the_top_k(plans):
    # Values whose plans move 256x the weight bytes: their DRAM floor alone exceeds the
    # small product's best time, so they are pruned unbuilt past their first launch; the
    # top 1 is the exhaustive search's.
    mixed = {"a-small": plans["fragment"],
             "b-huge": w4a16_layout_plans(M, 16 * N, 16 * K, group_size=128)["fragment"]}
    exhaustive = recommend_plans("w4a16", "choice", mixed, top_k=100)
    bounded = recommend_plans("w4a16", "choice", mixed, top_k=1)
    assert bounded.best == exhaustive.best and not exhaustive.pruned
    assert bounded.pruned
    exact = {c.key: c.seconds for c in exhaustive.ranked}
    for c in bounded.pruned:
        assert c.dropped.startswith("pruned") and exact[c.key] > exhaustive.ranked[0].seconds
    assert "pruned by the bound" in str(bounded)


def test_budget_is_visible(plans):
    small = recommend_plans("w4a16", "w_layout", plans, top_k=2, budget=3)
    total = sum(len(v) for v in plans.values())
    assert small.not_tried == total - 3
    assert len(small.ranked) + len(small.dropped) + len(small.pruned) == 3
    assert f"{total - 3} combination(s) not tried" in str(small)


@pytest.mark.parametrize("m, n, k, layout", [
    # H100, session 8 round 2 (docs/performance.md): at one token the rows kernel on plain
    # weights (11.2 us) beat the fragment kernel (16.6 us); at 64 x 4096 x 4096 the
    # fragment kernel (21.0 us) beat the best plain one (32.5 us).
    (1, 4096, 4096, "plain"), (64, 4096, 4096, "fragment")])
def test_decision_follows_the_model_where_it_agrees_with_the_gpu(m, n, k, layout):
    assert recommend_w4a16_layout(m, n, k, top_k=1).best["w_layout"] == layout


def test_bad_group_size_is_named():
    with pytest.raises(ValueError, match="group_size must be one of"):
        w4a16_layout_plans(16, 256, 256, group_size=100)


def test_cli(capsys):
    assert main(["explain", "--w4a16", f"{M}x{N}x{K}", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "open w_layout" in out and "1. " in out and "2. " in out
    assert main(["explain", "--w4a16", "16x4096"]) == 2
    assert main(["explain"]) == 2
    err = capsys.readouterr().err
    assert "expected MxNxK" in err and "give FILE.py:KERNEL" in err
