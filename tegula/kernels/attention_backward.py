"""Attention backward (FlashAttention-2 style, deterministic): dQ, dK, dV of
`o = softmax(scale · q @ k.T + mask) @ v` from the forward's output `o` and its natural-log
log-sum-exp `lse` (B, H, Sq) f32.

Tensors are (B, H, S, D) as torch SDPA; k and v may have fewer heads (GQA/MQA: query head
h reads kv head h // G, G = H / Hkv). Causal masks are aligned bottom-right as in
FlashAttention (query i sees keys j ≤ i + Sk − Sq), so a query row may see no key at all;
the forward gives such a row o = 0, and every gradient through it is 0 here.

Three kernels, none with atomics, so every result is the same bit for bit on every run
(the default):

* `attention_backward_preprocess_kernel` — delta_i = Σ_d dO[i, d] · O[i, d] (f32), the
  row term of softmax's Jacobian (Σ_j P_ij dP_ij = delta_i).
* `attention_backward_dkdv_kernel` — one program per (key block, kv head, batch): keeps a
  (BN, D) block of K and V in shared memory and walks the query blocks of the G query heads
  sharing that kv head, in a fixed order, recomputing Pᵀ = exp(scale · K Qᵀ − lse) from the
  saved lse (no second softmax), with
      dV += Pᵀ dO,   dPᵀ = V dOᵀ,   dSᵀ = Pᵀ ∘ (dPᵀ − delta),   dK += scale · dSᵀ Q.
  Working in the transposed (key, query) orientation makes each product a plain
  `tg.gemm(c, a, b)` (c += a @ b.T) whose b operand is a `.T` view of a shared tile (on
  sm_90a an MN-major wgmma operand, so every product of both kernels is a wgmma): the
  GQA sum over query heads happens in the accumulator, in order — deterministic.
* `attention_backward_dq_kernel` — one program per (query block, head, batch), walking the
  key blocks: S = scale · Q Kᵀ, P = exp(S − lse), dP = dO Vᵀ, dS = P ∘ (dP − delta),
  dQ += scale · dS K. Recomputes S a second time rather than adding dQ with float atomics.

With `deterministic=False` (an option; FlashAttention's default, and cuDNN's backward gave
different bits on a second run too, H100 session 13) the dK/dV kernel also adds each query
block's dS K into an f32 dQ (`tg.atomic_add`: TMA reduce-adds on sm_90, `red.global.add`
before; `attention_backward_dkdvdq_kernel`: dS goes to shared memory first, where dQ's
product reads it as the wgmma's MN-major A operand and dK's as its A; dQ's is issued
first, so the two products run back to back and dQ's wait leaves dK's in flight) and
`attention_backward_dq_convert_kernel` scales and converts it: 5 gemm passes instead of 7,
but the additions' order, so dQ's last bits, vary from run to run. Measured no faster than
the deterministic kernels (sessions 13 and 14: 3.32 ms against 3.33 at 4x16x4096, D = 128;
the L2 reduce-adds cost ~1% of it, `atomic_dq_candidates`).

Forms the tuner times (`backward_candidates`): 64 x 64 blocks in one role, or (`REGS`)
the roles stated, two consumer warpgroups of 240 registers beside a 24-register TMA
producer, with `EARLY_DP` issuing dP's product beside the first one so the deferred wgmma
waits let the exponentials run while it computes.

Masks come from tile coordinates: keys past Sk, queries past Sq and (causal) keys after
the query's diagonal get P = 0 (selected, so a fully masked row's lse of ±inf never turns
into a NaN). Causal programs also skip the blocks that are masked entirely.
"""
from __future__ import annotations

import contextlib
import math
from functools import lru_cache

import numpy as np

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, bf16, f16
from tegula.kernels.attention import LOG2E
from tegula.kernels.common import launch_emulated, poisoned

ATTENTION_BACKWARD_DTYPES = (f16, bf16)


@lru_cache(maxsize=None)
def attention_backward_preprocess_kernel(dtype: DType) -> tg.Kernel:
    """delta[b, h, i] = Σ_d do[b, h, i, d] · o[b, h, i, d], accumulated in f32."""

    @tg.kernel(threads=128)
    def attention_backward_preprocess(o: tg.Tensor[dtype, 4], dout: tg.Tensor[dtype, 4],
                                      delta: tg.Tensor[f32, 3],
                                      D: tg.constexpr, BM: tg.constexpr = 64):
        m, h, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        o_rows = tg.load(o[b, h].tile((BM, D), (m, 0))).to(f32)
        do_rows = tg.load(dout[b, h].tile((BM, D), (m, 0))).to(f32)
        tg.copy(tg.sum(o_rows * do_rows, 1)[:, 0], delta[b, h].tile((BM,), (m,)))

    return attention_backward_preprocess


