"""Shared scratch tiles in fuzz programs (`Stash` / `Unstash`): a tile stashed before a
loop, read at the top of each iteration (through `.T`: other threads' elements), written
back at its end, and read (or overwritten) after the loop — the loop-carried and
after-loop hazards of barrier placement (`lower.SharedSync`). The generator draws them, the
reference models them, the typing rules keep them well formed, and with the lowering's
loop-carried barrier removed the emulator reports the race the fuzzer would find."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tegula.fuzz import fuzz_program, make_program
from tegula.fuzz.program import (Binary, Full, Invalid, Load, Loop, Num, Program, Stash, Store,
                                 TensorDecl, Unstash, check)
from tegula.fuzz.source import kernel_source


def _carried_through_shared(stages: int = 1, transposed: bool = True) -> Program:
    """sc1 = 1.5; for each column tile t of k1: sc1 = sc1.T + t; out = sc1.T + x0."""
    loop = Loop(1, "k1", 1, (Load("v3", "k1", "shared" if stages > 1 else "load", None, 1),
                             Unstash("v4", "sc1", transposed),
                             Binary("v5", "add", "v4", "v3"),
                             Stash("sc1", "v5")), stages)
    return Program(threads=64, BM=16, BN=16, M=21, N=19,
                   tensors=(TensorDecl("x0", "f32", "in"), TensorDecl("k1", "f32", "loop1", 40),
                            TensorDecl("o0", "f32", "out")),
                   body=(Load("v1", "x0", "load"), Full("v2", (True, True), "f32", Num(1.5)),
                         Stash("sc1", "v2"), loop, Unstash("v6", "sc1", transposed),
                         Binary("v7", "add", "v6", "v1"), Store("o0", "v7", "copy")))


@pytest.mark.parametrize("stages", [1, 2], ids=["range", "pipeline"])
def test_a_tile_carried_through_shared_memory_runs_and_passes(stages):
    p = _carried_through_shared(stages)
    check(p)
    source = kernel_source(p)
    assert "sc1 = tg.shared((BM, BN), f32)" in source and "tg.load(sc1.T)" in source
    verdict = fuzz_program(p, 1, 0)
    assert verdict.status == "pass", verdict


def test_without_the_loop_carried_barrier_the_race_is_reported(monkeypatch):
    from tegula.lower import lower
    monkeypatch.setattr(lower.SharedSync, "carried_conflict",
                        lambda self, ignore=frozenset(), advance=None: False)
    verdict = fuzz_program(_carried_through_shared(), 1, 0)
    assert verdict.status == "internal" and "shared-memory race" in verdict.reason, verdict


@pytest.mark.parametrize("broken,why", [
    (lambda b: b[:2] + b[3:], "read before anything is stashed"),
    (lambda b: b[:2] + (Stash("sc2", "v1"),) + b[2:3]
     + (Loop(1, "k1", 1, b[3].body + (Stash("sc3", "v5"),)),) + b[4:],
     "first stashed outside loops"),
    (lambda b: b[:2] + (Full("v9", (True, True), "i32", Num(1)), Stash("sc1", "v9")) + b[2:],
     "keeps its element type"),
])
def test_the_typing_rules_keep_scratch_tiles_well_formed(broken, why):
    p = _carried_through_shared()
    with pytest.raises(Invalid, match=why):
        check(p.with_body(broken(p.body)))


def test_a_transposed_read_needs_a_square_tile():
    p = _carried_through_shared()
    with pytest.raises(Invalid, match="square"):
        check(Program(64, 16, 8, p.M, p.N, p.tensors, p.body))


def test_the_generator_draws_scratch_tiles_around_loops():
    found = {"before": 0, "in loop": 0, "written back": 0, "transposed": 0}
    for index in range(200):
        body = make_program(12, index).body
        for s in body:
            if isinstance(s, Stash):
                found["before"] += 1
            if isinstance(s, Loop):
                found["in loop"] += any(isinstance(b, Unstash) for b in s.body)
                found["written back"] += any(isinstance(b, Stash) for b in s.body)
                found["transposed"] += any(isinstance(b, Unstash) and b.transposed
                                           for b in s.body)
    assert all(found.values()), found


# -- a K loop through a scratch tile (the warp-specialized consumer body) ---------------------
def _gemm_through_scratch(dtype: str = "f16", stages: int = 3) -> Program:
    from tegula.fuzz.program import GEMM_ACCUMULATOR, Cast, Gemm
    acc = GEMM_ACCUMULATOR[dtype]
    return Program(threads=128, BM=64, BN=64, M=70, N=100,
                   tensors=(TensorDecl("ga0", dtype, "gemm_a", 72),
                            TensorDecl("gb1", dtype, "gemm_b", 72),
                            TensorDecl("o2", "f32", "out")),
                   body=(Full("v1", (True, True), acc, Num(0.0 if acc == "f32" else 0)),
                         Gemm("v1", "ga0", "gb1", 32 if dtype == "f16" else 64, "shared",
                              stages, scratch=True))
                   + ((Store("o2", "v1", "copy"),) if acc == "f32" else
                      (Cast("v2", "v1", "f32"), Store("o2", "v2", "copy"))))


@pytest.mark.parametrize("dtype", ["f16", "i8"])
def test_a_k_loop_through_a_scratch_tile_runs_and_passes(dtype):
    p = _gemm_through_scratch(dtype)
    if dtype == "f16":  # warp roles forced: the cost model keeps this tile in one role
        p = replace(p, warp_specialize=True)
    check(p)
    source = kernel_source(p)
    assert "v1 += tg.load(v1_x.T)" in source
    verdict = fuzz_program(p, 1, 0)
    assert verdict.status == "pass", verdict
    if dtype == "f16":  # the warp-specialized consumer loop with more than the gemm
        assert {"warp roles", "wgmma"} <= set(verdict.targets["sm_90a"][2]), verdict


def test_without_its_barrier_the_consumer_scratch_race_is_reported(monkeypatch):
    from tegula.lower import lower
    monkeypatch.setattr(lower.SharedSync, "carried_conflict",
                        lambda self, ignore=frozenset(), advance=None: False)
    verdict = fuzz_program(replace(_gemm_through_scratch(), warp_specialize=True), 1, 0,
                           targets=("sm_90a",))
    assert verdict.status == "internal" and "shared-memory race" in verdict.reason, verdict


def test_a_scratch_gemm_needs_a_k_loop_and_square_tiles():
    from dataclasses import replace
    p = _gemm_through_scratch()
    one_tile = replace(p, tensors=tuple(replace(t, extent=32) if t.kind.startswith("gemm")
                                        else t for t in p.tensors))
    one_tile = one_tile.with_body((p.body[0], replace(p.body[1], stages=0)) + p.body[2:])
    with pytest.raises(Invalid, match="K loop over square tiles"):
        check(one_tile)
    with pytest.raises(Invalid, match="K loop over square tiles"):
        check(replace(p, BN=32))


# -- branches (tg.if_ on the block's row or column) ----------------------------------------
def _branchy() -> Program:
    """The carried-through-shared loop with its write-back inside a branch that holds in
    some blocks, a branch of register work, and a branch after the loop overwriting the
    tile: blocks where a branch fails keep what they had."""
    from dataclasses import replace
    from tegula.fuzz.program import Branch, InPlace
    p = _carried_through_shared()
    loop = p.body[3]
    body = loop.body[:3] + (Branch(1, "ge", 1, (Stash("sc1", "v5"),)),
                            Branch(0, "eq", 0, (InPlace("v2", "mul", Num(2.0)),)))
    after = (Branch(0, "lt", 1, (Stash("sc1", "v1"),)),)
    return p.with_body(p.body[:3] + (replace(loop, body=body),) + after + p.body[4:])


def test_branches_around_shared_accesses_run_and_pass():
    p = _branchy()
    check(p)
    source = kernel_source(p)
    assert "with tg.if_(n >= 1):" in source and "with tg.if_(m == 0):" in source
    verdict = fuzz_program(p, 2, 0)
    assert verdict.status == "pass", verdict


def test_the_generator_draws_branches():
    from tegula.fuzz.program import Branch

    def count(body):
        return sum(isinstance(s, Branch) + (count(s.body) if isinstance(s, Loop) else 0)
                   for s in body)
    assert sum(count(make_program(12, index).body) for index in range(300)) > 0


def test_without_what_a_branch_leaves_unordered_the_race_is_reported(monkeypatch):
    """Barrier placement must carry a branch arm's unordered accesses past the branch
    (`SharedSync.absorb`): without, the write-back inside the branch races the next
    iteration's read."""
    from tegula.lower import lower
    monkeypatch.setattr(lower.SharedSync, "absorb", lambda self, inner: None)
    verdict = fuzz_program(_branchy(), 2, 0, targets=("sm_80",))
    assert verdict.status == "internal" and "shared-memory race" in verdict.reason, verdict
