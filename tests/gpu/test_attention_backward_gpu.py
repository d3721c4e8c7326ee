"""Attention backward on the GPU against torch autograd of a float32 reference with an
explicit mask (bottom-right causal), every element: the three kernels launched directly
into NaN-poisoned outputs (also with dQ added by atomics), the `attention_backward` entry
point (twice: bit-identical, as no atomics are used by default), and
`attention_differentiable` end to end through the forward.
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tegula.dtypes import bf16, f16

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import poison  # noqa: E402

TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2}  # of the largest |gradient|


def visible(seq_q: int, seq_k: int, causal: bool):
    """(Sq, Sk) bool on the GPU: key j is seen by query i (bottom-right causal)."""
    if not causal:
        return torch.ones(seq_q, seq_k, dtype=torch.bool, device="cuda")
    i = torch.arange(seq_q, device="cuda")[:, None]
    j = torch.arange(seq_k, device="cuda")[None, :]
    return j <= i + (seq_k - seq_q)


def reference(q, k, v, causal, scale):
    """(o, lse) in float32 from float32 leaves (differentiable): softmax over the visible
    keys, 0 for a row that sees none (no NaN in its gradient either)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    mask = visible(q.shape[2], k.shape[2], causal)
    s = scale * q @ k.transpose(2, 3)
    p = torch.softmax(s.masked_fill(~mask, -1e30), -1) * mask
    lse = torch.logsumexp(s.detach().masked_fill(~mask, float("-inf")), -1)
    return p @ v, lse