def _key_block_gradients(q, k, v, dout, lse, delta, dq_accum, n, hk, b, dtype: DType,
                         D: int, SCALE: float, CAUSAL: bool, G: int, BM: int, BN: int,
                         STAGES: int, EARLY_DP: bool = False, REGS: int = 0,
                         add_dq=tg.atomic_add, STAGGER: bool = False,
                         LATE_DELTA: bool = False, MASK_BRANCH: bool = False):
    """The dK/dV kernels' body (traced inline): (dk_acc, dv_acc), the f32 sums over the G
    query heads of kv head `hk` for key block `n`, dK not yet scaled. With `dq_accum` (an
    f32 (B, H, Sq, D) tensor of zeros) it also adds each query block's dS K into it with
    float atomics (`attention_backward_dkdvdq_kernel`; `add_dq(part, tile)` does the
    adding: a benchmark's ablation stores instead). `EARLY_DP`: V dOᵀ is issued right
    after K Qᵀ, before the exponentials (which run while it computes where the wgmma waits
    are deferred: in a warp-specialized consumer). `REGS` > 0: the kernel states its warp
    roles, a producer warpgroup of 24 registers a thread issuing the Q and dO boxes and the
    consumers at REGS (synthesis would give 40 / 232). `STAGGER`: key block n walks its
    query blocks from its n-th on (cyclically), so the blocks running at once add their dQ
    shares into different rows rather than all into the same ones (a fixed order per
    program: dK and dV stay deterministic). `LATE_DELTA`: delta is loaded after the
    exponentials, not with lse before the block's first product, so its 16 registers a
    thread are not live at the exponentials' peak (the stated-roles atomic kernel at D =
    128: ptxas then no longer serializes every wgmma, C7512). `MASK_BRANCH`: the mask
    only on blocks holding a key past Sk, a query past Sq or (causal) a pair past the
    diagonal (`_masked_probabilities`)."""
    seq_q, seq_k = q.shape[2], k.shape[2]
    sk, sv = tg.shared((BN, D), dtype), tg.shared((BN, D), dtype)
    tg.copy(k[b, hk].tile((BN, D), (n, 0)), sk)
    tg.copy(v[b, hk].tile((BN, D), (n, 0)), sv)
    sq = tg.shared((BM, D), dtype, stages=STAGES)
    sdo = tg.shared((BM, D), dtype, stages=STAGES)
    sds = tg.shared((BN, BM), dtype) if dq_accum is not None else None
    keys = tg.arange(BN, offset=n * BN)[:, None]            # (BN, 1) key positions
    dk_acc, dv_acc = tg.zeros((BN, D), f32), tg.zeros((BN, D), f32)
    first = 0
    if CAUSAL:  # the first query block whose last row reaches this block's first key
        first = tg.maximum(n * BN - (seq_k - seq_q), 0) // BM
    producer, consumer = _role_blocks(REGS)
    # Warp roles are the cost model's choice (`synth/cost_roles.py`) unless REGS states
    # them: 64x64 blocks on 128 threads keep one role, the block issuing its TMA ring (a
    # producer warpgroup measured 1.17-1.73x slower: two blocks per SM in one role, one
    # specialized, and four dependent gemms an iteration); 256-thread blocks, one per SM
    # either way, get the producer (0.89-0.96x). One pipeline over (head, block) pairs was
    # slower (session 9: 230 TFLOP/s with the block issuing the ring, 163 with a producer
    # warpgroup at 255 registers, against 359 for this form).
    # With stated roles and one query head a kv head, no loop over the heads: a ring nested
    # in another loop keeps the consumers cooperative (no ping-pong turns).
    for g in (range(1) if REGS and G == 1 else tg.range(G)):
        h = hk * G + g
        q_blocks = q[b, h].tile((BM, D), (None, 0))
        do_blocks = dout[b, h].tile((BM, D), (None, 0))
        for i in tg.pipeline(first, q_blocks.shape[2], stages=STAGES):
            m = i   # the query block of iteration i (stage i of the ring holds it)
            if STAGGER:
                m = first + (i - first + n) % tg.maximum(q_blocks.shape[2] - first, 1)
            with producer():
                tg.copy(q_blocks[:, :, m], sq[i])
                tg.copy(do_blocks[:, :, m], sdo[i])
            with consumer():
                queries = tg.arange(BM, offset=m * BM)[None, :]  # (1, BM) query positions
                # log2 units: exp(s·scale − lse) = exp2(s·(scale·log2 e) − lse·log2 e), one
                # FMA per score
                lse_m = tg.load(lse[b, h].tile((BM,), (m,)))[None, :] * LOG2E
                def delta_m(h=h, m=m):
                    return tg.load(delta[b, h].tile((BM,), (m,)))[None, :]

                def seen(keys=keys, queries=queries):  # traced after K Qᵀ: fewer live
                    visible = (keys < seq_k) & (queries < seq_q)
                    if CAUSAL:
                        visible = visible & (keys <= queries + (seq_k - seq_q))
                    return visible
                needs_mask = _block_needs_mask(n, m, BN, BM, seq_k, seq_q, CAUSAL) \
                    if MASK_BRANCH else None
                dq_part = _query_block_products(sk, sv, sq[i], sdo[i], seen, lse_m,
                                                delta_m, dk_acc, dv_acc, dtype, SCALE,
                                                EARLY_DP, sds, LATE_DELTA, needs_mask)
                if dq_accum is not None:                     # dQ += dS K, atomically
                    add_dq(dq_part, dq_accum[b, h].tile((BM, D), (m, 0)))
    return dk_acc, dv_acc


def _block_needs_mask(n, m, BN: int, BM: int, seq_k, seq_q, CAUSAL: bool):
    """Whether key block n and query block m hold a key past Sk, a query past Sq or
    (causal) a pair past the diagonal: one comparison, on the largest overshoot."""
    over = tg.maximum((n + 1) * BN - seq_k, (m + 1) * BM - seq_q)
    if CAUSAL:
        over = tg.maximum(over, (n + 1) * BN - 1 - m * BM - (seq_k - seq_q))
    return over > 0


#: The producer warpgroup's registers a thread where the kernels state their roles
#: (`REGS`): it only issues TMA boxes (FlashAttention-3 gives it 24).
PRODUCER_REGS = 24


def _role_blocks(regs: int):
    """(producer, consumer) context managers for a pipeline body: with `regs` > 0 the
    warp roles stated (`tg.producer` / `tg.consumer`, sm_90a), PRODUCER_REGS and `regs`
    registers a thread; 0 leaves the roles to synthesis."""
    if not regs:
        return contextlib.nullcontext, contextlib.nullcontext
    return (lambda: tg.producer(regs=PRODUCER_REGS)), (lambda: tg.consumer(regs=regs))


