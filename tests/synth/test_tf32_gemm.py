"""`tg.gemm` of f32 tiles: on sm_90a it takes the tf32 wgmma (`wgmma.m64n{N}k8.f32.tf32.tf32`,
operands truncated to tf32 as the entry's `execute` says, f32 accumulation rounded per k8
step); on a target without wgmma, or where the wgmma does not fit, it is a clear error at
the gemm's line (no mma.sync multiplies f32)."""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.arch.wgmma import truncate_to_tf32
from tegula.build import build
from tegula.codegen import emit_cuda
from tegula.errors import SynthesisError
from tegula.lower.async_ir import Wgmma
from tegula.lower.thread_ir import walk
from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemm_fixtures import readme_gemm  # noqa: E402


gemm_f32 = readme_gemm(f32, f32, BM=64, BN=64, BK=32, STAGES=2, name="gemm_f32")


@tg.kernel(threads=128)
def gemm_f32_transposed_b(a: tg.Tensor[f32], b: tg.Tensor[f32], c: tg.Tensor[f32]):
    m, n = tg.block_id(0), tg.block_id(1)
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((64, 32), f32)
    sb = tg.shared((32, 64), f32)                 # b is K x N here: read through .T
    tg.copy(a.tile((64, 32), (m, 0)), sa)
    tg.copy(b.tile((32, 64), (0, n)), sb)
    tg.gemm(acc, sa, sb.T)
    tg.copy(acc, c.tile((64, 64), (m, n)))


