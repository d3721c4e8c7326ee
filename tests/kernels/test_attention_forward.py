"""The FlashAttention forward (tegula.kernels.attention) in the emulator, against a float64
numpy reference with an explicit mask: every element of o and lse, both targets, odd
lengths, Sq != Sk, bottom-right causal masks, fully masked rows, GQA/MQA, varlen."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.emulate.values import round_to
from tegula.kernels.attention import (attention_emulated, attention_kernel,
                                      attention_varlen_emulated, qk_scale)
from tegula.kernels.common import launch_emulated, poisoned

TARGETS = ("sm_90a", "sm_80")


def reference(q, k, v, causal: bool, scale: float | None = None):
    """o and the natural-log lse in float64, K/V heads repeated for GQA, the causal mask
    written out: query i sees key j iff j <= i + Sk - Sq (bottom-right). A row that sees no
    key has o = 0 and lse = -inf."""
    b, h, sq, d = q.shape
    sk = k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    group = h // k.shape[1]
    kk = np.repeat(k.astype(np.float64), group, axis=1)
    vv = np.repeat(v.astype(np.float64), group, axis=1)
    s = q.astype(np.float64) @ kk.transpose(0, 1, 3, 2) * scale
    mask = np.ones((sq, sk), bool)
    if causal:
        mask = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
    s = np.where(mask, s, -np.inf)
    seen = mask.any(axis=1)[None, None, :, None]
    top = np.where(seen, s.max(axis=-1, keepdims=True), 0.0)
    e = np.where(mask, np.exp(s - top), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    o = np.where(seen, e @ vv / np.where(seen, total, 1.0), 0.0)
    lse = np.where(seen, np.log(np.where(seen, total, 1.0)) + top, -np.inf)[..., 0]
    return o, lse


def inputs(seed: int, b: int, h: int, h_kv: int, sq: int, sk: int, d: int, dtype=tg.f16):
    """Random q, k, v (never zeros) exactly representable in `dtype`, in its emulator
    storage (float16, or float32 holding bf16 values)."""
    rng = np.random.default_rng(seed)
    shapes = ((b, h, sq, d), (b, h_kv, sk, d), (b, h_kv, sk, d))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if dtype == tg.f16:
        return [a.astype(np.float16) for a in arrays]
    return [round_to(a, dtype) for a in arrays]


def check(o, lse, want_o, want_lse, dtype=tg.f16):
    """Every element: o within the rounding of p and o to the element type, lse to f32
    precision, -inf exactly where the reference has it, no NaN anywhere (outputs start
    poisoned with NaN, so an unwritten element fails)."""
    tol = 2e-3 if dtype == tg.f16 else 1.6e-2
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    np.testing.assert_allclose(o.astype(np.float64), want_o, rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-5, atol=1e-5)


# (B, H, H_kv, Sq, Sk, D, causal): odd lengths, Sq < Sk and Sq > Sk (fully masked rows
# when causal), length 1, GQA ratios 1, 2 and 8.
SHAPES = [
    (1, 2, 2, 17, 17, 64, False),
    (1, 2, 2, 17, 17, 64, True),
    (1, 2, 1, 50, 65, 64, True),       # Sq < Sk: the first rows see Sk - Sq + 1 keys
    (1, 2, 1, 50, 65, 64, False),
    (2, 2, 2, 65, 17, 64, True),       # Sq > Sk: rows 0..47 see no key
    (1, 8, 1, 1, 50, 64, True),        # one query (decoding) against 50 keys, MQA 8:1
    (1, 4, 2, 1, 1, 64, False),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("b,h,h_kv,sq,sk,d,causal", SHAPES)
def test_forward_matches_the_reference(b, h, h_kv, sq, sk, d, causal, target):
    q, k, v = inputs(sq * 7 + sk, b, h, h_kv, sq, sk, d)
    o, lse = attention_emulated(q, k, v, causal, return_lse=True, target=target)
    check(o, lse, *reference(q, k, v, causal))


@pytest.mark.parametrize("target", TARGETS)
def test_head_dim_128_bf16_with_an_explicit_scale(target):
    q, k, v = inputs(3, 1, 2, 1, 33, 40, 128, tg.bf16)
    o, lse = attention_emulated(q, k, v, True, 0.3, return_lse=True, dtype=tg.bf16,
                                target=target)
    check(o, lse, *reference(q, k, v, True, 0.3), tg.bf16)


def test_head_dim_128_on_three_warpgroups_with_stated_budgets():
    """The D = 128 tuner candidate of three consumer warpgroups (192 rows, 96-key blocks,
    consumers 160 / producer 24 registers): causal, Sq < Sk, ragged, GQA 2:1."""
    q, k, v = inputs(4, 1, 2, 1, 130, 200, 128)
    o, lse = attention_emulated(q, k, v, True, return_lse=True, BM=192, BN=96, threads=384,
                                REGS=160)
    check(o, lse, *reference(q, k, v, True))


@pytest.mark.parametrize("scale", [-0.3, 0.0])
@pytest.mark.parametrize("overlap", [False, True])
def test_zero_and_negative_scales(scale, overlap):
    """A positive scale is applied inside the softmax (the row max taken before it, one
    FMA per score); a negative one reverses which score is the max and zero would make
    -inf * 0 = NaN of a masked key, so those are applied to the scores first (causal:
    masked keys in every block; OVERLAP: the block before the loop too)."""
    q, k, v = inputs(8, 1, 2, 1, 40, 70, 64)
    o, lse = attention_emulated(q, k, v, True, scale, return_lse=True, target="sm_90a",
                                OVERLAP=overlap)
    check(o, lse, *reference(q, k, v, True, scale))


@pytest.mark.slow
def test_head_dim_256():
    q, k, v = inputs(4, 1, 2, 2, 20, 70, 256)
    o, lse = attention_emulated(q, k, v, False, return_lse=True)
    check(o, lse, *reference(q, k, v, False))


# Every dataflow and tile shape the torch entry's autotuner may pick, plus tiles smaller
# than the block (16 query rows, an lse tile of 16 for 128 threads).
CONFIGS = [
    ("sm_90a", dict(BM=128, BN=64, threads=256, V_KMAJOR=True, P_SHARED=True)),
    ("sm_90a", dict(BM=128, BN=128, threads=256, V_KMAJOR=False, P_SHARED=False)),
    ("sm_90a", dict(BM=64, BN=64, V_KMAJOR=True, P_SHARED=False)),
    ("sm_90a", dict(BM=64, BN=64, V_KMAJOR=False, P_SHARED=True)),
    ("sm_80", dict(BM=16, BN=32)),
    ("sm_80", dict(BM=16, BN=32, V_KMAJOR=True, P_SHARED=True)),
    # the key loop software-pipelined by one block of scores (OVERLAP)
    ("sm_90a", dict(BM=128, BN=128, threads=256, OVERLAP=True)),
    ("sm_90a", dict(BM=64, BN=64, V_KMAJOR=True, P_SHARED=True, OVERLAP=True)),
    ("sm_80", dict(BM=16, BN=32, OVERLAP=True)),
    # three consumer warpgroups (384 threads: the row reductions stay within warps), and
    # stated budgets (producer 24, consumers 240 registers a thread)
    ("sm_90a", dict(BM=192, BN=64, threads=384)),
    ("sm_90a", dict(BM=128, BN=64, threads=256, OVERLAP=True, REGS=240)),
]


# Session 14's candidates as the tuner launches them (`attention_tiles`): two 128-row blocks
# an SM in one role for short key loops, and D = 256's 128 x 80 tile (FlashAttention-3's) on
# the overlapped loop with block 0's keys through the ring, or on the plain loop. Ragged both
# ways, GQA 2:1 (one head at D = 256, whose 128 x 256 tiles emulate slowly); causal with
# Sq > Sk (rows that see no key) or Sq < Sk (a diagonal inside a key block).
NEW_CANDIDATES = [
    (64, dict(BM=128, BN=128, threads=256, warp_specialize=False, blocks_per_sm=2), True, 150, 70),
    (128, dict(BM=128, BN=64, threads=256, warp_specialize=False, blocks_per_sm=2), False, 150, 70),
    (64, dict(BM=128, BN=64, threads=256, OVERLAP=True, FIRST_IN_RING=True), True, 150, 70),
    (256, dict(BM=128, BN=80, threads=256, OVERLAP=True, FIRST_IN_RING=True, REGS=240), True,
     70, 150),
    (256, dict(BM=128, BN=80, threads=256, REGS=240), False, 70, 150),
]


@pytest.mark.parametrize("d,tiles,causal,sq,sk", NEW_CANDIDATES)
def test_session_14_candidates(d, tiles, causal, sq, sk):
    heads = 1 if d == 256 else 2
    q, k, v = inputs(d + sq, 1, heads, 1, sq, sk, d)
    o, lse = attention_emulated(q, k, v, causal, return_lse=True, **tiles)
    check(o, lse, *reference(q, k, v, causal))


def test_short_key_loops_add_two_blocks_an_sm_candidates():
    """D = 128's two-blocks-an-SM candidate is timed up to SHORT_KEYS keys (and listed for
    the GPU tests, keys=None), not beyond, where three warpgroups lead (H200, session 14);
    D = 64's at every length (it led at 1k, 2k and 4k)."""
    from tegula.kernels.attention_tiles import SHORT_KEYS, attention_candidates
    two = lambda cs: [c for c in cs if c.get("blocks_per_sm") == 2]  # noqa: E731
    for d in (64, 128):
        assert two(attention_candidates(d, True, False, SHORT_KEYS))
        assert two(attention_candidates(d, True, True, None))
        assert all(not c["warp_specialize"] for c in two(attention_candidates(d, True)))
    assert not two(attention_candidates(128, True, False, SHORT_KEYS + 1))
    assert two(attention_candidates(64, True, True, 16384))
    assert not two(attention_candidates(256, True, False, 1024))


