"""The one search over a traced program's gemm decisions (synth/search.py): a branch and
bound whose result is the exact minimum over every decision vector when the budget
allows, the same whatever order each decision's options are listed in, with a truncation
by the budget reported (by `tegula explain` too); and golden picks of the library's
kernels (what the greedy per-op planning and the pairwise chain search it replaced
picked: benchmarks/search_picks.py compared all of them, 426 builds)."""
from __future__ import annotations

import importlib
import itertools
import math
import os
import random
import sys

import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import f16
from tegula.ir.ops import Gemm, walk_ops
from tegula.synth import search
from tegula.synth.chains import gemm_chains
from tegula.synth.search import JointSearch, Option, branch_and_bound, search_plans

sys.path.insert(0, os.path.dirname(__file__))
from chain_kernels import attention_block, two_chunk_chain  # noqa: E402


def _problem(seed: int, groups: int = 4, per_group: int = 4):
    """Random options with ties in cost, a chain of couplings with conversion tables."""
    rng = random.Random(seed)
    options = [[Option({}, float(rng.choice([10, 20, 20, 30, 45])), (1, j))
                for j in range(per_group)] for _ in range(groups)]
    couplings = [(i, i + 1, f"g{i}", f"g{i + 1}") for i in range(groups - 1)]
    couplings.append((0, groups - 1, "g0", f"g{groups - 1}"))
    table = {(c[2], a.key, b.key): float(rng.choice([0, 0, 8, 25, 60]))
             for c in couplings for a in options[c[0]] for b in options[c[1]]}
    return options, couplings, lambda a, b, first, second: table[first, a.key, b.key]


def _brute_force(options, couplings, price):
    def total(vector):
        return sum(o.cost for o in vector) + sum(price(vector[i], vector[j], f, s)
                                                 for i, j, f, s in couplings)
    return min(((total(v), tuple(o.key for o in v)) for v in itertools.product(*options)))


def _sorted(options):
    return [sorted(o, key=lambda x: (x.cost, x.key)) for o in options]


def _shuffled(options, seed):
    rng = random.Random(seed)
    out = [list(o) for o in options]
    for o in out:
        rng.shuffle(o)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_search_finds_the_exact_minimum_whatever_the_order(seed):
    options, couplings, price = _problem(seed)
    expected = _brute_force(options, couplings, price)
    outcomes = set()
    for shuffle in range(4):
        chosen, record = branch_and_bound(_sorted(_shuffled(options, shuffle)), couplings,
                                          price, budget=10_000)
        keys = tuple(o.key for o in chosen)
        assert keys == expected[1]
        assert record.truncated == 0 and record.scored + record.pruned == record.space == 256
        outcomes.add((keys, record.scored, record.pruned, record.visited))
    assert len(outcomes) == 1          # same vector, same work, for every input order


def test_the_bound_prunes_vectors_that_cannot_win():
    cheap, dear = Option({}, 1.0, (1, 0)), Option({}, 100.0, (1, 1))
    options = [[cheap, dear], [cheap, dear], [cheap, dear]]
    chosen, record = branch_and_bound(options, [], lambda *a: 0.0, budget=100)
    assert chosen == [cheap, cheap, cheap]
    assert record.scored == 1 and record.pruned == 7 and record.truncated == 0


def test_a_conversion_is_a_cost_not_a_failure():
    """The cheaper options alone need a costly conversion between them: the search takes
    the pair whose total, conversion included, is least."""
    a0, a1 = Option({}, 10.0, (1, 0)), Option({}, 12.0, (1, 1))
    b0, b1 = Option({}, 10.0, (1, 0)), Option({}, 12.0, (1, 1))
    conversions = {((1, 0), (1, 0)): 50.0, ((1, 0), (1, 1)): 30.0,
                   ((1, 1), (1, 0)): 30.0, ((1, 1), (1, 1)): 0.0}
    chosen, _ = branch_and_bound([[a0, a1], [b0, b1]], [(0, 1, "f", "s")],
                                 lambda a, b, f, s: conversions[a.key, b.key], budget=100)
    assert chosen == [a1, b1]


