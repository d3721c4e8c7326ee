"""FlashAttention forward: `o = softmax(q @ k.T * scale + mask) @ v` and its log-sum-exp.

One program per (query block, head, batch): it keeps its BM query rows in shared memory and
walks the keys BN at a time (a `tg.pipeline`, so the next key and value blocks load while
this one computes), holding the softmax *online* as FlashAttention does — per row a running
maximum `m_i`, a running sum `l_i` of `exp(s - m_i)` and the unnormalized output `acc`, all
f32 and loop-carried, rescaled by `exp(m_old - m_new)` whenever the maximum grows — and
divides by `l_i` once at the end. Scores are computed in base 2: `exp(x) = exp2(x·log2 e)`
with `log2 e` folded into the scale, and the scale applied in the exponent: `exp2(s·c − m)`
is one FMA and one hardware `ex2` per score (the row max is taken on the unscaled scores).

Conventions (shared with the backward, `attention_backward.py`):

* Layout: q (B, H, Sq, D), k and v (B, H_kv, Sk, D) as torch SDPA; H_kv divides H (GQA;
  H_kv = 1 is MQA) and query head h reads kv head `h // (H // H_kv)`.
* `scale` defaults to 1/sqrt(D).
* **Causal masks are aligned bottom-right**, as FlashAttention's: query i sees key j when
  `j <= i + Sk - Sq` (the last query sees every key, so decoding one token against a cache
  is causal = True). torch SDPA's `is_causal` is aligned top-left (`j <= i`); the two agree
  only when Sq == Sk. A query row that sees no key (Sq > Sk, causal) gets output 0 and
  log-sum-exp -inf, not NaN.
* The log-sum-exp `lse` (B, H, Sq) f32 is in natural log: `lse = m + log(l)` over the row's
  visible scaled scores `s = q·k·scale`, so `softmax(s)_j = exp(s_j - lse)`.
* Masks are made from tile coordinates in the kernel (`tg.arange`, `tg.where`): keys past
  the sequence's end and causally hidden keys; a causal program stops its key loop at the
  last block its rows can see.

On sm_90a both gemms run on wgmma with K and V arriving by TMA into an mbarrier ring
filled by a producer warpgroup: `q @ k.T` reads q and k K-major (a D-wide row spans
D / 64 swizzle blocks), `p @ v` takes p from registers (wgmma's A fragment is the first
gemm's accumulator rows: no conversion) and v's tile through its transposed view, an
MN-major operand. On sm_80 the same source runs on mma.sync (`ldmatrix.trans` for v).
Variants, a constexpr each, so the autotuner can time them:

* `OVERLAP`: the key loop software-pipelined by one block, as FlashAttention-3 within a
  warpgroup (`_overlapped_key_loop`): iteration j issues s_{j+1} = q @ k_{j+1}.T and
  acc += p_j @ v_j, and block j+1's softmax runs while the tensor cores compute them
  (`lower/wgmma_waits.py` places the waits: wait_group 1 before the softmax reads s,
  wait_group 0 at the end of the body). One (BN, D) shared buffer more (block 0's keys).
  Sessions 7-9 measured it slower than the plain loop: ptxas placed the `WARPGROUP.DEPBAR
  0x0` right after the first row max, before the exponentials, because the body wrote
  registers of the in-flight p_j @ v_j (the rescale of acc, the f16 packing of p_{j+1})
  and ptxas puts a DEPBAR just ahead of its first use, or anywhere in its basic block
  (session 10, the SASS). Now nothing in the softmax touches them (acc is rescaled
  before its gemm, p crosses the iteration in f32) and the softmax sits in the mask's
  branch, so every `MUFU.EX2` lies between the two waits. Measured (H100, session 10):
  D=256 698 TFLOP/s against the plain loop's 669 (an autotuner candidate there); D=128
  563 against 583 and D=64 404 against 410 (the two consumer warpgroups already overlap
  each other's softmax, and the loop holds more registers); session 13, D=128 with REGS=240
  (no spill) 559 against the turns' 593.

* `FIRST_IN_RING` (with OVERLAP): block 0's keys come through the ring too, the ring shifted
  by one block, instead of a buffer of their own (`_overlapped_key_loop`): FlashAttention-3's
  D = 256 tile of 80-key blocks then fits the shared memory.

* BM=192 on threads=384: three consumer warpgroups of 64 rows (FlashAttention-3's D = 64
  tile): each key block serves 192 rows, and the warpgroups' softmax and gemms interleave
  without turns. At D = 64 493 TFLOP/s against the turns' 428 (H100, session 13).

* `consumers="pingpong"` (a build option, with BM=128 on 256 threads; sm_90a): the two
  consumer warpgroups take turns at the tensor cores (FlashAttention-3's inter-warpgroup
  ping-pong, `lower/warp_roles.py` `take_turns_in_loop`): each issues `acc += p_j @ v_j`
  and `s_{j+1} = q @ k_{j+1}.T` in its turn, then runs block j+1's softmax while the
  other's gemms run.

* `REGS` (> 0): the kernel states its warp roles (`tg.producer` / `tg.consumer`) with REGS
  registers a consumer thread and 24 a producer thread (FlashAttention-3's split) instead
  of synthesis's 232 / 40; at D = 128 the overlapped loop on the cooperative consumer then
  fits without spilling (ptxas: 237 of 240, against 60 B of spills at 232). 192-row query
  blocks on three consumer warpgroups (BM=192, threads=384, FlashAttention-3's D = 64 tile)
  get 152 (160 with REGS=160).

* `PERSISTENT`: one block an SM (grid (min(tiles, SMs),)) walks the query tiles, m fastest
  within a head (the blocks running together share their heads' keys in L2), reversed
  when causal (longest rows first). Without causality the key loop's trip count is the
  same for every tile, so on sm_90a its TMA ring runs on across the tiles and the producer
  loads the next tile's first keys while the consumers finish the current one (no block
  launch, prologue or epilogue left idle between tiles); a causal tile's trip count
  depends on m, so that ring is refused (`synth/copies.py`) and the loop falls back to
  cp.async. Measured slower (H100, session 13: 0.62-0.76x the one-block-per-tile kernel
  at D = 64 / 128, with or without turns): each tile still loads its q by cp.async and
  stores o from registers on the consumer's path, and the tensor pipe ran 32-41% busy
  against 44-65%; not a tuner candidate.

* `V_KMAJOR`: v is passed transposed, (B, H_kv, D, Sk), so that its tile is a K-major
  operand of `p @ v` (the torch entry makes the transposed copy: one more pass over v).
* `P_SHARED`: the probabilities go through shared memory to the gemm (a shared wgmma A
  operand) instead of staying in registers.

Variable lengths (`attention_varlen_kernel`): q (total_q, H, D), k and v (total_k, H_kv, D)
packed as flash-attn's varlen API, sequence e holding rows `cu_seqlens[e] …
cu_seqlens[e+1]-1`; lse is (H, total_q). The same loop (`_attend`) runs on views narrowed
by the offsets, which the kernel loads as scalars.
"""
from __future__ import annotations