def make_case(B, H, Hkv, Sq, Sk, D, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tdtype = getattr(torch, dtype)
    q, do = (torch.randn(B, H, Sq, D, device="cuda", generator=g).to(tdtype) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", generator=g).to(tdtype) for _ in range(2))
    return q, k, v, do


def reference_gradients(q, k, v, do, causal, scale):
    """(o, lse, dq, dk, dv): o and lse from the reference, gradients by torch autograd."""
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    o, lse = reference(*leaves, causal, scale)
    o.backward(do.float())
    return (o.detach(), lse, *(t.grad for t in leaves))


def assert_close(name, got, want, dtype):
    assert got.shape == want.shape, name
    got = got.float()
    assert not torch.isnan(got).any(), f"{name}: {int(torch.isnan(got).sum())} NaN (unwritten?)"
    err = (got - want).abs()
    bound = TOLERANCE[dtype] * max(1.0, want.abs().max().item())
    assert err.max().item() <= bound, (f"{name}: max error {err.max().item():.3g} at "
                                       f"{np.unravel_index(int(err.argmax()), err.shape)}, "
                                       f"bound {bound:.3g}")


SHAPES = [  # B, H, Hkv, Sq, Sk, D, causal, dtype
    (2, 4, 4, 128, 128, 64, False, "float16"),
    (2, 4, 4, 128, 128, 64, True, "float16"),
    (1, 8, 2, 300, 200, 128, True, "float16"),      # Sq > Sk: 100 rows see no key
    (1, 8, 2, 200, 513, 128, True, "bfloat16"),
    (2, 4, 1, 77, 1000, 64, False, "bfloat16"),     # MQA
    (1, 8, 1, 65, 130, 64, True, "float16"),        # GQA 8
    (1, 2, 2, 1, 1, 64, False, "float16"),
    (1, 2, 1, 1, 300, 128, True, "float16"),
    (1, 2, 1, 300, 1, 128, True, "float16"),
    (1, 4, 2, 255, 255, 256, False, "float16"),
    (1, 4, 2, 190, 257, 256, True, "bfloat16"),
    (1, 4, 4, 1024, 1024, 128, True, "float16"),
]


def _id(shape):
    B, H, Hkv, Sq, Sk, D, causal, dtype = shape
    return f"B{B}H{H}kv{Hkv}-{Sq}x{Sk}-D{D}-{'causal' if causal else 'full'}-{dtype}"


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic-dq"])
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_backward_kernels_into_poisoned_outputs(shape, deterministic):
    """The backward's launches into NaN-poisoned outputs, deterministic (dK/dV, then dQ
    walking the key blocks again) and with dQ added by f32 atomics from the dK/dV kernel."""
    from tegula.build import launch
    from tegula.kernels.attention_backward import backward_launches
    B, H, Hkv, Sq, Sk, D, causal, dtype = shape
    q, k, v, do = make_case(B, H, Hkv, Sq, Sk, D, dtype, zlib.crc32(_id(shape).encode()))
    scale = D ** -0.5
    o, lse, *want = reference_gradients(q, k, v, do, causal, scale)
    values = dict(q=q, k=k, v=v, do=do, o=o.to(q.dtype), lse=lse.contiguous(),
                  delta=poison(torch.empty(B, H, Sq, device="cuda")),
                  dq=poison(torch.empty_like(q)), dk=poison(torch.empty_like(k)),
                  dv=poison(torch.empty_like(v)),
                  dq_accum=torch.zeros(q.shape, dtype=torch.float32, device="cuda"))
    tg_dtype = f16 if dtype == "float16" else bf16
    for kernel, grid, names, constexprs in backward_launches(tg_dtype, B, H, Hkv, Sq, Sk, D,
                                                             scale, causal, deterministic):
        launch(kernel, grid, *(values[n] for n in names), **constexprs)
    torch.cuda.synchronize()
    for name, w in zip(("dq", "dk", "dv"), want):
        assert_close(name, values[name], w, dtype)


@pytest.mark.parametrize("shape", SHAPES[2:6], ids=_id)
def test_backward_entry_point_with_atomic_dq(shape):
    """attention_backward(deterministic=False), tuned on its first call: right (every
    element), and dk, dv, which no atomic touches, bit-identical from run to run."""
    from tegula.kernels.attention_backward import attention_backward
    B, H, Hkv, Sq, Sk, D, causal, dtype = shape
    q, k, v, do = make_case(B, H, Hkv, Sq, Sk, D, dtype, 11)
    o, lse, *want = reference_gradients(q, k, v, do, causal, D ** -0.5)
    atomic = attention_backward(q, k, v, o.to(q.dtype), lse, do, causal, deterministic=False)
    for name, a, w in zip(("dq", "dk", "dv"), atomic, want):
        assert_close(name, a, w, dtype)
    _, dk, dv = attention_backward(q, k, v, o.to(q.dtype), lse, do, causal, deterministic=False)
    assert torch.equal(dk, atomic[1]) and torch.equal(dv, atomic[2])


@pytest.mark.parametrize("shape", SHAPES[2:6], ids=_id)
def test_backward_entry_point_is_deterministic(shape):
    from tegula.kernels.attention_backward import attention_backward
    B, H, Hkv, Sq, Sk, D, causal, dtype = shape
    q, k, v, do = make_case(B, H, Hkv, Sq, Sk, D, dtype, 7)
    o, lse, *want = reference_gradients(q, k, v, do, causal, D ** -0.5)
    first = attention_backward(q, k, v, o.to(q.dtype), lse, do, causal)
    second = attention_backward(q, k, v, o.to(q.dtype), lse, do, causal)
    for name, a, b, w in zip(("dq", "dk", "dv"), first, second, want):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{name} not deterministic"
        assert_close(name, a, w, dtype)


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], SHAPES[4], SHAPES[9]], ids=_id)
def test_attention_autograd_end_to_end(shape):
    """o = attention_differentiable(q, k, v): the forward's o against the reference and
    torch autograd's gradients through the tegula forward and backward kernels."""
    from tegula.kernels.attention_backward import attention_differentiable
    B, H, Hkv, Sq, Sk, D, causal, dtype = shape
    q, k, v, do = make_case(B, H, Hkv, Sq, Sk, D, dtype, 11)
    o_ref, _, *want = reference_gradients(q, k, v, do, causal, D ** -0.5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attention_differentiable(*leaves, causal=causal)
    assert_close("o", o.detach(), o_ref, dtype)
    o.backward(do)
    for name, t, w in zip(("dq", "dk", "dv"), leaves, want):
        assert_close(name, t.grad, w, dtype)


def test_non_contiguous_gradient_and_inputs():
    """A (B, S, H, D) tensor's transposed view as q, and a gradient with a zero stride
    (from `.sum()`), go through the entry point."""
    from tegula.kernels.attention_backward import attention_differentiable
    g = torch.Generator(device="cuda").manual_seed(3)
    base = torch.randn(2, 100, 4, 64, device="cuda", generator=g).half()
    kv = torch.randn(2, 2, 90, 64, device="cuda", generator=g).half()
    q = base.transpose(1, 2).requires_grad_()
    k, v = kv.clone().requires_grad_(), kv.flip(2).clone().requires_grad_()
    attention_differentiable(q, k, v, causal=True).float().sum().backward()
    ones = torch.ones(2, 4, 100, 64, device="cuda", dtype=torch.half)
    _, _, *want = reference_gradients(q.detach(), k.detach(), v.detach(), ones, True, 0.125)
    for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), want):
        assert_close(name, t.grad, w, "float16")


def poisoned_launch_values(q, k, v, do, o, lse) -> dict:
    """The backward launches' tensors by name: gradients and delta NaN-poisoned, the f32 dQ
    accumulator (deterministic=False) zeros, o in q's type."""
    return dict(q=q, k=k, v=v, do=do, o=o.to(q.dtype), lse=lse.contiguous(),
                delta=poison(torch.empty(q.shape[:3], device="cuda")),
                dq=poison(torch.empty_like(q)), dk=poison(torch.empty_like(k)),
                dv=poison(torch.empty_like(v)),
                dq_accum=torch.zeros(q.shape, dtype=torch.float32, device="cuda"))


