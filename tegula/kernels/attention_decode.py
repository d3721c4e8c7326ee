"""Split-KV attention decoding: a few query tokens (Sq ≤ 16) against a long KV cache.

    o = softmax(scale · q @ k_cacheᵀ) @ v_cache   over the first cache_seqlens[b] keys

q is (B, H, Sq, D); the cache is (B, Hkv, S_max, D), or, paged, (pages, Hkv, PAGE, D) with a
block table (B, max_blocks) i32 naming the page that holds keys [i·PAGE, (i+1)·PAGE) of
batch b. With Sq > 1 the query tokens are the last Sq tokens of the sequence (already in
the cache); `causal=True` then lets token t see keys j ≤ cache_seqlens[b] − Sq + t (the
bottom-right alignment of the forward).

A single query row cannot fill the GPU, so the keys are split: one program per (split,
kv head, batch) runs the online softmax over its chunk of keys and writes a partial output
(f32, already divided by its own sum) and its log-sum-exp, then arrives on its (batch, kv
head)'s counter (`tg.last_arrival`); the last of them to arrive merges the splits in order
(deterministic) with weights exp(lse_s − lse). One launch: a second kernel for the merge
(`fused=False`, the combine kernel) cost its launch, 8 µs of a 191 µs step at 128k keys
(session 12). The counters, (B, Hkv) int32, are zero before a call and after it.

GQA: the G query heads sharing a kv head are one (G·Sq, D) tile of rows (q viewed as
(B, Hkv, G·Sq, D), free for a contiguous q), so each program reads its K/V chunk once for
all of them (paged at D = 128 on sm_90a the tile is padded to 64 rows: wgmma, whose warps
hold whole rows, so the softmax needs no cross-warp reduction). Keys past the sequence's
length are bounded views (they load as 0 and are
masked to −inf), so whatever an unused cache slot holds — NaN included — never reaches
the output. A sequence of length 0 gives o = 0 and lse = −inf. The kernels clamp each length to
0 … the cache's capacity (S_max, or max_blocks · PAGE), so a bad length can never make
them read outside the cache or the block table; the numpy entry point refuses one, the
torch one does not look (that would cost a device sync per step).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

import tegula as tg
from tegula import f32, i32
from tegula.dtypes import DType, bf16, f16
from tegula.kernels.attention import INF, LOG2E, masked_for_softmax, online_softmax_step
from tegula.kernels.attention_backward import default_scale
from tegula.kernels.common import launch_emulated, poisoned
from tegula.runtime.arrivals import arrival_counters

ATTENTION_DECODE_DTYPES = (f16, bf16)
DECODE_HEAD_DIMS = (32, 64, 128, 256)
MAX_QUERY_TOKENS = 16
MAX_SPLITS = 128         # the combine holds every split's lse in one register tile
COMBINE_COLUMNS = 32     # columns of o per combine program (D / 32 programs per kv head)
MERGE_WORDS = 64         # f32 partials a thread of the last split block loads per merge step
# sm_90a, paged, D = 128: the query tile padded to 64 rows takes wgmma (each warp holds
# whole rows: the softmax needs no cross-warp reduction, 1 barrier a key block against 10).
# H100, session 14 round 1, one process: paged 2.86 / 2.72 TB/s against 2.84 / 2.69 for
# 16 rows at 1x32/8 x 128k / 4x32/8 x 16k keys; contiguous level (2.93 / 2.79 against
# 2.94 / 2.80), so it keeps 16.
WGMMA_ROWS = 64
LN2 = 0.6931471805599453


def _partial_softmax(sq, k_block, v_block, keys, rows_token, seqlen, state, dtype: DType,
                     SCALE, SQ, CAUSAL):
    """The online-softmax update of one (BN, D) K/V block (shared tiles) at key positions
    `keys` (1, BN)."""
    m_i, l_i, acc = state
    s = tg.zeros((sq.shape[0], keys.shape[1]), f32)
    tg.gemm(s, sq, k_block)                                   # Q Kᵀ
    seen = keys < seqlen
    if CAUSAL:
        seen = seen & (keys <= rows_token + (seqlen - SQ))
    p, m_i, l_i = online_softmax_step(*masked_for_softmax(seen, s, SCALE * LOG2E), m_i, l_i, acc)
    tg.gemm(acc, p.to(dtype), v_block.T)                      # += P V
    return m_i, l_i, acc


def _query_rows(q_head, dtype: DType, BR: int, D: int, SQ: int):
    """The kv head's G·Sq query rows in shared memory, each row's query token, and the
    online softmax's initial (m, l, acc)."""
    sq = tg.shared((BR, D), dtype)
    tg.copy(q_head.tile((BR, D), (0, 0)), sq)
    rows_token = tg.arange(BR)[:, None] % SQ
    state = (tg.full((BR, 1), -INF, f32), tg.zeros((BR, 1), f32), tg.zeros((BR, D), f32))
    return sq, rows_token, state