import contextlib
import math
from functools import lru_cache

import numpy as np

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, bf16, f16, i32
from tegula.kernels.attention_tiles import attention_candidates
from tegula.kernels.common import check_array, launch_emulated, poisoned

ATTENTION_DTYPES = (f16, bf16)
HEAD_DIMS = (64, 128, 256)
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E)
INF = float("inf")


def online_softmax_probs(s, scale: float, m_i):
    """The probabilities of one key block in log2 units: `s` (R, BN) holds q·k with
    masked keys at −inf, `scale` > 0 is the kernel's scale · log2(e) (applied here, so that
    `s · scale − m` is one fused multiply-add per score before the `ex2`, and the row max
    is taken before scaling: scaling by a positive number keeps it). Returns (p, m_new,
    alpha): p = exp2(s·scale − m_new), and alpha = exp2(m_i − m_new), the factor rescaling
    the running sum and output; m is in scaled units. A row that has seen no key yet keeps
    m = −inf; its reference point is taken as 0 so that −inf − −inf never makes a NaN."""
    m_new = tg.maximum(m_i, tg.max(s, 1) * scale)
    m_base = tg.where(m_new == -INF, 0.0, m_new)
    return tg.exp2(s * scale - m_base), m_new, tg.exp2(m_i - m_base)


def masked_for_softmax(visible, s, scale: float):
    """(scores, the scale `online_softmax_probs` applies): `s` with the keys not `visible`
    at −inf (None: no mask). A positive `scale` is left to the softmax (one FMA per score);
    any other (a user's zero or negative scale) is applied here, where the row max must be
    taken after it (and −inf · 0 would be NaN)."""
    if scale <= 0:
        s, scale = s * scale, 1.0
    return (s if visible is None else tg.where(visible, s, -INF)), scale


def online_softmax_step(s, scale: float, m_i, l_i, acc):
    """One key block of the online softmax (`online_softmax_probs`): rescales `acc` in
    place (one accumulator live; the caller adds p @ v) and returns (p, m_new, l_i)."""
    p, m_new, alpha = online_softmax_probs(s, scale, m_i)
    acc *= alpha
    return p, m_new, l_i * alpha + tg.sum(p, 1)


