"""Adjacent f16/bf16 register elements assigned from f32 values round in one paired
conversion (`tg_f32x2_to_f16x2`, `cvt.rn.f16x2.f32`): the emitter's peephole
(`codegen/cuda._Emitter._rounded_pair`).

Why it matters: one-element roundings of a wgmma accumulator feeding bounds-checked
stores made ptxas wait for every wgmma (warning C7514, "wgmma serialized") in the README
GEMM, the one-block-per-tile library GEMMs and the ping-pong persistent GEMM; the paired
form keeps the wgmma pipeline (one `WARPGROUP.DEPBAR` per k-step instead of one per
wgmma). The bits are the same: each half rounds to nearest even as `cvt.rn.f16.f32` does
(tests/gpu/test_paired_rounding_gpu.py holds the two against each other and the emulator
on hardware)."""
from __future__ import annotations

import pytest

from tegula.build import build
from tegula.codegen.cuda import emit_cuda
from tegula.dtypes import bf16, f16, f32
from tegula.kernels.gemm import gemm_kernel, persistent_gemm_kernel
from tegula.lower.thread_ir import (BLOCK_IDS, TID, Assign, Binary, Cast, Const, GlobalLoad,
                                    GlobalStore, Reg, RegArray, RegRead, TensorParam,
                                    ThreadKernel)
from tegula.runtime.compiler import available_compilers, compile_cuda_report


def two_element_kernel(dtype, second_reads_first: bool = False) -> ThreadKernel:
    """With x0, x1 = x[2i], x[2i+1]: y[2i] = dtype(x0 * x1), y[2i+1] = dtype(x1 * x1)
    (or, second_reads_first, y[2i+1] = y[2i]: no pairing allowed)."""
    a, b = RegArray("a", f32, 2), RegArray("b", dtype, 2)
    i = (BLOCK_IDS[0] * 128 + TID) * 2
    x0, x1 = RegRead(Reg(a, Const(0))), RegRead(Reg(a, Const(1)))
    first = Cast(Binary("mul", x0, x1, f32), dtype)
    second = (Cast(RegRead(Reg(b, Const(0))), dtype) if second_reads_first
              else Cast(Binary("mul", x1, x1, f32), dtype))
    return ThreadKernel(
        f"pair_{dtype.name}", 128,
        [TensorParam("x", f32, 1), TensorParam("y", dtype, 1, True)], [a, b], [],
        [GlobalLoad(Reg(a, Const(0)), "x", i, 2),
         Assign(Reg(b, Const(0)), first), Assign(Reg(b, Const(1)), second),
         GlobalStore("y", i, Reg(b, Const(0)), 2)])


@pytest.mark.parametrize("dtype, helper", [(f16, "tg_f32x2_to_f16x2"),
                                           (bf16, "tg_f32x2_to_bf16x2")], ids=str)
def test_adjacent_roundings_print_as_one_pair(dtype, helper):
    source = emit_cuda(two_element_kernel(dtype))
    assert f"= {helper}(" in source                      # one paired conversion
    assert f"tg_f32_to_{dtype.name}(" not in source.split("extern \"C\"")[1]
    assert "& 0xffffu);" in source and ">> 16);" in source  # both halves written back


def test_a_pair_whose_second_reads_the_first_is_not_paired():
    source = emit_cuda(two_element_kernel(f16, second_reads_first=True))
    assert "tg_f32x2_to_f16x2(" not in source


def test_the_readme_gemm_rounds_its_accumulator_in_pairs():
    source = build(gemm_kernel(f16), dict(BM=64, BN=128, BK=64, STAGES=4), None,
                   "sm_90a").cuda_source()
    assert source.count("tg_f32x2_to_f16x2(r0[") == 32  # 64 accumulators a thread


GEMMS = [("README f16 64x128", gemm_kernel(f16), dict(BM=64, BN=128, BK=64, STAGES=4)),
         ("README bf16 128x128", gemm_kernel(bf16), dict(BM=128, BN=128, BK=64, STAGES=4)),
         ("ping-pong 64x256", persistent_gemm_kernel(f16),
          dict(BM=64, BN=256, BK=64, STAGES=4, GROUP=8, threads=128, consumers="pingpong"))]


@pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler (NVRTC or nvcc)")
@pytest.mark.parametrize("name, kernel, constexprs", GEMMS, ids=[g[0] for g in GEMMS])
def test_wgmma_gemms_are_not_serialized_by_ptxas(name, kernel, constexprs):
    """Each compiled with ptxas's report: no C7514 (every wgmma waited for) — which all
    three had before the paired rounding."""
    source = build(kernel, constexprs, None, "sm_90a").cuda_source()
    _, report = compile_cuda_report(source, kernel.name, "sm_90a")
    assert not [w for w in report.warnings if "C7514" in w], report.warnings


@pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler (NVRTC or nvcc)")
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_paired_rounding_compiles(target):
    for dtype in (f16, bf16):
        kernel = two_element_kernel(dtype)
        _, report = compile_cuda_report(emit_cuda(kernel), kernel.name, target)
        assert report.registers > 0