def _query_block_products(sk, sv, sq_m, sdo_m, seen, lse_m, delta_of, dk_acc, dv_acc,
                          dtype: DType, SCALE: float, EARLY_DP: bool, sds=None,
                          LATE_DELTA: bool = False, needs_mask=None):
    """One query block's share of key block's dK, dV (added into the accumulators), in the
    transposed (key, query) orientation; `seen()` traces the (BN, BM) mask of visible
    (key, query) pairs:
        Pᵀ = exp2(K Qᵀ · scale·log2 e − lse·log2 e) where seen, else 0
        dV += Pᵀ dO,   dPᵀ = V dOᵀ,   dSᵀ = Pᵀ ∘ (dPᵀ − delta),   dK += dSᵀ Q.
    With `sds` (a (BN, BM) shared tile: the atomic-dQ kernel) dSᵀ is stored there before
    either product that reads it, and the block's (BM, D) f32 share of dQ, dS K, is
    returned (issued before dK's product: the first to be waited for); else None.
    `delta_of()` loads the block's delta, first or (`LATE_DELTA`) after the exponentials.
    `needs_mask` (a scalar comparison): the mask behind a branch (`_masked_probabilities`)."""
    delta_m = None if LATE_DELTA else delta_of()
    rows, cols = sk.shape[0], sq_m.shape[0]
    s_t = tg.zeros((rows, cols), f32)
    tg.gemm(s_t, sk, sq_m)                                   # K Qᵀ
    if EARLY_DP:
        dp_t = tg.zeros((rows, cols), f32)
        tg.gemm(dp_t, sv, sdo_m)                             # V dOᵀ
    if needs_mask is None:
        p_t = tg.where(seen(), tg.exp2(s_t * (SCALE * LOG2E) - lse_m), 0.0)
    else:
        p_t = _masked_probabilities(s_t, seen, needs_mask, lse_m, SCALE)
    if LATE_DELTA:
        delta_m = delta_of()
    tg.gemm(dv_acc, p_t.to(dtype), sdo_m.T)                  # += Pᵀ dO
    if not EARLY_DP:
        dp_t = tg.zeros((rows, cols), f32)
        tg.gemm(dp_t, sv, sdo_m)                             # V dOᵀ
    ds_t = (p_t * (dp_t - delta_m)).to(dtype)
    if sds is None:
        tg.gemm(dk_acc, ds_t, sq_m.T)                        # += dSᵀ Q
        return None
    tg.copy(ds_t, sds)
    dq_part = tg.zeros((cols, sk.shape[1]), f32)
    tg.gemm(dq_part, sds.T, sk.T)                            # dS K
    tg.gemm(dk_acc, sds, sq_m.T)                             # += dSᵀ Q
    return dq_part


@lru_cache(maxsize=None)
def attention_backward_dkdv_kernel(dtype: DType) -> tg.Kernel:
    """dK, dV of one (BN, D) key block of kv head `hk`, summed over its G query heads.
    `MASK_BRANCH`: the mask only where a block needs it (`_key_block_gradients`)."""

    @tg.kernel(threads=128)
    def attention_backward_dkdv(q: tg.Tensor[dtype, 4], k: tg.Tensor[dtype, 4],
                                v: tg.Tensor[dtype, 4], dout: tg.Tensor[dtype, 4],
                                lse: tg.Tensor[f32, 3], delta: tg.Tensor[f32, 3],
                                dk: tg.Tensor[dtype, 4], dv: tg.Tensor[dtype, 4],
                                D: tg.constexpr, SCALE: tg.constexpr, CAUSAL: tg.constexpr,
                                G: tg.constexpr = 1, BM: tg.constexpr = 64,
                                BN: tg.constexpr = 64, STAGES: tg.constexpr = 2,
                                EARLY_DP: tg.constexpr = False, REGS: tg.constexpr = 0,
                                MASK_BRANCH: tg.constexpr = False):
        n, hk, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        dk_acc, dv_acc = _key_block_gradients(q, k, v, dout, lse, delta, None, n, hk, b,
                                              dtype, D, SCALE, CAUSAL, G, BM, BN, STAGES,
                                              EARLY_DP, REGS, MASK_BRANCH=MASK_BRANCH)
        tg.copy((dk_acc * SCALE).to(dtype), dk[b, hk].tile((BN, D), (n, 0)))
        tg.copy(dv_acc.to(dtype), dv[b, hk].tile((BN, D), (n, 0)))

    return attention_backward_dkdv