def _attend(qv, kv, vv, ov, lse_v, m, dtype: DType, D: int, QK_SCALE: float, CAUSAL: bool,
            BM: int, BN: int, STAGES: int, V_KMAJOR: bool, P_SHARED: bool,
            OVERLAP: bool = False, REGS: int = 0, ragged: bool = True,
            FIRST_IN_RING: bool = False) -> None:
    """The body every forward kernel shares (traced inline): query block `m` of the
    (Sq, D) view `qv` against the (Sk, D) keys `kv` and values `vv` ((D, Sk) when
    V_KMAJOR), writing its rows of `ov` (Sq, D) and `lse_v` (Sq,). `ragged`: the grid
    may hold blocks past the view's rows (varlen)."""
    seq_q, seq_k = qv.shape[0], kv.shape[0]
    sq = tg.shared((BM, D), dtype)
    tg.copy(qv.tile((BM, D), (m, 0)), sq)
    keys = kv.tile((BN, D), (None, 0))                    # (BN, D, key blocks)
    values = vv.tile((D, BN), (0, None)) if V_KMAJOR else vv.tile((BN, D), (None, 0))
    sk = tg.shared((BN, D), dtype, stages=STAGES)
    sv = tg.shared((D, BN) if V_KMAJOR else (BN, D), dtype, stages=STAGES)
    sp = tg.shared((BM, BN), dtype) if P_SHARED else None
    rows = tg.arange(BM, offset=m * BM)
    # Varlen grids are sized by the longest sequence: a block past this one's rows skips
    # its keys (its loads and stores are out of bounds anyway). Without that factor the
    # non-causal trip count does not depend on m, so a persistent kernel's TMA ring can
    # run on across its tiles (`synth/copies.py` `plan_nested_ring`).
    blocks = tg.cdiv(seq_k, BN)
    if ragged:
        blocks = blocks * tg.minimum(tg.maximum(seq_q - m * BM, 0), 1)
    if CAUSAL:  # the last key any row of this block sees is (m+1)·BM - 1 + Sk - Sq
        blocks = tg.minimum(blocks, ((m + 1) * BM + seq_k - seq_q + BN - 1) // BN)

    # Every row of the block sees the keys up to `seen` (the first row's last visible key,
    # or the last key): key blocks within it skip the mask's per-score compares.
    seen = m * BM + seq_k - seq_q if CAUSAL else seq_k - 1

    def masked_scores(s, j, mask=None):
        """Block j's scores with the keys past the end and causally hidden at −inf, and
        the scale the softmax applies (`masked_for_softmax`). `mask` None: only a block
        reaching past `seen` is masked (a branch on block-uniform scalars, `needs_mask`);
        True or False: the caller branched already."""
        s, scale = masked_for_softmax(None, s, QK_SCALE)
        if mask is None:
            with tg.if_(needs_mask(j)):
                s = hide_keys(s, j)
        elif mask:
            s = hide_keys(s, j)
        return s, scale

    def hide_keys(s, j):
        """`s` with block j's keys past the end and (causal) after each row's diagonal at
        −inf."""
        cols = tg.arange(BN, offset=j * BN)
        visible = cols[None, :] < seq_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + (seq_k - seq_q))
        return tg.where(visible, s, -INF)

    def needs_mask(j):
        """Whether key block j reaches past `seen` (the first key some row must not see)."""
        return (j + 1) * BN - 1 > seen

    def pv_gemm(p, v_block, acc):
        """acc += p @ v, p (registers) through shared memory where P_SHARED."""
        if P_SHARED:
            tg.copy(p, sp)
            p = sp
        tg.gemm(acc, p, v_block if V_KMAJOR else v_block.T)

    roles = _role_blocks(REGS)
    if OVERLAP:
        m_i, l_i, acc = _overlapped_key_loop(sq, keys, values, sk, sv, blocks, BN, dtype,
                                             STAGES, masked_scores, needs_mask, pv_gemm, roles,
                                             FIRST_IN_RING)
    else:
        m_i, l_i, acc = _key_loop(sq, keys, values, sk, sv, blocks, BN, dtype, STAGES,
                                  masked_scores, pv_gemm, roles)
    unseen = l_i == 0.0                                   # the row saw no key (NaN: it did)
    l_safe = tg.where(unseen, 1.0, l_i)
    tg.copy((acc * (1.0 / l_safe)).to(dtype), ov.tile((BM, D), (m, 0)))
    lse = tg.where(unseen, -INF, (m_i + tg.log2(l_safe)) * (1.0 / LOG2E))
    tg.copy(lse[:, 0], lse_v.tile((BM,), (m,)))


#: The producer warpgroup's registers a thread where the kernel states its roles (`REGS`):
#: it only issues TMA boxes, and FlashAttention-3 gives it 24 (32 beside three consumers).
PRODUCER_REGS = 24


def _role_blocks(regs: int):
    """(producer, consumer): context managers for the key loop's copies and the rest of
    its body. `regs` > 0 states the warp roles (`tg.producer` / `tg.consumer`, sm_90a) with
    `regs` registers a consumer thread and PRODUCER_REGS a producer thread, where
    synthesis would give 40 and what that frees (232 beside two consumer warpgroups);
    0 leaves the roles and budgets to synthesis."""
    if not regs:
        return contextlib.nullcontext, contextlib.nullcontext
    return (lambda: tg.producer(regs=PRODUCER_REGS)), (lambda: tg.consumer(regs=regs))


def _softmax_state(sq):
    """The online softmax's state for the rows of `sq` (BM, D): m_i, the running max
    (base-2 units), l_i, the running sum of exp2(s - m_i), and acc, the unnormalized
    output."""
    rows, d = sq.shape
    return tg.full((rows, 1), -INF, f32), tg.zeros((rows, 1), f32), tg.zeros((rows, d), f32)


def _key_loop(sq, keys, values, sk, sv, blocks, BN, dtype, STAGES, masked_scores,
              pv_gemm, roles):
    """The key loop: block j's scores, their online softmax (rescaling acc), then
    acc += p_j @ v_j; returns (m_i, l_i, acc). With consumers="pingpong" each turn's
    sync waits for p's f16 fragment (`lower/warp_roles.py` `_turn_operands`), so this
    softmax runs before the warpgroup takes its turn at the tensor cores (without that
    dependency ptxas sank every MUFU.EX2 below the turn's BAR.SYNC). Session 11 kept it
    above by copying the softmax into both sides of the mask's branch instead: 0.881x
    cuDNN against 0.895x at D = 128 (H100), reverted."""
    m_i, l_i, acc = _softmax_state(sq)
    producer, consumer = roles
    for j in tg.pipeline(blocks, stages=STAGES):
        with producer():
            tg.copy(keys[:, :, j], sk[j])
            tg.copy(values[:, :, j], sv[j])
        with consumer():
            s = tg.zeros((sq.shape[0], BN), f32)
            tg.gemm(s, sq, sk[j])                         # s = q @ k.T
            p, m_new, l_i = online_softmax_step(*masked_scores(s, j), m_i, l_i, acc)
            pv_gemm(p.to(dtype), sv[j], acc)              # acc += p @ v
            m_i = m_new
    return m_i, l_i, acc


