"""The 4-bit-weight MoE grouped GEMM on weights pre-packed in the MMA fragment's order
(session 12, issue 13): `quant_fragment.w4a16_fragment_kernel`'s k-step inside
`moe_w4`'s work items.

Each expert's (N, K) weight is stored as `quant_fragment.pack_fragments` stores one
(`pack_experts_fragments`: (E, N/64, K/64, 4, 8, 4, 16) bytes, read as (E, N/64, K/64,
128, 4) i32 words), so a thread's weights of a 64-k block are one 16-byte load, turned
into 16-bit magic + w by one lop3 a pair and dequantized two at a time
(`dequantize_in`: HADD2 and HMUL2) — about 1.6 SASS a weight against ~9 for the byte
loads and f32 arithmetic of `moe_w4`'s swapped kernel. A work item computes outᵀ's
(64·WG, BT) tile: the dequantized weights are the MMA's register A operand, the BT token
rows of the item the shared B operand in a STAGES-deep ring, the words in a ring of their
own (WSMEM=1, the kernel's default) or loaded straight into registers two steps ahead
with step k+1 dequantized while step k's wgmmas run (WSMEM=0: with one register operand
ptxas serializes the register-A wgmmas, C7513; PAIRS=1, the entry point's default, takes
two steps an iteration with two operands and keeps them in flight, `_paired_steps`).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import tegula as tg
from tegula import f32, i32
from tegula.dtypes import DType
from tegula.kernels.moe import COLUMN_TILE, END_ROW, EXPERT, FIRST_ROW, has_rows
from tegula.kernels.quant_fragment import (FRAGMENT_K, FRAGMENT_ROWS, STORED_WORDS,
                                           as_words, dequantize_in, fragment_weights,
                                           group_constants, pack_fragments,
                                           stored_shared, stored_tv)


def _fragment_item(x: Any, w: Any, scales: Any, zeros: Any, schedule: Any, out: Any, t: Any,
                   sa: Any, sw: Any, sb: Any, dtype: DType, fractional: bool, G: int,
                   BT: int, KS: int, WG: int, STAGES: int, PERSISTENT: bool,
                   head: Any = None, next_t: Any = None) -> Any:
    """Work item t (trace time): outᵀ's (64·WG, BT) tile of rows first… of expert e at
    weight row block n, over K in steps of 64·KS. `sw` None: the words straight into
    registers, step k+1 dequantized after step k's gemm is issued (ptxas then serializes
    the register-A wgmmas, C7513, as for `w4a16_fragment_kernel`'s WSMEM=0); else the
    words' ring, each step dequantized before its gemm, the other warpgroup's wgmmas
    filling the tensor cores meanwhile. `head` (PAIRS): this item's `_item_head`, loaded
    by the previous item; then the head of item `next_t` is loaded before this item's
    epilogue and returned (AHEAD=1)."""
    e, first, end = schedule[EXPERT, t], schedule[FIRST_ROW, t], schedule[END_ROW, t]
    n = schedule[COLUMN_TILE, t]
    BN, BK = FRAGMENT_ROWS * WG, FRAGMENT_K * KS
    ga = x[first:, :].tile((BT, BK), (0, None))
    steps = ga.shape[2] if PERSISTENT else ga.shape[2] * has_rows(first, end)
    gw, words_tv, dequantized, constants = _item_weights(w, scales, zeros, e, n, dtype,
                                                         fractional, G, KS, WG)
    acc = tg.zeros((BN, BT), f32)                        # outᵀ: weight rows x tokens
    if sw is not None:
        ahead_constants = constants(0)                   # a k-step ahead, as loaded
        for k in tg.pipeline(steps, stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gw[:, :, :, :, k], sw[k])
            following = constants(k + 1)                 # past K: masked, never used
            words = tg.load(sw[k], layout=words_tv)
            tg.gemm(acc, dequantized(words, ahead_constants), sa[k])
            ahead_constants = following
        tg.copy(tg.rearrange(acc.to(dtype)), out[first:end, :].T.tile((BN, BT), (n, 0)))
        return
    if sb is not None:
        if head is None:
            head = _item_head(gw, words_tv, dequantized, constants)
        acc = _paired_steps(ga, gw, words_tv, sa, sb, steps, acc, dequantized, constants,
                            STAGES, head)
        following = None
        if next_t is not None:              # the next item's words fly during the epilogue
            following = _item_head(*_item_weights(
                w, scales, zeros, schedule[EXPERT, next_t], schedule[COLUMN_TILE, next_t],
                dtype, fractional, G, KS, WG))
        tg.copy(tg.rearrange(acc.to(dtype)), out[first:end, :].T.tile((BN, BT), (n, 0)))
        return following
    current = dequantized(tg.load(gw[:, :, :, :, 0], layout=words_tv), constants(0))
    ahead = tg.load(gw[:, :, :, :, 1], layout=words_tv)
    for k in tg.pipeline(steps, stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        following = constants(k + 1)                     # past K: masked, never used
        after = tg.load(gw[:, :, :, :, k + 2], layout=words_tv)
        tg.gemm(acc, current, sa[k])                     # acc += w @ x rows.T
        current = dequantized(ahead, following)          # while the wgmmas run
        ahead = after
    # Rearranged through shared memory: out's rows are tokens, 16-byte stores along N.
    tg.copy(tg.rearrange(acc.to(dtype)), out[first:end, :].T.tile((BN, BT), (n, 0)))


def _item_weights(w: Any, scales: Any, zeros: Any, e: Any, n: Any, dtype: DType,
                  fractional: bool, G: int, KS: int, WG: int) -> tuple:
    """(gw, words_tv, dequantized, constants) of expert e's weight row block n (trace
    time): its stored words as k-steps, their layout in registers, the dequantization of
    a step's words, and step k's zeros and scales (loads)."""
    BN, BK = FRAGMENT_ROWS * WG, FRAGMENT_K * KS
    S = max(1, BK // G)
    gw = w[e].tile((WG, KS) + STORED_WORDS, (n, None, 0, 0))
    z_e = zeros[e] if zeros is not None else None

    def dequantized(words, constants):                   # the (BN, BK) weights of a step
        packed = tg.reshape(fragment_weights(words, dtype), (BN, S, BK // S))
        return tg.reshape(dequantize_in(packed, *constants, fractional), (BN, BK))

    def constants(k):                                    # step k's zeros and scales (loads)
        return group_constants(dtype, scales[e], z_e, n, k // max(1, G // BK), (BN, S))
    return gw, stored_tv(KS, WG), dequantized, constants


def _item_head(gw: Any, words_tv: Any, dequantized: Any, constants: Any) -> tuple:
    """What `_paired_steps` needs before its first iteration: step 0's weights
    dequantized, steps 1 and 2's words (loads)."""
    return (dequantized(tg.load(gw[:, :, :, :, 0], layout=words_tv), constants(0)),
            tg.load(gw[:, :, :, :, 1], layout=words_tv),
            tg.load(gw[:, :, :, :, 2], layout=words_tv))


