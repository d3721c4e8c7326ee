"""MoE grouped GEMM in the emulator against a float64 numpy loop over experts: random
routing with k = 1 and 2, experts with no tokens, one expert with every token, rows, N and K
that divide no tile, tiles smaller than the block; persistent and one-block-per-item
launches on both targets; FP8 weights; the device-side schedule itself; the routing
helpers (numpy and CPU torch); NaN staying in its row; and the argument checks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tegula.dtypes import bf16, f16
from tegula.emulate.values import round_to
from tegula.kernels import moe
from tegula.kernels.common import poisoned, random_input, launch_emulated
from tegula.kernels.schedule import grouped_tile

#: Small tiles (smaller than the 128-thread block) so the tests cross many tile edges.
TILES = dict(BM=16, BN=32, BK=16, STAGES=2, GROUP=3)


def loop_reference(x_sorted, w, offsets) -> np.ndarray:
    """out[p] = x_sorted[p] @ w[e].T, expert by expert, in float64; NaN past offsets[E]."""
    out = np.full((x_sorted.shape[0], w.shape[1]), np.nan)
    for e in range(w.shape[0]):
        a, b = offsets[e], offsets[e + 1]
        out[a:b] = x_sorted[a:b].astype(np.float64) @ w[e].astype(np.float64).T
    return out


def check_rows(out, x_sorted, w, offsets, dtype) -> None:
    """Every routed row within the output's rounding plus the f32 accumulation error."""
    end = offsets[-1]
    ref = loop_reference(x_sorted, w, offsets)[:end]
    scale = np.concatenate([np.abs(x_sorted[offsets[e]:offsets[e + 1]]).astype(np.float64)
                            @ np.abs(w[e]).astype(np.float64).T for e in range(w.shape[0])]
                           ) if end else np.zeros((0, w.shape[1]))
    k = x_sorted.shape[1]
    bound = 2.0 ** -dtype.mantissa_bits * np.abs(ref) + k * 2.0 ** -24 * scale
    got = out[:end].astype(np.float64)
    assert not np.isnan(got).any(), "a routed row was left unwritten"
    err = np.abs(got - ref)
    assert np.all(err <= bound), f"max error {err.max():.3g}"


def offsets_of(counts) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


# -- the grouped GEMM -----------------------------------------------------------------------

@pytest.mark.parametrize("counts, n, k, persistent, staged, target", [
    ([12, 0, 15, 22, 15, 10], 40, 48, True, False, "sm_90a"),  # an empty expert; all ragged
    ([0, 0, 74, 0], 33, 40, True, True, "sm_90a"),             # one expert has every row
    ([9, 30, 0, 0, 1], 40, 24, False, False, "sm_90a"),        # one block per possible item
    ([5, 0, 40, 3], 40, 48, True, True, "sm_80"),
    ([7, 16, 33], 24, 16, False, True, "sm_80"),
    ([0, 0, 0], 40, 48, True, False, "sm_90a"),                # nothing routed
])
def test_grouped_gemm_matches_loop_over_experts(counts, n, k, persistent, staged, target):
    rng = np.random.default_rng(len(counts) * 1000 + n)
    offsets = offsets_of(counts)
    rows = offsets[-1] + 3                              # rows past the last expert
    x = random_input(rng, (rows, k), bf16)
    w = random_input(rng, (len(counts), n, k), bf16)
    out = moe.moe_gemm_emulated(x, w, offsets, dtype=bf16, target=target,
                                PERSISTENT=persistent, STAGED=staged, **TILES)
    check_rows(out, x, w, offsets, bf16)
    assert np.isnan(out[offsets[-1]:]).all(), "rows of no expert were written"


@pytest.mark.parametrize("bm, bn, n, staged", [(64, 48, 100, True), (64, 48, 96, False),
                                               (64, 40, 120, True), (192, 48, 100, True)])
