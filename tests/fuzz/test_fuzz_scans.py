"""The fuzzer rebinds values to their cumulative sums (`tg.cumsum`, forward and reversed,
along either axis; `program.Cumsum`), modelled in the reference as prefix sums in any
order (integers wrapping, 16/8-bit floats summed in f32 and rounded once); since session
12 also inside loops, folded into the loop's carried tiles."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

import tegula as tg
from tegula.fuzz import fuzz_program, make_program
from tegula.fuzz.generate import Switches
from tegula.fuzz.program import Binary, Cumsum, Invalid, Loop, Num, check
from tegula.fuzz.source import kernel_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fuzz_transposed import transposed_gemm  # noqa: E402

SEED, PROGRAMS = 3, 150


def _cumsums(program) -> list:
    return [s for s in program.body if isinstance(s, Cumsum)]


def _loop_cumsums(program) -> list:
    """Cumsums inside loops (`Generator.carried_scan`: folded into carried state)."""
    return [x for s in program.body if isinstance(s, Loop) for x in s.body
            if isinstance(x, Cumsum)]


def test_cumsums_are_generated_without_changing_the_other_statements():
    with_scans = [make_program(SEED, i) for i in range(PROGRAMS)]
    without = [make_program(SEED, i, Switches(scans=False)) for i in range(PROGRAMS)]
    drawn = [p for p in with_scans if _cumsums(p)]
    assert len(drawn) >= 15, len(drawn)
    assert {s.axis for p in drawn for s in _cumsums(p)} == {0, 1}
    assert {s.reverse for p in drawn for s in _cumsums(p)} == {False, True}
    in_loops = 0
    for p, q in zip(with_scans, without):
        if _loop_cumsums(p):   # a scan folded into a loop's carried tile changes the fold
            in_loops += 1
            continue
        assert replace(p, body=tuple(s for s in p.body if not isinstance(s, Cumsum))) == q
    assert in_loops >= 2, in_loops
    source = kernel_source(drawn[0])
    s = _cumsums(drawn[0])[0]
    assert f"{s.out} = tg.cumsum({s.x}, {s.axis}" in source


def test_the_generated_cumsums_pass():
    passed = 0
    for index in range(PROGRAMS):
        program = make_program(SEED, index)
        if not _cumsums(program):
            continue
        verdict = fuzz_program(program, SEED, index)
        assert not verdict.failed, (index, verdict.detail)
        passed += verdict.status == "pass"
    assert passed >= 12, passed


def test_a_cumsum_in_the_wrong_direction_is_caught(monkeypatch):
    real = tg.cumsum
    monkeypatch.setattr(tg, "cumsum", lambda x, axis, reverse=False: real(x, axis, not reverse))
    caught = 0
    for index in range(PROGRAMS):
        program = make_program(SEED, index)
        if _cumsums(program):
            caught += fuzz_program(program, SEED, index).status == "mismatch"
        if caught >= 5:   # enough: the rest of the programs would only cost CI time
            break
    assert caught >= 5, caught


def test_a_cumsum_of_bool_is_not_a_program():
    program = transposed_gemm("", "", stages=0, extent=16)
    compare = Binary("vb", "gt", "v1", Num(0.0))
    check(replace(program, body=program.body[:2] + (compare, Cumsum("v1", "v1", 1, True))
                  + program.body[2:]))
    with pytest.raises(Invalid, match="cumulative sum of bool"):
        check(replace(program, body=program.body[:2] + (compare, Cumsum("vb", "vb", 0))
                      + program.body[2:]))


def test_a_cumsum_of_negative_zero_may_keep_its_sign():
    """Seed 1002 program 605 (session 10): a cumsum of a lone -0.0 is -0.0 in the kernel
    (the scan adds nothing to the first element), +0.0 in numpy's sum, which the reference
    used; rsqrt then gave -inf against an expected +inf. A zero sum with a -0.0 among its
    terms now has either sign."""
    verdict = fuzz_program(make_program(1002, 605), 1002, 605)
    assert verdict.status == "pass", verdict.detail


def test_scans_folded_into_loop_carried_tiles_pass():
    drawn = [(i, p) for i in range(PROGRAMS) if _loop_cumsums(p := make_program(SEED, i))]
    assert len(drawn) >= 2, len(drawn)
    for index, program in drawn[:3]:
        assert "tg.cumsum(" in kernel_source(program)
        verdict = fuzz_program(program, SEED, index)
        assert not verdict.failed, (index, verdict.detail)