@lru_cache(maxsize=None)
def attention_backward_dkdvdq_kernel(dtype: DType) -> tg.Kernel:
    """The dK/dV kernel that also adds each block's dS K into `dq_accum` (f32, zeros before)
    with float atomics: the backward without the dQ kernel's second pass over S and dP
    (5 gemms instead of 7), at the price of an order of the additions that varies.
    `STAGGER`: each key block starts its walk over the query blocks at its own;
    `LATE_DELTA`: delta loaded after the exponentials (`_key_block_gradients`)."""

    @tg.kernel(threads=128)
    def attention_backward_dkdvdq(q: tg.Tensor[dtype, 4], k: tg.Tensor[dtype, 4],
                                  v: tg.Tensor[dtype, 4], dout: tg.Tensor[dtype, 4],
                                  lse: tg.Tensor[f32, 3], delta: tg.Tensor[f32, 3],
                                  dk: tg.Tensor[dtype, 4], dv: tg.Tensor[dtype, 4],
                                  dq_accum: tg.Tensor[f32, 4],
                                  D: tg.constexpr, SCALE: tg.constexpr, CAUSAL: tg.constexpr,
                                  G: tg.constexpr = 1, BM: tg.constexpr = 64,
                                  BN: tg.constexpr = 64, STAGES: tg.constexpr = 2,
                                  EARLY_DP: tg.constexpr = False, REGS: tg.constexpr = 0,
                                  STAGGER: tg.constexpr = False,
                                  LATE_DELTA: tg.constexpr = False,
                                  MASK_BRANCH: tg.constexpr = False):
        n, hk, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        dk_acc, dv_acc = _key_block_gradients(q, k, v, dout, lse, delta, dq_accum, n, hk, b,
                                              dtype, D, SCALE, CAUSAL, G, BM, BN, STAGES,
                                              EARLY_DP, REGS, STAGGER=STAGGER,
                                              LATE_DELTA=LATE_DELTA, MASK_BRANCH=MASK_BRANCH)
        tg.copy((dk_acc * SCALE).to(dtype), dk[b, hk].tile((BN, D), (n, 0)))
        tg.copy(dv_acc.to(dtype), dv[b, hk].tile((BN, D), (n, 0)))

    return attention_backward_dkdvdq


@lru_cache(maxsize=None)
def attention_backward_dq_convert_kernel(dtype: DType) -> tg.Kernel:
    """dq = (dq_accum · SCALE) in `dtype`, one (BM, D) block of rows per program."""

    @tg.kernel(threads=128)
    def attention_backward_dq_convert(dq_accum: tg.Tensor[f32, 4], dq: tg.Tensor[dtype, 4],
                                      D: tg.constexpr, SCALE: tg.constexpr,
                                      BM: tg.constexpr = 64):
        m, h, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        rows = tg.load(dq_accum[b, h].tile((BM, D), (m, 0)))
        tg.copy((rows * SCALE).to(dtype), dq[b, h].tile((BM, D), (m, 0)))

    return attention_backward_dq_convert