# The tuner's picks at long sequences (H100, session 13) as ptxas compiles them: their three
# consumer warpgroups run at 160 registers a thread with a few to spare, so a lowering change
# that keeps one more value live spills there (session 14: a pass clearing accumulators by
# wgmma's scale-d spilled 32 B at D = 128 and 24 B at D = 64; a p @ v left in flight across
# iterations made ptxas serialize the wgmmas, C7511, at D = 128). A compile each (~1.5 s).
NO_SPILL = [(128, dict(BM=192, BN=128, threads=384, REGS=160)),
            (64, dict(BM=192, BN=176, threads=384, REGS=160))]


@pytest.mark.parametrize("d,tiles", NO_SPILL)
def test_the_tuned_configurations_compile_without_spills(d, tiles):
    from tegula.build import build
    from tegula.runtime.compiler import available_compilers, compile_cuda_report
    if not available_compilers():
        pytest.skip("neither NVRTC nor nvcc found")
    result = build(attention_kernel(tg.f16), dict(tiles, D=d, QK_SCALE=qk_scale(None, d)),
                   None, "sm_90a")
    _, report = compile_cuda_report(result.cuda_source(), result.thread_kernel.name)
    assert report is not None and not report.spills and not report.stack_frame, str(report)
    assert not [w for w in report.warnings if "serialized" in w], str(report)  # C7511


