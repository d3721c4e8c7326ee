"""Attention backward in the emulator against the analytic gradients in float64 numpy:
dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O)), dQ = scale · dS K, dK = scale · dSᵀ Q (GQA:
summed over the query heads of a kv head), every element, outputs poisoned (NaN) first.
Shapes are small and odd (lengths that divide no tile, Sq ≠ Sk, length 1, rows that see no
key under the bottom-right causal mask), on sm_90a and sm_80.
"""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f16
from tegula.kernels.attention_backward import (atomic_dq_candidates,
                                               attention_backward_emulated,
                                               backward_candidates, backward_launches)
from tegula.kernels.common import random_input


# -- float64 references ----------------------------------------------------------------------
def visible(seq_q: int, seq_k: int, causal: bool) -> np.ndarray:
    """(Sq, Sk) bool: which keys each query sees (bottom-right causal alignment)."""
    if not causal:
        return np.ones((seq_q, seq_k), bool)
    return np.arange(seq_k)[None, :] <= np.arange(seq_q)[:, None] + (seq_k - seq_q)


def reference_forward(q, k, v, causal, scale):
    """(o, lse, p) in float64; a row that sees no key has o = 0, lse = -inf, p = 0."""
    group = q.shape[1] // k.shape[1]
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.where(visible(q.shape[2], k.shape[2], causal), scale * q @ k.swapaxes(2, 3),
                 -np.inf)
    top = s.max(-1, keepdims=True, initial=-np.inf)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = e.sum(-1, keepdims=True)
    seen = total > 0
    p = np.where(seen, e / np.where(seen, total, 1.0), 0.0)
    lse = np.where(seen, np.log(np.where(seen, total, 1.0)) + top, -np.inf)[..., 0]
    return p @ v, lse, p


def reference_backward(q, k, v, do, causal, scale):
    """(o, lse, dq, dk, dv) in float64, by the analytic formulas."""
    o, lse, p = reference_forward(q, k, v, causal, scale)
    batch, kv_heads, seq_k, dim = k.shape
    group = q.shape[1] // kv_heads
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    dv = p.swapaxes(2, 3) @ do
    ds = p * (do @ v.swapaxes(2, 3) - (do * o).sum(-1, keepdims=True))
    dq = scale * ds @ k
    dk = scale * ds.swapaxes(2, 3) @ q
    per_kv = (batch, kv_heads, group, seq_k, dim)
    return o, lse, dq, dk.reshape(per_kv).sum(2), dv.reshape(per_kv).sum(2)


# -- running a case --------------------------------------------------------------------------
TOLERANCE = {f16: 4e-3, bf16: 3e-2}   # of the largest |gradient| (P and dS round to the type)


def inputs(shape_q, shape_kv, dtype, seed):
    rng = np.random.default_rng(seed)
    q, do = (random_input(rng, shape_q, dtype) for _ in range(2))
    k, v = (random_input(rng, shape_kv, dtype) for _ in range(2))
    return q, k, v, do


def stored(x, dtype):
    """A float64 reference value as the kernel's input storage (f16, or f32 holding bf16)."""
    from tegula.emulate.values import round_to
    return x.astype(np.float16) if dtype == f16 else round_to(x.astype(np.float32), dtype)


def run_case(B, H, Hkv, Sq, Sk, D, causal, dtype=f16, target=None, seed=0, lse_masked=None,
             **tiles):
    q, k, v, do = inputs((B, H, Sq, D), (B, Hkv, Sk, D), dtype, seed)
    scale = D ** -0.5
    o, lse, *want = reference_backward(q, k, v, do, causal, scale)
    lse32 = lse.astype(np.float32)
    if lse_masked is not None:   # what a forward stores for a row that sees no key
        lse32[np.isinf(lse32)] = lse_masked
    got = attention_backward_emulated(q, k, v, stored(o, dtype), lse32, do, causal=causal,
                                      dtype=dtype, target=target, **tiles)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape, name
        assert not np.isnan(g).any(), f"{name}: {np.isnan(g).sum()} elements never written"
        err = np.abs(g.astype(np.float64) - w)
        bound = TOLERANCE[dtype] * max(1.0, np.abs(w).max())
        assert err.max() <= bound, (f"{name}: max error {err.max():.3g} at "
                                    f"{np.unravel_index(err.argmax(), err.shape)}, bound "
                                    f"{bound:.3g}")
    return got, lse