def test_grouped_gemm_with_tile_widths_that_are_not_powers_of_two(bm, bn, n, staged):
    """Column tiles a wgmma n48 / n40 wide (session 10: N = 1408, the 64-expert model's,
    is 8 tiles of 176 or 6 of 240, where 256 wastes a ninth): ragged and exact N, 70 rows
    over two 64-row tiles, an empty expert, K not a multiple of BK, on sm_90a's warp-
    specialized TMA pipeline; and 192-row tiles on three consumer warpgroups, each
    expert's rows a fraction of one."""
    rng = np.random.default_rng(bn + n + bm)
    offsets = offsets_of([70, 0, 5, 64])
    x = random_input(rng, (offsets[-1] + 2, 40), bf16)
    w = random_input(rng, (4, n, 40), bf16)
    out = moe.moe_gemm_emulated(x, w, offsets, dtype=bf16, target="sm_90a", STAGED=staged,
                                BM=bm, BN=bn, BK=16, STAGES=2, GROUP=2,
                                **({"threads": 384} if bm == 192 else {}))
    check_rows(out, x, w, offsets, bf16)
    assert np.isnan(out[offsets[-1]:]).all(), "rows of no expert were written"


def test_candidates_fit_the_column_tile_to_n_and_the_bands_to_an_expert():
    """The autotuner's first candidate for the 64-expert top-6 model (N = 1408, 384 rows
    an expert) is 176 columns wide in bands of 3 row tiles, then 192 rows on three
    consumer warpgroups in bands of 2; Mixtral's (N = 14336, 1024
    rows an expert) keeps 256 columns and bands of 8; every candidate's tiles divide into
    whole 16-column wgmma steps."""
    assert [moe.column_tile(n) for n in (1408, 14336, 4096, 11008, 1000, 100)] == \
        [176, 256, 256, 256, 256, 256]
    e64 = moe.moe_candidates(4096 * 6, 64, False, 1408)
    assert (e64[0]["BN"], e64[0]["GROUP"]) == (176, 3)
    assert (e64[1]["BM"], e64[1]["GROUP"], e64[1]["threads"]) == (192, 2, 384)
    mixtral = moe.moe_candidates(4096 * 2, 8, False, 14336)
    assert (mixtral[0]["BN"], mixtral[0]["GROUP"]) == (256, 8)
    decode = moe.moe_candidates(64 * 2, 8, False, 14336)
    assert decode[0]["BM"] == 64 and decode[0]["GROUP"] == 1
    assert all(c["BN"] % 16 == 0 for c in e64 + mixtral + decode)


def test_f16_with_routing_k1_and_k2_and_default_tiles():
    rng = np.random.default_rng(7)
    tokens, experts, n, k = 45, 6, 36, 40
    x = random_input(rng, (tokens, k), f16)
    w = random_input(rng, (experts, n, k), f16)
    for top_k in (1, 2):
        ids, _ = moe.route(rng.standard_normal((tokens, experts)).astype(np.float32), top_k)
        routing = moe.sort_by_expert(ids, experts)
        x_sorted = moe.scatter_rows(x, routing)
        assert x_sorted.shape == (tokens * top_k, k)
        tiles = TILES if top_k == 1 else {}              # k = 2: the 128x128 defaults
        out = moe.moe_gemm_emulated(x_sorted, w, routing.expert_offsets, **tiles)
        check_rows(out, x_sorted, w, routing.expert_offsets, f16)


def test_nan_stays_in_its_row():
    """A tile's rows past its expert's end are fetched from the next expert (the TMA box is
    not cut at the end) and computed, but never stored: a NaN there must not leak."""
    rng = np.random.default_rng(3)
    counts = [10, 20]                                   # expert 0's tile reads rows 10..15
    offsets = offsets_of(counts)
    x = random_input(rng, (30, 32), bf16)
    x[12, 5] = np.nan                                   # expert 1's third row
    x[25, 0] = np.inf
    w = random_input(rng, (2, 24, 32), bf16)
    out = moe.moe_gemm_emulated(x, w, offsets, dtype=bf16, **TILES)
    bad = {12, 25}
    finite = [r for r in range(30) if r not in bad]
    assert np.isfinite(out[finite]).all()
    assert np.isnan(out[12]).all()
    assert not np.isfinite(out[25]).any()
    check_rows(out[finite], x[finite], w, offsets_of([10, 18]), bf16)