@lru_cache(maxsize=None)
def attention_decode_split_kernel(dtype: DType, paged: bool) -> tg.Kernel:
    """One chunk of keys for the G·Sq query rows of one kv head: partial o and lse.
    `chunk` (run time): key blocks of BN per split."""
    return _paged_split_kernel(dtype) if paged else _contiguous_split_kernel(dtype)


def _contiguous_split_kernel(dtype: DType) -> tg.Kernel:
    @tg.kernel(threads=128)
    def attention_decode_split(q: tg.Tensor[dtype, 4], k: tg.Tensor[dtype, 4],
                               v: tg.Tensor[dtype, 4], seqlens: tg.Tensor[i32, 1],
                               o_part: tg.Tensor[f32, 5], lse_part: tg.Tensor[f32, 4],
                               o: tg.Tensor[dtype, 4], lse: tg.Tensor[f32, 3],
                               counters: tg.Tensor[i32, 2],
                               chunk: int, D: tg.constexpr, SCALE: tg.constexpr,
                               SQ: tg.constexpr, CAUSAL: tg.constexpr,
                               BR: tg.constexpr = 16, BN: tg.constexpr = 64,
                               STAGES: tg.constexpr = 3, SP: tg.constexpr = 0,
                               MR: tg.constexpr = 16):
        s_id, hk, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        seqlen = tg.minimum(tg.maximum(seqlens[b], 0), k.shape[2])   # within the cache
        sq, rows_token, state = _query_rows(q[b, hk], dtype, BR, D, SQ)
        k_blocks = k[b, hk][0:seqlen, :].tile((BN, D), (None, 0))
        v_blocks = v[b, hk][0:seqlen, :].tile((BN, D), (None, 0))
        sk = tg.shared((BN, D), dtype, stages=STAGES)
        sv = tg.shared((BN, D), dtype, stages=STAGES)
        start = s_id * tg.maximum(chunk, 0)   # known >= 0: C division on the key index
        stop = tg.minimum(start + chunk, k_blocks.shape[2])
        for j in tg.pipeline(start, stop, stages=STAGES):
            tg.copy(k_blocks[:, :, j], sk[j])
            tg.copy(v_blocks[:, :, j], sv[j])
            keys = tg.arange(BN, offset=j * BN)[None, :]
            state = _partial_softmax(sq, sk[j], sv[j], keys, rows_token, seqlen, state,
                                     dtype, SCALE, SQ, CAUSAL)
        _store_partial(state, o_part[b, hk, s_id], lse_part[b, hk, s_id], BR, D)
        if SP:
            _combine_in_last_block(o_part, lse_part, o, lse, counters, MR, D, SP)

    return attention_decode_split