@pytest.mark.parametrize("budget", [1, 3, 7])
def test_a_truncated_search_is_reported_and_still_deterministic(budget):
    options, couplings, price = _problem(3)
    outcomes = set()
    for shuffle in range(4):
        chosen, record = branch_and_bound(_sorted(_shuffled(options, shuffle)), couplings,
                                          price, budget)
        assert record.scored == budget and record.truncated > 0
        assert "TRUNCATED at the budget of" in record.describe()
        outcomes.add(tuple(o.key for o in chosen))
    assert len(outcomes) == 1


def _gemms(kernel, target, **cx):
    result = build(kernel, cx, None, target)
    return result, [op for op in walk_ops(result.traced.body) if isinstance(op, Gemm)]


def _picked(plans, gemms):
    return [(p.kind, p.atom.name, getattr(p.grid, "wm", None), getattr(p.grid, "wn", None))
            for p in (plans[id(g)] for g in gemms)]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("kernel", [attention_block, two_chunk_chain], ids=lambda k: k.name)
def test_shuffled_option_lists_give_the_same_plans(kernel, target):
    result, gemms = _gemms(kernel, target)
    chains = gemm_chains(gemms, result.traced.body)
    picks = set()
    for seed in range(4):
        plans, record = search_plans(gemms, chains, result.traced.threads, result.target,
                                     shuffle=random.Random(seed).shuffle)
        picks.add((tuple(_picked(plans, gemms)), record))
    assert len(picks) == 1
    assert _picked({id(g): g.choices["plan"] for g in gemms}, gemms) == list(picks.pop()[0])


def test_explain_reports_the_search_and_its_truncation(monkeypatch):
    attention_block.__dict__.pop("_builds", None)   # rebuild under the patched budget
    full = tg.explain(attention_block, target="sm_80")
    assert ("one search over 2 gemm decision(s) (6x6 options, 1 chained pair(s) priced by "
            "their conversion)") in full
    assert "TRUNCATED" not in full
    monkeypatch.setattr(search, "SEARCH_BUDGET", 4)
    attention_block.__dict__.pop("_builds", None)
    try:
        cut = tg.explain(attention_block, target="sm_80")
    finally:
        attention_block.__dict__.pop("_builds", None)
    assert "4 of 36 vectors scored" in cut and "TRUNCATED at the budget of 4 vectors" in cut


def test_search_records_are_plain_numbers():
    record = JointSearch(groups=2, options=(2, 5), couplings=1, space=10, visited=3,
                         scored=4, pruned=6, budget=4)
    assert record.truncated == 0 and "TRUNCATED" not in record.describe()


# ------------------------------------------------------------------ golden picks

def _attention(d, target, **tiles):
    at = importlib.import_module("tegula.kernels.attention")
    cx = dict(at.default_tiles(d), D=d, QK_SCALE=at.qk_scale(None, d), **tiles)
    return _gemms(at.attention_kernel(f16), target, **cx)


def _backward(which, d, target, **tiles):
    ab = importlib.import_module("tegula.kernels.attention_backward")
    kernel = getattr(ab, f"attention_backward_{which}_kernel")(f16)
    return _gemms(kernel, target, D=d, SCALE=1 / math.sqrt(d), CAUSAL=False, **tiles)


def _grids(gemms):
    return [(g.choices["plan"].kind, g.choices["plan"].grid.wm, g.choices["plan"].grid.wn)
            for g in gemms]