@pytest.mark.parametrize("causal", [False, True])
def test_persistent_blocks_walk_every_tile(causal):
    """PERSISTENT: 3 blocks walk the 2 x 3 x 2 query tiles of two batches and three heads
    (GQA 3:1, Sq != Sk, ragged), the non-causal TMA ring running on across the tiles."""
    q, k, v = inputs(9, 2, 3, 1, 70, 133, 64)
    o, lse = poisoned(q.shape, tg.f16), poisoned((2, 3, 70), tg.f32)
    launch_emulated(attention_kernel(tg.f16), (3,), q, k, v, o, lse, D=64,
                    QK_SCALE=qk_scale(None, 64), CAUSAL=causal, BM=64, BN=64, PERSISTENT=True,
                    target="sm_90a")
    check(o, lse, *reference(q, k, v, causal))


@pytest.mark.parametrize("target,tiles", CONFIGS)
def test_every_configuration_gives_the_same_answer(target, tiles):
    q, k, v = inputs(5, 1, 2, 1, 70, 133, 64)
    o, lse = attention_emulated(q, k, v, True, return_lse=True, target=target, **tiles)
    check(o, lse, *reference(q, k, v, True))


def test_causal_programs_skip_the_key_blocks_above_the_diagonal():
    """Values past key 63 are NaN. A causal query block whose rows see only keys < 64 must
    not even load the blocks past them (a NaN value times a masked p of 0 is NaN), so rows
    0..63 come out finite and right; rows that do see the NaN keys are NaN, as in the
    reference."""
    q, k, v = inputs(6, 1, 1, 1, 128, 128, 64)
    v[:, :, 64:, :] = np.nan
    o, lse = attention_emulated(q, k, v, True, return_lse=True, target="sm_80", BM=16, BN=32)
    clean = v.copy()
    clean[:, :, 64:, :] = 0
    want_o, want_lse = reference(q, k, clean, True)
    np.testing.assert_allclose(o[:, :, :64].astype(np.float64), want_o[:, :, :64],
                               rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)  # lse ignores v
    assert np.isnan(o[:, :, 64:]).all()


