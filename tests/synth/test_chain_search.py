"""The chain search (synth/chains.py) is a branch and bound: its result is the exact
minimum over every pair when the budget allows, the same whatever order the options come
in, and a truncation by the budget is reported (by `tegula explain` too)."""
from __future__ import annotations

import itertools
import os
import random
import sys

import pytest

import tegula as tg
from tegula.synth import chains
from tegula.synth.chains import ChainSearch, search_pairs

sys.path.insert(0, os.path.dirname(__file__))
from chain_kernels import attention_block  # noqa: E402


def _options(seed: int, n: int) -> tuple[list, list, dict]:
    """Two lists of (option, own cost, key) with ties in cost, and a conversion table."""
    rng = random.Random(seed)
    firsts = [(f"a{i}", float(rng.choice([10, 20, 20, 30, 45])), (f"a{i}",)) for i in range(n)]
    seconds = [(f"b{j}", float(rng.choice([5, 15, 15, 40])), (f"b{j}",)) for j in range(n)]
    table = {(a, b): float(rng.choice([0, 0, 8, 25, 60])) for (a, _, _), (b, _, _)
             in itertools.product(firsts, seconds)}
    return firsts, seconds, table


def _brute_force(firsts, seconds, table):
    return min((s1 + s2 + table[o1, o2], k1, k2, o1, o2)
               for (o1, s1, k1), (o2, s2, k2) in itertools.product(firsts, seconds))


@pytest.mark.parametrize("seed", range(20))
def test_the_search_finds_the_exact_minimum_whatever_the_order(seed):
    firsts, seconds, table = _options(seed, 6)
    expected = _brute_force(firsts, seconds, table)
    results = set()
    for shuffle in range(5):
        rng = random.Random(shuffle)
        f, s = firsts[:], seconds[:]
        rng.shuffle(f)
        rng.shuffle(s)
        calls = []

        def convert(a, b):
            calls.append((a, b))
            return table[a, b]

        (o1, o2, cost), search = search_pairs(f, s, convert, budget=10_000)
        assert (o1, o2) == expected[3:] and cost == table[o1, o2]
        assert search.truncated == 0 and search.scored == len(calls)
        assert search.scored + search.pruned == search.pairs == 36
        results.add((o1, o2, search.scored, search.pruned))
    assert len(results) == 1          # same pair, same work, for every input order


def test_the_bound_prunes_pairs_that_cannot_win():
    firsts = [("cheap", 1.0, ("cheap",)), ("dear", 100.0, ("dear",))]
    seconds = [("x", 1.0, ("x",)), ("y", 50.0, ("y",))]
    (o1, o2, cost), search = search_pairs(firsts, seconds, lambda a, b: 0.0, budget=100)
    assert (o1, o2, cost) == ("cheap", "x", 0.0)
    assert search.scored == 1 and search.pruned == 3


@pytest.mark.parametrize("budget", [1, 3, 7])
def test_a_truncated_search_is_reported_and_still_deterministic(budget):
    firsts, seconds, table = _options(3, 6)
    outcomes = set()
    for shuffle in range(4):
        f, s = firsts[:], seconds[:]
        random.Random(shuffle).shuffle(f)
        random.Random(shuffle + 100).shuffle(s)
        (o1, o2, _), search = search_pairs(f, s, lambda a, b: table[a, b], budget)
        assert search.scored == budget and search.truncated > 0
        assert "TRUNCATED at the budget of" in search.describe()
        outcomes.add((o1, o2))
    assert len(outcomes) == 1


def test_explain_reports_the_chain_search_and_its_truncation(monkeypatch):
    attention_block.__dict__.pop("_builds", None)   # rebuild under the patched budget
    full = tg.explain(attention_block, target="sm_80")
    assert "chain search: 36 of 36 warp-grid pairs scored" in full
    assert "TRUNCATED" not in full
    monkeypatch.setattr(chains, "CHAIN_SEARCH_BUDGET", 4)
    attention_block.__dict__.pop("_builds", None)
    try:
        cut = tg.explain(attention_block, target="sm_80")
    finally:
        attention_block.__dict__.pop("_builds", None)
    assert "chain search: 4 of 36 warp-grid pairs scored" in cut
    assert "TRUNCATED at the budget of 4 pairs" in cut


def test_search_records_are_plain_numbers():
    search = ChainSearch(pairs=10, scored=4, pruned=6, budget=4)
    assert search.truncated == 0 and "TRUNCATED" not in search.describe()