def test_golden_gemm_picks():
    gemm = importlib.import_module("tegula.kernels.gemm")
    _, (op,) = _gemms(gemm.gemm_kernel(f16), "sm_80", BM=128, BN=256, BK=64, threads=256)
    assert op.choices["plan"].atom.name == "mma.m16n8k16.f32.f16.f16.f32"
    assert (op.choices["plan"].grid.wm, op.choices["plan"].grid.wn) == (2, 4)
    _, (op,) = _gemms(gemm.gemm_kernel(f16), "sm_90a", BM=128, BN=256, BK=64, threads=256)
    assert op.choices["plan"].atom.name == "wgmma.m64n256k16.f32.f16.f16"
    assert (op.choices["plan"].grid.wm, op.choices["plan"].grid.wn) == (2, 1)


def test_golden_attention_forward_keeps_p_in_registers_on_wgmma():
    for d in (64, 128):
        _, (s, o) = _attention(d, "sm_90a")
        assert _grids([s, o]) == [("wgmma", 1, 1)] * 2
        assert o.choices["plan"].a_tv is not None          # P read from registers


def test_golden_attention_backward_picks():
    _, gemms = _backward("dkdv", 128, "sm_90a", BM=64, BN=64)
    assert [g.choices["plan"].atom.name for g in gemms] == [
        "wgmma.m64n64k16.f32.f16.f16", "wgmma.m64n128k16.f32.f16.f16"] * 2
    _, gemms = _backward("dq", 64, "sm_80", BM=64, BN=64)
    assert _grids(gemms) == [("mma.sync", 2, 2)] * 3


# ------------------------------------------------------------------ wgmma N width

def _attention_block_sm90():
    attention_block.__dict__.pop("_builds", None)
    result = build(attention_block, {}, None, "sm_90a")
    gemms = [op for op in walk_ops(result.traced.body) if isinstance(op, Gemm)]
    return result, gemms


def test_a_chained_gemm_offers_every_wgmma_width():
    """S = Q Kᵀ feeds P V: each of its wgmma N widths (64, 32, 16, 8 on one warpgroup) is
    a decision of the search, at its own cost; alone the widest is cheapest and is picked,
    as before the widths were searched."""
    result, (s, o) = _attention_block_sm90()
    try:
        widths = [p.atom.n for opt in search.gemm_options([s], 128, result.target, True)
                  for p in opt.plans.values() if p.kind == "wgmma"]
        assert sorted(widths) == [8, 16, 32, 64]
        assert len(search.gemm_options([s], 128, result.target, False)) == \
            len(search.gemm_options([s], 128, result.target, True)) - 3
        assert (s.choices["plan"].atom.n, o.choices["plan"].atom.n) == (64, 64)
        record = search_plans([s, o], gemm_chains([s, o], result.traced.body), 128,
                              result.target)[1]
        assert record.options[0] == len(widths) + 6    # + the six mma.sync options
    finally:
        attention_block.__dict__.pop("_builds", None)


def test_the_conversion_can_pick_a_narrower_width(monkeypatch):
    """Priced so that only S on m64n32 reaches P's A layout cheaply, the search takes that
    width over the cheaper m64n64 alone, and says so in the plan (`tegula explain`)."""
    def price(o1, o2, first, second, threads, target):
        return 0.0 if o1.plans[id(first)].atom.n == 32 else 1000.0
    monkeypatch.setattr(search, "_conversion", price)
    result, (s, o) = _attention_block_sm90()
    try:
        plan = s.choices["plan"]
        assert plan.kind == "wgmma" and plan.atom.n == 32
        assert "N width and warpgroup grid chosen with the gemm at line" in plan.describe()
        assert "wgmma.m64n32k16" in result.explain()
    finally:
        attention_block.__dict__.pop("_builds", None)


def test_operand_words_count_the_accumulator_and_a_register_a():
    """64x64 f32 accumulator on 128 threads: 32 words; P (64x64 f16) from registers: 16."""
    _, (s, o) = _attention_block_sm90()
    attention_block.__dict__.pop("_builds", None)
    assert search.operand_words(s.choices["plan"]) == 32
    assert search.operand_words(o.choices["plan"]) == 32 + 16
