"""The fuzzer's chains of two gemms in a pipeline (`tegula.fuzz.gemm_chains`): on
ping-pong consumers at 256 threads the two warpgroups take turns inside the loop, which
only the attention forward reached before. A seeded sample against numpy (turns with a
rescaled accumulator and a row sum, turns in stated roles, a persistent tile loop, one
cooperative with v stored K-major) and the checker's teeth: session 12's turn order
(arrive before sync, lapping) is reported under a stall order, and a wrong model fails."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tegula.fuzz import gemm_chains as gc
from tegula.fuzz.gemm_chains import GemmChain, check_gemm_chain, make_gemm_chain

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "emulate"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))

SEED = 1801


def _first(predicate, limit=300) -> tuple[int, GemmChain]:
    return next((i, p) for i in range(limit) if predicate(p := make_gemm_chain(SEED, i)))


def _turns(p: GemmChain) -> bool:
    return p.consumers == "pingpong" and p.bm == 128 and not p.persistent


SAMPLES = {
    "turns, rescale, row sum": lambda p: _turns(p) and p.rescale and p.rowsum
    and p.keys > p.bn and p.d <= 64,
    "turns in stated roles": lambda p: _turns(p) and p.roles and not p.rescale
    and p.keys > p.bn and p.d <= 64,
    "persistent": lambda p: p.persistent and p.m > p.bm and p.d <= 64,
    "cooperative, v K-major": lambda p: p.consumers == "cooperative" and p.v_kmajor
    and p.d <= 64,
}


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_seeded_gemm_chains_are_right(kind):
    index, p = _first(SAMPLES[kind])
    status, reason, detail = check_gemm_chain(p, index, targets=("sm_90a",))
    assert status in ("pass", "rejected"), (
        f"python -m tegula.fuzz --seed {SEED} --gemm-chain {index}: {reason}\n{detail}")
    if kind != "persistent":   # the others are in ping-pong's or cooperative's frame
        assert status == "pass", detail


def test_the_draws_cover_every_choice():
    programs = [make_gemm_chain(SEED, i) for i in range(80)]
    assert {p.f for p in programs} == set(gc.FUNCTIONS)
    assert {p.consumers for p in programs} == {None, "cooperative", "pingpong"}
    for flag in ("mask", "rowsum", "rescale", "v_kmajor", "roles", "persistent"):
        assert {bool(getattr(p, flag)) for p in programs} == {True, False}, flag
    assert sum(_turns(p) for p in programs) >= 20
    assert make_gemm_chain(SEED, 9) == programs[9]


TURNS = GemmChain(m=100, keys=150, d=32, dv=32, bm=128, bn=64, stages=2, f="tanh")


def test_the_old_turn_order_is_reported_under_a_stall_order(monkeypatch):
    """Before 2be99ba each iteration arrived on the other's turn barrier before syncing on
    its own: a warpgroup could arrive twice while the other was held (the D = 64 forward
    hung on the H100). Seed 1 runs the stall order."""
    from test_named_barrier_lapping import _old_turns_across_the_back_edge

    from tegula.lower import warp_roles
    monkeypatch.setattr(warp_roles, "_turns_across_the_back_edge",
                        _old_turns_across_the_back_edge)
    monkeypatch.setattr(gc, "_KERNELS", {})
    status, reason, detail = check_gemm_chain(TURNS, 1, targets=("sm_90a",))
    assert status == "internal" and "a second time" in detail, detail


def test_a_wrong_model_is_a_mismatch(monkeypatch):
    expected = gc.expected
    monkeypatch.setattr(gc, "expected", lambda p, x: expected(replace(p, f="scale"), x))
    status, reason, detail = check_gemm_chain(TURNS, 2, targets=("sm_90a",))
    assert status == "mismatch" and "wrong element" in reason, detail