@pytest.mark.parametrize("target,first_in_ring", [("sm_90a", False), ("sm_80", False),
                                                  ("sm_90a", True)])
def test_the_overlapped_loop_never_uses_the_scores_it_computes_past_the_last_block(
        target, first_in_ring):
    """OVERLAP computes one block of scores ahead, so the last iteration of a causal
    program multiplies q by the key block past the diagonal. Keys past 63 are NaN: rows
    0..63 (which see only keys < 64) must come out finite and right — those scores are
    never used — and the rows that do see the NaN keys NaN, as in the reference (with
    FIRST_IN_RING too: there the loop runs once more instead of computing block 0 first)."""
    q, k, v = inputs(16, 1, 2, 1, 128, 128, 64)
    k[:, :, 64:, :] = np.nan
    tiles = dict(BM=16, BN=32) if target == "sm_80" else dict(BM=64, BN=64)
    o, lse = attention_emulated(q, k, v, True, return_lse=True, target=target,
                                OVERLAP=True, FIRST_IN_RING=first_in_ring, **tiles)
    want_o, want_lse = reference(q[:, :, :64], k[:, :, :64], v[:, :, :64], True)
    check(o[:, :, :64], lse[:, :, :64], want_o, want_lse)
    assert np.isnan(o[:, :, 64:]).all() and np.isnan(lse[:, :, 64:]).all()


def test_large_scores_do_not_overflow_and_nan_keys_stay_hidden():
    """Scaled scores past 100, where exp overflows f32 (the running max keeps exp2 in
    range), and a NaN key that the rows before it never see (causal): those rows right,
    the rows that see it NaN in o and lse."""
    q, k, v = inputs(7, 1, 2, 2, 40, 40, 64)
    q = (q.astype(np.float32) * 40).astype(np.float16)
    k[0, 0, 30, 5] = np.nan
    o, lse = attention_emulated(q, k, v, True, return_lse=True, target="sm_90a")
    want_o, want_lse = reference(q, k, v, True)
    assert np.isnan(o[0, 0, 30:]).all() and np.isnan(lse[0, 0, 30:]).all()
    check(o[0, 1], lse[0, 1], want_o[0, 1], want_lse[0, 1])
    check(o[0, 0, :30], lse[0, 0, :30], want_o[0, 0, :30], want_lse[0, 0, :30])
    assert want_lse[np.isfinite(want_lse)].max() > 100


def test_no_keys_gives_zero_output_and_minus_infinity():
    q, k, v = inputs(8, 1, 2, 1, 5, 0, 64)
    o, lse = attention_emulated(q, k, v, return_lse=True)
    assert (o == 0).all() and np.isneginf(lse).all()


@pytest.mark.parametrize("target,overlap", [(t, o) for t in TARGETS for o in (False, True)]
                         + [("sm_90a", "ring")])
