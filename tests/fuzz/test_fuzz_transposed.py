"""Gemm operands stored transposed in the fuzzer (issue 9): a (K x M) a or (K x N) b read
through a shared buffer's `.T` view (an MN-major wgmma operand on sm_90a, ldmatrix.trans
on sm_80) or through the tensor's global `.T` view, with ragged shapes and K rows over
several swizzle spans. Each program is right against numpy on both targets or refused
cleanly; the generator draws every form; the reference reads the orientation (a program
judged against the untransposed model fails); the shrinker stores an operand K-major when
the failure does not need the transposition."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tegula.fuzz import fuzz_program, make_program
from tegula.fuzz.program import (Binary, Cast, Full, Gemm, Invalid, Num, Program, Store,
                                 TensorDecl, check)
from tegula.fuzz.reference import reference
from tegula.fuzz.runner import Verdict, check_outputs, data_seed, emulate_for, program_inputs
from tegula.fuzz.shrink import shrink
from tegula.fuzz.source import kernel_source


def transposed_gemm(ta="", tb="smem", dtype="f16", stages=3, bk=16, extent=40, m=72, n=40,
                    bm=64, bn=32, threads=128, route="shared") -> Program:
    """acc = a @ b.T * 0.5 stored as f16, with a and/or b stored K-major or transposed."""
    def decl(name, side, trans):
        return TensorDecl(name, dtype, f"gemm_{side}" + ("_t" if trans else ""), extent)
    return Program(threads=threads, BM=bm, BN=bn, M=m, N=n,
                   tensors=(decl("ga0", "a", ta), decl("gb1", "b", tb),
                            TensorDecl("o2", "f16", "out")),
                   body=(Full("v1", (True, True), "f32", Num(0.0)),
                         Gemm("v1", "ga0", "gb1", bk, route, stages, ta, tb),
                         Binary("v2", "mul", "v1", Num(0.5)),
                         Cast("v3", "v2", "f16"), Store("o2", "v3", "copy")))


# (ta, tb, stages, bk, extent, M, N): pipelined (TMA + wgmma on sm_90a when the rows of
# every operand tensor are a multiple of 16 bytes), a plain K loop, one K tile; K rows of
# two swizzle spans (bk 128: 256 bytes); shapes that do not divide the tiles; M rows of 70
# (140 bytes: no TMA for a transposed a).
CASES = [("", "smem", 3, 16, 40, 72, 40), ("smem", "", 2, 32, 72, 72, 40),
         ("smem", "smem", 3, 64, 130, 72, 40), ("", "smem", 2, 128, 296, 72, 40),
         ("", "gmem", 3, 16, 40, 70, 40), ("gmem", "smem", 1, 32, 70, 70, 33),
         ("smem", "gmem", 0, 32, 29, 72, 40), ("", "smem", 4, 16, 40, 70, 40)]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_transposed_operands_are_right_on_both_targets(case, dtype):
    ta, tb, stages, bk, extent, m, n = case
    p = transposed_gemm(ta, tb, dtype, stages, bk, extent, m, n)
    check(p)
    verdict = fuzz_program(p, 7, stages + bk)
    assert verdict.status == "pass", f"{verdict.reason}\n{verdict.detail}\n{kernel_source(p)}"
    assert "mma.sync" in verdict.targets["sm_80"][2]


@pytest.mark.parametrize("ta,tb", [("", "smem"), ("smem", ""), ("smem", "smem")])
def test_a_pipelined_mn_major_operand_takes_tma_and_wgmma(ta, tb):
    # Warp roles forced: the cost model keeps this small tile in one role by default.
    verdict = fuzz_program(replace(transposed_gemm(ta, tb), warp_specialize=True), 7, 0)
    assert verdict.status == "pass", verdict.detail
    assert {"wgmma", "TMA", "warp roles"} <= verdict.targets["sm_90a"][2], verdict.targets
    assert "ldmatrix" in verdict.targets["sm_80"][2], verdict.targets


def test_an_8_bit_transposed_operand_falls_back_or_is_refused_cleanly():
    p = transposed_gemm("", "smem", "f8e4m3", bk=32, extent=70)
    verdict = fuzz_program(p, 7, 1)
    assert not verdict.failed, verdict.detail
    assert "wgmma" not in verdict.targets["sm_90a"][2]


def test_register_operands_read_a_transposed_tensor_through_its_global_view():
    p = transposed_gemm("gmem", "gmem", stages=0, bk=32, extent=25, route="register")
    assert "tg.load(ga0.T.tile((BM, 32), (m, 0)))" in kernel_source(p)
    assert fuzz_program(p, 7, 2).status == "pass"
    with pytest.raises(Invalid, match="shared or global .T view"):
        check(replace(p, body=tuple(replace(s, ta="smem") if isinstance(s, Gemm) else s
                                    for s in p.body)))


def test_the_reference_reads_the_orientation():
    """Square operands, so the same arrays fit both programs: the emulator's output of the
    transposed program is judged wrong against the model of the untransposed one."""
    p = transposed_gemm("", "smem", extent=40, m=40, n=40, bm=64, bn=32)
    plain = transposed_gemm("", "", extent=40, m=40, n=40, bm=64, bn=32)
    inputs = program_inputs(p, data_seed(7, 3))
    outputs, failure, _ = emulate_for(p, inputs, "sm_90a")
    assert failure is None
    assert check_outputs(p, inputs, outputs).status == "pass"
    assert check_outputs(plain, inputs, outputs,
                         reference_outputs=reference(plain, inputs)).status == "mismatch"


def test_the_generator_draws_every_transposed_form():
    forms = set()
    for index in range(300):
        p = make_program(11, index)
        for s in p.body:
            if isinstance(s, Gemm):
                dtype = p.tensor(s.a).dtype
                for side, trans in (("a", s.ta), ("b", s.tb)):
                    if trans:
                        forms.add((side, trans, dtype in ("f16", "bf16"), s.stages > 1))
    assert {(side, trans, True, True) for side in "ab" for trans in ("smem", "gmem")} <= forms
    assert any(not wide for _, _, wide, _ in forms), "no 8-bit near miss drawn"
    assert any(not piped for _, _, _, piped in forms), "no one-tile or plain-loop form"


def test_shrinker_stores_an_operand_k_major_unless_the_failure_needs_it():
    p = transposed_gemm("smem", "smem", stages=3, extent=60)

    def run(q: Program) -> Verdict:  # a stand-in bug: "an MN-major B fails"
        gemm = next((s for s in q.body if isinstance(s, Gemm)), None)
        failing = gemm is not None and gemm.tb == "smem"
        return Verdict("mismatch", "mismatch") if failing else Verdict("pass")

    small, _, _ = shrink(p, run, Verdict("mismatch", "mismatch"), budget_s=30)
    gemm = next(s for s in small.body if isinstance(s, Gemm))
    assert (gemm.ta, gemm.tb) == ("", "smem"), kernel_source(small)
    assert small.tensor(gemm.a).kind == "gemm_a" and small.tensor(gemm.b).kind == "gemm_b_t"