@lru_cache(maxsize=None)
def attention_backward_dq_kernel(dtype: DType) -> tg.Kernel:
    """dQ of one (BM, D) query block of head `h`, walking the key blocks in order.
    `EARLY_DP`, `REGS`: as the dK/dV kernel's (`_key_block_gradients`). `MASK_BRANCH`:
    the exponentials behind a branch on whether the key block needs the mask at all
    (`_masked_probabilities`)."""

    @tg.kernel(threads=128)
    def attention_backward_dq(q: tg.Tensor[dtype, 4], k: tg.Tensor[dtype, 4],
                              v: tg.Tensor[dtype, 4], dout: tg.Tensor[dtype, 4],
                              lse: tg.Tensor[f32, 3], delta: tg.Tensor[f32, 3],
                              dq: tg.Tensor[dtype, 4],
                              D: tg.constexpr, SCALE: tg.constexpr, CAUSAL: tg.constexpr,
                              G: tg.constexpr = 1, BM: tg.constexpr = 64,
                              BN: tg.constexpr = 64, STAGES: tg.constexpr = 2,
                              EARLY_DP: tg.constexpr = False, REGS: tg.constexpr = 0,
                              MASK_BRANCH: tg.constexpr = False):
        m, h, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        hk = h // G
        seq_q, seq_k = q.shape[2], k.shape[2]
        sq, sdo = tg.shared((BM, D), dtype), tg.shared((BM, D), dtype)
        tg.copy(q[b, h].tile((BM, D), (m, 0)), sq)
        tg.copy(dout[b, h].tile((BM, D), (m, 0)), sdo)
        sk = tg.shared((BN, D), dtype, stages=STAGES)
        sv = tg.shared((BN, D), dtype, stages=STAGES)
        k_blocks = k[b, hk].tile((BN, D), (None, 0))
        v_blocks = v[b, hk].tile((BN, D), (None, 0))
        queries = tg.arange(BM, offset=m * BM)[:, None]         # (BM, 1)
        lse_m = tg.load(lse[b, h].tile((BM,), (m,)))[:, None] * LOG2E  # log2 units
        delta_m = tg.load(delta[b, h].tile((BM,), (m,)))[:, None]
        dq_acc = tg.zeros((BM, D), f32)
        stop = k_blocks.shape[2]
        if CAUSAL:  # key blocks past the block's last row's diagonal are masked entirely
            last_key = m * BM + BM - 1 + (seq_k - seq_q)
            stop = tg.minimum(stop, tg.maximum(last_key, -1) // BN + 1)
        producer, consumer = _role_blocks(REGS)
        for n in tg.pipeline(stop, stages=STAGES):
            with producer():
                tg.copy(k_blocks[:, :, n], sk[n])
                tg.copy(v_blocks[:, :, n], sv[n])
            with consumer():
                keys = tg.arange(BN, offset=n * BN)[None, :]     # (1, BN)
                s = tg.zeros((BM, BN), f32)
                tg.gemm(s, sq, sk[n])                            # Q Kᵀ
                if EARLY_DP:  # before the exponentials (see _key_block_gradients)
                    dp = tg.zeros((BM, BN), f32)
                    tg.gemm(dp, sdo, sv[n])                      # dO Vᵀ
                def seen(keys=keys):
                    visible = (keys < seq_k) & (queries < seq_q)
                    if CAUSAL:
                        visible = visible & (keys <= queries + (seq_k - seq_q))
                    return visible
                if MASK_BRANCH:
                    # the first row's last visible key (causal), or the last key
                    visible_to = m * BM + (seq_k - seq_q) if CAUSAL else seq_k - 1
                    p = _masked_probabilities(s, seen, (n + 1) * BN - 1 > visible_to,
                                              lse_m, SCALE)
                else:
                    p = tg.where(seen(), tg.exp2(s * (SCALE * LOG2E) - lse_m), 0.0)  # 1 FMA
                if not EARLY_DP:
                    dp = tg.zeros((BM, BN), f32)
                    tg.gemm(dp, sdo, sv[n])                      # dO Vᵀ
                ds = p * (dp - delta_m)
                tg.gemm(dq_acc, ds.to(dtype), sk[n].T)           # += dS K
        tg.copy((dq_acc * SCALE).to(dtype), dq[b, h].tile((BM, D), (m, 0)))

    return attention_backward_dq


def _masked_probabilities(s, seen, needs_mask, lse_m, SCALE: float):
    """P = exp2(S · scale·log2 e − lse·log2 e), 0 where not `seen()` (traced on the
    masked path only), written into `s`'s registers (returned) on one of two paths: the
    mask only where `needs_mask` (a scalar comparison: the block reaches past a limit,
    `needs_mask` false means every pair it computes is seen). Besides sparing the
    interior blocks the compares and selects, the branch's join keeps ptxas from moving a
    later wgmma wait (dP's, issued with S) above the exponentials: it places its
    `WARPGROUP.DEPBAR` anywhere in a basic block, never across one (the attention
    forward's overlapped loop does the same). Rows past Sq (never stored; a row's dQ reads
    only its own dS) go unmasked on the interior path."""
    with tg.if_(needs_mask):
        s.assign(tg.where(seen(), tg.exp2(s * (SCALE * LOG2E) - lse_m), 0.0))
    with tg.else_():
        s.assign(tg.exp2(s * (SCALE * LOG2E) - lse_m))
    return s


# --------------------------------------------------------------------------------------
# Shapes, checks and configuration shared by the numpy and torch entry points
# --------------------------------------------------------------------------------------

HEAD_DIMS = (32, 64, 128, 256)  # D = 16 leaves a 16 x 16 tile for 4 warps


def check_backward_shapes(fn: str, q, k, v, o, lse, do) -> tuple[int, int, int, int, int, int]:
    """(B, H, Hkv, Sq, Sk, D) after checking the arguments' ranks and shapes against q's;
    a ValueError naming the argument otherwise (numpy arrays and torch tensors alike)."""
    shapes = {name: tuple(x.shape) for name, x in
              dict(q=q, k=k, v=v, o=o, lse=lse, do=do).items()}
    for name, shape in shapes.items():
        want = 3 if name == "lse" else 4
        if len(shape) != want:
            raise ValueError(f"tegula.kernels.{fn}: {name} must be {want}-D "
                             f"({'B, H, Sq' if want == 3 else 'B, H, S, D'}), got shape {shape}")
    B, H, Sq, D = shapes["q"]
    _, Hkv, Sk, _ = shapes["k"]
    if shapes["k"][0] != B or shapes["k"][3] != D:
        raise ValueError(f"tegula.kernels.{fn}: k has shape {shapes['k']}, which does not match "
                         f"q {shapes['q']} in batch or head dim")
    if shapes["v"] != shapes["k"]:
        raise ValueError(f"tegula.kernels.{fn}: v has shape {shapes['v']}, k {shapes['k']}; "
                         f"they must match")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"tegula.kernels.{fn}: q has {H} heads, k and v {Hkv}; the query heads "
                         f"must be a multiple of the kv heads (GQA)")
    for name in ("o", "do"):
        if shapes[name] != shapes["q"]:
            raise ValueError(f"tegula.kernels.{fn}: {name} has shape {shapes[name]}, q "
                             f"{shapes['q']}; they must match")
    if shapes["lse"] != (B, H, Sq):
        raise ValueError(f"tegula.kernels.{fn}: lse has shape {shapes['lse']}; expected "
                         f"{(B, H, Sq)} (B, H, Sq of q)")
    if D not in HEAD_DIMS:
        raise ValueError(f"tegula.kernels.{fn}: head dim {D} is not supported; supported: "
                         f"{', '.join(map(str, HEAD_DIMS))}")
    return B, H, Hkv, Sq, Sk, D


