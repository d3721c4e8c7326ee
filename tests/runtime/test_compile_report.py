"""The compiler's own report of a cubin: ptxas `-v` logs parsed (recorded logs), shown by
`tegula compile`, `tegula explain --compile` and `explain(compile=True)`."""
from __future__ import annotations

import os

import pytest

import tegula as tg
from tegula.cli import main
from tegula.dtypes import f16
from tegula.kernels.gemm import gemm_kernel
from tegula.runtime.compiler import (PtxasReport, available_compilers, compile_cuda,
                                     compile_cuda_report, disassemble, parse_ptxas_log)

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "gemm.py")
COMPILERS = {c.kind: c for c in available_compilers()}
needs_compiler = pytest.mark.skipif(not COMPILERS, reason="neither NVRTC nor nvcc found")

# NVRTC 13.5, the README GEMM at BM=128, BN=256, BK=64 for sm_90a at 128 threads (spills).
NVRTC_SPILLING = (
    "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are "
    "serialized due to insufficient register resources for the wgmma pipeline in the function "
    "'gemm' in line 651\nptxas info    : 0 bytes gmem\nptxas info    : Compiling entry "
    "function 'gemm' for 'sm_90a'\nptxas info    : Function properties for gemm\nptxas       "
    "  .     1808 bytes stack frame, 3440 bytes spill stores, 2928 bytes spill loads\nptxas "
    "info    : Used 255 registers, used 2 barriers, 1808 bytes cumulative stack size\nptxas "
    "info    : Compile time = 641.510 ms\n")
# NVRTC 13.5, the same kernel's defaults for sm_80 (no spills).
NVRTC_CLEAN = (
    "ptxas info    : 0 bytes gmem\nptxas info    : Compiling entry function 'gemm' for "
    "'sm_80'\nptxas info    : Function properties for gemm\nptxas         .     0 bytes "
    "stack frame, 0 bytes spill stores, 0 bytes spill loads\nptxas info    : Used 238 "
    "registers, used 1 barriers, 424 bytes cmem[0]\nptxas info    : Compile time = "
    "119.409 ms\n")
# nvcc 12.x style: a helper function's properties before the kernel's, static shared memory.
NVCC_TWO_FUNCTIONS = (
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Function properties for helper\n"
    "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
    "ptxas info    : Compiling entry function 'other' for 'sm_80'\n"
    "ptxas info    : Used 12 registers, 360 bytes cmem[0]\n"
    "ptxas info    : Compiling entry function 'softmax' for 'sm_80'\n"
    "ptxas info    : Function properties for softmax\n"
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 32 registers, used 1 barriers, 2048 bytes smem, 368 bytes cmem[0]\n")


def test_parse_spilling_log():
    r = parse_ptxas_log(NVRTC_SPILLING, "gemm")
    assert (r.kernel, r.target, r.registers) == ("gemm", "sm_90a", 255)
    assert (r.spill_stores, r.spill_loads, r.stack_frame, r.barriers) == (3440, 2928, 1808, 2)
    assert r.spills
    assert any("wgmma.mma_async instructions are serialized" in w for w in r.warnings)
    text = str(r)
    assert "255 registers per thread, SPILLS 3440 B stored, 2928 B loaded" in text
    assert "ptxas: (C7511) Potential Performance Loss" in text


def test_parse_clean_log():
    r = parse_ptxas_log(NVRTC_CLEAN, "gemm")
    assert (r.registers, r.spill_stores, r.spill_loads, r.stack_frame) == (238, 0, 0, 0)
    assert not r.spills and r.warnings == ()
    assert "no spills" in str(r)


def test_parse_picks_the_named_entry_function():
    r = parse_ptxas_log(NVCC_TWO_FUNCTIONS, "softmax")
    assert (r.registers, r.shared_bytes, r.barriers, r.spill_stores) == (32, 2048, 1, 0)
    assert parse_ptxas_log(NVCC_TWO_FUNCTIONS, "other").registers == 12


@pytest.mark.parametrize("log", ["", "ptxas info    : 0 bytes gmem\n", NVRTC_CLEAN])
def test_no_report_for_another_kernel_or_a_quiet_log(log):
    assert parse_ptxas_log(log, "not_there") is None


@needs_compiler
@pytest.mark.parametrize("kind", sorted(COMPILERS))
def test_compile_with_report_really_compiles(kind):
    built = tg.build.build(gemm_kernel(f16), {"BM": 64, "BN": 64}, target="sm_80")
    source, name = built.cuda_source(), built.thread_kernel.name
    cubin, report = compile_cuda_report(source, name, "sm_80", compiler=COMPILERS[kind])
    assert isinstance(report, PtxasReport) and report.kernel == name
    assert 32 <= report.registers <= 255 and report.target == "sm_80"
    # The verbose option only adds the log: the same machine code as a plain compile (the
    # ELF bytes differ: it records the option).
    plain = compile_cuda(source, name, "sm_80", compiler=COMPILERS[kind])
    sass = disassemble(cubin)
    if sass is not None:
        assert sass == disassemble(plain) and "HMMA" in sass


@needs_compiler
def test_tegula_compile_prints_and_writes_the_report(tmp_path, capsys):
    assert main(["compile", f"{EXAMPLE}:gemm", "--target", "sm_80", "--out", str(tmp_path),
                 "-D", "BM=64", "-D", "BN=64"]) == 0
    printed = capsys.readouterr().out
    assert "compiler's report (ptxas, sm_80):" in printed
    explained = (tmp_path / "gemm.explain.txt").read_text()
    assert "compiler's report (ptxas, sm_80):" in explained
    assert "estimated from liveness" in explained


@needs_compiler
def test_explain_compile_shows_the_report(capsys):
    text = tg.explain(gemm_kernel(f16), target="sm_80", compile=True, BM=64, BN=64)
    assert "compiler's report (ptxas, sm_80):" in text and "no spills" in text
    assert main(["explain", f"{EXAMPLE}:gemm", "--target", "sm_80", "--compile",
                 "-D", "BM=64", "-D", "BN=64"]) == 0
    assert "compiler's report (ptxas, sm_80):" in capsys.readouterr().out


def test_explain_without_compile_has_no_report():
    assert "compiler's report" not in tg.explain(gemm_kernel(f16), target="sm_80", BM=64,
                                                 BN=64)