def _overlapped_key_loop(sq, keys, values, sk, sv, blocks, BN, dtype, STAGES,
                         masked_scores, needs_mask, pv_gemm, roles, first_in_ring=False):
    """The key loop software-pipelined by one block, in FlashAttention-3's order (its
    intra-warpgroup overlap). Iteration j issues s_{j+1} = q @ k_{j+1}.T, rescales acc by
    alpha_j, issues acc += p_j @ v_j, and runs block j+1's softmax while the tensor cores
    compute both: `lower/wgmma_waits.py` puts a `wgmma.wait_group 1` (s_{j+1} only) before
    the softmax and the `wait_group 0` at the end of the body. Nothing in the softmax
    touches the registers of the in-flight p_j @ v_j (acc and p_j's f16 fragment): the
    probabilities cross the iteration in f32 and become the wgmma's f16 A fragment only
    at the next issue, and acc is rescaled before its gemm, not after. Otherwise ptxas,
    which places a `WARPGROUP.DEPBAR` just ahead of the first instruction needing it,
    hoists the wait above the exponentials to interleave the f16 packing with them, and
    nothing overlaps (sessions 7-9 measured this loop slower than the plain one for it).
    The probabilities cross the iteration in the scores' own registers (`s.assign(p)`, as
    FlashAttention-3 exponentiates in place): a p of its own (or block 0's scores apart)
    would be another 64-register tile live through the loop. At D = 128 with 128-key
    blocks on the cooperative consumer, s, acc and p_j's f16 fragment still leave too few
    of the 232 registers (ptxas spills ~60 B of scalars; the operand fences were not the
    cause, 19ad5f4); with 112-key blocks, or with consumers="pingpong" (whose turn sync
    waits for p_j's fragment), the SASS has no local loads or stores.
    Stage j of the ring holds k_{j+1} and v_j; block 0's keys come through a buffer of
    their own and its softmax runs before the loop. Loop invariant at iteration j: acc =
    Σ_{i<j} exp2(s_i − m_{j−1})·v_i, p_j = exp2(s_j − m_j), alpha_j = exp2(m_{j−1} − m_j),
    l_i = Σ_{i≤j} exp2(s_i − m_j). The last iteration's scores are of the block past the
    last one (keys out of bounds load as 0, causally hidden keys are masked): all −inf,
    so p = 0 and alpha = 1 (0 for a row that saw no key, whose acc is 0).
    `first_in_ring` (FIRST_IN_RING): block 0's keys come through the ring as well, shifted
    by one — stage j holds k_j and v_{j-1} (at j = 0 the block past the last, zeros times
    p = 0), the loop runs once more (s starts at 0, alpha at 1) — so no key buffer of their
    own: at D = 256 q (64 KB) and two stages of 80-key k and v (160 KB) then fit
    FlashAttention-3's 128 x 80 tile, which the extra buffer (40 KB) did not. Costs one
    p @ v of zeros a block."""
    m_i, l_i, acc = _softmax_state(sq)
    s = tg.zeros((sq.shape[0], BN), f32)
    if first_in_ring:  # iteration j computes s_j: p_{-1} = 0, alpha_{-1} = 1, v_{-1} = 0
        ahead, trips, alpha = 0, blocks + tg.minimum(blocks, 1), tg.full(m_i.shape, 1.0, f32)
        past = values.shape[2] + 1  # v_{-1}: the block past the last (out of bounds: zeros)
    else:
        ahead, trips = 1, blocks
        sk_first = tg.shared((BN, sq.shape[1]), dtype)
        tg.copy(keys[:, :, 0], sk_first)
        tg.gemm(s, sq, sk_first)                          # s_0
        p, m_i, alpha = online_softmax_probs(*masked_scores(s, 0), m_i)
        l_i = l_i * alpha + tg.sum(p, 1)                  # acc is 0: alpha_0 rescales nothing
        s.assign(p)
    producer, consumer = roles
    for j in tg.pipeline(trips, stages=STAGES):
        with producer():
            tg.copy(keys[:, :, j + ahead], sk[j])
            tg.copy(values[:, :, j if ahead else j - 1 + (1 - tg.minimum(j, 1)) * past], sv[j])
        with consumer():  # (the comments' j: the loop's without first_in_ring, j - 1 with it)
            p16 = s.to(dtype)
            s.assign(0.0)
            tg.gemm(s, sq, sk[j])                         # s_{j+1}          } both in flight
            acc *= alpha                                  #                  } during block
            pv_gemm(p16, sv[j], acc)                      # acc += p_j @ v_j } j+1's softmax
            # The mask's branch holds the whole softmax (each side a copy of it), so the
            # body ends in a join holding the wait for p_j @ v_j: ptxas places a
            # WARPGROUP.DEPBAR anywhere before its first use within a basic block (at D = 64
            # it filled a stall of the row-max chain with it), never across blocks.
            with tg.if_(needs_mask(j + ahead)):
                p, m_i, alpha = online_softmax_probs(*masked_scores(s, j + ahead, True), m_i)
                l_i = l_i * alpha + tg.sum(p, 1)
                s.assign(p)
            with tg.else_():
                p, m_i, alpha = online_softmax_probs(*masked_scores(s, j + ahead, False), m_i)
                l_i = l_i * alpha + tg.sum(p, 1)
                s.assign(p)
    acc *= alpha                                          # the block past the last: 1 or 0
    return m_i, l_i, acc