CASES = [  # B, H, Hkv, Sq, Sk, D, causal, tiles
    pytest.param(1, 2, 2, 19, 23, 32, False, {}, id="ragged"),
    pytest.param(2, 2, 1, 45, 37, 32, True, dict(BM=16, BN=32), id="causal-Sq>Sk-masked-rows"),
    pytest.param(1, 4, 2, 13, 70, 32, True, dict(BM=16, BN=32), id="causal-Sq<Sk-gqa2"),
    pytest.param(1, 8, 1, 9, 17, 32, False, dict(BM=16, BN=32), id="mqa8"),
    pytest.param(1, 1, 1, 1, 1, 32, False, {}, id="length1"),
    pytest.param(1, 2, 1, 1, 40, 32, True, {}, id="one-query-causal"),
    pytest.param(1, 1, 1, 40, 1, 32, True, dict(BM=16, BN=32), id="one-key-causal"),
    pytest.param(1, 1, 1, 33, 35, 64, True, dict(BM=32, BN=32), id="d64"),
]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,causal,tiles", CASES)
def test_backward_matches_analytic_gradients(B, H, Hkv, Sq, Sk, D, causal, tiles, target):
    run_case(B, H, Hkv, Sq, Sk, D, causal, target=target, seed=Sq * 100 + Sk, **tiles)


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,causal,tiles", [
    pytest.param(1, 2, 2, 19, 23, 32, False, {}, id="ragged"),
    pytest.param(2, 2, 1, 45, 37, 32, True, dict(BM=16, BN=32), id="causal-Sq>Sk-masked-rows"),
    pytest.param(1, 4, 2, 13, 70, 32, True, dict(BM=16, BN=32), id="causal-Sq<Sk-gqa2"),
    pytest.param(1, 1, 1, 70, 75, 64, False, dict(BM=32, BN=32), id="d64-several-key-blocks"),
])
def test_atomic_dq_matches_analytic_gradients(B, H, Hkv, Sq, Sk, D, causal, tiles, target):
    """deterministic=False: the dK/dV kernel adds each key block's dS K into an f32 dQ
    (float atomics, summed over key blocks and, with GQA, nothing else: each query head has
    its own rows) and a last kernel scales and converts it: the same gradients."""
    run_case(B, H, Hkv, Sq, Sk, D, causal, target=target, seed=Sq * 100 + Sk + 1,
             deterministic=False, **tiles)


@pytest.mark.slow
@pytest.mark.parametrize("D", [64, 128, 256])
def test_every_tuning_candidate_is_right(D):
    """The torch entry point times these configurations on the GPU and keeps the fastest:
    each one (block sizes, thread counts, stated roles) must be right, not only the
    default. At D = 128 only those D = 64 does not have (the same code at another head
    dim; tests/gpu runs every one at every D)."""
    both = backward_candidates(D, "dkdv")
    seen = backward_candidates(64, "dkdv") + backward_candidates(64, "dq") if D == 128 else []
    for tiles in both:   # each runs both kernels
        if tiles not in seen:
            run_case(1, 2, 1, 20, 23, D, True, seed=D, **tiles)
    for tiles in backward_candidates(D, "dq"):
        if tiles not in both and tiles not in seen:   # the dQ kernel's own
            run_case(1, 2, 1, 20, 23, D, True, seed=D, dq_tiles=tiles)


def test_backward_bf16():
    run_case(1, 4, 2, 21, 30, 32, True, dtype=bf16, seed=5, BM=16, BN=32)


@pytest.mark.parametrize("D", [128, 256])
def test_backward_large_head_dims(D):
    run_case(1, 1, 1, 20, 37, D, True, seed=D, BM=16, BN=32)


@pytest.mark.parametrize("lse_masked", [-np.inf, np.inf])
def test_rows_that_see_no_key_get_zero_gradient(lse_masked):
    """Causal with Sq > Sk: query rows 0 … Sq − Sk − 1 see no key. Whatever their lse
    (−inf as here, +inf as FlashAttention stores), their dq is exactly 0 and they add
    nothing to dk, dv."""
    (dq, dk, dv), lse = run_case(1, 2, 1, 30, 12, 32, True, seed=9, lse_masked=lse_masked,
                                 BM=16, BN=32)
    assert np.isinf(lse[:, :, :18]).all() and np.isfinite(lse[:, :, 18:]).all()
    assert (dq[:, :, :18] == 0).all()