def test_varlen_matches_each_sequence_alone(target, overlap):
    """Four packed sequences (one empty, one of a single query, one longer than a block),
    GQA 2:1, then padding rows whose keys are NaN and values infinite: no sequence may
    read them, and rows of no sequence stay unwritten (NaN poison). OVERLAP computes the
    scores of one key block past each sequence's last (the next sequence's keys, or the
    padding): they must never count; "ring" (FIRST_IN_RING) also multiplies p = 0 by the
    values past each sequence's last block (zeros there, never the padding's inf)."""
    lengths_q, lengths_k = [5, 0, 70, 1], [9, 3, 64, 30]
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    rng = np.random.default_rng(9)
    q = rng.standard_normal((cu_q[-1] + 3, 4, 64)).astype(np.float16)
    k = rng.standard_normal((cu_k[-1] + 5, 2, 64)).astype(np.float16)
    v = rng.standard_normal((cu_k[-1] + 5, 2, 64)).astype(np.float16)
    k[cu_k[-1]:], v[cu_k[-1]:] = np.nan, np.inf
    for causal in (False, True):
        o, lse = attention_varlen_emulated(q, k, v, cu_q, cu_k, max(lengths_q), causal,
                                           return_lse=True, target=target,
                                           OVERLAP=bool(overlap),
                                           FIRST_IN_RING=overlap == "ring")
        for e in range(len(lengths_q)):
            rows, keys = slice(cu_q[e], cu_q[e + 1]), slice(cu_k[e], cu_k[e + 1])
            want_o, want_lse = reference(q[rows].transpose(1, 0, 2)[None],
                                         k[keys].transpose(1, 0, 2)[None],
                                         v[keys].transpose(1, 0, 2)[None], causal)
            check(o[rows].transpose(1, 0, 2)[None], lse[:, rows][None], want_o, want_lse)
        assert np.isnan(o[cu_q[-1]:]).all()


@pytest.mark.parametrize("d,bn", [(128, 128), (256, 64)])
def test_sm90a_puts_both_gemms_on_wgmma_with_k_and_v_by_tma(d, bn):
    """The default sm_90a dataflow: q @ k.T over the whole head dim (a K row of D / 64
    swizzle spans, no D chunks) and p @ v on wgmma, p from registers and v's tile as an
    MN-major operand (no transposed copy of v), K and V arriving by TMA (D / 64 boxes each)
    into a ring filled by a producer warpgroup."""
    text = tg.explain(attention_kernel(tg.f16), target="sm_90a", D=d, QK_SCALE=0.1,
                      CAUSAL=True, BM=128, BN=bn, threads=256)
    gemms = [line for line in text.splitlines() if line.strip().startswith("line ")
             and " gemm " in line]
    assert len(gemms) == 2  # q @ k.T, then p @ v
    assert text.count("MMA      wgmma.") == 2 and "mma.sync" not in text.split("== ops")[1]
    assert "wgmma not used" not in text and "layout conversions: none" in text
    assert "A from registers, B (MN-major) read from shared memory" in text
    assert "warp-specialized" in text and text.count("tma.load") == 2
    assert text.count(f"{d // 64} TMA boxes 64x{bn}x1x1") == 2  # one per 64-wide span of D


@pytest.mark.parametrize("order", ["reversed", "random:1", "random:2"])
def test_the_overlapped_loop_is_right_under_other_role_interleavings(order):
    """Two consumer warpgroups and the TMA producer, scheduled in other orders than the
    listed one (the emulator's `role_order`; random ones switch at every asynchronous
    statement): the same answer, every element."""
    q, k, v = inputs(17, 1, 2, 1, 150, 200, 64)
    o, lse = attention_emulated(q, k, v, True, return_lse=True, target="sm_90a", BM=128,
                                BN=64, threads=256, OVERLAP=True, role_order=order)
    check(o, lse, *reference(q, k, v, True))