def default_scale(scale: float | None, head_dim: int, fn: str = "attention") -> float:
    """The softmax scale: 1/sqrt(D) as in torch SDPA unless given (as a Python float, the
    value the kernels are compiled with); a bool, NaN or infinity is refused."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
            not math.isfinite(scale):
        raise ValueError(f"tegula.kernels.{fn}: scale must be a finite number or None "
                         f"(1/sqrt(D)), got {scale!r}")
    return float(scale)


def backward_tiles(head_dim: int, seq_q: int, seq_k: int, **tiles: int) -> dict:
    """BM, BN for the backward: 64 × 64 (32 rows at D = 256, to keep the K, V, Q and dO
    tiles and the f32 dK/dV accumulators within one block's registers and shared memory),
    shrunk to the (power-of-two rounded) sequence lengths when those are shorter, to no
    less than 16 × 32 (a 16 × 16 score tile has two MMA fragments for four warps)."""
    base = 32 if head_dim > 128 else 64
    bm = min(base, max(16, 1 << max(0, seq_q - 1).bit_length()))
    bn = min(base, max(32, 1 << max(0, seq_k - 1).bit_length()))
    return {"BM": bm, "BN": bn, **tiles}


def backward_candidates(head_dim: int, kernel: str = "dkdv") -> list[dict]:
    """Configurations of the dK/dV (`kernel="dkdv"`) or dQ (`"dq"`) kernel the torch entry
    point times per shape bucket (each kernel tuned on its own; the first runs where
    nothing is timed, on any target). On sm_90a blocks of 64 rows and columns put every
    gemm of both kernels on wgmma (the transposed products read MN-major); ptxas
    (2026-11-24): no spills at D = 128 with 128 threads (on mma.sync that dK/dV kernel
    spilled ~430 B a thread) nor at D = 256 with 256 threads (128 threads spill 2 KB
    there). `_STATED` (sm_90a): two consumer warpgroups of 240 registers beside a
    24-register producer, dP issued before the exponentials, the consumers' wgmma waits
    deferred: dK/dV 64 x 128, dQ 128 x 128 (239 / 218 registers, no spill at D = 128)
    measured 2.01 / 1.35 ms against 64 x 64's 2.21 / 1.52 at 4x16x4096, D = 128 (H100,
    session 13 round 1, `benchmarks/attention_backward.py` det-ws). The dQ kernel's
    128 x 128 also with MASK_BRANCH (session 14 round 1: 1.296 / 0.781 ms against 1.328 /
    0.794, D = 128 full / causal), and dK/dV's 64 x 128 with MASK_BRANCH (round 2, both
    masks behind branches: dK/dV 1.988 / dQ 1.298 ms against 2.079 / 1.365, D = 128 full,
    the first checked element by element on the GPU at that shape only, and emulated at
    odd causal shapes). Narrower blocks (32 rows: mma.sync) stay for the tuner to compare,
    and on targets without wgmma."""
    if kernel not in ("dkdv", "dq"):
        raise ValueError(f"backward_candidates: kernel must be 'dkdv' or 'dq', got {kernel!r}")
    if head_dim > 128:
        return [dict(BM=64, BN=64, threads=256), dict(BM=32, BN=32), dict(BM=16, BN=32),
                dict(BM=32, BN=64, threads=256)]
    if kernel == "dkdv":
        stated = [dict(_STATED, BM=64, BN=128), dict(_STATED, BM=64, BN=128, STAGES=3),
                  dict(_STATED, BM=64, BN=128, MASK_BRANCH=True)]
        wide = [dict(BM=64, BN=128, threads=256)] + \
            ([dict(BM=128, BN=64, threads=256)] if head_dim <= 64 else [])
    else:
        stated = [dict(_STATED, BM=128, BN=128), dict(_STATED, BM=128, BN=64),
                  dict(_STATED, BM=128, BN=128, MASK_BRANCH=True)]
        wide = [dict(BM=128, BN=64, threads=256)] + \
            ([dict(BM=64, BN=128, threads=256)] if head_dim <= 64 else [])
    narrow = [dict(BM=64, BN=32)] if head_dim > 64 else []
    return [dict(BM=64, BN=64)] + stated + wide + narrow


#: The stated-roles form of the backward's kernels (`_key_block_gradients`): two consumer
#: warpgroups at 240 registers, dP issued with the first product.
_STATED = dict(threads=256, REGS=240, EARLY_DP=True)


def atomic_dq_candidates(head_dim: int) -> list[dict]:
    """Configurations of the dK/dV kernel that adds dQ by TMA reduce-adds
    (`deterministic=False`) the torch entry point times per shape bucket (the first runs
    where nothing is timed). Round 1 of session 13 (H100, 4x16x4096, the kernel alone):
    64 query rows by 128 keys on two warpgroups in one role (FlashAttention-3's tile; ptxas
    254 registers at D = 128, no spill) 3.31 ms at D = 128, 1.82 causal, with dP issued
    early (104 B spilled) 3.32 / 1.85; 64 x 64 4.15 / 2.16, but the fastest at D = 64
    (2.26 / 1.19 against 2.59 / 1.42); 32 x 128 (5.3 ms) and a producer warpgroup (at 232
    or 240 registers: 3.6 ms) were slower and are not candidates. At D = 256 only the
    default tiles (`backward_tiles`), 32 x 32. Session 14 round 1 (D = 128, the kernel
    alone): dQ issued before dK 3.32 ms in one role (no change); the stated roles with
    delta loaded late (`LATE_DELTA`: ptxas no longer serializes every wgmma, C7512) 3.39
    against 3.73 without, so a candidate; dQ's share stored instead of added (an ablation)
    3.30, so the L2 reduce-adds cost ~1%; element-wise `red.global.add` 5.16; staggered
    walks (`STAGGER`) 3.35: no contention to spread."""
    if head_dim > 128:
        return [dict(BM=32, BN=32)]
    one_role = dict(threads=256, warp_specialize=False)
    return [dict(BM=64, BN=64), dict(BM=64, BN=128, **one_role),
            dict(BM=64, BN=128, EARLY_DP=True, **one_role),
            dict(BM=64, BN=128, STAGES=3, **one_role),
            dict(_STATED, BM=64, BN=128, LATE_DELTA=True)]


def backward_launches(dtype: DType, B: int, H: int, Hkv: int, Sq: int, Sk: int, D: int,
                      scale: float, causal: bool, deterministic: bool = True,
                      dq_tiles: dict | None = None, **tiles: int) -> list[tuple]:
    """The three launches of the backward as (kernel, grid, argument names, constexprs), in
    order; argument names refer to q, k, v, o, do, lse, delta, dq, dk, dv and, when not
    `deterministic`, dq_accum (f32 like q, zeros before the launches): the dK/dV kernel
    then adds dQ into it atomically and the last launch converts it. `tiles`: BM, BN,
    STAGES, EARLY_DP, REGS and the build options `threads`, `warp_specialize` of the dK/dV
    and dQ kernels; `dq_tiles`: the dQ kernel's instead, where they differ."""
    t = backward_tiles(D, Sq, Sk, **tiles)
    common = dict(D=D, SCALE=scale, CAUSAL=bool(causal), G=H // Hkv, **t)
    dq_common = common if dq_tiles is None else \
        dict(common, **backward_tiles(D, Sq, Sk, **dq_tiles))
    preprocess = (attention_backward_preprocess_kernel(dtype), (tg.cdiv(Sq, t["BM"]), H, B),
                  ("o", "do", "delta"), dict(D=D, BM=t["BM"]))
    key_blocks = (tg.cdiv(Sk, t["BN"]), Hkv, B)
    gradients = ("q", "k", "v", "do", "lse", "delta", "dk", "dv")
    if not deterministic:
        return [preprocess,
                (attention_backward_dkdvdq_kernel(dtype), key_blocks,
                 gradients + ("dq_accum",), common),
                (attention_backward_dq_convert_kernel(dtype), (tg.cdiv(Sq, 64), H, B),
                 ("dq_accum", "dq"), dict(D=D, SCALE=scale, BM=64))]
    return [
        preprocess,
        (attention_backward_dkdv_kernel(dtype), key_blocks, gradients, common),
        (attention_backward_dq_kernel(dtype), (tg.cdiv(Sq, dq_common["BM"]), H, B),
         ("q", "k", "v", "do", "lse", "delta", "dq"), dq_common),
    ]


def attention_backward_emulated(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray,
                                lse: np.ndarray, do: np.ndarray, causal: bool = False,
                                scale: float | None = None, dtype: DType | None = None,
                                target: str | None = None, deterministic: bool = True,
                                dq_tiles: dict | None = None, **tiles: int):
    """(dq, dk, dv) by the emulated backward kernels. q, o, do: (B, H, Sq, D); k, v:
    (B, Hkv, Sk, D); lse: (B, H, Sq) float32 (natural log). float16 arrays are f16; bf16
    data comes as float32 arrays holding bf16 values with `dtype=bf16` (the gradients
    then come back the same way). `deterministic=False`: dQ by atomics from the dK/dV
    kernel (`backward_launches`). `tiles`: BM, BN overrides (`dq_tiles`: the dQ kernel's,
    where they differ)."""
    fn = "attention_backward_emulated"
    arrays = dict(q=q, k=k, v=v, o=o, lse=lse, do=do)
    for name, x in arrays.items():
        if not isinstance(x, np.ndarray):
            raise TypeError(f"tegula.kernels.{fn}: {name} must be a numpy array, got "
                            f"{type(x).__name__}")
    B, H, Hkv, Sq, Sk, D = check_backward_shapes(fn, q, k, v, o, lse, do)
    dtype = dtype or _dtype_of(fn, q)
    storage = np.float16 if dtype == f16 else np.float32
    for name in ("q", "k", "v", "o", "do"):
        if arrays[name].dtype != storage:
            raise TypeError(f"tegula.kernels.{fn}: {name} has dtype {arrays[name].dtype}; "
                            f"{dtype} data must be numpy {np.dtype(storage)}")
    if lse.dtype != np.float32:
        raise TypeError(f"tegula.kernels.{fn}: lse must be float32, got {lse.dtype}")
    values = {name: np.ascontiguousarray(x) for name, x in arrays.items()}
    values["delta"] = poisoned((B, H, Sq), f32)
    values["dq"] = poisoned(q.shape, dtype)
    values["dk"] = poisoned(k.shape, dtype)
    values["dv"] = poisoned(v.shape, dtype)
    values["dq_accum"] = np.zeros(q.shape, np.float32)
    scale = default_scale(scale, D, fn)
    if q.size and k.size:
        extra = {} if target is None else {"target": target}
        for kernel, grid, names, constexprs in backward_launches(dtype, B, H, Hkv, Sq, Sk, D,
                                                                 scale, causal, deterministic,
                                                                 dq_tiles, **tiles):
            with np.errstate(invalid="ignore", over="ignore"):  # padded rows: never stored
                launch_emulated(kernel, grid, *(values[n] for n in names), **constexprs,
                                **extra)
    elif q.size or k.size:  # no keys: o = 0 and every gradient 0; no queries: dk = dv = 0
        for name in ("dq", "dk", "dv"):
            values[name][...] = 0
    return values["dq"], values["dk"], values["dv"]


# --------------------------------------------------------------------------------------
# torch entry points (CUDA)
# --------------------------------------------------------------------------------------

_TORCH_DTYPES = {"float16": f16, "bfloat16": bf16}


def attention_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                       deterministic: bool = True, **tiles: int):
    """(dq, dk, dv) on CUDA tensors: q, o, do (B, H, Sq, D) and k, v (B, Hkv, Sk, D) of one
    dtype (f16/bf16), lse (B, H, Sq) float32 as `attention_forward` returns it. Any strides
    (inputs whose last dim is not contiguous are copied); the gradients are contiguous.
    `deterministic=False` adds dQ with float atomics from the dK/dV kernel (5 gemms, not
    7; the sums' order, so dq's last bits, vary from run to run), tuned over
    `atomic_dq_candidates` unless `tiles` are given."""
    import torch

    from tegula.build import launch
    from tegula.kernels.api import _check_cuda, _check_same_dtype, _check_tensor
    fn = "attention_backward"
    tensors = dict(q=q, k=k, v=v, o=o, do=do)
    for name, t in tensors.items():
        dtype = _check_tensor(fn, name, t, _TORCH_DTYPES, ndim=4)
    _check_same_dtype(fn, tensors)
    _check_tensor(fn, "lse", lse, {"float32": f32}, ndim=3)
    B, H, Hkv, Sq, Sk, D = check_backward_shapes(fn, q, k, v, o, lse, do)
    scale = default_scale(scale, D, fn)
    _check_cuda(fn, dict(tensors, lse=lse))
    values = {name: t if t.stride(-1) == 1 else t.contiguous()
              for name, t in dict(tensors, lse=lse).items()}
    values.update(dq=torch.empty(q.shape, dtype=q.dtype, device=q.device),
                  dk=torch.empty(k.shape, dtype=k.dtype, device=q.device),
                  dv=torch.empty(v.shape, dtype=v.dtype, device=q.device),
                  delta=torch.empty((B, H, Sq), dtype=torch.float32, device=q.device))
    if q.numel() == 0 or k.numel() == 0:
        for name in ("dq", "dk", "dv"):
            values[name].zero_()
        return values["dq"], values["dk"], values["dv"]
    launches = backward_launches(dtype, B, H, Hkv, Sq, Sk, D, scale, causal,
                                 bool(deterministic), **tiles)
    if not deterministic:
        values["dq_accum"] = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    key_grid = lambda c: (tg.cdiv(Sk, c["BN"]), Hkv, B)  # noqa: E731
    query_grid = lambda c: (tg.cdiv(Sq, c["BM"]), H, B)  # noqa: E731
    tuned = {1: (key_grid, backward_candidates(D, "dkdv") if deterministic else
                 atomic_dq_candidates(D))}
    if deterministic:
        tuned[2] = (query_grid, backward_candidates(D, "dq"))
    for index, (kernel, grid, names, constexprs) in enumerate(launches):
        args = [values[n] for n in names]
        if tiles or index not in tuned:   # the caller chose, or nothing to tune
            launch(kernel, grid, *args, **constexprs)
            continue
        grid_of, candidates = tuned[index]
        prepare = None if deterministic else _fresh_accumulator(values["dq_accum"])
        _tuned_launch(kernel, grid_of, args, constexprs, dtype, (B * H, Sq, Sk), q.device,
                      candidates, prepare)
    return values["dq"], values["dk"], values["dv"]