def test_causal_skips_masked_blocks():
    """The causal launches run the same kernels; the dK/dV programs start at the first
    query block reaching their keys and the dQ programs stop after the last key block on
    their diagonal. A run with large Sk − Sq (most blocks skipped) is right."""
    run_case(1, 1, 1, 17, 90, 32, True, seed=4, BM=16, BN=32)
    launches = backward_launches(f16, 1, 1, 1, 17, 90, 32, 0.1, True, BM=16, BN=32)
    assert [grid for _, grid, _, _ in launches] == [(2, 1, 1), (3, 1, 1), (2, 1, 1)]


@pytest.mark.parametrize("which", ["dkdv", "dq"])
def test_sm90a_runs_every_backward_gemm_on_wgmma(which):
    """The products with a transposed shared operand (Pᵀ dO, dSᵀ Q, dS K) read it MN-major,
    and D = 128 rows span two swizzle blocks: every gemm is a wgmma, none falls back."""
    import tegula as tg
    from tegula.kernels.attention_backward import (attention_backward_dkdv_kernel,
                                                   attention_backward_dq_kernel)
    kernel = {"dkdv": attention_backward_dkdv_kernel,
              "dq": attention_backward_dq_kernel}[which](f16)
    text = tg.explain(kernel, target="sm_90a", D=128, SCALE=0.1, CAUSAL=True)
    ops = text.split("== ops")[1]
    gemms = ops.count(" gemm %")
    assert gemms == {"dkdv": 4, "dq": 3}[which]
    assert ops.count("MMA      wgmma.") == gemms and "wgmma not used" not in text
    assert ops.count("B (MN-major) read from shared memory") == gemms // 2
    assert "layout conversions: none" in text
    # one role: the block issues its own TMA ring (a producer warpgroup measured 1.2-1.4x
    # slower on an H100, session 10)
    assert "128 threads per block (4 warps)\n" in text and "roles: warp-specialized" not in text
    assert "TMA boxes into an mbarrier ring" in text


@pytest.mark.parametrize("order", ["reversed", "random:5"])
def test_gqa_causal_64x64_blocks_under_role_orders(order):
    """64 x 64 blocks (every gemm on wgmma, the dQ kernel warp-specialized) on GQA 2,
    causal, lengths that divide no tile with Sk > Sq: some key blocks start past query
    block 0, the last sees only part of one; roles interleaved as `order` says."""
    run_case(1, 4, 2, 130, 141, 64, True, seed=11, BM=64, BN=64, role_order=order)


def test_empty_sequences_give_zero_gradients():
    q, k, v, do = inputs((1, 2, 5, 32), (1, 2, 0, 32), f16, 1)
    o = np.zeros_like(q)
    lse = np.full((1, 2, 5), -np.inf, np.float32)
    dq, dk, dv = attention_backward_emulated(q, k, v, o, lse, do)
    assert (dq == 0).all() and dk.shape == (1, 2, 0, 32) and dv.shape == (1, 2, 0, 32)


@pytest.mark.parametrize("change,message", [
    (dict(k=(1, 3, 8, 32), v=(1, 3, 8, 32)), "multiple of the kv heads"),
    (dict(v=(1, 2, 9, 32)), "v has shape"),
    (dict(o=(1, 2, 8, 32)), "o has shape"),
    (dict(lse=(1, 2, 5)), "lse has shape"),
    (dict(q=(1, 2, 4, 48), do=(1, 2, 4, 48), o=(1, 2, 4, 48), k=(1, 2, 8, 48),
          v=(1, 2, 8, 48)), "head dim 48"),
    (dict(q=(2, 4, 32)), "q must be 4-D"),
])
def test_bad_shapes_are_named(change, message):
    shapes = dict(q=(1, 2, 4, 32), k=(1, 2, 8, 32), v=(1, 2, 8, 32), o=(1, 2, 4, 32),
                  do=(1, 2, 4, 32), lse=(1, 2, 4))
    shapes.update(change)
    arrays = {n: np.ones(s, np.float32 if n == "lse" else np.float16)
              for n, s in shapes.items()}
    with pytest.raises(ValueError, match=message):
        attention_backward_emulated(**arrays)


def test_bad_dtypes_are_named():
    q = np.ones((1, 1, 4, 32), np.float16)
    lse = np.zeros((1, 1, 4), np.float32)
    with pytest.raises(TypeError, match="k has dtype float32"):
        attention_backward_emulated(q, q.astype(np.float32), q, q, lse, q)
    with pytest.raises(TypeError, match="lse must be float32"):
        attention_backward_emulated(q, q, q, q, lse.astype(np.float16), q)
    with pytest.raises(TypeError, match="q has dtype float64"):
        attention_backward_emulated(*(q.astype(np.float64),) * 4, lse, q)


