"""The fuzzer runs a GEMM's K loop again inside a `tg.range` into the same accumulator
(`Gemm.repeat`): a pipeline in a run-time loop whose iterations are not independent.
Session 10 found by hand that the ping-pong consumer split took such a loop for a
persistent kernel's tile loop (each warpgroup summed every other repetition: half the
sum, no error; `synth/roles.py: _tile_loop_dependence`); the generated programs now
catch it, as the last test shows with the rule taken out.
"""
from __future__ import annotations

from dataclasses import replace

import tegula.synth.roles as roles
from tegula.fuzz import fuzz_program, make_program
from tegula.fuzz.generate import Switches
from tegula.fuzz.program import Gemm, Invalid, check
from tegula.fuzz.shrink import _simpler
from tegula.fuzz.source import kernel_source

SEED, PROGRAMS = 1, 300
#: A repeated pipeline the default takes to TMA + wgmma with warp roles, whose tile loop
#: ping-pong would split without the rule (64x32 tiles, 128 threads, no other shared);
#: drawn without bitcasts, as it was found (one would leave its output undecided).
FINDING = (1, 195)
AS_FOUND = Switches(bitcasts=False)


def _repeated(program):
    return next((s for s in program.body if isinstance(s, Gemm) and s.repeat > 1), None)


def test_repeats_are_generated_without_changing_the_other_programs():
    with_repeats = [make_program(SEED, i) for i in range(PROGRAMS)]
    without = [make_program(SEED, i, Switches(repeats=False)) for i in range(PROGRAMS)]
    repeated = [i for i, p in enumerate(with_repeats) if _repeated(p)]
    assert len(repeated) >= 10, repeated
    for p, q in zip(with_repeats, without):  # drawn from a stream of their own
        body = tuple(replace(s, repeat=1) if isinstance(s, Gemm) else s for s in p.body)
        assert replace(p, body=body) == q
    program = with_repeats[repeated[0]]
    gemm = _repeated(program)
    source = kernel_source(program)
    outer = source.index(f"for {gemm.a}_r in tg.range({gemm.repeat}):")
    assert outer < source.index(f"for {gemm.a}_k in tg.") < source.index("tg.gemm(", outer)


def test_a_repeat_belongs_to_a_k_loop_and_shrinks_away():
    program = make_program(*FINDING, AS_FOUND)
    gemm = _repeated(program)
    assert gemm is not None and gemm.stages >= 2
    assert replace(gemm, repeat=1) in list(_simpler(gemm))
    one_tile = replace(program, body=tuple(replace(s, stages=0) if s is gemm else s
                                           for s in program.body))
    try:
        check(one_tile)
    except Invalid as e:
        assert "repeated gemm is a K loop" in str(e)
    else:
        raise AssertionError("a repeated gemm of one K tile was accepted")


def test_the_repeated_pipeline_is_right_with_warp_roles():
    # Warp roles forced on sm_90a: the cost model keeps this small tile in one role.
    verdict = fuzz_program(replace(make_program(*FINDING, AS_FOUND), warp_specialize=True),
                           *FINDING)
    assert verdict.status == "pass", verdict.detail
    assert {"TMA", "warp roles", "wgmma"} <= verdict.targets["sm_90a"][2]


def test_without_the_independence_rule_the_fuzzer_reports_half_the_sum(monkeypatch):
    monkeypatch.setattr(roles, "_tile_loop_dependence", lambda kernel, loop: "")
    # Warp roles forced on sm_90a: the cost model keeps this small tile in one role.
    verdict = fuzz_program(replace(make_program(*FINDING, AS_FOUND), warp_specialize=True),
                           *FINDING)
    assert verdict.status == "mismatch" and verdict.target == "sm_90a", verdict
