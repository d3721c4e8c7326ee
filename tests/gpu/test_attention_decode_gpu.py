"""Split-KV decoding on the GPU against a float32 reference with explicit masks, every
element of o and lse: the kernels launched directly into NaN-poisoned outputs and
partials, cache slots past each length holding NaN/inf, paged caches with shuffled pages,
caches up to 128k keys; the `attention_decode` entry point against torch SDPA.
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

TOLERANCE = {"float16": 4e-3, "bfloat16": 2e-2}  # of the largest |o|


def reference(q, k, v, seqlens, causal, scale):
    """(o, lse) float32 for a contiguous (B, Hkv, S, D) cache, batch by batch."""
    B, H, Sq, D = q.shape
    group = H // k.shape[1]
    o = torch.zeros(B, H, Sq, D, device="cuda")
    lse = torch.full((B, H, Sq), float("-inf"), device="cuda")
    for b, length in enumerate(seqlens.tolist()):
        if length == 0:
            continue
        keys = k[b, :, :length].float().repeat_interleave(group, 0)
        values = v[b, :, :length].float().repeat_interleave(group, 0)
        s = scale * q[b].float() @ keys.transpose(1, 2)                     # (H, Sq, L)
        if causal:
            i = torch.arange(Sq, device="cuda")[:, None]
            j = torch.arange(length, device="cuda")[None, :]
            s = s.masked_fill(j > i + length - Sq, float("-inf"))
        lse[b] = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[b][..., None]).nan_to_num(0.0)
        o[b] = p @ values
    return o, lse


def make_cache(B, H, Hkv, Sq, D, capacity, seqlens, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tdtype = getattr(torch, dtype)
    q = torch.randn(B, H, Sq, D, device="cuda", generator=g).to(tdtype)
    k, v = (torch.randn(B, Hkv, capacity, D, device="cuda", generator=g).to(tdtype)
            for _ in range(2))
    for b, length in enumerate(seqlens):
        k[b, :, length:] = float("nan")
        v[b, :, length:] = float("inf")
    return q, k, v, torch.tensor(seqlens, dtype=torch.int32, device="cuda")


def paged(k, v, page, seed):
    """The cache as a shuffled pool of pages (3 unused, NaN) and its block table."""
    B, Hkv, capacity, D = k.shape
    per_seq = capacity // page
    order = torch.randperm(B * per_seq + 3, generator=torch.Generator().manual_seed(seed))
    table = order[:B * per_seq].view(B, per_seq).to(torch.int32).cuda()
    pool_k = torch.full((len(order), Hkv, page, D), float("nan"), dtype=k.dtype, device="cuda")
    pool_v = pool_k.clone()
    for b in range(B):
        for i in range(per_seq):
            pool_k[table[b, i]] = k[b, :, i * page:(i + 1) * page]
            pool_v[table[b, i]] = v[b, :, i * page:(i + 1) * page]
    return pool_k, pool_v, table


def assert_close(o, lse, want_o, want_lse, dtype):
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} NaN in o (unwritten?)"
    err = (o.float() - want_o).abs()
    bound = TOLERANCE[dtype] * max(1.0, want_o.abs().max().item())
    assert err.max().item() <= bound, (f"o: max error {err.max().item():.3g} at "
                                       f"{np.unravel_index(int(err.argmax()), err.shape)}")
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    finite = torch.isfinite(want_lse)
    if finite.any():
        lse_err = (lse[finite] - want_lse[finite]).abs().max().item()
        assert lse_err <= 1e-4 * (1 + want_lse[finite].abs().max().item()), f"lse: {lse_err}"


CASES = [  # B, H, Hkv, Sq, D, capacity, seqlens, causal, page, dtype
    (4, 32, 8, 1, 128, 4096, [4096, 1, 0, 2999], False, 0, "float16"),
    (2, 32, 4, 4, 128, 8192, [8192, 5000], True, 0, "bfloat16"),
    (3, 8, 1, 1, 64, 3000, [3000, 17, 2048], False, 0, "float16"),
    (2, 16, 2, 16, 64, 1000, [1000, 999], True, 0, "float16"),
    (1, 8, 8, 1, 256, 2048, [2047], False, 0, "float16"),
    (3, 32, 8, 1, 128, 4096, [4096, 100, 3333], False, 64, "float16"),
    (2, 16, 2, 2, 128, 2048, [2048, 1500], True, 16, "bfloat16"),
    (2, 8, 1, 1, 64, 4096, [4096, 0], False, 256, "float16"),
    (1, 32, 8, 1, 128, 131072, [131072 - 5], False, 0, "float16"),
    (1, 8, 1, 1, 128, 131072, [131072], False, 256, "bfloat16"),
]


def _id(case):
    B, H, Hkv, Sq, D, capacity, seqlens, causal, page, dtype = case
    return (f"B{B}H{H}kv{Hkv}-q{Sq}-D{D}-S{capacity}-{'causal' if causal else 'full'}"
            f"-{'page' + str(page) if page else 'contiguous'}-{dtype}")


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-launches"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_decode_kernels_into_poisoned_outputs(case, fused):
    """The fused form (the last split block merges) three times on the same counters,
    each into fresh poisoned outputs: the counters must be back at 0 after every call."""
    from tegula.build import launch
    from tegula.kernels.attention_decode import decode_launches
    B, H, Hkv, Sq, D, capacity, seqlens, causal, page, dtype = case
    seed = zlib.crc32(_id(case).encode())
    q, k, v, lengths = make_cache(B, H, Hkv, Sq, D, capacity, seqlens, dtype, seed)
    want_o, want_lse = reference(q, k, v, lengths, causal, D ** -0.5)
    table = None
    if page:
        k, v, table = paged(k, v, page, seed)
    R = H // Hkv * Sq
    config, launches = decode_launches(f16 if dtype == "float16" else bf16, B, H, Hkv, Sq, D,
                                       capacity, page, D ** -0.5, causal, fused=fused)
    splits = config["splits"]
    counters = torch.zeros(B, Hkv, dtype=torch.int32, device="cuda")
    for _ in range(3 if fused else 1):
        values = dict(q=q.view(B, Hkv, R, D), k=k, v=v, seqlens=lengths, block_table=table,
                      o_part=poison(torch.empty(B, Hkv, splits, R, D, device="cuda")),
                      lse_part=poison(torch.empty(B, Hkv, splits, R, device="cuda")),
                      o=poison(torch.empty(B, Hkv, R, D, dtype=q.dtype, device="cuda")),
                      lse=poison(torch.empty(B, Hkv, R, device="cuda")), counters=counters)
        for kernel, grid, names, scalars, constexprs in launches:
            launch(kernel, grid, *(values[n] for n in names), *scalars, **constexprs)
        torch.cuda.synchronize()
        assert_close(values["o"].view(B, H, Sq, D), values["lse"].view(B, H, Sq), want_o,
                     want_lse, dtype)
        assert int(counters.abs().sum()) == 0, "an arrival counter was left non-zero"


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]], ids=_id)
def test_decode_entry_point_against_sdpa(case):
    """All sequences full (SDPA has no per-sequence length without a mask): the entry
    point against torch SDPA and the reference."""
    import torch.nn.functional as F

    from tegula.kernels.attention_decode import attention_decode
    B, H, Hkv, Sq, D, capacity, _, causal, page, dtype = case
    seqlens = [capacity] * B
    q, k, v, lengths = make_cache(B, H, Hkv, Sq, D, capacity, seqlens, dtype, 5)
    group = H // Hkv
    sdpa = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                          v.repeat_interleave(group, 1))
    want_o, want_lse = reference(q, k, v, lengths, causal, D ** -0.5)
    table = None
    if page:
        k, v, table = paged(k, v, page, 5)
    o, lse = attention_decode(q, k, v, lengths, table, return_lse=True)
    assert_close(o, lse, want_o, want_lse, dtype)
    err = (o.float() - sdpa.float()).abs().max().item()
    assert err <= 2 * TOLERANCE[dtype] * max(1.0, sdpa.abs().max().item()), f"vs SDPA: {err}"


def test_lengths_past_the_capacity_are_clamped():
    """A length beyond the cache reads no memory outside it: the kernels clamp it to the
    capacity (the result is attention over the whole cache)."""
    from tegula.kernels.attention_decode import attention_decode
    q, k, v, lengths = make_cache(2, 8, 2, 1, 64, 256, [256, 256], "float16", 9)
    want_o, want_lse = reference(q, k, v, lengths, False, 0.125)
    o, lse = attention_decode(q, k, v, torch.tensor([100000, 256], dtype=torch.int32,
                                                    device="cuda"), return_lse=True)
    assert_close(o, lse, want_o, want_lse, "float16")


@pytest.mark.parametrize("case", [CASES[5], CASES[9]], ids=_id)
def test_paged_decode_touching_pages_ahead(case):
    """The paged split kernel with WARM=8 (it also copies the first 16 bytes of the page 8
    key blocks ahead into a scratch ring): the same results into poisoned outputs."""
    from tegula.build import launch
    from tegula.kernels.attention_decode import decode_launches
    B, H, Hkv, Sq, D, capacity, seqlens, causal, page, dtype = case
    q, k, v, lengths = make_cache(B, H, Hkv, Sq, D, capacity, seqlens, dtype, 21)
    want_o, want_lse = reference(q, k, v, lengths, causal, D ** -0.5)
    k, v, table = paged(k, v, page, 21)
    R = H // Hkv * Sq
    config, launches = decode_launches(f16 if dtype == "float16" else bf16, B, H, Hkv, Sq, D,
                                       capacity, page, D ** -0.5, causal)
    splits = config["splits"]
    values = dict(q=q.view(B, Hkv, R, D), k=k, v=v, seqlens=lengths, block_table=table,
                  o_part=poison(torch.empty(B, Hkv, splits, R, D, device="cuda")),
                  lse_part=poison(torch.empty(B, Hkv, splits, R, device="cuda")),
                  o=poison(torch.empty(B, Hkv, R, D, dtype=q.dtype, device="cuda")),
                  lse=poison(torch.empty(B, Hkv, R, device="cuda")),
                  counters=torch.zeros(B, Hkv, dtype=torch.int32, device="cuda"))
    (kernel, grid, names, scalars, constexprs), = launches
    launch(kernel, grid, *(values[n] for n in names), *scalars, **dict(constexprs, WARM=8))
    torch.cuda.synchronize()
    assert_close(values["o"].view(B, H, Sq, D), values["lse"].view(B, H, Sq), want_o,
                 want_lse, dtype)


def test_entry_point_replays_and_streams_share_no_counters():
    """Repeated calls (the second and later replayed) on the default stream and on a
    second stream, all against the reference; the fused and two-launch forms agree."""
    from tegula.kernels.attention_decode import attention_decode
    q, k, v, lengths = make_cache(3, 32, 8, 1, 128, 4096, [4096, 1, 2500], "float16", 11)
    want_o, want_lse = reference(q, k, v, lengths, False, 128 ** -0.5)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side, torch.cuda.current_stream()):
        with torch.cuda.stream(stream):
            for _ in range(3):
                o, lse = attention_decode(q, k, v, lengths, return_lse=True)
                assert_close(o, lse, want_o, want_lse, "float16")
        stream.synchronize()
    two, _ = attention_decode(q, k, v, lengths, return_lse=True, fused=False)
    assert (two.float() - o.float()).abs().max().item() <= 1e-3


def test_captured_calls_get_counters_of_their_own():
    """Under CUDA-graph capture each call's arrival counters are its own (zeroed by the
    graph), not the capture stream's shared buffer: two graphs capture decode calls on
    torch's one capture stream, then replay at once on two streams, 20 times, each against
    its reference (shared counters would mix their arrivals)."""
    from tegula.kernels.attention_decode import attention_decode
    from tegula.runtime.arrivals import arrival_counters
    cases = [make_cache(2, 32, 8, 1, 128, 8192, [8192, 3000], "float16", seed)
             for seed in (31, 32)]
    wants = [reference(q, k, v, lengths, False, 128 ** -0.5)[0] for q, k, v, lengths in cases]
    for q, k, v, lengths in cases:
        attention_decode(q, k, v, lengths)                 # compiles outside the capture
    torch.cuda.synchronize()
    graphs, outs, seen = [], [], []
    for q, k, v, lengths in cases:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append(attention_decode(q, k, v, lengths))
            seen.append(arrival_counters(q.device, 16).data_ptr())
        graphs.append(graph)
    shared = arrival_counters(cases[0][0].device, 16).data_ptr()
    assert len({*seen, shared}) == 3, "a captured call reused shared arrival counters"
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(20):
        for out in outs:
            out.fill_(float("nan"))                        # poisoned before each replay
        torch.cuda.synchronize()
        for graph, stream in zip(graphs, streams):
            with torch.cuda.stream(stream):
                graph.replay()
        torch.cuda.synchronize()
        for out, want in zip(outs, wants):
            assert not torch.isnan(out).any()
            bound = 4e-3 * max(1.0, want.abs().max().item())
            assert (out.float() - want).abs().max().item() <= bound


@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[6], CASES[9]], ids=_id)
def test_decode_on_wgmma_with_64_query_rows(case):
    """BR=64 (the query tile padded to 64 rows: wgmma on sm_90a, no cross-warp softmax
    reductions) into poisoned outputs, twice on the same counters."""
    from tegula.build import launch
    from tegula.kernels.attention_decode import decode_launches
    B, H, Hkv, Sq, D, capacity, seqlens, causal, page, dtype = case
    q, k, v, lengths = make_cache(B, H, Hkv, Sq, D, capacity, seqlens, dtype, 41)
    want_o, want_lse = reference(q, k, v, lengths, causal, D ** -0.5)
    table = None
    if page:
        k, v, table = paged(k, v, page, 41)
    R = H // Hkv * Sq
    config, launches = decode_launches(f16 if dtype == "float16" else bf16, B, H, Hkv, Sq, D,
                                       capacity, page, D ** -0.5, causal)
    (kernel, grid, names, scalars, constexprs), = launches
    counters = torch.zeros(B, Hkv, dtype=torch.int32, device="cuda")
    for _ in range(2):
        values = dict(q=q.view(B, Hkv, R, D), k=k, v=v, seqlens=lengths, block_table=table,
                      o_part=poison(torch.empty(B, Hkv, config["splits"], R, D, device="cuda")),
                      lse_part=poison(torch.empty(B, Hkv, config["splits"], R, device="cuda")),
                      o=poison(torch.empty(B, Hkv, R, D, dtype=q.dtype, device="cuda")),
                      lse=poison(torch.empty(B, Hkv, R, device="cuda")), counters=counters)
        launch(kernel, grid, *(values[n] for n in names), *scalars, **dict(constexprs, BR=64))
        torch.cuda.synchronize()
        assert_close(values["o"].view(B, H, Sq, D), values["lse"].view(B, H, Sq), want_o,
                     want_lse, dtype)
        assert int(counters.abs().sum()) == 0