@lru_cache(maxsize=None)
def attention_kernel(dtype: DType) -> tg.Kernel:
    """The forward on (B, H, S, D) tensors of `dtype`; grid (cdiv(Sq, BM), H, B), or
    (min(tiles, SMs),) with PERSISTENT."""

    @tg.kernel(threads=128)
    def attention_fwd(q: tg.Tensor[dtype, 4], k: tg.Tensor[dtype, 4], v: tg.Tensor[dtype, 4],
                      o: tg.Tensor[dtype, 4], lse: tg.Tensor[f32, 3],
                      D: tg.constexpr, QK_SCALE: tg.constexpr, CAUSAL: tg.constexpr = False,
                      BM: tg.constexpr = 64, BN: tg.constexpr = 64, STAGES: tg.constexpr = 2,
                      V_KMAJOR: tg.constexpr = False, P_SHARED: tg.constexpr = False,
                      OVERLAP: tg.constexpr = False, REGS: tg.constexpr = 0,
                      PERSISTENT: tg.constexpr = False, FIRST_IN_RING: tg.constexpr = False):
        def attend(m, h, b):
            kv_head = h // (q.shape[1] // k.shape[1])
            _attend(q[b, h], k[b, kv_head], v[b, kv_head], o[b, h], lse[b, h], m, dtype, D,
                    QK_SCALE, CAUSAL, BM, BN, STAGES, V_KMAJOR, P_SHARED, OVERLAP, REGS,
                    ragged=False, FIRST_IN_RING=FIRST_IN_RING)

        if PERSISTENT:
            blocks_m = tg.cdiv(q.shape[2], BM)
            for t in tg.range(tg.block_id(0), blocks_m * q.shape[1] * q.shape[0],
                              tg.num_programs(0)):
                m = t % blocks_m
                if CAUSAL:
                    m = blocks_m - 1 - m
                attend(m, t // blocks_m % q.shape[1], t // blocks_m // q.shape[1])
        else:
            m = tg.block_id(0)
            if CAUSAL:  # the query blocks seeing the most keys first: the last wave runs short
                m = tg.num_programs(0) - 1 - m
            attend(m, tg.block_id(1), tg.block_id(2))

    return attention_fwd


@lru_cache(maxsize=None)
def attention_varlen_kernel(dtype: DType) -> tg.Kernel:
    """The forward on packed sequences: q (total_q, H, D), k (total_k, H_kv, D), v the same
    or (H_kv, D, total_k) when V_KMAJOR, lse (H, total_q); sequence e's rows run from
    cu_seqlens_*[e] to cu_seqlens_*[e+1]. Grid (cdiv(max_seqlen_q, BM), H, sequences)."""

    @tg.kernel(threads=128)
    def attention_varlen_fwd(q: tg.Tensor[dtype, 3], k: tg.Tensor[dtype, 3],
                             v: tg.Tensor[dtype, 3], o: tg.Tensor[dtype, 3],
                             lse: tg.Tensor[f32, 2], cu_seqlens_q: tg.Tensor[i32, 1],
                             cu_seqlens_k: tg.Tensor[i32, 1],
                             D: tg.constexpr, QK_SCALE: tg.constexpr,
                             CAUSAL: tg.constexpr = False, BM: tg.constexpr = 64,
                             BN: tg.constexpr = 64, STAGES: tg.constexpr = 2,
                             V_KMAJOR: tg.constexpr = False, P_SHARED: tg.constexpr = False,
                             OVERLAP: tg.constexpr = False, REGS: tg.constexpr = 0,
                             FIRST_IN_RING: tg.constexpr = False):
        m, h, e = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        kv_head = h // (q.shape[1] // k.shape[1])
        q0, q1 = cu_seqlens_q[e], cu_seqlens_q[e + 1]
        k0, k1 = cu_seqlens_k[e], cu_seqlens_k[e + 1]
        vv = v[kv_head, :, k0:k1] if V_KMAJOR else v[k0:k1, kv_head, :]
        _attend(q[q0:q1, h, :], k[k0:k1, kv_head, :], vv, o[q0:q1, h, :], lse[h, q0:q1], m,
                dtype, D, QK_SCALE, CAUSAL, BM, BN, STAGES, V_KMAJOR, P_SHARED, OVERLAP, REGS,
                FIRST_IN_RING=FIRST_IN_RING)

    return attention_varlen_fwd


# --------------------------------------------------------------------------------------
# Configuration: tiles per head dim, the dataflow per target
# --------------------------------------------------------------------------------------

def default_tiles(head_dim: int, target: str | None = None) -> dict:
    """The untuned configuration for `head_dim` on `target` (any): BM=BN=64 query and key
    blocks in a two-stage pipeline (with D=256 a 64-row f32 accumulator is already 128
    registers a thread of 128), v as it comes and p in registers — both gemms on wgmma on
    sm_90a, on mma.sync elsewhere."""
    return dict(BM=64, BN=64, STAGES=2, V_KMAJOR=False, P_SHARED=False, OVERLAP=False)


def qk_scale(scale: float | None, head_dim: int) -> float:
    """The factor applied to q·k in the kernel: `scale` (default 1/sqrt(D)) times log2 e,
    since the kernel's softmax is in base 2."""
    return (1.0 / math.sqrt(head_dim) if scale is None else float(scale)) * LOG2E


def check_scale(fn: str, scale: object) -> None:
    """`scale` is None or a finite real number (a bool or NaN is a mistake, not a scale)."""
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"tegula.kernels.{fn}: scale must be a finite number or None "
                         f"(1/sqrt(D)), got {scale!r}")


def check_heads(fn: str, q_shape: tuple, k_shape: tuple, v_shape: tuple, head_dim_axis: int,
                head_axis: int, seq_axis: int) -> int:
    """Shape checks shared by every entry point (the axes of the layout: D, heads, the
    sequence or the packed rows); returns D."""
    d = q_shape[head_dim_axis]
    if d not in HEAD_DIMS:
        raise ValueError(f"tegula.kernels.{fn}: head dim D = {d} (q's last dim, q has shape "
                         f"{q_shape}) is not supported; D must be one of {HEAD_DIMS}")
    if k_shape != v_shape:
        raise ValueError(f"tegula.kernels.{fn}: k and v must have one shape, got k "
                         f"{k_shape} and v {v_shape}")
    lead = [a for a in range(len(q_shape)) if a not in (head_axis, seq_axis, head_dim_axis)]
    if k_shape[head_dim_axis] != d or any(q_shape[a] != k_shape[a] for a in lead):
        raise ValueError(f"tegula.kernels.{fn}: q {q_shape} and k {k_shape} must agree on "
                         f"the batch and head dim (only the sequence length and the number "
                         f"of heads may differ)")
    h, h_kv = q_shape[head_axis], k_shape[head_axis]
    if h_kv == 0 or h % h_kv:
        raise ValueError(f"tegula.kernels.{fn}: k and v have {h_kv} heads, which must "
                         f"divide q's {h} heads (GQA/MQA: query head i reads kv head "
                         f"i // (H // H_kv))")
    return d