@pytest.mark.parametrize("D", [64, 128, 256])
def test_every_tuning_candidate_on_the_gpu(D):
    """The entry point's autotuner may pick any of these: each, launched directly into
    poisoned outputs, against the reference (causal, GQA 4, lengths that divide no tile)."""
    from tegula.build import launch
    from tegula.kernels.attention_backward import backward_candidates, backward_launches
    B, H, Hkv, Sq, Sk = 2, 8, 2, 333, 301
    q, k, v, do = make_case(B, H, Hkv, Sq, Sk, D, "float16", D)
    scale = D ** -0.5
    o, lse, *want = reference_gradients(q, k, v, do, True, scale)
    dkdv, dq = backward_candidates(D, "dkdv"), backward_candidates(D, "dq")
    # The entry tunes the two kernels over their own lists, so a dK/dV candidate runs with
    # the same tiles for dQ only where dQ's list has them (dK/dV's 64 x 128 3-stage tile
    # as a dQ tile needs 262 KB of shared memory at D = 128: never launched by the entry)
    with_dkdv = [t if t in dq else dict(t, dq_tiles=dq[0]) for t in dkdv]
    dq_only = [dict(dq_tiles=t) for t in dq if t not in dkdv]  # with dK/dV's default
    for tiles in with_dkdv + dq_only:
        values = poisoned_launch_values(q, k, v, do, o, lse)
        for kernel, grid, names, constexprs in backward_launches(f16, B, H, Hkv, Sq, Sk, D,
                                                                 scale, True, **tiles):
            launch(kernel, grid, *(values[n] for n in names), **constexprs)
        torch.cuda.synchronize()
        for name, w in zip(("dq", "dk", "dv"), want):
            assert_close(f"{name} {tiles}", values[name], w, "float16")


@pytest.mark.parametrize("D", [64, 128, 256])
def test_every_atomic_dq_candidate_on_the_gpu(D):
    """deterministic=False's autotuner may pick any of these: each, launched directly into
    poisoned outputs (dQ added into zeros by TMA reduce-adds), against the reference
    (causal, GQA 4, lengths that divide no tile)."""
    from tegula.build import launch
    from tegula.kernels.attention_backward import atomic_dq_candidates, backward_launches
    B, H, Hkv, Sq, Sk = 2, 8, 2, 333, 301
    q, k, v, do = make_case(B, H, Hkv, Sq, Sk, D, "float16", D + 1)
    scale = D ** -0.5
    o, lse, *want = reference_gradients(q, k, v, do, True, scale)
    for tiles in atomic_dq_candidates(D):
        values = poisoned_launch_values(q, k, v, do, o, lse)
        for kernel, grid, names, constexprs in backward_launches(
                f16, B, H, Hkv, Sq, Sk, D, scale, True, False, **tiles):
            launch(kernel, grid, *(values[n] for n in names), **constexprs)
        torch.cuda.synchronize()
        for name, w in zip(("dq", "dk", "dv"), want):
            assert_close(f"{name} {tiles}", values[name], w, "float16")


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("turns", [False, True], ids=["cooperative", "pingpong"])
def test_stated_roles_with_one_query_head_on_the_gpu(D, turns):
    """One query head a kv head with the roles stated (REGS): the dK/dV kernel without a
    loop over the heads, its and the dQ kernel's consumer warpgroups cooperating or taking
    turns at the tensor cores; into poisoned outputs, causal, lengths dividing no tile."""
    from tegula.build import launch
    from tegula.kernels.attention_backward import backward_launches
    B, H, Hkv, Sq, Sk = 2, 4, 4, 333, 301
    q, k, v, do = make_case(B, H, Hkv, Sq, Sk, D, "float16", D + 2)
    scale = D ** -0.5
    o, lse, *want = reference_gradients(q, k, v, do, True, scale)
    stated = dict(threads=256, REGS=240, EARLY_DP=True)
    if turns:
        stated["consumers"] = "pingpong"
    values = poisoned_launch_values(q, k, v, do, o, lse)
    for kernel, grid, names, constexprs in backward_launches(
            f16, B, H, Hkv, Sq, Sk, D, scale, True, dq_tiles=dict(stated, BM=128, BN=128),
            BM=64, BN=128, **stated):
        launch(kernel, grid, *(values[n] for n in names), **constexprs)
    torch.cuda.synchronize()
    for name, w in zip(("dq", "dk", "dv"), want):
        assert_close(name, values[name], w, "float16")