# -- the torch entry points, on CPU tensors through the emulator (conftest: on_cpu) ------------

def test_torch_entry_point_matches_numpy(on_cpu):
    from tegula.kernels.attention_backward import attention_backward
    torch = on_cpu
    q, k, v, do = inputs((1, 4, 21, 32), (1, 2, 30, 32), f16, 8)
    o, lse, *want = reference_backward(q, k, v, do, True, 0.3)
    args = [torch.from_numpy(x) for x in (q, k, v, o.astype(np.float16),
                                          lse.astype(np.float32), do)]
    args[5] = args[5].transpose(2, 3).contiguous().transpose(2, 3)  # do: not row-major
    got = attention_backward(*args, causal=True, scale=0.3)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.dtype == torch.float16 and g.is_contiguous(), name
        err = np.abs(g.numpy().astype(np.float64) - w).max()
        assert err <= TOLERANCE[f16] * max(1.0, np.abs(w).max()), f"{name}: {err}"


def test_autograd_function_gives_the_analytic_gradients(on_cpu):
    """tegula.kernels.attention is differentiable: the forward's o, and o.backward(do)
    fills q.grad, k.grad and v.grad (GQA: k and v have fewer heads) with the analytic
    gradients."""
    from tegula.kernels import attention as attention_differentiable
    torch = on_cpu
    q, k, v, do = inputs((1, 4, 19, 64), (1, 2, 26, 64), f16, 12)
    o, _, *want = reference_backward(q, k, v, do, True, 64 ** -0.5)
    leaves = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    out = attention_differentiable(*leaves, causal=True)
    assert out.requires_grad
    assert np.abs(out.detach().numpy() - o).max() <= 4e-3 * max(1, np.abs(o).max())
    out.backward(torch.from_numpy(do))
    for name, t, w in zip(("dq", "dk", "dv"), leaves, want):
        err = np.abs(t.grad.numpy().astype(np.float64) - w).max()
        assert err <= TOLERANCE[f16] * max(1.0, np.abs(w).max()), f"{name}: {err}"
    with torch.no_grad():   # no graph: the forward alone
        assert not attention_differentiable(*leaves, causal=True).requires_grad


def test_torch_argument_errors(on_cpu):
    from tegula.kernels.attention_backward import attention_backward
    torch = on_cpu
    q = torch.ones(1, 2, 4, 32, dtype=torch.float16)
    lse = torch.zeros(1, 2, 4)
    with pytest.raises(TypeError, match="k has dtype torch.float32"):
        attention_backward(q, q.float(), q, q, lse, q)
    with pytest.raises(TypeError, match="lse has dtype torch.float16"):
        attention_backward(q, q, q, q, lse.half(), q)
    with pytest.raises(ValueError, match="do has shape"):
        attention_backward(q, q, q, q, lse, q[:, :, :3])
    with pytest.raises(ValueError, match="scale must be a finite number"):
        attention_backward(q, q, q, q, lse, q, scale=float("nan"))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_backward_cuda_compiles(target):
    """The three kernels' CUDA compiles (NVRTC or nvcc) at D = 64: the emulator runs the
    same thread IR, but only a compiler sees the printed source (a parameter named `do`
    emulated fine and did not compile)."""
    from tegula.build import build
    from tegula.runtime.compiler import available_compilers, compile_cuda
    if not available_compilers():
        pytest.skip("no CUDA compiler (NVRTC or nvcc)")
    for kernel, _, _, constexprs in backward_launches(f16, 1, 4, 2, 200, 300, 64, 0.125, True):
        assert compile_cuda(build(kernel, constexprs, target=target).cuda_source(),
                            kernel.name, target)


@pytest.mark.parametrize("tiles", atomic_dq_candidates(64), ids=lambda t: "-".join(
    f"{k}{v}" for k, v in t.items()))
def test_every_atomic_dq_candidate_is_right(tiles):
    """deterministic=False: the torch entry point times these dK/dV-adding-dQ tiles (two
    warpgroups of 64 keys in one role among them) and keeps the fastest: each must be
    right, at lengths that divide no tile (two or three key blocks adding into each query
    block's dQ), causal with Sq < Sk and GQA 2."""
    run_case(1, 2, 1, 37, 140, 64, True, seed=65, deterministic=False, **tiles)