def _fresh_accumulator(dq_accum):
    """What runs before each launch of the kernel adding dQ into `dq_accum` while it is
    tuned: nothing the first time (zeros from the caller), zeros again after that, so that
    the launch the tuner keeps (its last) adds into zeros (a timed run's memset costs every
    configuration the same)."""
    launched = []

    def prepare():
        if launched:
            dq_accum.zero_()
        launched.append(True)
    return prepare


def _tuned_launch(kernel, grid_of, args: list, constexprs: dict, dtype: DType, dims: tuple,
                  device, candidates: list[dict], prepare=None) -> None:
    """Launch `kernel` (dK/dV, dQ, or dK/dV adding dQ) with the best of `candidates`, timed
    once per shape bucket by the library's autotuner (each timed run rewrites the same
    outputs; `prepare()`, where given, runs before each launch). `grid_of(tiles)`: the grid
    for a configuration."""
    from tegula.kernels import api
    from tegula.runtime.autotune import Autotuner, Config
    api.TUNERS.setdefault("attention_backward", Autotuner("attention_backward"))
    fixed = {k: constexprs[k] for k in ("D", "SCALE", "CAUSAL", "G")}
    configs = tuple(Config.of(c) for c in candidates)

    def run(config: Config):
        if prepare is not None:
            prepare()
        return api._launch(kernel, grid_of(config.kwargs), args,
                           dict(fixed, **config.kwargs), config.threads)

    extra = f"{kernel.name}/{dtype}/D{fixed['D']}/{'causal' if fixed['CAUSAL'] else 'full'}"
    api._tune_and_run("attention_backward", device.index, configs, dims, extra, run)


