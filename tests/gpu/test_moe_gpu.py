"""MoE grouped GEMM on the GPU against a torch loop over experts (f32), every routed element,
outputs poisoned with NaN first: random routing with k = 1 and 2, experts with no tokens, one
expert with every token, rows, N and K that divide no tile; persistent (sm_90a: TMA ring
across work items) and one-block-per-item launches, 128x256 tiles on two consumer
warpgroups (stores direct or staged through shared memory) and small tiles; FP8 weights; the autotuned entry point; and the routing
helpers' device path (no host sync) agreeing with numpy.

Bound: inputs are bf16, products exact in f32, sums in f32 over K (wgmma's f32
accumulation), one bf16 rounding: 2^-8·|ref| + K·2^-22·Σ|x·w| (generous for the f32 sums).
"""
from __future__ import annotations

import numpy as np
import pytest

from tegula.kernels import moe

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

CONFIGS = [dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=8, threads=256),
           dict(BM=128, BN=256, BK=64, STAGES=3, GROUP=8, threads=256, STAGED=True),
           dict(BM=128, BN=128, BK=64, STAGES=4, GROUP=8),
           dict(BM=64, BN=128, BK=64, STAGES=3, GROUP=4, PERSISTENT=False),
           # session 10's 64-expert candidates: a 176-wide column tile, 192 rows on three
           # consumer warpgroups, bands of 3 / 2 row tiles
           dict(BM=128, BN=176, BK=64, STAGES=4, GROUP=3, threads=256, STAGED=True),
           dict(BM=192, BN=176, BK=64, STAGES=3, GROUP=2, threads=384, STAGED=True)]


def problem(counts, n, k, seed, extra_rows=5):
    g = torch.Generator(device="cuda").manual_seed(seed)
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32,
                           device="cuda")
    rows = int(offsets[-1]) + extra_rows
    x = torch.randn(rows, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(len(counts), n, k, device="cuda", generator=g) * k ** -0.5).bfloat16()
    return x, w, offsets


def loop_reference(x, w, offsets):
    """The torch loop over experts, in f32, and Σ|x·w| for the bound."""
    bounds = offsets.tolist()
    ref = torch.zeros(bounds[-1], w.shape[1], device="cuda")
    mag = torch.zeros_like(ref)
    for e in range(w.shape[0]):
        a, b = bounds[e], bounds[e + 1]
        ref[a:b] = x[a:b].float() @ w[e].float().T
        mag[a:b] = x[a:b].float().abs() @ w[e].float().abs().T
    return ref, mag


def check(out, x, w, offsets, what):
    end = int(offsets[-1])
    ref, mag = loop_reference(x, w, offsets)
    got = out[:end].float()
    assert not torch.isnan(got).any(), f"{what}: routed rows left unwritten"
    bound = 2.0 ** -8 * ref.abs() + x.shape[1] * 2.0 ** -22 * mag + 1e-30
    err = (got - ref).abs()
    worst = int(torch.argmax(err / bound))
    i, j = divmod(worst, ref.shape[1])
    assert bool((err <= bound).all()), (f"{what} ({i}, {j}): got {got[i, j].item()}, "
                                        f"expected {ref[i, j].item()}")
    assert torch.isnan(out[end:].float()).all(), f"{what}: rows of no expert were written"


CASES = [([300, 0, 517, 1, 129, 0, 64, 200], 1000, 520),   # empty experts, ragged all
         ([0, 0, 1300, 0], 384, 256),                      # one expert holds everything
         ([7, 3, 1, 0, 2, 9, 5, 1, 0, 4, 6, 2, 3, 1, 8, 1], 136, 72)]   # decode-like


@pytest.mark.parametrize("config", CONFIGS,
                         ids=["p128x256", "p128x256staged", "p128x128", "np64x128",
                              "p128x176staged", "p192x176staged"])