def test_fp8_weights_per_expert_scales():
    rng = np.random.default_rng(11)
    counts = [20, 0, 37, 9]
    offsets = offsets_of(counts)
    n, k = 40, 64
    x = random_input(rng, (offsets[-1], k), bf16)
    w = random_input(rng, (4, n, k), bf16) * np.float32([[[1.0]], [[0.01]], [[3.0]], [[0.2]]])
    w_q, w_scale = moe.quantize_experts_fp8(w)
    out = moe.moe_gemm_emulated(x, w_q, offsets, w_scale=w_scale, dtype=bf16,
                                **dict(TILES, BK=32))
    # The kernel computes (x_q · x_scale) @ (w_q · w_scale).T exactly up to f32 sums.
    x_q, x_scale = moe.quantize_rows_fp8(x)
    check_rows(out, x_q * x_scale, w_q * w_scale[:, None, None], offsets, bf16)
    # and is the bf16 product up to e4m3's rounding of both operands (2^-4 relative each)
    ref = loop_reference(x, w, offsets)
    scale = loop_reference(np.abs(x), np.abs(w), offsets)
    assert np.all(np.abs(out - ref) <= 2 * 2.0 ** -4 * scale + 2.0 ** -8 * np.abs(ref))


def test_schedule_lists_every_row_tile_once():
    """The device-side work list against a numpy model: dense items (no tile without rows),
    grouped order, each (expert, row tile, column tile) exactly once, the count."""
    counts = [0, 35, 0, 16, 1, 0, 0, 70, 0]
    offsets = offsets_of(counts)
    rows, n, experts, bm, bn = offsets[-1] + 5, 100, len(counts), 16, 32
    plan = moe.plan_launches(rows, n, experts, dict(BM=bm, BN=bn, BK=16, STAGES=2, GROUP=3),
                             num_sms=4)
    schedule, count = poisoned((4, plan.capacity), moe.i32), poisoned((1,), moe.i32)
    launch_emulated(moe.moe_schedule_kernel(), plan.schedule_grid, offsets, schedule, count,
                    *plan.schedule_scalars, **plan.schedule_constexprs)
    tiles = [(e, offsets[e] + m * bm) for e in range(experts)
             for m in range(-(-counts[e] // bm))]
    tiles_n = -(-n // bn)
    assert count[0] == len(tiles) * tiles_n
    items = [tuple(schedule[:, t]) for t in range(count[0])]
    expected = {(e, first, offsets[e + 1], j) for e, first in tiles for j in range(tiles_n)}
    assert set(items) == expected and len(items) == len(expected)
    assert (schedule[1:, count[0]:] == 0).all()         # past the count: no rows
    assert items[1][0:2] == tiles[1] and items[3][0:2] == tiles[0]  # GROUP = 3 row tiles


# -- routing helpers ------------------------------------------------------------------------

def test_routing_round_trip_numpy():
    rng = np.random.default_rng(5)
    tokens, experts, top_k, n = 23, 5, 2, 7
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    ids, weights = moe.route(logits, top_k)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    for t in range(tokens):
        best = np.argsort(-probs[t], kind="stable")[:top_k]
        assert list(ids[t]) == list(best)
        np.testing.assert_allclose(weights[t], probs[t, best] / probs[t, best].sum(),
                                   rtol=1e-6)
    routing = moe.sort_by_expert(ids, experts)
    flat = ids.reshape(-1)
    assert list(routing.expert_offsets) == [0] + list(np.cumsum(np.bincount(flat, None,
                                                                            experts)))
    sorted_ids = flat[routing.order]
    assert np.all(np.diff(sorted_ids) >= 0)
    for e in range(experts):                            # token order within an expert
        assert np.all(np.diff(routing.order[sorted_ids == e]) > 0)
    assert np.array_equal(routing.order[routing.inverse], np.arange(tokens * top_k))
    # Gather back: y_sorted holds (token, choice) codes; the weighted sum is exact here.
    y_sorted = np.stack([np.full(n, 100.0 * (c // top_k) + c % top_k, np.float32)
                         for c in routing.order])
    got = moe.gather_rows(y_sorted, routing, weights)
    want = sum(weights[:, j:j + 1] * (100.0 * np.arange(tokens)[:, None] + j)
               for j in range(top_k))
    np.testing.assert_allclose(got, np.broadcast_to(want, (tokens, n)), rtol=1e-6)


def test_routing_torch_matches_numpy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    logits = rng.standard_normal((31, 6)).astype(np.float32)
    ids, weights = moe.route(logits, 2, renormalize=False)
    t_ids, t_weights = moe.route(torch.from_numpy(logits), 2, renormalize=False)
    assert np.array_equal(t_ids.numpy(), ids)
    np.testing.assert_allclose(t_weights.numpy(), weights, rtol=1e-6)
    r, tr = moe.sort_by_expert(ids, 6), moe.sort_by_expert(t_ids, 6)
    for field in ("order", "inverse", "expert_offsets"):
        assert np.array_equal(getattr(tr, field).numpy(), getattr(r, field)), field
    assert tr.expert_offsets.dtype == torch.int32
    y = rng.standard_normal((62, 4)).astype(np.float32)
    # The same f32 products added in the same order: equal (torch's softmax may differ
    # from numpy's in the last bit, so both gather with numpy's weights).
    np.testing.assert_array_equal(
        moe.gather_rows(torch.from_numpy(y), tr, torch.from_numpy(weights)).numpy(),
        moe.gather_rows(y, r, weights))


def test_torch_entry_point_in_the_emulator(on_cpu):
    """moe_gemm's plumbing (checks, schedule workspace, persistent launch) on CPU tensors."""
    torch = on_cpu
    rng = np.random.default_rng(13)
    counts = [19, 0, 40]
    offsets = offsets_of(counts)
    x = random_input(rng, (offsets[-1], 48), bf16)
    w = random_input(rng, (3, 40, 48), bf16)
    out = moe.moe_gemm(torch.from_numpy(x).bfloat16(), torch.from_numpy(w).bfloat16(),
                       torch.from_numpy(offsets),
                       config=dict(TILES, PERSISTENT=True))
    check_rows(out.float().numpy(), x, w, offsets, bf16)


# -- argument checks ------------------------------------------------------------------------

def test_bad_arguments_are_named():
    rng = np.random.default_rng(0)
    x = random_input(rng, (10, 16), bf16)
    w = random_input(rng, (2, 8, 16), bf16)
    good = offsets_of([4, 6])
    cases = [
        (dict(x_sorted=x, w=w[:, :, :8], expert_offsets=good), "one K"),
        (dict(x_sorted=x, w=w, expert_offsets=good[:2]), r"experts \+ 1"),
        (dict(x_sorted=x, w=w, expert_offsets=np.int32([0, 6, 4])), "never decrease"),
        (dict(x_sorted=x, w=w, expert_offsets=np.int32([1, 4, 6])), "start at 0"),
        (dict(x_sorted=x, w=w, expert_offsets=np.int32([0, 4, 11])), "at most at 10"),
        (dict(x_sorted=x, w=w, expert_offsets=good.astype(np.int64)), "int32"),
        (dict(x_sorted=x, w=w[0], expert_offsets=good), "w must be 3-D"),
        (dict(x_sorted=x, w=w, expert_offsets=good, w_scale=np.ones(3, np.float32)),
         "one scale per expert"),
        (dict(x_sorted=x, w=w + np.float32(0.001), expert_offsets=good,
              w_scale=np.ones(2, np.float32)), "e4m3"),
    ]
    for kwargs, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            moe.moe_gemm_emulated(dtype=bf16, **kwargs)
    with pytest.raises(TypeError, match="dtype=bf16"):
        moe.moe_gemm_emulated(x, w, good)                # float32 arrays need dtype=
    many = np.zeros((300, 8, 16), np.float32)
    with pytest.raises(ValueError, match="300 experts"):
        moe.moe_gemm_emulated(x, many, np.zeros(301, np.int32), dtype=bf16)
    with pytest.raises(ValueError, match="topk_ids must lie in 0"):
        moe.sort_by_expert(np.int32([[0, 2]]), 2)
    with pytest.raises(ValueError, match="k must be an int in 1"):
        moe.route(np.zeros((3, 4), np.float32), 5)


def test_torch_arguments_are_named():
    torch = pytest.importorskip("torch")
    x = torch.zeros(10, 16, dtype=torch.bfloat16)
    w = torch.zeros(2, 8, 16, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 4, 6], dtype=torch.int32)
    with pytest.raises(TypeError, match="w has dtype torch.float16"):
        moe.moe_gemm(x, w.half(), offsets)
    with pytest.raises(TypeError, match="expert_offsets has dtype torch.int64"):
        moe.moe_gemm(x, w, offsets.long())
    with pytest.raises(ValueError, match="w_scale must have one scale per expert"):
        moe.moe_gemm(x, w.to(torch.float8_e4m3fn), offsets, torch.ones(3))
    with pytest.raises(ValueError, match="x_sorted is on cpu"):
        moe.moe_gemm(x, w, offsets)


def test_torch_out_is_checked(on_cpu):
    torch = on_cpu
    x = torch.zeros(10, 16, dtype=torch.bfloat16)
    w = torch.zeros(2, 8, 16, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 4, 6], dtype=torch.int32)
    for bad in (torch.empty(10, 9, dtype=torch.bfloat16), torch.empty(10, 8)):
        with pytest.raises(ValueError, match=r"out must have shape \(10, 8\)"):
            moe.moe_gemm(x, w, offsets, out=bad)



@settings(max_examples=12, deadline=None)
@given(counts=st.lists(st.integers(0, 70), min_size=1, max_size=12),
       extra=st.integers(0, 20), n=st.integers(1, 130), bm=st.sampled_from([16, 32, 64]),
       bn=st.sampled_from([32, 64]), group=st.integers(1, 5))
def test_schedule_property(counts, extra, n, bm, bn, group):
    """Any counts (empty experts, one expert, none), rows past the last expert, any N: the
    work list holds each (expert, row tile, column tile) once, in grouped order."""
    offsets = offsets_of(counts)
    experts, rows = len(counts), int(offsets[-1]) + extra
    plan = moe.plan_launches(rows, n, experts, dict(BM=bm, BN=bn, BK=16, STAGES=2,
                                                    GROUP=group), num_sms=4)
    schedule, count = poisoned((4, plan.capacity), moe.i32), poisoned((1,), moe.i32)
    launch_emulated(moe.moe_schedule_kernel(), plan.schedule_grid, offsets, schedule, count,
                    *plan.schedule_scalars, **plan.schedule_constexprs)
    tiles = [(e, offsets[e] + m * bm, offsets[e + 1]) for e in range(experts)
             for m in range(-(-counts[e] // bm))]
    tiles_n = -(-n // bn)
    want = [tiles[r] + (c,) for r, c in (grouped_tile(t, len(tiles), tiles_n, group)
                                         for t in range(len(tiles) * tiles_n))]
    assert count[0] == len(want) <= plan.capacity
    assert [tuple(schedule[:, t]) for t in range(count[0])] == want


def test_schedule_count_never_exceeds_its_capacity():
    """Offsets claiming more rows than x has (the torch path cannot check them without a
    host sync) must not send the GEMM past the end of its work list."""
    offsets = offsets_of([40, 40])                      # 80 rows claimed
    plan = moe.plan_launches(20, 64, 2, dict(BM=16, BN=32, BK=16, STAGES=2), num_sms=4)
    schedule, count = poisoned((4, plan.capacity), moe.i32), poisoned((1,), moe.i32)
    launch_emulated(moe.moe_schedule_kernel(), plan.schedule_grid, offsets, schedule, count,
                    *plan.schedule_scalars, **plan.schedule_constexprs)
    assert plan.capacity == (20 // 16 + 2) * 2 and count[0] == plan.capacity