def _paired_steps(ga: Any, gw: Any, words_tv: Any, sa: Any, sb: Any, steps: Any, acc: Any,
                  dequantized: Any, constants: Any, STAGES: int, head: tuple) -> Any:
    """PAIRS=1 (words in registers): two k-steps an iteration, each its own token ring
    (`sa` the even steps, `sb` the odd) and its own register A operand (`first` and
    `second`). With one operand reassigned every step (`_fragment_item`), the C
    compiler gives the next step's weights the registers the in-flight wgmmas read, and
    ptxas then waits for every wgmma before the next (C7513: 8 waits a step in the
    SASS); two operands keep them apart. Within a warpgroup the dequantization still
    does not overlap its own wgmmas: ptxas puts the step's `WARPGROUP.DEPBAR` right
    after its HGMMAs and dequantizes after it (nothing may define a later wgmma's A
    registers inside a pipeline stage; session 14, SASS); the other warpgroups' wgmmas
    fill the tensor cores meanwhile. A pair past an odd step count reads zero tokens (TMA fills past K) and
    masked words. `head`: `_item_head` (step 0 dequantized, steps 1 and 2's words)."""
    first, odd_words, even_words = head
    del head                             # the loop carries `first` &c., not head's tiles
    for k in tg.pipeline((steps + 1) // 2, stages=STAGES):
        tg.copy(ga[:, :, 2 * k], sa[k])
        tg.copy(ga[:, :, 2 * k + 1], sb[k])
        odd_constants, even_constants = constants(2 * k + 1), constants(2 * k + 2)
        next_odd = tg.load(gw[:, :, :, :, 2 * k + 3], layout=words_tv)
        next_even = tg.load(gw[:, :, :, :, 2 * k + 4], layout=words_tv)
        tg.gemm(acc, first, sa[k])                       # step 2k
        second = dequantized(odd_words, odd_constants)   # ptxas: after 2k's retire
        tg.gemm(acc, second, sb[k])                      # step 2k + 1
        first = dequantized(even_words, even_constants)  # ptxas: after 2k + 1's
        odd_words, even_words = next_odd, next_even
    return acc


@lru_cache(maxsize=None)
def moe_gemm_w4_fragment_kernel(dtype: DType, has_zeros: bool) -> tg.Kernel:
    """out (R, N) = x_sorted (R, K) @ dequant(w[e]).T per expert e's rows, w the
    fragment-ordered words (E, N/64, K/64, 128, 4) i32 (`pack_experts_fragments`,
    `as_words`), scales and zeros (E, N, K/G) of `dtype` (zeros unread without
    `has_zeros`: zero point 8). WSMEM=1: the words through a STAGES-deep shared ring
    (`_fragment_item`). WG warpgroups (threads = 128·WG) take 64 weight rows each; KS
    stored blocks a k-step (BK = 64·KS divides G or is a multiple of it); INTEGER_ZEROS
    skips the fractional zero's residue step. PAIRS (with WSMEM=0): two k-steps an
    iteration, two register operands (`_paired_steps`). PERSISTENT: a block walks the
    work count's items; else one block an item. AHEAD (PERSISTENT, PAIRS): the next
    item's first weights are loaded and dequantized before this item's epilogue, so their
    latency is not paid at the item's start. The schedule's row tile is BT."""

    @tg.kernel(threads=128)
    def moe_gemm_w4_fragment(x: tg.Tensor[dtype], w: tg.Tensor[i32, 5],
                             scales: tg.Tensor[dtype, 3], zeros: tg.Tensor[dtype, 3],
                             schedule: tg.Tensor[i32, 2], work_count: tg.Tensor[i32, 1],
                             out: tg.Tensor[dtype], G: tg.constexpr = 128,
                             BT: tg.constexpr = 128, KS: tg.constexpr = 1,
                             WG: tg.constexpr = 2, STAGES: tg.constexpr = 4,
                             PERSISTENT: tg.constexpr = True, WSMEM: tg.constexpr = 1,
                             INTEGER_ZEROS: tg.constexpr = 0, PAIRS: tg.constexpr = 0,
                             AHEAD: tg.constexpr = 0):
        sa = tg.shared((BT, FRAGMENT_K * KS), dtype, stages=STAGES)
        sw = tg.shared((WG, KS) + STORED_WORDS, i32, stages=STAGES,
                       layout=stored_shared(KS, WG)) if WSMEM else None
        sb = tg.shared((BT, FRAGMENT_K * KS), dtype, stages=STAGES) \
            if PAIRS and not WSMEM else None
        z = zeros if has_zeros else None
        fractional = has_zeros and not INTEGER_ZEROS
        args = (sa, sw, sb, dtype, fractional, G, BT, KS, WG, STAGES)
        if PERSISTENT and AHEAD and sb is not None:
            # Each item's head (`_item_head`) is loaded during the previous item's
            # epilogue; the last item's follower is a clamped repeat, never used.
            last = tg.maximum(work_count[0] - 1, 0)
            t0 = tg.minimum(tg.block_id(0), last)
            head = _item_head(*_item_weights(w, scales, z, schedule[EXPERT, t0],
                                             schedule[COLUMN_TILE, t0], dtype, fractional,
                                             G, KS, WG))
            for t in tg.range(tg.block_id(0), work_count[0], tg.num_programs(0)):
                head = _fragment_item(x, w, scales, z, schedule, out, t, *args, True, head,
                                      tg.minimum(t + tg.num_programs(0), last))
        elif PERSISTENT:
            for t in tg.range(tg.block_id(0), work_count[0], tg.num_programs(0)):
                _fragment_item(x, w, scales, z, schedule, out, t, *args, True)
        else:
            _fragment_item(x, w, scales, z, schedule, out, tg.block_id(0), *args, False)

    return moe_gemm_w4_fragment


def pack_experts_fragments(packed: Any) -> Any:
    """Row-major packed experts ((E, N, K/2) uint8, `moe_w4.quantize_experts_w4`; numpy
    or torch) -> the fragment order, (E, N/64, K/64, 4, 8, 4, 16) uint8, each expert by
    `pack_fragments` (N and K padded with zero weights to multiples of 64). Done once
    per weight."""
    if len(packed.shape) != 3:
        raise ValueError(f"tegula.kernels.pack_experts_fragments: packed must be 3-D "
                         f"(experts, N, K/2) uint8, got shape {tuple(packed.shape)}")
    parts = [pack_fragments(packed[e]) for e in range(packed.shape[0])]
    if hasattr(packed, "numpy"):
        import torch
        return torch.stack(parts)
    import numpy as np
    return np.stack(parts)


def expert_words(stored: Any) -> Any:
    """The (E, N/64, K/64, 4, 8, 4, 16) fragment bytes as the (E, N/64, K/64, 128, 4) i32
    words the kernel reads (a view)."""
    flat = stored.reshape((stored.shape[0] * stored.shape[1],) + tuple(stored.shape[2:]))
    return as_words(flat).reshape(tuple(stored.shape[:3]) + STORED_WORDS)


__all__ = ["moe_gemm_w4_fragment_kernel", "pack_experts_fragments", "expert_words"]