@pytest.mark.parametrize("counts, n, k", CASES, ids=["ragged", "one-expert", "few-rows"])
def test_moe_gemm_matches_torch_loop(counts, n, k, config):
    x, w, offsets = problem(counts, n, k, seed=n + k)
    out = torch.full((x.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
    moe.moe_gemm(x, w, offsets, out=out, config=config)
    torch.cuda.synchronize()
    check(out, x, w, offsets, f"{counts} {config}")


def test_fp8_weights():
    x, w, offsets = problem([100, 0, 333, 17], 264, 256, seed=1)
    w_q, w_scale = moe.quantize_experts_fp8(w)
    out = torch.full((x.shape[0], 264), float("nan"), device="cuda", dtype=torch.bfloat16)
    moe.moe_gemm(x, w_q, offsets, w_scale, out=out,
                 config=dict(BM=128, BN=256, BK=128, STAGES=4, threads=256))
    torch.cuda.synchronize()
    x_q, x_scale = moe.quantize_rows_fp8(x)
    # Against the dequantized operands: exact products, f32 sums (FP8 wgmma keeps ~14 bits
    # of its running sum per k32 step: 2^-11 of Σ|x·w| per step, as tests/gpu/test_fp8_gpu).
    xd, wd = x_q.float() * x_scale, w_q.float() * w_scale[:, None, None]
    ref, mag = loop_reference(xd, wd, offsets)
    end = int(offsets[-1])
    bound = 2.0 ** -8 * ref.abs() + (256 // 32) * 2.0 ** -11 * mag + 1e-30
    assert not torch.isnan(out[:end].float()).any()
    assert bool(((out[:end].float() - ref).abs() <= bound).all())


def test_routing_on_device_and_autotuned_entry_point():
    g = torch.Generator(device="cuda").manual_seed(5)
    tokens, experts, hidden, n = 777, 8, 256, 384
    x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    w = (torch.randn(experts, n, hidden, device="cuda", generator=g) * 0.06).bfloat16()
    logits = torch.randn(tokens, experts, device="cuda", generator=g)
    for top_k in (1, 2):
        ids, weights = moe.route(logits, top_k)
        routing = moe.sort_by_expert(ids, experts)
        host = moe.sort_by_expert(ids.cpu().numpy(), experts)
        assert np.array_equal(routing.expert_offsets.cpu().numpy(), host.expert_offsets)
        assert np.array_equal(routing.order.cpu().numpy(), host.order)
        x_sorted = moe.scatter_rows(x, routing)
        y_sorted = moe.moe_gemm(x_sorted, w, routing.expert_offsets)
        check(y_sorted, x_sorted, w, routing.expert_offsets, f"k={top_k}")
        y = moe.gather_rows(y_sorted, routing, weights)
        ref = sum(weights[:, j:j + 1] * torch.einsum("tk,tnk->tn", x.float(),
                                                     w[ids[:, j].long()].float())
                  for j in range(top_k))
        assert float((y.float() - ref).abs().max()) <= 0.02 * float(ref.abs().max())


W4_CONFIGS = [None,                       # the default tiles
              dict(SWAPPED=True, BM=128, BN=128, BK=64, STAGES=4, threads=256),
              dict(SWAPPED=True, BM=256, BN=128, BK=64, STAGES=3, threads=256),
              dict(SWAPPED=True, BM=64, BN=64, BK=64, STAGES=4, PERSISTENT=False),
              dict(FRAGMENT=True, BM=128, WG=2, STAGES=4, PAIRS=0),   # PAIRS=1: two rings,
              dict(FRAGMENT=True, BM=256, WG=2, KS=1, STAGES=3, WSMEM=0, PAIRS=0),  # > 227 KB
              dict(FRAGMENT=True, BM=128, WG=2, KS=2, STAGES=3, PERSISTENT=False),
              dict(FRAGMENT=True, BM=128, WG=3, KS=2, STAGES=2, WSMEM=0, PAIRS=1),
              dict(FRAGMENT=True, BM=128, WG=2, KS=1, STAGES=4, WSMEM=0, PAIRS=1),
              dict(FRAGMENT=True, BM=128, WG=2, KS=2, STAGES=3, WSMEM=0, PAIRS=1),
              dict(FRAGMENT=True, AHEAD=0)]   # session 13's default: no head early


@pytest.mark.parametrize("config", W4_CONFIGS, ids=["default", "swapped128x128",
                                                    "swapped128x256", "swapped-np64",
                                                    "fragment128", "fragment256-wsmem0",
                                                    "fragment-ks2-np", "pairs-wg3-ks2",
                                                    "pairs-ks1", "pairs-wg2-ks2",
                                                    "no-ahead"])
@pytest.mark.parametrize("counts, n, k", [([90, 0, 200, 33], 200, 256),
                                          ([300, 0, 517, 1, 129, 0, 64, 200], 1000, 512),
                                          ([40, 1, 0, 77], 136, 384)])     # 3 steps of 128
def test_w4a16_weights(config, counts, n, k):
    """The 4-bit-weight grouped GEMM into a NaN-poisoned output: session 12's swapped
    and fragment kernels (persistent: 132 blocks walk the items; one block an item; the
    fragment kernel's weights packed by the entry point, integer zeros: no residue step;
    session 13's PAIRS, two k-steps an iteration, at an odd step count too; without
    AHEAD, session 13's default) and the default (AHEAD=1 since session 14: each item's
    first weights loaded during the previous item's epilogue)."""
    from tegula.kernels import moe_w4
    from tegula.kernels.quant import dequantize_w4, unpack_w4
    x, w, offsets = problem(counts, n, k, seed=2)
    x = x.half()
    packed, scales, zeros = moe_w4.quantize_experts_w4(w.half(), 128)
    out = torch.full((x.shape[0], n), float("nan"), device="cuda", dtype=torch.float16)
    moe_w4.moe_gemm_w4a16(x, packed, scales, zeros, 128, offsets, config=config, out=out)
    torch.cuda.synchronize()
    assert torch.isnan(out[int(offsets[-1]):].float()).all(), "rows of no expert written"
    w_q = unpack_w4(packed.cpu().numpy())
    bounds = offsets.tolist()
    for e in range(w.shape[0]):
        a, b = bounds[e], bounds[e + 1]
        wd = torch.from_numpy(dequantize_w4(w_q[e], scales[e].cpu().numpy(),
                                            zeros[e].cpu().numpy(), 128)).cuda()
        ref = x[a:b].double() @ wd.T
        mag = x[a:b].double().abs() @ wd.abs().T
        got = out[a:b].double()
        assert not torch.isnan(got).any()
        assert bool(((got - ref).abs() <= 2.0 ** -11 * (ref.abs() + mag) + 1e-30).all()), e


def test_moe_mlp_fused_gate_up():
    from tegula.kernels import moe_layer
    g = torch.Generator(device="cuda").manual_seed(9)
    tokens, experts, hidden, inner = 300, 8, 256, 384
    x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    w13 = (torch.randn(experts, 2 * inner, hidden, device="cuda", generator=g) * 0.06).bfloat16()
    w2 = (torch.randn(experts, hidden, inner, device="cuda", generator=g) * 0.05).bfloat16()
    logits = torch.randn(tokens, experts, device="cuda", generator=g)
    logits[:, 3] = -30.0                                  # expert 3 gets no token
    ids, weights = moe.route(logits, 2)
    y = moe_layer.moe_mlp(x, w13, w2, ids, weights)
    ref = torch.zeros(tokens, hidden, device="cuda")
    for j in range(2):
        e = ids[:, j].long()
        h = torch.einsum("th,tnh->tn", x.float(), w13[e].float())
        a = (torch.nn.functional.silu(h[:, :inner]) * h[:, inner:]).bfloat16().float()
        ref += weights[:, j:j + 1] * torch.einsum("ti,thi->th", a, w2[e].float())
    assert not torch.isnan(y).any()
    assert float((y.float() - ref).abs().max()) <= 2.0 ** -6 * float(ref.abs().max())