# --------------------------------------------------------------------------------------
# numpy entry points (the emulator)
# --------------------------------------------------------------------------------------

def _check_arrays(fn: str, dtype: DType | None, ndim: int, **arrays: np.ndarray) -> DType:
    """Each array numpy of rank `ndim`, all of one dtype: float16 (f16) or float32 holding
    bf16 values (dtype=bf16)."""
    for name, a in arrays.items():
        check_array(fn, name, a, ndim=ndim)
    kinds = {a.dtype for a in arrays.values()}
    if len(kinds) > 1:
        listed = ", ".join(f"{n}: {a.dtype}" for n, a in arrays.items())
        raise TypeError(f"tegula.kernels.{fn}: q, k and v must share one dtype ({listed})")
    kind = kinds.pop()
    dtype = dtype or (f16 if kind == np.float16 else None)
    if dtype not in ATTENTION_DTYPES or (dtype == f16) != (kind == np.float16) or \
            kind not in (np.float16, np.float32):
        raise TypeError(f"tegula.kernels.{fn}: q, k and v must be float16 arrays (f16) or "
                        f"float32 arrays with dtype=tegula.bf16, got {kind} with "
                        f"dtype={dtype}")
    return dtype


def attention_emulated(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False,
                       scale: float | None = None, *, return_lse: bool = False,
                       dtype: DType | None = None, target: str = "sm_90a", **tiles):
    """The forward kernel in the emulator on (B, H, Sq, D) q and (B, H_kv, Sk, D) k, v
    (float16 arrays, or float32 ones holding bf16 values with dtype=tegula.bf16). Returns
    o (B, H, Sq, D), and with `return_lse` also lse (B, H, Sq) float32 (natural log).
    `tiles` override `default_tiles` (BM, BN, STAGES, V_KMAJOR, P_SHARED, threads)."""
    fn = "attention_emulated"
    dtype = _check_arrays(fn, dtype, 4, q=q, k=k, v=v)
    d = check_heads(fn, q.shape, k.shape, v.shape, 3, 1, 2)
    check_scale(fn, scale)
    b, h, sq, _ = q.shape
    constexprs = {**default_tiles(d, target), **tiles}
    if constexprs["V_KMAJOR"]:
        v = keys_last(v, (0, 1, 3, 2))
    o, lse = poisoned(q.shape, dtype), poisoned((b, h, sq), f32)
    if q.size and k.shape[2]:
        grid = (tg.cdiv(sq, constexprs["BM"]), h, b)
        launch_emulated(attention_kernel(dtype), grid, np.ascontiguousarray(q),
                        np.ascontiguousarray(k), np.ascontiguousarray(v), o, lse, D=d,
                        QK_SCALE=qk_scale(scale, d), CAUSAL=bool(causal), target=target,
                        **constexprs)
    else:  # no keys: every row sees nothing
        o[...], lse[...] = 0, -INF
    return (o, lse) if return_lse else o


def attention_varlen_emulated(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                              cu_seqlens_q: np.ndarray, cu_seqlens_k: np.ndarray,
                              max_seqlen_q: int, causal: bool = False,
                              scale: float | None = None, *, return_lse: bool = False,
                              dtype: DType | None = None, target: str = "sm_90a", **tiles):
    """The variable-length forward in the emulator: q (total_q, H, D), k and v (total_k,
    H_kv, D), `cu_seqlens_*` int32 (sequences + 1,) offsets into them (nondecreasing, from
    0; rows past the last offset are never read), `max_seqlen_q` ≥ every query length.
    Returns o (total_q, H, D) — rows of no sequence are left NaN — and with `return_lse`
    lse (H, total_q)."""
    fn = "attention_varlen_emulated"
    dtype = _check_arrays(fn, dtype, 3, q=q, k=k, v=v)
    d = check_heads(fn, q.shape, k.shape, v.shape, 2, 1, 0)
    check_scale(fn, scale)
    starts_q = check_offsets(fn, "cu_seqlens_q", cu_seqlens_q, q.shape[0])
    check_offsets(fn, "cu_seqlens_k", cu_seqlens_k, k.shape[0], len(starts_q))
    lengths = np.diff(starts_q)
    if lengths.size and lengths.max() > max_seqlen_q:
        raise ValueError(f"tegula.kernels.{fn}: max_seqlen_q = {max_seqlen_q} is below the "
                         f"longest query sequence ({lengths.max()})")
    constexprs = {**default_tiles(d, target), **tiles}
    if constexprs["V_KMAJOR"]:
        v = keys_last(v, (1, 2, 0))
    o, lse = poisoned(q.shape, dtype), poisoned((q.shape[1], q.shape[0]), f32)
    if lengths.size and max_seqlen_q > 0:
        grid = (tg.cdiv(max_seqlen_q, constexprs["BM"]), q.shape[1], lengths.size)
        launch_emulated(attention_varlen_kernel(dtype), grid, np.ascontiguousarray(q),
                        np.ascontiguousarray(k), v, o, lse, cu_seqlens_q, cu_seqlens_k,
                        D=d, QK_SCALE=qk_scale(scale, d), CAUSAL=bool(causal),
                        target=target, check_coverage=False, **constexprs)
    return (o, lse) if return_lse else o