def test_torch_entry_point_with_atomic_dq_matches_numpy(on_cpu, monkeypatch):
    """The tuned atomic path adds into zeros even after the tuner's timed runs added into
    the same accumulator: here a stand-in tuner runs the first candidate twice (a timed
    run, then the launch it keeps), which would double dQ without the fresh zeros."""
    import tegula.kernels.api
    from tegula.kernels.attention_backward import attention_backward
    torch = on_cpu
    monkeypatch.setattr(tegula.kernels.api, "_tune_and_run",
                        lambda name, device, configs, dims, extra, run:
                        (run(configs[0]), run(configs[0]))[1])
    q, k, v, do = inputs((1, 2, 40, 64), (1, 1, 67, 64), f16, 3)
    o, lse, *want = reference_backward(q, k, v, do, True, 0.2)
    args = [torch.from_numpy(x) for x in (q, k, v, o.astype(np.float16),
                                          lse.astype(np.float32), do)]
    got = attention_backward(*args, causal=True, scale=0.2, deterministic=False)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        err = np.abs(g.numpy().astype(np.float64) - w).max()
        assert err <= TOLERANCE[f16] * max(1.0, np.abs(w).max()), f"{name}: {err}"


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic-dq"])
def test_stated_roles_and_early_dp_are_right(deterministic):
    """REGS states the warp roles (a producer warpgroup of 24 registers issuing the boxes,
    consumers deferring their wgmma waits) and EARLY_DP issues dO Vᵀ before the
    exponentials: the same gradients, dK/dV and dQ kernels alike, at lengths dividing no
    tile, causal with Sq < Sk, GQA 2."""
    run_case(1, 2, 1, 37, 140, 64, True, seed=66, deterministic=deterministic, BM=64,
             BN=128, threads=256, REGS=240, EARLY_DP=True)


def test_stated_roles_with_one_query_head_and_turns_are_right():
    """One query head a kv head: with stated roles the dK/dV kernel has no loop over the
    heads (the ring not nested), so its consumer warpgroups may take turns at the tensor
    cores (consumers="pingpong"), as the dQ kernel's do; both right."""
    turns = dict(threads=256, REGS=240, EARLY_DP=True, consumers="pingpong")
    run_case(1, 1, 1, 37, 300, 64, True, seed=67, BM=64, BN=128,
             dq_tiles=dict(turns, BM=128, BN=128), **turns)


@pytest.mark.parametrize("Sq,Sk,tiles", [
    pytest.param(150, 140, dict(BM=32, BN=32, target="sm_80"), id="one-role-sm80"),
    pytest.param(140, 150, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True,
                                LATE_DELTA=True), id="stated-roles-late-delta"),
])
def test_staggered_atomic_dq_is_right(Sq, Sk, tiles):
    """STAGGER: key block n walks its query blocks from its n-th on (the ring's stage i
    holding query block first + (i − first + n) mod count), so blocks running at once add
    into different dQ rows: the same gradients, causal (each key block its own first query
    block), GQA 2, several key and query blocks (a later key block walking two or more),
    lengths dividing no tile. With stated roles also LATE_DELTA (delta loaded after the
    exponentials)."""
    run_case(1, 2, 1, Sq, Sk, 32, True, seed=68, deterministic=False, STAGGER=True, **tiles)


@pytest.mark.parametrize("causal,target,deterministic", [
    (True, "sm_90a", True), (True, "sm_80", False), (False, "sm_90a", False),
    (False, "sm_80", True)])
def test_mask_behind_a_branch_is_right(causal, target, deterministic):
    """MASK_BRANCH: the dK/dV (or dK/dV-adding-dQ) and dQ kernels mask only blocks reaching
    past a limit (a key past Sk, a query past Sq, or causally past a row's last visible
    key); interior blocks take the unmasked path. Both paths run here: several key and
    query blocks, Sq < Sk, lengths dividing no tile, GQA 2. (Pairs past Sq or Sk add
    nothing either way, their Q, dO or K, V rows loading as zeros: only the causal
    limit's error shows.)"""
    run_case(1, 2, 1, 45, 70, 32, causal, target=target, seed=69,
             deterministic=deterministic, BM=16, BN=32, MASK_BRANCH=True,
             dq_tiles=dict(BM=16, BN=32, MASK_BRANCH=True))