def _attention_function():
    """The autograd Function (built on first use: this module imports without torch)."""
    global _ATTENTION_FUNCTION
    if _ATTENTION_FUNCTION is None:
        import torch

        class AttentionFunction(torch.autograd.Function):
            """o = attention(q, k, v): forward by `attention_forward`, backward by the
            deterministic kernels above, from the saved o and lse."""

            @staticmethod
            def forward(ctx, q, k, v, causal, scale):
                from tegula.kernels.attention import attention_forward
                o, lse = attention_forward(q, k, v, causal, scale)
                ctx.save_for_backward(q, k, v, o, lse)
                ctx.causal, ctx.scale = causal, scale
                return o

            @staticmethod
            def backward(ctx, do):
                q, k, v, o, lse = ctx.saved_tensors
                dq, dk, dv = attention_backward(q, k, v, o, lse, do.contiguous(),
                                                ctx.causal, ctx.scale)
                return dq, dk, dv, None, None

        _ATTENTION_FUNCTION = AttentionFunction
    return _ATTENTION_FUNCTION


_ATTENTION_FUNCTION = None


def attention_differentiable(q, k, v, causal: bool = False, scale: float | None = None):
    """`tegula.kernels.attention` with gradients: o (B, H, Sq, D) as `attention_forward`
    computes it; when q, k or v require grad, `o.backward(...)` runs the backward kernels
    (dK and dV summed over the query heads of each kv head, deterministically)."""
    import torch
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _attention_function().apply(q, k, v, bool(causal), scale)
    from tegula.kernels.attention import attention_forward
    return attention_forward(q, k, v, causal, scale)[0]


def _dtype_of(fn: str, x: np.ndarray) -> DType:
    if x.dtype == np.float16:
        return f16
    raise TypeError(f"tegula.kernels.{fn}: q has dtype {x.dtype}; pass float16 arrays, or "
                    f"float32 arrays holding bf16 values with dtype=tegula.bf16")


__all__ = ["attention_backward_preprocess_kernel", "attention_backward_dkdv_kernel",
           "attention_backward_dq_kernel", "attention_backward_dkdvdq_kernel",
           "attention_backward_dq_convert_kernel", "attention_backward_emulated", "attention_backward",
           "attention_differentiable",
           "check_backward_shapes", "backward_launches", "default_scale",
           "backward_candidates", "atomic_dq_candidates",
           "ATTENTION_BACKWARD_DTYPES"]
