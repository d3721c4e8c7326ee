"""Loop-carried state on the GPU: the online-softmax kernels of test_loop_carried, written
with `=` rebinding, launched with `kernel[grid]` against numpy (and the emulator)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg

try:
    from tests.lang.test_loop_carried import (attention, attention_inputs, decayed_gemm, rand,
                                              softmax_reference, softmax_weighted_sum, stepped,
                                              chunks)
except ImportError:  # pytest's rootdir-relative import mode
    from test_loop_carried import (attention, attention_inputs, decayed_gemm, rand,  # noqa
                                   softmax_reference, softmax_weighted_sum, stepped, chunks)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]


def cuda(x: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


def nan_output(*shape: int):
    return torch.full(shape, float("nan"), dtype=torch.float32, device="cuda")


@pytest.mark.parametrize("M,N,BM,BN", [(11, 75, 4, 32), (300, 1000, 2, 64)])
def test_online_softmax_on_the_gpu(M, N, BM, BN):
    s, v = rand(M, N, seed=7) * 4.0, rand(M, N, seed=9)
    out = nan_output(M, 3)
    softmax_weighted_sum[(tg.cdiv(M, BM),)](cuda(s), cuda(v), out, BM=BM, BN=BN)
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.cpu().numpy(), softmax_reference(s, v), rtol=1e-4,
                               atol=1e-6)


@pytest.mark.parametrize("M,N", [(40, 96), (200, 512)])
def test_online_softmax_attention_on_the_gpu(M, N):
    q, k, vt, want = attention_inputs(M, N, 32)
    o = nan_output(M, 32)
    attention[(tg.cdiv(M, 16),)](cuda(q), cuda(k), cuda(vt), o)
    torch.cuda.synchronize()
    np.testing.assert_allclose(o.cpu().numpy(), want, rtol=1e-2, atol=2e-3)


def test_pipelined_rebound_accumulator_on_the_gpu():
    M, N, K, BK = 70, 90, 160, 16
    a = rand(M, K, seed=41).astype(np.float16)
    b = rand(N, K, seed=42).astype(np.float16)
    c = nan_output(M, N)
    decayed_gemm[(tg.cdiv(M, 32), tg.cdiv(N, 32))](cuda(a), cuda(b), c)
    torch.cuda.synchronize()
    want = np.zeros((M, N))
    for k in range(0, K, BK):
        want = want * 0.5 + a[:, k:k + BK].astype(np.float64) @ b[:, k:k + BK].astype(
            np.float64).T
    np.testing.assert_allclose(c.cpu().numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("start,stop", [(1, 4), (3, 1)])
def test_zero_trip_and_stepped_loops_on_the_gpu(start, stop):
    M, N = 13, 64
    x = rand(M, N, seed=21)
    y = nan_output(M, 16)
    stepped[(tg.cdiv(M, 8),)](cuda(x), y, start, stop)
    torch.cuda.synchronize()
    parts = chunks(x, 16)
    want = parts[0]
    for k in range(start, stop):
        want = want * 0.5 + parts[k]
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-6, atol=1e-6)