def _paged_split_kernel(dtype: DType) -> tg.Kernel:
    @tg.kernel(threads=128)
    def attention_decode_split_paged(q: tg.Tensor[dtype, 4], k: tg.Tensor[dtype, 4],
                                     v: tg.Tensor[dtype, 4], seqlens: tg.Tensor[i32, 1],
                                     block_table: tg.Tensor[i32, 2],
                                     o_part: tg.Tensor[f32, 5], lse_part: tg.Tensor[f32, 4],
                                     o: tg.Tensor[dtype, 4], lse: tg.Tensor[f32, 3],
                                     counters: tg.Tensor[i32, 2],
                                     chunk: int, D: tg.constexpr, SCALE: tg.constexpr,
                                     SQ: tg.constexpr, CAUSAL: tg.constexpr, PAGE: tg.constexpr,
                                     BR: tg.constexpr = 16, BN: tg.constexpr = 64,
                                     STAGES: tg.constexpr = 3, SP: tg.constexpr = 0,
                                     MR: tg.constexpr = 16, WARM: tg.constexpr = 0,
                                     BOUND_K: tg.constexpr = 1):
        s_id, hk, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        seqlen = tg.minimum(tg.maximum(seqlens[b], 0), block_table.shape[1] * PAGE)
        sq, rows_token, state = _query_rows(q[b, hk], dtype, BR, D, SQ)
        sk = tg.shared((BN, D), dtype, stages=STAGES)
        sv = tg.shared((BN, D), dtype, stages=STAGES)
        start = s_id * tg.maximum(chunk, 0)   # known >= 0: C division on the key index
        stop = tg.minimum(start + chunk, tg.cdiv(seqlen, BN))
        if WARM:
            touch = (tg.shared((1, 8), dtype, stages=STAGES),
                     tg.shared((1, 8), dtype, stages=STAGES))
        for j in tg.pipeline(start, stop, stages=STAGES):
            if WARM:  # the first 16 bytes of the page WARM blocks ahead (measured no gain
                      # at 128k / 16k keys, session 13 round 2: off by default)
                far = block_table[b, tg.minimum(j + WARM, stop - 1) * BN // PAGE]
                tg.copy(k[far, hk].tile((1, 8), (0, 0)), touch[0][j])
                tg.copy(v[far, hk].tile((1, 8), (0, 0)), touch[1][j])
            page = block_table[b, j // (PAGE // BN)]           # BN divides PAGE
            first = j % (PAGE // BN) * BN                      # the block's first row in it
            stop_row = seqlen - j * BN + first                 # rows of the page in use
            # The block as its page view's first tile: 656 SASS a loop iteration against
            # 673 for the page's (in_page)-th tile of rows 0 … the end (sm_90a, D = 128).
            # BOUND_K=0: K's rows past the sequence's end load whatever the page holds
            # (their scores are masked to −inf by a select, so not even NaN reaches o),
            # one bound fewer; V's stay bounded (0 · NaN would be NaN in P V). Measured
            # level (H100, session 14: 2.83 / 2.87 TB/s against 2.84 / 2.86): off.
            k_page = k[page, hk][first:stop_row, :] if BOUND_K else k[page, hk][first:, :]
            tg.copy(k_page.tile((BN, D), (0, 0)), sk[j])
            tg.copy(v[page, hk][first:stop_row, :].tile((BN, D), (0, 0)), sv[j])
            keys = tg.arange(BN, offset=j * BN)[None, :]
            state = _partial_softmax(sq, sk[j], sv[j], keys, rows_token, seqlen, state,
                                     dtype, SCALE, SQ, CAUSAL)
        _store_partial(state, o_part[b, hk, s_id], lse_part[b, hk, s_id], BR, D)
        if SP:
            _combine_in_last_block(o_part, lse_part, o, lse, counters, MR, D, SP)

    return attention_decode_split_paged


def _store_partial(state, o_view, lse_view, BR: int, D: int) -> None:
    """A split's output o / l and lse = m·ln2 + ln(l); a split with no key (past the
    sequence's end) stores o = 0 and lse = −inf, which the combine weighs 0."""
    m_i, l_i, acc = state
    some = l_i > 0.0
    tg.copy(tg.where(some, acc / tg.where(some, l_i, 1.0), 0.0), o_view.tile((BR, D), (0, 0)))
    lse = tg.where(some, m_i * LN2 + tg.log(tg.where(some, l_i, 1.0)), -INF)
    tg.copy(lse[:, 0], lse_view.tile((BR,), (0,)))


def _combine_in_last_block(o_part, lse_part, o, lse, counters, MR: int, D: int,
                           SP: int) -> None:
    """The split blocks of one (batch, kv head) arrive on its counter once their partials
    are stored; the last to arrive merges all of them (`tg.last_arrival`: its loads see
    every other block's stores, and the counter is back at 0 for the next call). The merge
    is the step's tail, a chain of dependent L2 round trips: it reads only the MR rows
    that hold query rows (not the split's BR-row tile) and MERGE_WORDS of partials a thread
    per loop step (16 splits of 4 rows at D = 128: one step)."""
    hk, b = tg.block_id(1), tg.block_id(2)
    unroll = max(2, min(16, MERGE_WORDS * 128 // (MR * D)))
    with tg.if_(tg.last_arrival(counters[b].tile((1,), (hk,)), tg.num_programs(0))):
        _merge_splits(o_part[b, hk], lse_part[b, hk], o[b, hk], lse[b, hk], 0, MR, D, SP,
                      unroll=unroll, writes_lse=True)


def _merge_splits(o_part, lse_part, o, lse, d, BR: int, BD: int, SP: int, unroll: int,
                  writes_lse) -> None:
    """o (columns d·BD …) and lse of the G·Sq rows of one kv head from the splits'
    partials (`o_part` (splits, BR, D), `lse_part` (splits, BR)): weights
    exp(lse_s − max_s lse_s), added in split order (deterministic). Online, as the
    softmax runs over keys: `unroll` splits per loop step, their loads independent so they
    issue together (splits past the last load as lse = −inf: weight 0), then the running
    max grows by the step's and the sums rescale once. Each split's o is loaded before its
    lse: loads take their layouts in op order, so the weight gets o's row layout. Loading
    lse first (a pass over every lse for the max, then each split's) converted every
    weight through shared memory, three barriers a split that serialized the splits' L2
    round trips (4.5 µs of a 185 µs step at 16 splits, 9 at 33; H100, session 13).
    SP: the split count rounded up to a power of two (unused here; the caller's gate).
    `writes_lse`: a Python bool, or a condition for tg.if_."""
    top = tg.full((BR, 1), -INF, f32)                          # max lse so far
    total = tg.zeros((BR, 1), f32)
    acc = tg.zeros((BR, BD), f32)
    for first in tg.range(0, o_part.shape[0], unroll):
        step = []
        for s in range(unroll):
            o_s = tg.load(o_part[first + s:].tile((1, BR, BD), (0, 0, d)))[0, :, :]
            lse_s = tg.load(lse_part[first + s:].tile((1, BR), (0, 0)),
                            fill=-INF)[0, :][:, None]
            step.append((o_s, lse_s))
        new_top = top
        for _, lse_s in step:
            new_top = tg.maximum(new_top, lse_s)
        base = tg.where(new_top == -INF, 0.0, new_top)         # no split saw a key yet
        rescale = tg.exp(top - base)                           # 0 while top = −inf
        total = total * rescale
        acc = acc * rescale
        for o_s, lse_s in step:
            weight = tg.exp(lse_s - base)                      # 0 for a split past the end
            total = total + weight
            acc = acc + weight * o_s
        top = new_top
    some = total > 0.0
    tg.copy(tg.where(some, acc / tg.where(some, total, 1.0), 0.0).to(o.dtype),
            o.tile((BR, BD), (0, d)))
    every = tg.where(some, top + tg.log(tg.where(some, total, 1.0)), -INF)
    if writes_lse is True:
        tg.copy(every[:, 0], lse.tile((BR,), (0,)))
        return
    with tg.if_(writes_lse):                                   # one program writes lse
        tg.copy(every[:, 0], lse.tile((BR,), (0,)))


@lru_cache(maxsize=None)
def attention_decode_combine_kernel(dtype: DType) -> tg.Kernel:
    """The two-launch form's second kernel (`fused=False`): o and lse of the G·Sq rows of
    one kv head, BD columns of o per program, from the splits' partials
    (`_merge_splits`, UNROLL splits a loop step)."""

    @tg.kernel(threads=128)
    def attention_decode_combine(o_part: tg.Tensor[f32, 5], lse_part: tg.Tensor[f32, 4],
                                 o: tg.Tensor[dtype, 4], lse: tg.Tensor[f32, 3],
                                 SP: tg.constexpr, BR: tg.constexpr = 16, BD: tg.constexpr = 32,
                                 UNROLL: tg.constexpr = 8):
        d, hk, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        _merge_splits(o_part[b, hk], lse_part[b, hk], o[b, hk], lse[b, hk], d, BR, BD, SP,
                      UNROLL, tg.eq(d, 0))

    return attention_decode_combine


# --------------------------------------------------------------------------------------
# Shapes, checks and configuration shared by the numpy and torch entry points
# --------------------------------------------------------------------------------------

def check_decode_shapes(fn: str, q, k_cache, v_cache, cache_seqlens,
                        block_table=None) -> tuple[int, int, int, int, int, int]:
    """(B, H, Hkv, Sq, D, PAGE) after checking ranks and shapes (PAGE = 0 when not paged):
    a ValueError naming the argument otherwise (numpy arrays and torch tensors alike)."""
    for name, x in dict(q=q, k_cache=k_cache, v_cache=v_cache).items():
        if len(x.shape) != 4:
            raise ValueError(f"tegula.kernels.{fn}: {name} must be 4-D, got shape "
                             f"{tuple(x.shape)}")
    B, H, Sq, D = tuple(q.shape)
    kshape = tuple(k_cache.shape)
    if tuple(v_cache.shape) != kshape:
        raise ValueError(f"tegula.kernels.{fn}: v_cache has shape {tuple(v_cache.shape)}, "
                         f"k_cache {kshape}; they must match")
    if kshape[3] != D:
        raise ValueError(f"tegula.kernels.{fn}: k_cache has head dim {kshape[3]}, q {D}")
    Hkv = kshape[1]
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"tegula.kernels.{fn}: q has {H} heads, the cache {Hkv}; the query "
                         f"heads must be a multiple of the kv heads (GQA)")
    if not 1 <= Sq <= MAX_QUERY_TOKENS:
        raise ValueError(f"tegula.kernels.{fn}: q has {Sq} query tokens; decoding takes 1 to "
                         f"{MAX_QUERY_TOKENS} (use tegula.kernels.attention for more)")
    if D not in DECODE_HEAD_DIMS:
        raise ValueError(f"tegula.kernels.{fn}: head dim {D} is not supported; supported: "
                         f"{', '.join(map(str, DECODE_HEAD_DIMS))}")
    if tuple(cache_seqlens.shape) != (B,):
        raise ValueError(f"tegula.kernels.{fn}: cache_seqlens must have shape ({B},) (one "
                         f"length per batch), got {tuple(cache_seqlens.shape)}")
    page = 0
    if block_table is None:
        if kshape[0] != B:
            raise ValueError(f"tegula.kernels.{fn}: k_cache has batch {kshape[0]}, q {B} "
                             f"(a paged cache needs block_table=)")
    else:
        if len(block_table.shape) != 2 or block_table.shape[0] != B:
            raise ValueError(f"tegula.kernels.{fn}: block_table must be (B, max_blocks) with "
                             f"B = {B}, got shape {tuple(block_table.shape)}")
        page = kshape[2]
        if page < 16 or page & (page - 1):
            raise ValueError(f"tegula.kernels.{fn}: the page size (k_cache dim 2) is {page}; "
                             f"it must be a power of two ≥ 16")
    return B, H, Hkv, Sq, D, page


def group_rows(num_heads: int, kv_heads: int, seq_q: int, block_keys: int) -> int:
    """Rows of one program's query tile: the G query heads sharing a kv head, Sq each,
    rounded up to a power of two of at least 16 (the smallest MMA row tile), and of at
    least 32 for 16-key blocks (a 16 x 16 score tile has two MMA fragments, too few for
    the block's four warps)."""
    rows = num_heads // kv_heads * seq_q
    return max(16 if block_keys >= 32 else 32, 1 << (rows - 1).bit_length())


# The split count's cost model (`split_time`), fitted to a sweep of split counts on an
# H100 (session 7, `benchmarks/results/attention-h100-2026-11-24-session7.txt`): the read
# bandwidth (bytes/µs), the most one program streams and the most one SM streams however
# many programs it holds (bytes/µs, contiguous and paged: a paged program waits on its
# page table and copies in smaller pieces), the cost of one more split (µs: the merge
# walks the splits in order) and a fixed cost (µs: launch, ramp-up and tail; fitted when the
# merge was a second kernel).
DECODE_BANDWIDTH = 3.3e6
# Devices whose DRAM reads faster than the H100's the fit was taken on: their bandwidth
# scaled by the datasheets' ratio (H200 4.8 against 3.35 TB/s). Session 14 round 2 (H200):
# 16 splits at 128k contiguous streamed 3.24 TB/s (0.79x SDPA) where the paged kernel's 33
# read 4.0; at 4.7e6 the model picks 33 / 8 splits at 128k / 16k contiguous (not measured).
DEVICE_BANDWIDTH = {"H200": DECODE_BANDWIDTH * 4.8 / 3.35}
PROGRAM_RATE = {False: 27e3, True: 11e3}   # contiguous, paged
SM_RATE = {False: 30e3, True: 20e3}
SPLIT_COST_US = 0.6
# D = 64 programs and SMs stream at (64/128)^0.6 = 0.66 of those rates (fitted to the
# session-7 held-out D = 64 shape, 0.51 TB/s at one split where 0.82 was modeled; paged
# 0.25 against 0.34).
NARROW_EXPONENT = 0.6
FIXED_US = 15.0
SHARED_PER_SM = 228 * 1024                 # H100; 1 KB of it reserved per resident block
STAGES = 3                                 # the split kernels' K/V ring


def split_time(splits: int, rows: int, blocks: int, BR: int, BN: int, D: int, paged: bool,
               sms: int = 132, bandwidth: float = DECODE_BANDWIDTH) -> float:
    """Modeled µs of the split and combine kernels with `splits` splits (normalized to
    whole chunks) of `blocks` key blocks for `rows` = B·Hkv (batch, kv head) pairs. The
    programs run in waves of as many as fit on the GPU at once (shared memory bounds
    them). In a wave of n, each streams its chunk at min(bandwidth / n, PROGRAM_RATE,
    SM_RATE / k) with k the programs on the fullest SM: a wave of few programs is slow
    (too few splits), and so is a count whose programs fill a wave and spill a few into
    the next, or fill some SMs twice and others once (quantization). The partial outputs
    cost a write and a read, each split SPLIT_COST_US, and both kernels FIXED_US."""
    chunk = -(-blocks // splits)
    splits = -(-blocks // chunk)
    block_shared = (BR * D + 2 * STAGES * BN * D) * 2 + 1024
    slots = sms * max(1, SHARED_PER_SM // block_shared)
    chunk_bytes = chunk * BN * D * 2 * 2            # K and V, 2-byte elements
    # A key block's time has a part that does not shrink with its bytes (waits, the
    # softmax's shuffles): below D = 128 a program streams fewer bytes per µs.
    narrow = min(1.0, D / 128) ** NARROW_EXPONENT
    time, left = 0.0, rows * splits
    while left > 0:
        wave = min(left, slots)
        fullest = -(-wave // sms)
        rate = min(bandwidth / wave, PROGRAM_RATE[bool(paged)] * narrow,
                   SM_RATE[bool(paged)] / fullest)
        time += chunk_bytes / rate
        left -= wave
    partials = 2 * rows * splits * BR * D * 4
    return time + partials / bandwidth + SPLIT_COST_US * splits + FIXED_US


@lru_cache(maxsize=4096)
def best_split_count(rows: int, blocks: int, BR: int, BN: int, D: int, paged: bool,
                     sms: int = 132, bandwidth: float = DECODE_BANDWIDTH) -> int:
    """The split count (1 … MAX_SPLITS) of least `split_time`; ties go to fewer splits
    (deterministic)."""
    counts = sorted({-(-blocks // -(-blocks // n)) for n in range(1, min(blocks, MAX_SPLITS) + 1)})
    return min(counts, key=lambda n: (split_time(n, rows, blocks, BR, BN, D, paged, sms,
                                                 bandwidth), n))


def key_block(D: int, page: int = 0, BN: int | None = None) -> int:
    """Keys per block: `BN` if given, else 64 (32 for D = 256: its K/V ring fits shared
    memory twice per SM), never more than a page."""
    BN = BN or (64 if D <= 128 else 32)
    return min(BN, page) if page else BN


def decode_config(B: int, Hkv: int, capacity: int, D: int, page: int = 0,
                  num_splits: int | None = None, BN: int | None = None, BR: int = 16,
                  sms: int = 132, bandwidth: float = DECODE_BANDWIDTH) -> dict:
    """Key blocks per split (`chunk`), the split count and BN for a cache of `capacity`
    keys per sequence (its allocated length, not the current lengths, so that choosing
    needs no device sync; splits past a sequence's end return at once). The split count
    is the one `split_time` models fastest for B·Hkv programs per split on `sms` SMs
    (BR: the query tile's rows; `bandwidth`: the device's DRAM reads, bytes/µs), at most
    MAX_SPLITS."""
    BN = key_block(D, page, BN)
    blocks = max(1, tg.cdiv(capacity, BN))
    if num_splits is None:
        num_splits = best_split_count(B * Hkv, blocks, BR, BN, D, bool(page), sms, bandwidth)
    chunk = tg.cdiv(blocks, max(1, min(num_splits, blocks, MAX_SPLITS)))
    return dict(chunk=chunk, splits=tg.cdiv(blocks, chunk), BN=BN)


def decode_launches(dtype: DType, B: int, H: int, Hkv: int, Sq: int, D: int, capacity: int,
                    page: int, scale: float, causal: bool, num_splits: int | None = None,
                    BN: int | None = None, sms: int = 132, fused: bool = True,
                    wgmma: bool = False,
                    bandwidth: float = DECODE_BANDWIDTH) -> tuple[dict, list[tuple]]:
    """(config, launches): the launches as (kernel, grid, argument names, run-time
    scalars, constexprs): the split kernel, whose last block per (batch, kv head) merges
    the partials (`fused`), or the split kernel and then the combine kernel. Names: q
    (B, Hkv, R, D), k, v, seqlens, block_table, o_part, lse_part, o (B, Hkv, R, D), lse
    (B, Hkv, R), counters (B, Hkv) i32, zero before the first call (each call leaves them
    zero). `sms`: the device's SM count (the split count's model); `wgmma`: the target has
    wgmma (sm_90a), where a paged split kernel at D = 128 takes a WGMMA_ROWS-row query tile;
    `bandwidth`: the device's DRAM reads (the split count's model, `DEVICE_BANDWIDTH`)."""
    BR = split_rows = group_rows(H, Hkv, Sq, key_block(D, page, BN))
    if wgmma and page and D == 128 and BR <= WGMMA_ROWS:
        split_rows = WGMMA_ROWS
    config = decode_config(B, Hkv, capacity, D, page, num_splits, BN, split_rows, sms,
                           bandwidth)
    splits = config["splits"]
    SP = max(2, 1 << (splits - 1).bit_length())   # the max over splits: one (SP, BR) tile
    R = H // Hkv * Sq
    constexprs = dict(D=D, SCALE=scale, SQ=Sq, CAUSAL=bool(causal), BR=split_rows,
                      BN=config["BN"],
                      SP=SP if fused else 0, MR=1 << (R - 1).bit_length())
    tensors = ("q", "k", "v", "seqlens") + (("block_table",) if page else ()) + \
        ("o_part", "lse_part", "o", "lse", "counters")
    split = (attention_decode_split_kernel(dtype, bool(page)), (splits, Hkv, B), tensors,
             (config["chunk"],), dict(constexprs, PAGE=page) if page else constexprs)
    if fused:
        return config, [split]
    combine = (attention_decode_combine_kernel(dtype), (D // COMBINE_COLUMNS, Hkv, B),
               ("o_part", "lse_part", "o", "lse"), (),
               dict(SP=SP, BR=BR, BD=COMBINE_COLUMNS))
    return config, [split, combine]


def attention_decode_emulated(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                              cache_seqlens: np.ndarray, block_table: np.ndarray | None = None,
                              scale: float | None = None, causal: bool = False,
                              dtype: DType | None = None, target: str | None = None,
                              num_splits: int | None = None, BN: int | None = None,
                              return_lse: bool = False, fused: bool = True,
                              counters: np.ndarray | None = None):
    """o (B, H, Sq, D) by the emulated split-KV kernels (and lse (B, H, Sq) f32 with
    `return_lse`). float16 arrays are f16; bf16 data comes as float32 arrays holding bf16
    values with `dtype=bf16`. cache_seqlens (B,) and block_table (B, max_blocks) are
    int32. `num_splits`, `BN`: configuration overrides (tests); `fused=False`: the
    two-launch form (split, then combine); `counters`: the (B, Hkv) int32 arrival counters
    to use (zeros by default; the call leaves them zero)."""
    fn = "attention_decode_emulated"
    arrays = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens)
    if block_table is not None:
        arrays["block_table"] = block_table
    for name, x in arrays.items():
        if not isinstance(x, np.ndarray):
            raise TypeError(f"tegula.kernels.{fn}: {name} must be a numpy array, got "
                            f"{type(x).__name__}")
    B, H, Hkv, Sq, D, page = check_decode_shapes(fn, q, k_cache, v_cache, cache_seqlens,
                                                 block_table)
    if dtype is None:
        if q.dtype != np.float16:
            raise TypeError(f"tegula.kernels.{fn}: q has dtype {q.dtype}; pass float16 "
                            f"arrays, or float32 arrays holding bf16 values with "
                            f"dtype=tegula.bf16")
        dtype = f16
    storage = np.float16 if dtype == f16 else np.float32
    for name in ("q", "k_cache", "v_cache"):
        if arrays[name].dtype != storage:
            raise TypeError(f"tegula.kernels.{fn}: {name} has dtype {arrays[name].dtype}; "
                            f"{dtype} data must be numpy {np.dtype(storage)}")
    for name in ("cache_seqlens", "block_table"):
        if name in arrays and arrays[name].dtype != np.int32:
            raise TypeError(f"tegula.kernels.{fn}: {name} must be int32, got "
                            f"{arrays[name].dtype}")
    capacity = page * block_table.shape[1] if page else k_cache.shape[2]
    _check_lengths(fn, cache_seqlens, capacity)
    R = H // Hkv * Sq
    config, launches = decode_launches(dtype, B, H, Hkv, Sq, D, capacity, page,
                                       default_scale(scale, D, fn), causal, num_splits, BN,
                                       fused=fused, wgmma=_has_wgmma(target))
    if counters is None:
        counters = np.zeros((B, Hkv), np.int32)
    values = dict(q=np.ascontiguousarray(q).reshape(B, Hkv, R, D), k=k_cache, v=v_cache,
                  seqlens=cache_seqlens, block_table=block_table, counters=counters,
                  o_part=poisoned((B, Hkv, config["splits"], R, D), f32),
                  lse_part=poisoned((B, Hkv, config["splits"], R), f32),
                  o=poisoned((B, Hkv, R, D), dtype), lse=poisoned((B, Hkv, R), f32))
    if B:
        extra = {} if target is None else {"target": target}
        for kernel, grid, names, scalars, constexprs in launches:
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                launch_emulated(kernel, grid, *(values[n] for n in names), *scalars,
                                **constexprs, **extra)
    o = values["o"].reshape(B, H, Sq, D)
    return (o, values["lse"].reshape(B, H, Sq)) if return_lse else o


def attention_decode(q, k_cache, v_cache, cache_seqlens, block_table=None,
                     scale: float | None = None, causal: bool = False, *,
                     return_lse: bool = False, num_splits: int | None = None,
                     BN: int | None = None, fused: bool = True):
    """Decoding attention on CUDA tensors: q (B, H, Sq ≤ 16, D); the cache (B, Hkv, S_max, D),
    or with `block_table` (B, max_blocks) int32 a pool of pages (pages, Hkv, PAGE, D);
    cache_seqlens (B,) int32 (clamped to the cache's capacity on the device, not checked
    here: that would sync). Returns o (B, H, Sq, D) in q's dtype (and lse (B, H, Sq) f32
    with `return_lse`). `num_splits`, `BN` override the configuration; `fused=False`
    runs the two-launch form (split, then combine) instead of one launch whose last split
    block per (batch, kv head) merges the partials. The fused form counts arrivals in a
    (B, Hkv) int32 view of the counters kept per device and stream
    (`runtime.arrivals`), which every call leaves zero: calls on one stream run in order;
    two streams get two buffers, and a call captured in a CUDA graph its own."""
    import torch

    from tegula.build import launch
    from tegula.kernels import api
    from tegula.kernels.api import _check_cuda, _check_same_dtype, _check_tensor
    # A later call with this one's replay key (shapes, strides, dtypes, devices, options)
    # replays its two launches into fresh outputs: the checks and choices below are a
    # function of the key (tegula.kernels.api.plan_replay).
    key_tensors = (q, k_cache, v_cache, cache_seqlens) + (
        () if block_table is None else (block_table,))
    replayed, found = api._replay_plan(key_tensors, "attention_decode", block_table is None,
                                       type(scale), scale, type(causal), causal,
                                       bool(return_lse), type(num_splits), num_splits,
                                       type(BN), BN, bool(fused))
    if replayed:
        return found
    fn = "attention_decode"
    floats = {"float16": f16, "bfloat16": bf16}
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache)
    for name, t in tensors.items():
        dtype = _check_tensor(fn, name, t, floats, ndim=4)
    _check_same_dtype(fn, tensors)
    _check_tensor(fn, "cache_seqlens", cache_seqlens, {"int32": i32}, ndim=1)
    if block_table is not None:
        _check_tensor(fn, "block_table", block_table, {"int32": i32}, ndim=2)
        tensors["block_table"] = block_table
    B, H, Hkv, Sq, D, page = check_decode_shapes(fn, q, k_cache, v_cache, cache_seqlens,
                                                 block_table)
    scale = default_scale(scale, D, fn)
    _check_cuda(fn, dict(tensors, cache_seqlens=cache_seqlens))
    capacity = page * block_table.shape[1] if page else k_cache.shape[2]
    R = H // Hkv * Sq
    device = q.device
    sms, bandwidth, wgmma = _device_model(torch, device)
    config, launches = decode_launches(dtype, B, H, Hkv, Sq, D, capacity, page, scale,
                                       causal, num_splits, BN, sms, fused, wgmma,
                                       bandwidth)
    inner = lambda t: t if t.stride(-1) == 1 else t.contiguous()  # noqa: E731
    values = dict(q=q.contiguous().view(B, Hkv, R, D), k=inner(k_cache), v=inner(v_cache),
                  seqlens=cache_seqlens.contiguous(),
                  block_table=None if block_table is None else block_table.contiguous(),
                  o_part=torch.empty((B, Hkv, config["splits"], R, D), dtype=torch.float32,
                                     device=device),
                  lse_part=torch.empty((B, Hkv, config["splits"], R), dtype=torch.float32,
                                       device=device),
                  o=torch.empty((B, Hkv, R, D), dtype=q.dtype, device=device),
                  lse=torch.empty((B, Hkv, R), dtype=torch.float32, device=device),
                  counters=arrival_counters(device, B * Hkv).view(B, Hkv))
    launched = []
    if B:
        for kernel, grid, names, scalars, constexprs in launches:
            args = (*(values[n] for n in names), *scalars)
            launched.append((launch(kernel, grid, *args, **constexprs), grid, args))
    o = values["o"].view(B, H, Sq, D)
    lse = values["lse"].view(B, H, Sq)
    if launched and found is not None:
        replay = api.plan_replay(launched, key_tensors + (values["counters"],),
                                 [o, lse, values["o_part"], values["lse_part"]],
                                 (lambda outs: (outs[0], outs[1])) if return_lse else
                                 (lambda outs: outs[0]))
        if replay is not None:
            api._remember(found, _CountedReplay(replay, device, B * Hkv))
    return (o, lse) if return_lse else o


def _device_model(torch, device) -> tuple[int, float, bool]:
    """(SMs, DRAM read bandwidth in bytes/µs, sm_90a) of `device` for the split count and
    the query tile (CPU tensors, the tests' emulated launch: an H100 without wgmma)."""
    if device.type != "cuda":
        return 132, DECODE_BANDWIDTH, False
    props = torch.cuda.get_device_properties(device)
    bandwidth = next((bw for name, bw in DEVICE_BANDWIDTH.items() if name in props.name),
                     DECODE_BANDWIDTH)
    return (props.multi_processor_count, bandwidth,
            torch.cuda.get_device_capability(device) == (9, 0))


class _CountedReplay:
    """A `PlanReplay` of the fused call whose last call tensor is the counter buffer:
    looked up for the replaying call's stream, then the plan replays."""

    __slots__ = ("plan", "device", "count")

    def __init__(self, plan, device, count: int):
        self.plan, self.device, self.count = plan, device, count

    def __call__(self, tensors: tuple, pointers) -> object:
        counters = arrival_counters(self.device, self.count)
        return self.plan(tensors, [*pointers, counters.data_ptr()])


def _has_wgmma(target) -> bool:
    """Whether an emulated launch's target (a name, a Target or None: sm_90a) is sm_90a."""
    if target is None or isinstance(target, str):
        return (target or "sm_90a") == "sm_90a"
    return target.cc == 90 and target.arch_suffix == "a"


def _check_lengths(fn: str, cache_seqlens, capacity: int) -> None:
    """Every length within 0 … the cache's capacity (numpy values; torch entry points
    check theirs on the host only when asked, to avoid a sync)."""
    lengths = np.asarray(cache_seqlens)
    if lengths.size and (lengths.min() < 0 or lengths.max() > capacity):
        raise ValueError(f"tegula.kernels.{fn}: cache_seqlens must lie in 0 … {capacity} (the "
                         f"cache's capacity), got {lengths.min()} … {lengths.max()}")


__all__ = ["attention_decode_split_kernel", "attention_decode_combine_kernel",
           "attention_decode_emulated", "attention_decode", "check_decode_shapes", "decode_config",
           "decode_launches", "group_rows", "key_block", "split_time", "best_split_count",
           "ATTENTION_DECODE_DTYPES"]
