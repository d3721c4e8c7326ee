"""Session 14's wgmma wait changes on the GPU (`lower/wgmma_waits.py`), every element into
NaN-poisoned outputs against float references, at lengths that divide no tile:

* carried groups (`carry_wgmma_groups`): the attention forward's p @ v stays in flight
  into the next key block (stated roles, ping-pong turns), its stage released after the
  wait that retires it (the overlapped loop, not carried, for comparison);
* waits deferred in one-role pipelines: the backward's dK/dV kernel in one role with dP
  issued beside the first product (an atomic-dQ tuning candidate);
* a second gemm into an accumulator in flight (same instruction, no wait between): a
  GEMM taking two k-steps an iteration, warp-specialized and in one role.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tegula as tg
from tegula.dtypes import f16

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from gpu_helpers import poison  # noqa: E402
from test_wgmma_waits import two_steps_an_iteration  # noqa: E402
from test_attention_backward_gpu import (assert_close, make_case,  # noqa: E402
                                         poisoned_launch_values, reference,
                                         reference_gradients)

FORWARD = {  # (D, tiles): the consumer forms
    "stated-D128": (128, dict(BM=128, BN=128, threads=256, REGS=240)),
    "stated-overlap-D128": (128, dict(BM=128, BN=112, threads=256, REGS=240, OVERLAP=True)),
    "pingpong-D64": (64, dict(BM=128, BN=128, threads=256, consumers="pingpong")),
}


@pytest.mark.parametrize("name,causal", [("stated-D128", True), ("stated-overlap-D128", False),
                                         ("pingpong-D64", True)])
def test_forward_with_carried_groups(name, causal):
    from tegula.kernels.attention import attention_kernel, default_tiles, qk_scale
    d, tiles = FORWARD[name]
    b, h, sq, sk = 2, 3, 333, 517
    q, k, v, _ = make_case(b, h, h, sq, sk, d, "float16", sq + d)
    scale = qk_scale(None, d)
    o = poison(torch.empty_like(q))
    lse = poison(torch.empty(b, h, sq, device="cuda"))
    values = {**default_tiles(d, "sm_90a"), **tiles}
    threads = values.pop("threads")
    attention_kernel(f16)[(tg.cdiv(sq, values["BM"]), h, b)](
        q, k, v, o, lse, D=d, QK_SCALE=scale, CAUSAL=causal, threads=threads, **values)
    torch.cuda.synchronize()
    want, _ = reference(q.float(), k.float(), v.float(), causal, d ** -0.5)
    assert_close("o", o, want, "float16")


def test_backward_one_role_with_early_dp():
    """dK/dV in one role, two warpgroups, dP issued with the first product (its waits
    now deferred: the exponentials run while dP computes), dQ by atomics."""
    from tegula.build import launch
    from tegula.kernels.attention_backward import backward_launches
    B, H, Hkv, Sq, Sk, D = 2, 4, 2, 333, 301, 128
    q, k, v, do = make_case(B, H, Hkv, Sq, Sk, D, "float16", 1414)
    scale = D ** -0.5
    o, lse, *want = reference_gradients(q, k, v, do, True, scale)
    values = poisoned_launch_values(q, k, v, do, o, lse)
    for kernel, grid, names, constexprs in backward_launches(
            f16, B, H, Hkv, Sq, Sk, D, scale, True, deterministic=False, BM=64, BN=128,
            EARLY_DP=True, threads=256, warp_specialize=False):
        launch(kernel, grid, *(values[n] for n in names), **constexprs)
    torch.cuda.synchronize()
    for name, w in zip(("dq", "dk", "dv"), want):
        assert_close(name, values[name], w, "float16")


@pytest.mark.parametrize("warp_specialize", [True, False], ids=["roles", "one-role"])
@pytest.mark.parametrize("m,n,k", [(200, 300, 456), (64, 128, 64), (130, 70, 1000)])
def test_two_gemms_an_iteration_into_one_accumulator(m, n, k, warp_specialize):
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=g).half()
    b = torch.randn(n, k, device="cuda", generator=g).half()
    c = poison(torch.empty(m, n, device="cuda"))
    two_steps_an_iteration[(tg.cdiv(m, 64), tg.cdiv(n, 128))](
        a, b, c, warp_specialize=warp_specialize)
    torch.cuda.synchronize()
    want = a.double() @ b.double().T
    assert not torch.isnan(c).any()
    err = (c.double() - want).abs().max().item()
    assert err <= 1e-3 * max(1.0, want.abs().max().item()), err