def keys_last(v, order: tuple):
    """v (numpy array or torch tensor) with its dims permuted to `order`, the key dim last,
    copied into rows padded to a multiple of 8 elements and returned as a view of the real
    length: the rows' stride is then a multiple of 16 bytes, which TMA needs (an odd key
    count would otherwise drop the V_KMAJOR pipeline to cp.async)."""
    moved = v.transpose(*order) if isinstance(v, np.ndarray) else v.permute(*order)
    keys = moved.shape[-1]
    padded = -(-keys // 8) * 8
    if isinstance(v, np.ndarray):
        out = np.empty(moved.shape[:-1] + (padded,), dtype=v.dtype)
    else:
        out = v.new_empty(tuple(moved.shape[:-1]) + (padded,))
    out[..., :keys] = moved
    return out[..., :keys]


def check_offsets(fn: str, name: str, offsets: object, rows: int,
                  count: int | None = None) -> np.ndarray:
    """`offsets` as an int32 array of (sequences + 1,) nondecreasing offsets from 0 to at
    most `rows` (the packed tensor's length); `count`: the length it must have."""
    a = np.asarray(offsets)
    if a.ndim != 1 or a.size < 1 or a.dtype != np.int32:
        raise ValueError(f"tegula.kernels.{fn}: {name} must be a 1-D int32 array of "
                         f"sequences + 1 offsets, got {a.dtype} of shape {a.shape}")
    if count is not None and a.size != count:
        raise ValueError(f"tegula.kernels.{fn}: {name} has {a.size} offsets, "
                         f"cu_seqlens_q has {count}: one per sequence plus one")
    if a[0] != 0 or np.any(np.diff(a) < 0) or a[-1] > rows:
        raise ValueError(f"tegula.kernels.{fn}: {name} = {a.tolist()} must start at 0, never "
                         f"decrease and end at most at {rows} (the packed rows)")
    return a


# --------------------------------------------------------------------------------------
# torch entry points (CUDA): checks, autotuned configuration, launch
# --------------------------------------------------------------------------------------

_TORCH_DTYPES = {"float16": f16, "bfloat16": bf16}


def _tuner_name() -> str:
    """The autotuner of the attention entry points, registered beside the others once."""
    from tegula.kernels import api
    from tegula.runtime.autotune import Autotuner
    api.TUNERS.setdefault("attention", Autotuner("attention"))
    return "attention"


def _check_torch(fn: str, ndim: int, **tensors) -> DType:
    from tegula.kernels.api import _check_same_dtype, _check_tensor
    dtype = None
    for name, t in tensors.items():
        dtype = _check_tensor(fn, name, t, _TORCH_DTYPES, ndim=ndim)
    _check_same_dtype(fn, tensors)
    return dtype


def _inner_contiguous(t):
    """`t` with unit stride along its last dim (the kernels read rows with vectors) and no
    broadcast dim (an `expand`ed K for MQA: TMA needs positive strides); any other strides
    are specialized on, e.g. a (B, S, H, D) tensor's (B, H, S, D) view."""
    broadcast = any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))
    return t if t.stride(-1) == 1 and not broadcast else t.contiguous()


def _run_tuned(fn: str, kernel, grid, tensors: tuple, v, transpose_v, dims: tuple,
               extra: str, constexprs: dict, head_dim: int, device, boxes: bool = True):
    """Tune (once per shape bucket) and launch `kernel` on `tensors` with v inserted third
    (transposed by `transpose_v` for the V_KMAJOR configurations) on the grid `grid(values)`
    gives for a configuration's constexprs; (the CompiledKernel that ran, its grid, its
    arguments), for the entry point's replay. `dims` (rows, query length, key length)
    buckets the tuner's choice; the key length also picks the candidates
    (`attention_tiles.attention_candidates`). Stated warp roles (REGS) and turns
    (consumers="pingpong") need the stage loads to be TMA boxes: without `boxes` (varlen's
    narrowed views) candidates run without REGS and turns are not timed, and a tensor TMA
    cannot address (alignment, strides) runs such a candidate with synthesis's own roles
    instead of failing."""
    import torch

    from tegula.errors import SynthesisError
    from tegula.kernels.api import _launch, _tune_and_run
    from tegula.runtime.autotune import Config
    wgmma = torch.cuda.get_device_capability(device) >= (9, 0)
    candidates = attention_candidates(head_dim, wgmma, constexprs["CAUSAL"], dims[2])
    if not boxes:  # synthesis's roles and budgets, no turns; the first of equal ones
        stripped = [dict(c, REGS=0) for c in candidates if "consumers" not in c]
        candidates = [c for i, c in enumerate(stripped) if c not in stripped[:i]]
    configs = tuple(Config.of(c) for c in candidates)

    def run(config: Config):
        values = config.kwargs
        operand = transpose_v(v) if values["V_KMAJOR"] else v
        args = tensors[:2] + (operand,) + tensors[2:]
        try:
            launched = _launch(kernel, grid(values), args, dict(values, **constexprs),
                               config.threads)
        except SynthesisError:
            if not values.get("REGS") and "consumers" not in values:
                raise
            values = {k: x for k, x in values.items() if k != "consumers"} | dict(REGS=0)
            launched = _launch(kernel, grid(values), args, dict(values, **constexprs),
                               config.threads)
        return launched, grid(values), args

    return _tune_and_run(_tuner_name(), device.index, configs, dims, f"{fn}/{extra}", run)


