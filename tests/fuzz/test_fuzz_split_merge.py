"""The fuzzer's split-K GEMMs merged by their last block (`tegula.fuzz.split_merge`,
`tg.last_arrival`): a seeded sample (a counter per tile and one per launch, sum and max
merges, relaunches on the same counters) against numpy, and the checker's teeth: a merge
by a block that did not arrive last, a counter not zeroed and a wrong model all fail."""
from __future__ import annotations

from dataclasses import replace

import pytest

import tegula as tg
from tegula.fuzz import split_merge as sm
from tegula.fuzz.split_merge import SplitMerge, check_split_merge, make_split_merge

SEED = 1801


def _first(predicate, limit=200) -> tuple[int, SplitMerge]:
    return next((i, p) for i in range(limit) if predicate(p := make_split_merge(SEED, i)))


SAMPLES = {
    "per tile, sum, relaunched": lambda p: p.counter == "tile" and p.merge == "sum"
    and p.launches > 1 and p.m > p.bm,
    "per launch, max, tg.num_programs": lambda p: p.counter == "launch" and p.merge == "max"
    and not p.count_literal,
    "shared operands, empty splits": lambda p: p.route == "shared"
    and p.k <= (p.splits - 1) * p.k_tiles * p.bk,
}


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_seeded_split_merges_are_right(kind):
    index, p = _first(SAMPLES[kind])
    status, reason, detail = check_split_merge(p, index)
    assert status == "pass", (f"python -m tegula.fuzz --seed {SEED} --split-merge {index}: "
                              f"{reason}\n{detail}")


def test_the_draws_cover_every_choice():
    programs = [make_split_merge(SEED, i) for i in range(60)]
    for field, values in (("merge", sm.MERGES), ("epilogue", sm.EPILOGUES),
                          ("counter", sm.COUNTERS), ("route", sm.ROUTES),
                          ("launches", (1, 2, 3)), ("splits", (1, 2, 3, 4, 5))):
        assert {getattr(p, field) for p in programs} == set(values), field
    assert make_split_merge(SEED, 7) == programs[7]


SMALL = SplitMerge(m=40, n=24, k=70, bm=32, bn=32, bk=16, threads=64, splits=3, k_tiles=2)


def test_a_merge_by_a_block_that_did_not_arrive_last_is_a_race(monkeypatch):
    """The split with the highest index "merges" without an arrival: nothing orders the
    other splits' stores before its reads (whatever order the blocks happened to run in)."""
    monkeypatch.setattr(sm, "_KERNELS", {})
    monkeypatch.setattr(tg, "last_arrival",
                        lambda counter, count: tg.block_id(2) == tg.num_programs(2) - 1)
    status, reason, detail = check_split_merge(SMALL, 5, targets=("sm_80",))
    assert status == "internal" and "race" in detail, detail


def test_a_counter_not_zeroed_fails(monkeypatch):
    inputs = sm.inputs

    def dirty(p, seed):
        x = inputs(p, seed)
        x["counters"][-1] = 1
        return x
    monkeypatch.setattr(sm, "inputs", dirty)
    status, _, detail = check_split_merge(SMALL, 5, targets=("sm_80",))
    assert status in ("internal", "mismatch"), detail


def test_a_wrong_model_is_a_mismatch(monkeypatch):
    expected = sm.expected
    monkeypatch.setattr(sm, "expected", lambda p, x: expected(replace(p, epilogue="scale"), x))
    status, reason, detail = check_split_merge(SMALL, 5, targets=("sm_80",))
    assert status == "mismatch" and "wrong element" in reason, detail