def tf32_steps_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b.T as the tf32 wgmma computes it: operands truncated to tf32, each k8 step's
    exact sum added to the f32 accumulator and rounded to f32, in K order."""
    ta, tb = truncate_to_tf32(a), truncate_to_tf32(b)
    acc = np.zeros((a.shape[0], b.shape[0]), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for k0 in range(0, a.shape[1], 8):
            acc = (acc + ta[:, k0:k0 + 8] @ tb[:, k0:k0 + 8].T).astype(np.float32)
    return acc


def _operands(seed, m, n, k):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((n, k)).astype(np.float32))


@pytest.mark.parametrize("bn,bk", [(64, 32), (128, 16), (64, 8)])
def test_f32_gemm_takes_tf32_wgmma_and_matches_the_model_bit_for_bit(bn, bk):
    thread_kernel = build(gemm_f32, dict(BN=bn, BK=bk), None, "sm_90a").thread_kernel
    assert {s.instr for s in walk(thread_kernel.body) if isinstance(s, Wgmma)} == \
        {f"wgmma.m64n{bn}k8.f32.tf32.tf32"}
    M, N, K = 70, 150, 203                                    # none divides its tile
    a, b = _operands(bn + bk, M, N, K)
    c = np.full((M, N), np.nan, np.float32)
    tg.emulate(gemm_f32, (tg.cdiv(M, 64), tg.cdiv(N, bn)), a, b, c, BN=bn, BK=bk,
               target="sm_90a")
    assert np.array_equal(c, tf32_steps_reference(a, b))
    # tf32, not f32: the operands' low mantissa bits are gone
    exact = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.abs(c - exact).max() > 1e-4


def test_f32_gemm_nan_and_inf_propagate():
    M, N, K = 64, 64, 64
    a, b = _operands(7, M, N, K)
    a[2, 5], b[9, 40], a[4, 0] = np.nan, np.inf, 0.0
    b[:, 0] = 1.0                                             # row 4 x inf column: 0 * inf
    c = np.zeros((M, N), np.float32)
    tg.emulate(gemm_f32, (1, 1), a, b, c, target="sm_90a")
    want = tf32_steps_reference(a, b)
    assert np.array_equal(np.isnan(c), np.isnan(want)) and np.isnan(c[2]).all()
    assert np.isinf(c[:, 9]).any()
    assert np.array_equal(c[~np.isnan(c)], want[~np.isnan(want)])


def test_f32_gemm_on_sm80_is_a_clear_error_at_the_gemm_line():
    a, b = _operands(0, 64, 64, 32)
    with pytest.raises(SynthesisError) as info:
        tg.emulate(gemm_f32, (1, 1), a, b, np.zeros((64, 64), np.float32), target="sm_80")
    text = str(info.value)
    assert "f32 x f32 into f32" in text and "only through wgmma (as tf32" in text
    assert "sm_80 has no wgmma" in text and ".to(f16) or .to(bf16)" in text
    assert "tg.gemm(acc, sa[k], sb[k])" in text


def test_f32_gemm_that_wgmma_cannot_take_says_why():
    a, b = _operands(0, 64, 32, 32)
    with pytest.raises(SynthesisError) as info:
        tg.emulate(gemm_f32_transposed_b, (1, 1), a, b.T.copy(), np.zeros((64, 64), np.float32),
                   target="sm_90a")
    text = str(info.value)
    assert "does not fit here" in text and "transposed view" in text
    assert "tg.gemm(acc, sa, sb.T)" in text


@pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler")
@pytest.mark.parametrize("bn,bk", [(64, 32), (256, 8)])
def test_f32_gemm_compiles_to_hgmma_tf32(bn, bk):
    thread_kernel = build(gemm_f32, dict(BN=bn, BK=bk), None, "sm_90a").thread_kernel
    sass = disassemble(compile_cuda(emit_cuda(thread_kernel, "sm_90a"), thread_kernel.name,
                                    "sm_90a"))
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    assert f"HGMMA.64x{bn}x8.F32.TF32" in sass and "UTMALDG.2D" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass)


@pytest.mark.gpu
@pytest.mark.parametrize("bn,bk", [(64, 32), (128, 16)])
def test_f32_gemm_on_the_gpu(bn, bk):
    """On an H100: small integers (exact in tf32 and in every sum) give the model's bits;
    random f32 data is within f32 rounding of the truncation model and clearly not the
    round-to-nearest one where they differ (which model the hardware follows)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    M, N, K = 70, 150, 203
    rng = np.random.default_rng(bn)
    exact = (rng.integers(-3, 4, (M, K)).astype(np.float32),
             rng.integers(-3, 4, (N, K)).astype(np.float32))
    for a, b in (exact, _operands(bn, M, N, K)):
        c = torch.full((M, N), float("nan"), device="cuda")
        gemm_f32[(tg.cdiv(M, 64), tg.cdiv(N, bn))](
            torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c, BN=bn, BK=bk)
        got = c.cpu().numpy()
        want = tf32_steps_reference(a, b)
        if a is exact[0]:
            assert np.array_equal(got, want)
            continue
        scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= 2.0 ** -18 * scale), \
            f"max error {err.max()} against the truncation model (tf32 operands)"


@tg.kernel(threads=128)
def gemm_e4m3(a: tg.Tensor[tg.f8e4m3], b: tg.Tensor[tg.f8e4m3], c: tg.Tensor[f32]):
    m, n = tg.block_id(0), tg.block_id(1)
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((64, 64), tg.f8e4m3)
    sb = tg.shared((64, 64), tg.f8e4m3)
    tg.copy(a.tile((64, 64), (m, 0)), sa)
    tg.copy(b.tile((64, 64), (n, 0)), sb)
    tg.gemm(acc, sa, sb)
    tg.copy(acc, c.tile((64, 64), (m, n)))


def test_types_another_targets_mma_sync_takes_keep_the_no_mma_message():
    """Found by the fuzzer: the wgmma-only message must not claim f8 multiplies only through
    wgmma (sm_89's mma.sync takes it); sm_80 still says it has no such MMA instruction."""
    x = np.ones((64, 64), np.float32)
    with pytest.raises(SynthesisError, match="no MMA instruction on sm_80 multiplies f8e4m3") \
            as info:
        tg.emulate(gemm_e4m3, (1, 1), x, x, np.zeros((64, 64), np.float32), target="sm_80")
    assert "only through wgmma" not in str(info.value)
