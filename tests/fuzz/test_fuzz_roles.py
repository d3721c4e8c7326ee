"""The fuzzer writes pipelines as warp-role blocks (`with tg.producer(regs=)` around the
copies, `with tg.consumer(regs=, schedule=)` around the rest; `Gemm.roles`), runs them
with the roles interleaved at random, and compares them with numpy and with sm_80 (which
refuses the blocks at their line). Session 8 added the blocks; the fuzzer never wrote one.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tegula.fuzz import fuzz_program, make_program
from tegula.fuzz.generate import Switches
from tegula.fuzz.program import Gemm, Invalid, check
from tegula.fuzz.shrink import _simpler
from tegula.fuzz.source import kernel_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fuzz_interleavings import early_release_lowering  # noqa: E402,F401 (a fixture)
from test_fuzz_transposed import transposed_gemm  # noqa: E402

SEED, PROGRAMS = 2, 400


def _role_gemm(program):
    return next((s for s in program.body if isinstance(s, Gemm) and s.roles), None)


def _with_roles(program, roles):
    return replace(program, body=tuple(replace(s, roles=roles) if isinstance(s, Gemm) else s
                                       for s in program.body))


def test_role_programs_are_generated_without_changing_the_other_programs():
    with_roles = [make_program(SEED, i) for i in range(PROGRAMS)]
    without = [make_program(SEED, i, Switches(roles=False, warp_specialize=False))
               for i in range(PROGRAMS)]
    stated = [i for i, p in enumerate(with_roles) if _role_gemm(p)]
    assert len(stated) >= 10, stated
    for p, q in zip(with_roles, without):  # role blocks drawn from a stream of their own
        # (the build options too: a pipeline with stated roles asks for none)
        assert replace(_with_roles(p, ()), warp_specialize=None, consumers=None) == q
    source = kernel_source(with_roles[stated[0]])
    producer = source.index("with tg.producer(regs=")
    consumer = source.index("with tg.consumer(regs=")
    assert producer < source.index("tg.copy(", producer) < consumer < \
        source.index("tg.gemm(", consumer)


@pytest.mark.parametrize("roles", [(None, None, None), (40, 232, None), (24, 240, "cooperative")])
def test_a_stated_split_is_right_and_sm_80_refuses_it(roles):
    program = _with_roles(transposed_gemm("", "smem", stages=3, extent=88), roles)
    check(program)
    verdict = fuzz_program(program, 3, 1)
    assert verdict.status == "pass", verdict.detail
    assert {"TMA", "warp roles", "wgmma"} <= verdict.targets["sm_90a"][2]
    status, reason, _ = verdict.targets["sm_80"]
    assert status == "rejected" and "sm_90a" in reason, reason


def test_near_misses_are_refused_at_the_block():
    # a 32-row tile: no wgmma, so no TMA box for the producer to issue
    program = _with_roles(transposed_gemm("", "", dtype="f16", stages=2, bm=32, bn=32),
                          (None, None, None))
    verdict = fuzz_program(program, 3, 2)
    assert verdict.status == "rejected", verdict.detail
    assert "tg.producer" in verdict.reason, verdict.reason


def test_role_blocks_belong_to_pipelines_and_shrink_away():
    program = _with_roles(transposed_gemm("", "smem", stages=1), (None, None, None))
    with pytest.raises(Invalid, match="warp-role blocks are a pipeline's"):
        check(program)
    gemm = _role_gemm(_with_roles(transposed_gemm("", "smem", stages=3), (40, None, None)))
    simpler = list(_simpler(gemm))
    assert replace(gemm, roles=()) in simpler
    assert replace(gemm, stages=2) in simpler                  # still a pipeline: kept
    two = replace(gemm, stages=2)
    assert replace(two, stages=1, roles=()) in list(_simpler(two))


def test_the_generated_role_programs_pass_under_random_interleavings():
    passed = 0
    for index in range(PROGRAMS):
        program = make_program(SEED, index)
        if not _role_gemm(program):
            continue
        verdict = fuzz_program(program, SEED, index)  # role_order random per program
        assert not verdict.failed, (index, verdict.detail)
        passed += "warp roles" in verdict.targets["sm_90a"][2]
    assert passed >= 4, passed


def test_random_interleavings_of_a_stated_split_find_an_early_release(early_release_lowering):
    program = _with_roles(transposed_gemm("", "", stages=3, extent=88), (None, None, None))
    assert fuzz_program(program, 1, 0, role_order="listed").status == "pass"
    assert early_release_lowering and all(early_release_lowering)
    found = [index for index in range(6)
             if fuzz_program(program, 1, index).status == "internal"]
    assert found, "no random interleaving of six programs exposed the early release"