def forward_grid(values: dict, sq: int, h: int, b: int, device) -> tuple:
    """`attention_kernel`'s grid for a configuration's constexprs `values`: a block per
    query tile, or with PERSISTENT one an SM of `device` (fewer when there are fewer
    tiles)."""
    tiles = (-(-sq // values["BM"]), h, b)
    if not values.get("PERSISTENT"):
        return tiles
    import torch
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return (min(tiles[0] * h * b, sms),)


def attention_forward(q, k, v, causal: bool = False, scale: float | None = None):
    """FlashAttention forward on CUDA tensors: q (B, H, Sq, D), k and v (B, H_kv, Sk, D),
    f16 or bf16, D in (64, 128, 256), H_kv dividing H. Returns (o, lse): o (B, H, Sq, D)
    in q's dtype and lse (B, H, Sq) f32, the natural-log log-sum-exp of each row's scaled
    scores (what the backward needs). `causal` is aligned bottom-right (query i sees keys
    j <= i + Sk - Sq; see the module docstring: torch SDPA's is_causal is top-left)."""
    import torch

    from tegula.kernels import api
    from tegula.kernels.api import _check_cuda
    # A later call with this one's replay key replays its launch into fresh outputs
    # (tegula.kernels.api.plan_replay; a V_KMAJOR configuration's transposed copy of v
    # keeps the full path).
    replayed, found = api._replay_plan((q, k, v), "attention_forward", type(causal), causal,
                                       type(scale), scale)
    if replayed:
        return found
    fn = "attention"
    dtype = _check_torch(fn, 4, q=q, k=k, v=v)
    d = check_heads(fn, tuple(q.shape), tuple(k.shape), tuple(v.shape), 3, 1, 2)
    check_scale(fn, scale)
    _check_cuda(fn, {"q": q, "k": k, "v": v})
    b, h, sq, _ = q.shape
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return o, lse
    if k.shape[2] == 0:  # no keys: every row sees nothing
        return o.zero_(), lse.fill_(-INF)
    inputs = (q, k, v)
    q, k, v = _inner_contiguous(q), _inner_contiguous(k), _inner_contiguous(v)
    constexprs = dict(D=d, QK_SCALE=qk_scale(scale, d), CAUSAL=bool(causal))
    launched = _run_tuned(fn, attention_kernel(dtype),
                          lambda values: forward_grid(values, sq, h, b, q.device),
                          (q, k, o, lse), v, lambda t: keys_last(t, (0, 1, 3, 2)),
                          (b * h, sq, k.shape[2]),
                          f"{dtype}/D{d}/{'causal' if causal else 'full'}", constexprs, d,
                          q.device)
    replay = found is not None and api.plan_replay([launched], inputs, (o, lse), tuple)
    if replay:
        api._remember(found, replay)
    return o, lse


def attention(q, k, v, causal: bool = False, scale: float | None = None):
    """`attention_forward(q, k, v, causal, scale)`'s output o alone (see there),
    differentiable: when q, k or v require grad, `o.backward()` runs the deterministic
    backward kernels (`tegula.kernels.attention_backward`)."""
    from tegula.kernels.attention_backward import attention_differentiable
    _check_torch("attention", 4, q=q, k=k, v=v)  # named before autograd looks at them
    return attention_differentiable(q, k, v, causal, scale)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                     max_seqlen_k: int | None = None, causal: bool = False,
                     scale: float | None = None, return_lse: bool = False):
    """The forward on packed variable-length sequences (flash-attn's varlen layout): q
    (total_q, H, D), k and v (total_k, H_kv, D) on one CUDA device, `cu_seqlens_q/_k`
    int32 CUDA tensors of sequences + 1 offsets (from 0, nondecreasing, at most the packed
    length: not checked, as that would read them back to the host; rows past the packed
    length are never read), `max_seqlen_q` ≥ every query length (it sizes the grid).
    Returns o (total_q, H, D) — rows belonging to no sequence are left unwritten — and
    with `return_lse` also lse (H, total_q) f32. `max_seqlen_k` is accepted for flash-attn
    compatibility and only buckets the autotuner's choice."""
    import torch

    from tegula.kernels.api import _check_cuda, _check_tensor
    fn = "attention_varlen"
    dtype = _check_torch(fn, 3, q=q, k=k, v=v)
    d = check_heads(fn, tuple(q.shape), tuple(k.shape), tuple(v.shape), 2, 1, 0)
    check_scale(fn, scale)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _check_tensor(fn, name, t, {"int32": i32}, ndim=1)
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.shape[0] < 1:
        raise ValueError(f"tegula.kernels.{fn}: cu_seqlens_q {tuple(cu_seqlens_q.shape)} and "
                         f"cu_seqlens_k {tuple(cu_seqlens_k.shape)} must both hold sequences "
                         f"+ 1 offsets")
    if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        raise ValueError(f"tegula.kernels.{fn}: max_seqlen_q must be a non-negative int, got "
                         f"{max_seqlen_q!r}")
    _check_cuda(fn, {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q,
                     "cu_seqlens_k": cu_seqlens_k})
    total_q, h, _ = q.shape
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((h, total_q), dtype=torch.float32, device=q.device)
    sequences = cu_seqlens_q.shape[0] - 1
    if sequences and max_seqlen_q and total_q:
        q, k, v = _inner_contiguous(q), _inner_contiguous(k), _inner_contiguous(v)
        constexprs = dict(D=d, QK_SCALE=qk_scale(scale, d), CAUSAL=bool(causal))
        tensors = (q, k, o, lse, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous())
        _run_tuned(fn, attention_varlen_kernel(dtype),
                   lambda values: (-(-max_seqlen_q // values["BM"]), h, sequences), tensors, v,
                   lambda t: keys_last(t, (1, 2, 0)),
                   (total_q, max_seqlen_q, max_seqlen_k or max_seqlen_q),
                   f"{dtype}/D{d}/{'causal' if causal else 'full'}", constexprs, d, q.device,
                   boxes=False)
    return (o, lse) if return_lse else o


__all__ = ["attention_kernel", "attention_varlen_kernel", "attention_emulated",
           "attention_varlen_emulated", "attention_forward", "attention", "attention_varlen",
           "attention_candidates", "default_tiles", "qk_scale", "check_heads", "check_scale",
           "check_offsets", "ATTENTION_DTYPES", "HEAD_DIMS", "LOG2E"]