def test_the_overlapped_loop_runs_the_softmax_while_both_gemms_are_in_flight():
    """OVERLAP on sm_90a: iteration j issues s_{j+1} = q @ k_{j+1}.T and acc += p_j @ v_j
    on wgmma, then waits for the first alone (wait_group 1) before block j+1's softmax
    (its row max and sum are warp shuffles) and for the second (wait_group 0) only after
    it, at the end of the body: the tensor cores work while the softmax runs. Without
    OVERLAP the one wait comes before the softmax, which reads the scores."""
    from tegula.build import build
    from tegula.lower.async_ir import MBarrierArrive, WgmmaCommit, WgmmaWait
    from tegula.lower.thread_ir import Assign, Comment, For, If, Shuffle, walk

    def loop_body(overlap):
        kernel = build(attention_kernel(tg.f16), dict(D=128, QK_SCALE=0.1, CAUSAL=False,
                                                      BM=128, BN=128, OVERLAP=overlap,
                                                      threads=256), None, "sm_90a")
        loop, = [s for s in walk(kernel.thread_kernel.body) if isinstance(s, For)
                 and any(isinstance(x, WgmmaCommit) for x in s.body)]
        return loop.body

    def positions(body, kind):
        return [i for i, s in enumerate(body) if isinstance(s, kind)]

    body = loop_body(True)
    commits, waits, branches = (positions(body, kind) for kind in (WgmmaCommit, WgmmaWait, If))
    assert [body[i].pending for i in waits] == [1, 0]
    # the softmax (its row max and sum: warp shuffles) runs in the mask's branch, one copy
    # masked and one not; the join holds the carried values' copies, the second wait and
    # the stage's release (by one lane of each warp: a branch)
    softmax = branches[0]
    assert commits[1] < waits[0] < softmax < waits[1]
    assert all(isinstance(x, (Assign, Comment)) for x in body[softmax + 1:waits[1]])
    release = list(walk(body[waits[1] + 1:]))
    assert any(isinstance(x, MBarrierArrive) for x in release)
    assert all(isinstance(x, (MBarrierArrive, If)) for x in release)
    for side in (body[softmax].then, body[softmax].otherwise):
        assert any(isinstance(x, Shuffle) for x in walk(side))
        assert not any(isinstance(x, (WgmmaWait, WgmmaCommit)) for x in walk(side))
    body = loop_body(False)
    assert positions(body, WgmmaWait)[0] < positions(body, Shuffle)[0]


@pytest.mark.parametrize("causal", [False, True])
def test_only_key_blocks_past_the_diagonal_or_the_end_are_masked(causal):
    """The mask's compares and selects sit in a branch on the key block's index, taken by
    blocks reaching past the first row's last visible key (causal) or the last key; the
    waits stay outside it, so the interior blocks run no mask code."""
    from tegula.build import build
    from tegula.lower.async_ir import MBarrierArrive, WgmmaCommit, WgmmaWait
    from tegula.lower.thread_ir import Assign, For, If, walk

    kernel = build(attention_kernel(tg.f16), dict(D=64, QK_SCALE=0.1, CAUSAL=causal, BM=128,
                                                  BN=64, threads=256), None, "sm_90a")
    loop, = [s for s in walk(kernel.thread_kernel.body) if isinstance(s, For)
             and any(isinstance(x, WgmmaCommit) for x in s.body)]
    # (the other branch of the body: one lane of each warp releasing the stage)
    branches = [s for s in loop.body if isinstance(s, If)
                and not any(isinstance(x, MBarrierArrive) for x in walk(s.then))]
    assert len(branches) == 1 and "i0" in str(branches[0].cond)
    inside = list(walk(branches[0].then))
    assert len([x for x in inside if isinstance(x, Assign)]) >= 32   # a select per score
    assert not any(isinstance(x, WgmmaWait) for x in inside) and not branches[0].otherwise


