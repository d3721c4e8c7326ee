"""Issue 11's joint decision for a row-normalizing epilogue: an RMSNorm (and a softmax) fused
after a gemm reduces along the accumulator's own layout — shuffles and, where a row spans
warps, a shared row of partials — with no layout conversion of the accumulator (no
shared-memory round trip of the tile), on the mma.sync and the wgmma paths; the emulated
result matches numpy."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.build import build
from tegula.ir.ops import Rearrange, walk_ops
from tegula.kernels.common import poisoned


@tg.kernel(threads=128)
def gemm_then_norm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                   SOFTMAX: tg.constexpr = False):
    acc = tg.zeros((64, 64), f32)
    sa, sb = tg.shared((64, 32), f16), tg.shared((64, 32), f16)
    tg.copy(a.tile((64, 32), (0, 0)), sa)
    tg.copy(b.tile((64, 32), (0, 0)), sb)
    tg.gemm(acc, sa, sb)
    if SOFTMAX:
        e = tg.exp2(acc - tg.max(acc, 1))
        out = e * (1.0 / tg.sum(e, 1))
    else:
        out = acc * tg.rsqrt(tg.sum(acc * acc, 1) * (1.0 / 64) + 1e-6)
    tg.copy(out, c.tile((64, 64), (0, 0)))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("softmax", [False, True])
def test_the_epilogue_reduces_in_the_accumulators_layout(target, softmax):
    result = build(gemm_then_norm, dict(SOFTMAX=softmax), None, target)
    assert not any(isinstance(op, Rearrange) for op in walk_ops(result.traced.body))
    rng = np.random.default_rng(3)
    a = rng.integers(-2, 3, (64, 32)).astype(np.float16)
    b = rng.integers(-2, 3, (64, 32)).astype(np.float16)
    c = poisoned((64, 64), f32)
    tg.emulate(gemm_then_norm, (1,), a, b, c, target=target, SOFTMAX=softmax)
    s = a.astype(np.float64) @ b.astype(np.float64).T
    if softmax:
        e = np.exp2(s - s.max(1, keepdims=True))
        want = e / e.sum(1, keepdims=True)
    else:
        want = s / np.sqrt((s * s).mean(1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(c, want, rtol=2e-3, atol=2e-3)
