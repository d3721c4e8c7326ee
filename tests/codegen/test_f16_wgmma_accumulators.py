"""f16 wgmma accumulators, end to end: a `tg.gemm` into an f16 accumulator on sm_90a takes
`wgmma.m64n{N}k16.f16.f16.f16`, is right in the emulator (the catalogue's `execute`: the
k16 step's exact sum plus D, rounded once to f16 — the same rounding the mma.sync path
gets, so sm_80 gives the same bits), and is emitted: the packed f16 pairs are 32-bit
lvalues over the accumulator array itself (it stays the wgmma's until the wait_group, so
no temporaries unpacked after the asm), which compile to HGMMA.F16 with no local memory.
Before, codegen refused "f16 accumulators are not emitted yet"."""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import tegula as tg
from tegula import f16
from tegula.build import build
from tegula.codegen import CodegenError, emit_cuda
from tegula.lower.async_ir import SmemDesc, Wgmma
from tegula.lower.thread_ir import Const, Reg, RegArray, SharedBuffer, ThreadKernel, walk
from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemm_fixtures import readme_gemm  # noqa: E402


gemm_f16_acc = readme_gemm(f16, f16, BM=64, BN=64, BK=64, STAGES=2, name="gemm_f16_acc")


def f16_steps_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b.T accumulated in f16 the way the catalogue says both MMAs round: each k16
    step's products summed exactly with the accumulator, then rounded to f16."""
    acc = np.zeros((a.shape[0], b.shape[0]), np.float16)
    for k0 in range(0, a.shape[1], 16):
        step = a[:, k0:k0 + 16].astype(np.float64) @ b[:, k0:k0 + 16].astype(np.float64).T
        with np.errstate(over="ignore"):
            acc = (acc.astype(np.float64) + step).astype(np.float16)
    return acc


def _operands(seed, m, n, k):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * 0.5).astype(np.float16)
    b = (rng.standard_normal((n, k)) * 0.5).astype(np.float16)
    return a, b


def _wgmma_instrs(kernel, **constexprs) -> set:
    thread_kernel = build(kernel, constexprs, None, "sm_90a").thread_kernel
    return {s.instr for s in walk(thread_kernel.body) if isinstance(s, Wgmma)}


@pytest.mark.parametrize("bn", [64, 128])
def test_f16_accumulator_gemm_takes_wgmma_and_rounds_per_k16_step(bn):
    assert _wgmma_instrs(gemm_f16_acc, BN=bn) == {f"wgmma.m64n{bn}k16.f16.f16.f16"}
    M, N, K = 70, 150, 200                          # none divides its tile
    a, b = _operands(bn, M, N, K)
    want = f16_steps_reference(a, b)
    for target in ("sm_90a", "sm_80"):
        c = np.full((M, N), np.nan, np.float16)
        tg.emulate(gemm_f16_acc, (tg.cdiv(M, 64), tg.cdiv(N, bn)), a, b, c, BN=bn,
                   target=target)
        assert np.array_equal(c.view(np.uint16), want.view(np.uint16)), target


def test_f16_accumulator_overflow_and_nan_propagate():
    M, N, K = 64, 64, 64
    a, b = _operands(1, M, N, K)
    a[3, :] = 60000.0                                 # row 3 overflows f16: +-inf
    a[5, 7] = np.nan                                  # row 5: NaN
    c = np.zeros((M, N), np.float16)
    tg.emulate(gemm_f16_acc, (1, 1), a, b, c, target="sm_90a")
    want = f16_steps_reference(a, b)
    assert np.array_equal(np.isnan(c), np.isnan(want)) and np.isnan(c[5]).all()
    assert np.array_equal(c[~np.isnan(c)], want[~np.isnan(want)])
    assert np.isinf(c[3]).any()


needs_compiler = pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler")


@needs_compiler
@pytest.mark.parametrize("bn", [64, 256])
def test_f16_accumulators_compile_to_hgmma_f16_in_registers(bn):
    thread_kernel = build(gemm_f16_acc, dict(BN=bn), None, "sm_90a").thread_kernel
    source = emit_cuda(thread_kernel, "sm_90a")
    assert "*reinterpret_cast<unsigned*>(&" in source
    sass = disassemble(compile_cuda(source, thread_kernel.name, "sm_90a"))
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    assert f"HGMMA.64x{bn}x16.F16" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass), "f16 accumulators fell back to local memory"


def test_f16_accumulator_pairs_must_be_neighbours_at_even_indices():
    acc = RegArray("acc", f16, 32)
    desc = SmemDesc("tile", Const(0), leading_bytes=16, stride_bytes=1024, swizzle=128)
    kernel = lambda d: ThreadKernel(  # noqa: E731
        name="k", threads=128, params=[], registers=[acc],
        shared=[SharedBuffer("tile", f16, 64 * 64, 0)],
        body=[Wgmma("wgmma.m64n64k16.f16.f16.f16", d, desc, desc, Const(1))])
    emit_cuda(kernel([Reg(acc, Const(i)) for i in range(32)]), "sm_90a")  # in order: fine
    swapped = [Reg(acc, Const(i ^ 1)) for i in range(32)]                # high half first
    with pytest.raises(CodegenError, match=r"acc\[1\] and acc\[0\] share a 32-bit register"):
        emit_cuda(kernel(swapped), "sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("bn", [64, 128])
def test_f16_accumulator_gemm_on_the_gpu(bn):
    """Small integers: every partial sum is exact in f16, so the H100 must give the
    emulator's bits; random data: within the per-k16-step rounding of the emulator."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    M, N, K = 70, 150, 200
    rng = np.random.default_rng(bn)
    exact = (rng.integers(-3, 4, (M, K)).astype(np.float16),
             rng.integers(-3, 4, (N, K)).astype(np.float16))
    for a, b in (exact, _operands(bn, M, N, K)):
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        gemm_f16_acc[(tg.cdiv(M, 64), tg.cdiv(N, bn))](
            torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c, BN=bn)
        got = c.cpu().numpy()
        want = f16_steps_reference(a, b)
        if a is exact[0]:
            assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
        else:
            scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
            err = np.abs(got.astype(np.float64) - want.astype(np.float64))
            assert np.all(err <= 2.0 ** -9 * (K // 16 + 1) * scale), err.max()