# -- bad input: a clear error naming the argument, before anything is traced -------------------
def test_bad_arguments_are_named():
    q, k, v = inputs(10, 1, 4, 2, 8, 8, 64)
    with pytest.raises(ValueError, match="head dim D = 32"):
        attention_emulated(q[..., :32].copy(), k[..., :32].copy(), v[..., :32].copy())
    with pytest.raises(ValueError, match="3 heads, which must divide q's 4"):
        attention_emulated(q, np.concatenate([k, k[:, :1]], 1), np.concatenate([v, v[:, :1]], 1))
    with pytest.raises(ValueError, match="k and v must have one shape"):
        attention_emulated(q, k, v[:, :, :5].copy())
    with pytest.raises(ValueError, match="must agree on the batch"):
        attention_emulated(q, np.concatenate([k, k]), np.concatenate([v, v]))
    with pytest.raises(TypeError, match="share one dtype"):
        attention_emulated(q, k.astype(np.float32), v)
    with pytest.raises(TypeError, match="float16 arrays"):
        attention_emulated(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    with pytest.raises(ValueError, match="q must be 4-D"):
        attention_emulated(q[0], k, v)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        attention_emulated(q, k, v, scale=float("nan"))
    cu = np.array([0, 4, 8], np.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k = \\[0, 9, 8\\] must start at 0"):
        attention_varlen_emulated(q[0].transpose(1, 0, 2).copy(), k[0].transpose(1, 0, 2).copy(),
                                  v[0].transpose(1, 0, 2).copy(), cu,
                                  np.array([0, 9, 8], np.int32), 4)
    with pytest.raises(ValueError, match="max_seqlen_q = 3 is below"):
        attention_varlen_emulated(q[0].transpose(1, 0, 2).copy(), k[0].transpose(1, 0, 2).copy(),
                                  v[0].transpose(1, 0, 2).copy(), cu, cu, 3)


def test_torch_entry_points_name_bad_arguments_before_the_device():
    """The checks run in the order type, rank, dtype, shapes, device: testable on a CPU."""
    torch = pytest.importorskip("torch")
    from tegula.kernels import attention, attention_forward, attention_varlen
    q = torch.randn(1, 4, 8, 64, dtype=torch.float16)
    k = torch.randn(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="q is on cpu; tegula kernels run on a CUDA device"):
        attention_forward(q, k, k)
    with pytest.raises(TypeError, match="q has dtype torch.float32"):
        attention(q.float(), k, k)
    with pytest.raises(TypeError, match="must share one dtype"):
        attention(q, k.bfloat16(), k.bfloat16())
    with pytest.raises(ValueError, match="head dim D = 48"):
        attention(q[..., :48], k[..., :48], k[..., :48])
    with pytest.raises(ValueError, match="3 heads, which must divide q's 4"):
        attention(q, k[:, :1].expand(1, 3, 8, 64), k[:, :1].expand(1, 3, 8, 64))
    with pytest.raises(ValueError, match="v must be 4-D"):
        attention(q, k, k[0])
    with pytest.raises(ValueError, match="scale must be a finite number"):
        attention(q, k, k, scale=True)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        attention(q.numpy(), k, k)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    packed_q, packed_k = q[0].transpose(0, 1), k[0].transpose(0, 1)
    with pytest.raises(TypeError, match="cu_seqlens_k has dtype torch.int64"):
        attention_varlen(packed_q, packed_k, packed_k, cu, cu.long(), 8)
    with pytest.raises(ValueError, match="max_seqlen_q must be a non-negative int"):
        attention_varlen(packed_q, packed_k, packed_k, cu, cu, 8.0)
    with pytest.raises(ValueError, match="q is on cpu"):
        attention_varlen(packed_q, packed_k, packed_k, cu, cu, 8)


def test_the_custom_op_runs_the_emulator_on_cpu_and_passes_opcheck():
    torch = pytest.importorskip("torch")
    import tegula.kernels.torch_ops  # noqa: F401  (registers torch.ops.tegula.*)
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(1, 2, 9, 64, generator=gen).bfloat16()
    k, v = (torch.randn(1, 1, 5, 64, generator=gen).bfloat16() for _ in range(2))
    o, lse = torch.ops.tegula.attention_forward(q, k, v, True, 0.2)
    want_o, want_lse = reference(*(t.float().numpy() for t in (q, k, v)), True, 0.2)
    check(o.float().numpy(), lse.numpy(), want_o, want_lse, tg.bf16)
    assert np.isneginf(lse.numpy()[0, :, :4]).all()  # Sq > Sk: the first 4 rows see nothing
    torch.library.opcheck(torch.ops.tegula.attention_forward.default, (q, k, v, True, 0.2))
    with pytest.raises(ValueError, match="head dim D = 16"):
        torch.ops.tegula.attention_forward(q[..., :16], k[..., :16], v[..., :16])


@pytest.mark.parametrize("keys", [77, 128])
def test_transposed_v_keeps_the_tma_pipeline_at_any_key_count(keys):
    """v transposed for the all-wgmma dataflow has rows padded to 16 bytes (`keys_last`),
    so an odd key count still gets TMA and the producer warpgroup (a contiguous (D, 77)
    f16 tensor's 154-byte rows would drop the pipeline to cp.async), and the answer holds."""
    from tegula.kernels.attention import keys_last, qk_scale
    q, k, v = inputs(12, 1, 2, 1, 40, keys, 64)
    vt = keys_last(v, (0, 1, 3, 2))
    assert vt.shape == (1, 1, 64, keys) and vt.strides[2] % 16 == 0
    o, lse = np.full(q.shape, np.nan, np.float16), np.full((1, 2, 40), np.nan, np.float32)
    report = tg.emulate(attention_kernel(tg.f16), (1, 2, 1), q, k, vt, o, lse, D=64,
                        QK_SCALE=qk_scale(None, 64), CAUSAL=True, BM=64, BN=64,
                        V_KMAJOR=True, P_SHARED=True, target="sm_90a",
                        warp_specialize=True)  # 64 rows: the cost model's default is one role
    assert report.threads == 256 and report.kind("TmaLoad").count > 0
    check(o, lse, *reference(q, k, v, True))


def test_varlen_blocks_past_a_sequence_do_no_gemms():
    """The grid is sized by max_seqlen_q: blocks past a sequence's rows must skip its keys
    (same gemm count with a grid of 1 or 4 query blocks), and the answer is unchanged."""
    from tegula.kernels.attention import attention_varlen_kernel, qk_scale
    rng = np.random.default_rng(13)
    q = rng.standard_normal((10, 2, 64)).astype(np.float16)
    k, v = (rng.standard_normal((200, 1, 64)).astype(np.float16) for _ in range(2))
    cu_q, cu_k = np.array([0, 10], np.int32), np.array([0, 200], np.int32)
    counts, outputs = [], []
    for query_blocks in (1, 4):
        o, lse = np.full(q.shape, np.nan, np.float16), np.full((2, 10), np.nan, np.float32)
        report = tg.emulate(attention_varlen_kernel(tg.f16), (query_blocks, 2, 1), q, k, v, o,
                            lse, cu_q, cu_k, D=64, QK_SCALE=qk_scale(None, 64), BM=64, BN=64,
                            target="sm_80")
        counts.append(report.kind("Mma").count)
        outputs.append(o)
    assert counts[0] == counts[1] > 0
    np.testing.assert_array_equal(outputs[0], outputs[1])
    want_o, _ = reference(q.transpose(1, 0, 2)[None], k.transpose(1, 0, 2)[None],
                          v.transpose(1, 0, 2)[None], False)
    np.testing.assert_allclose(outputs[0].transpose(1, 0, 2)[None], want_o, rtol=2e-3, atol=2e-3)


def test_a_stated_budget_candidate_falls_back_where_tma_cannot_serve(monkeypatch):
    """REGS (stated warp roles) and turns need TMA boxes: a launch synthesis refuses (a
    tensor TMA cannot address) reruns the candidate with synthesis's own roles, and the
    varlen entry (narrowed views, never boxes) does not time such candidates at all (a
    varlen launch with turns raised in round 2)."""
    import importlib
    import types

    from tegula.errors import SynthesisError
    from tegula.kernels import api
    attention = importlib.import_module("tegula.kernels.attention")  # the module, not the op
    launched, timed = [], []

    def launch(kernel, grid, args, constexprs, threads):
        launched.append(constexprs.get("REGS", 0))
        if constexprs.get("REGS") or "consumers" in constexprs:
            raise SynthesisError("tg.producer: the copy is not a TMA box")
        return "kernel"

    def tune(name, index, configs, dims, key, run):
        timed.extend(c.kwargs.get("REGS", 0) or "consumers" in c.kwargs for c in configs)
        return run(next(c for c in configs if c.kwargs.get("REGS", 0)) if any(
            c.kwargs.get("REGS", 0) for c in configs) else configs[0])

    monkeypatch.setattr(api, "_launch", launch)
    monkeypatch.setattr(api, "_tune_and_run", tune)
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_device_capability=lambda device: (9, 0)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    device = types.SimpleNamespace(index=0)
    run = lambda boxes: attention._run_tuned(  # noqa: E731
        "attention", None, lambda values: (1,), ("q", "k", "o", "lse"), "v", None, (1, 1, 1),
        "x", dict(D=128, QK_SCALE=1.0, CAUSAL=False), 128, device, boxes=boxes)
    assert run(True)[0] == "kernel"
    assert launched[0] > 0 and launched[1:] == [0]   # the REGS launch, then synthesis's roles
    launched.clear(), timed.clear()
    run(False)
    assert not any(timed) and launched == [0]
