"""Every program the fuzzer emulates is printed as CUDA too (the same build, no compiler
needed): a program the emulator runs but codegen refuses — session 8's i8 `tg.atomic_add`
emulated, wrapping, and failed only when compiled — is an internal error of the run."""
from __future__ import annotations

import sys
from pathlib import Path

from tegula.build import Build
from tegula.codegen.cuda import CodegenError
from tegula.fuzz import fuzz_program

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fuzz_transposed import transposed_gemm  # noqa: E402


def test_a_codegen_refusal_is_an_internal_error(monkeypatch):
    program = transposed_gemm("", "", stages=2)
    assert fuzz_program(program, 1, 0).status == "pass"
    printed = []

    def refuse(self):
        printed.append(self.target.name)
        raise CodegenError("the CUDA emitter has no rule for this statement")
    monkeypatch.setattr(Build, "cuda_source", refuse)
    verdict = fuzz_program(program, 1, 0)
    assert verdict.status == "internal", verdict
    assert "CodegenError" in verdict.reason
    assert {"sm_90a", "sm_80"} <= set(printed)
