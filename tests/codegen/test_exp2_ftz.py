"""`tg.exp2` is one `ex2.approx.ftz.f32` in the CUDA (CUDA's `exp2f` wraps it in a compare
and two multiplies to keep denormal results: four issue slots where one does, the selective
scan's bottleneck at one exp2 per state and step), and the emulator flushes results below
2^-126 to zero as that instruction does, so both agree there."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.build import build, emulate
from tegula.dtypes import f32
from tegula.runtime.compiler import available_compilers, compile_cuda

# Around the flush threshold (2^-126), the denormal range, the specials, and ordinary values.
VALUES = np.array([-125.5, -126.0, -126.2, -130.0, -149.0, -160.0, -0.3, 0.0, 3.25, 127.5,
                   200.0, np.nan, np.inf, -np.inf, -1e-40, 1e-40], dtype=np.float32)


@tg.kernel(threads=32)
def exp2_of(x: tg.Tensor[f32], out: tg.Tensor[f32]):
    tg.copy(tg.exp2(tg.load(x.tile((1, 16), (0, 0)))), out.tile((1, 16), (0, 0)))


def test_emitted_exp2_is_one_ftz_instruction():
    source = build(exp2_of).cuda_source()
    assert "ex2.approx.ftz.f32" in source and "exp2f(" not in source
    if available_compilers():
        assert compile_cuda(source, "exp2_of", "sm_90a")[:4] == b"\x7fELF"


def test_emulator_flushes_results_below_the_smallest_normal():
    out = np.full((1, 16), 7.0, np.float32)
    emulate(exp2_of, (1,), VALUES.reshape(1, 16), out)
    with np.errstate(over="ignore"):
        want = np.exp2(VALUES.astype(np.float64))
        want[want < 2.0 ** -126] = 0.0
        want = want.astype(np.float32)
    np.testing.assert_allclose(out[0], want, rtol=1e-6)
    assert out[0, 3] == 0.0 and out[0, 4] == 0.0 and out[0, 1] == np.float32(2.0 ** -126)
    assert np.isnan(out[0, 11]) and out[0, 12] == np.inf and out[0, 13] == 0.0


@pytest.mark.gpu
def test_gpu_agrees_with_the_emulator():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    emulated = np.zeros((1, 16), np.float32)
    emulate(exp2_of, (1,), VALUES.reshape(1, 16), emulated)
    out = torch.full((1, 16), float("nan"), device="cuda")
    exp2_of[(1,)](torch.from_numpy(VALUES.reshape(1, 16)).cuda(), out)
    got = out.cpu().numpy()
    # ex2.approx is within 2 ulp; zeros, infinities and NaN exactly where emulated.
    np.testing.assert_allclose(got, emulated, rtol=3e-7, atol=0)
    assert np.array_equal(np.isnan(got), np.isnan(emulated))
