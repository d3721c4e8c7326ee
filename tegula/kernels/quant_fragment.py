"""W4A16 with the weights pre-packed in the MMA fragment's order (issue 13): each thread's
weights of a k-step are one 16-byte load, dequantized two at a time in 16-bit registers.

The swapped W4A16 kernel (`quant.w4a16_swapped_kernel`) computes cᵀ = dequant(w)·aᵀ with
the dequantized (64, 64) weight tile as the MMA's *register* A operand. Read from the
row-major packed weights, the A fragment's elements are scattered (each thread holds
byte pairs 4 bytes apart along K, on two rows 8 apart): 16 one-byte loads per thread and
k-step, each with its own address. Here the weights are stored so that a thread's 32
nibbles are one 16-byte run, and the kernel source says which weight each one is:

    stored (N/64, K/64, 4, 8, 4, 16) bytes = 128 runs of 32 nibbles per (64 x 64) block
    run (w, r, c), 32-bit word s, nibble 4j + p (p = 2h + i) holds weight
        n = 64·nb + 16·w + 8·i + r,   k = 64·kb + 16·s + 8·h + 2·c + j

(wgmma m64k16 over four warps: warp w, lane 4r + c holds rows 16w + r (+8) and k pairs
2c (+8) of each k16 step.) The kernel reads the bytes as (N/64, K/64, 128, 4) i32 words
(`as_words`: run t = 32w + 4r + c, so copies coalesce along t) and loads a run as four
words (a pinned layout: thread t holds run t), and `fragment_weights` masks each word (bf16:
shifted right by 4p; f16: by 0 or 8, `NIBBLE_SLOTS`) so that both weights of pair p (k and
k + 1: j = 0, 1) sit in the mantissa of two 16-bit halves, OR-ed with a magic number
(1024.0 or 64.0 as f16, 128.0 as bf16) that makes each half magic + w exactly — mask and
OR print as one lop3 (`codegen/lop3.py`); `tg.bitcast` reads the word as two
f16s, and `tg.reshape` / `tg.permute` name the (64, 64) weight tile those registers hold
(no data moves: synthesis renames the registers' elements; the MMA fragment's register
order is reached by register copies inside each thread). `dequantize_in` then subtracts
magic + zero and multiplies by the scale in f16x2 (one HADD2 and one HMUL2 a pair; the
emitter pairs the two halves of a word, `codegen/expr.py`). About 1.6 SASS a weight in
f16 (a 16-token 256-k step: ~360 SASS a thread in all for its 128 weights), against ~9
for the register-A kernel's one-byte loads and f32 dequantization.

The arrangement is what the kernel source says, on any target: if a target's fragment
differs, the result is still exact and only the load narrows (tests check both
targets). `pack_fragments` writes this order from the row-major packed bytes of
`quantize_w4` / `prepack` (N and K padded with zero weights to multiples of 64: padded
rows are never stored, and padded k meet the zero activations a masked load gives past
K); the kernels read it as words (`as_words`, a view). Words go through a STAGES-deep
ring (WSMEM=1, default: TMA boxes into the stage `stored_shared` pins, with the
activations', or cp.async where TMA does not qualify) or straight into registers one
k-step ahead.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

import tegula as tg
from tegula import f32, i32
from tegula.dtypes import DType
from tegula.layout.cute import Layout

FRAGMENT_ROWS = 64      # weight rows per block: one wgmma A tile (4 warps x 16 rows)
FRAGMENT_K = 64         # k per block and per k-step (32 nibbles = 16 bytes per thread)
STORED_BLOCK = (4, 8, 4, 32)  # (w, r, c, v) of one block, after (N/64, K/64), in nibbles
STORED_WORDS = (128, 4)       # the same as 32-bit words (run 32w + 4r + c, s): what the
                              # kernel loads (runs one dim: the copies coalesce along it)
#: Word s of a run holds pair slot p = (h, i) of k16 step s in nibbles p (j = 0) and p + 4
#: (j = 1): shifted right by 4p and masked with 0x000F000F, both weights of the pair sit in
#: the mantissas of one 32-bit pair of 16-bit floats. The bitcast (WG, KS, …, s, p, j)
#: tile of WG blocks along N by KS along K splits into (nb, kb) + FRAGMENT_SPLIT =
#: (nb, kb, w, r, c, s, h, i, j) ...
FRAGMENT_SPLIT = (4, 8, 4, 4, 2, 2, 2)
#: ... and is ordered (nb, w, i, r, kb, s, h, c, j): row-major, rows n = (nb, w, i, r),
#: k = (kb, s, h, c, j)
FRAGMENT_PERM = (0, 2, 7, 3, 1, 5, 6, 4, 8)


def stored_tv(blocks: int, row_blocks: int = 1) -> Layout:
    """How a loaded (row_blocks, blocks, 128, 4) tile of word blocks is spread over
    128 · row_blocks threads: thread 128b + t (warpgroup b) holds run t's 4 words of each
    block of row block b (a 16-byte load each), the words of a block in consecutive
    registers. (Tile coordinates column-major: row block, block, run, word.)"""
    if row_blocks == 1:
        return Layout((128, (4, blocks)), (blocks, (128 * blocks, 1)))
    blocks_in_tile = row_blocks * blocks
    return Layout(((128, row_blocks), (4, blocks)),
                  ((blocks_in_tile, 1), (128 * blocks_in_tile, row_blocks)))


def stored_shared(blocks: int, row_blocks: int = 1) -> Layout:
    """The ring's stage: the words as they are in memory (thread t's run at byte 16t of
    each block), so that cp.async and the shared load are 16-byte vectors, conflict-free
    (eight threads' runs make one 128-byte wavefront); a swizzle would only split runs."""
    return Layout((row_blocks, blocks) + STORED_WORDS, (512 * blocks, 512, 4, 1))
#: Per activation type: the magic number of a pair (a 16-bit float whose mantissa's low
#: bits take a 4-bit value exactly: 1024 for f16, 128 for bf16) and its value.
MAGIC = {"f16": (0x64006400, 1024.0), "bf16": (0x43004300, 128.0)}
#: Per activation type, how pair slot p of a word becomes magic + w in both halves:
#: (right shift, mask, magic number, its value). bf16 shifts slot p's nibbles to bits 0-3
#: (three shifts a word). f16 reads the odd slots where they are, in bits 4-7, under the
#: magic number 64.0 (0x5400: its mantissa's bit 4 is worth 1, so 64 + w exactly, the
#: low nibble masked off), and slots 2-3 after one shift by 8: one shift a word
#: (Marlin's trick without its fused multiply-add). Odd slots are the rows 8-15 of each
#: 16 (p = 2h + i), so the magic to subtract is a constant per row (`dequantize_in`).
NIBBLE_SLOTS = {
    "f16": ((0, 0x000F000F, 0x64006400, 1024.0), (0, 0x00F000F0, 0x54005400, 64.0),
            (8, 0x000F000F, 0x64006400, 1024.0), (8, 0x00F000F0, 0x54005400, 64.0)),
    "bf16": tuple((4 * p, 0x000F000F, 0x43004300, 128.0) for p in range(4)),
}


def fragment_shape(n: int, k: int) -> tuple[int, ...]:
    """The logical (4-bit element) shape of the fragment-ordered weights of an (N, K)
    weight: (N/64, K/64, 4, 8, 4, 32), each extent rounded up."""
    return (-(-n // FRAGMENT_ROWS), -(-k // FRAGMENT_K)) + STORED_BLOCK


def pack_fragments(packed: Any, k: int | None = None) -> Any:
    """Row-major packed 4-bit weights ((N, K/2) uint8, element 2j of a row in the low
    nibble of byte j: what `quantize_w4` and `prepack` return; numpy or torch) -> the
    fragment order, (N/64, K/64, 4, 8, 4, 16) uint8 (two nibbles a byte, the same
    nibble order), N and K padded with zero weights to multiples of 64. Done once per
    weight, like `prepack`."""
    from tegula.kernels.quant import prepack, unpack_w4
    if len(packed.shape) != 2:
        raise ValueError(f"tegula.kernels.pack_fragments: packed must be 2-D (N, K/2) "
                         f"uint8, got shape {tuple(packed.shape)}")
    w_q = unpack_w4(packed)
    n, k = w_q.shape
    nb, kb = fragment_shape(n, k)[:2]
    padded = _zeros_like(w_q, (nb * FRAGMENT_ROWS, kb * FRAGMENT_K))
    padded[:n, :k] = w_q
    # (nb, w, i, r, kb, s, h, c, j) -> (nb, kb, w, r, c, s, j, h, i)
    blocks = padded.reshape(nb, 4, 2, 8, kb, 4, 2, 4, 2)
    ordered = _permute(blocks, (0, 4, 1, 3, 7, 5, 8, 6, 2))
    return prepack(_contiguous(ordered).reshape(nb, kb, 4, 8, 4, 32))


def unpack_fragments(stored: Any, n: int, k: int) -> Any:
    """The inverse of `pack_fragments`: the (N, K/2) row-major packed bytes."""
    from tegula.kernels.quant import prepack, unpack_w4
    nb, kb = stored.shape[:2]
    values = unpack_w4(stored).reshape(nb, kb, 4, 8, 4, 4, 2, 2, 2)
    rows = _permute(values, (0, 2, 8, 3, 1, 5, 7, 4, 6))   # back to (nb, w, i, r, kb, s, h, c, j)
    w_q = _contiguous(rows).reshape(nb * FRAGMENT_ROWS, kb * FRAGMENT_K)[:n, :k]
    return prepack(_contiguous(w_q))


def _zeros_like(x: Any, shape: tuple) -> Any:
    return np.zeros(shape, x.dtype) if isinstance(x, np.ndarray) else x.new_zeros(shape)


def _permute(x: Any, dims: tuple) -> Any:
    return x.transpose(dims) if isinstance(x, np.ndarray) else x.permute(dims)


def _contiguous(x: Any) -> Any:
    return np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x.contiguous()


def fragment_weights(words: Any, dtype: DType) -> Any:
    """Inside a kernel: the loaded (WG, KS, 128, 4) words of WG x KS stored blocks (WG
    along N, KS along K) as the (64·WG, 64·KS) weight tile they hold, each weight as
    magic + w (`NIBBLE_SLOTS`: 1024 + w or 64 + w in f16) — per 32-bit word one mask and
    OR a pair slot (one lop3, `arch/logic.py`) after at most one shift (three in bf16),
    then register reshapes (no data moved)."""
    row_blocks, blocks = words.shape[0], words.shape[1]
    words = tg.reshape(words, (row_blocks, blocks, 4, 8, 4, 4))     # run = (w, r, c)
    slots = tuple(words.shape) + (4,)
    slot = tg.indices(slots, len(slots) - 1)   # a constant per register: the where folds
    word, shifted = words[..., None], {}
    pair_slots = []
    for shift, mask, magic, _ in NIBBLE_SLOTS[dtype.name]:
        if shift not in shifted:
            shifted[shift] = word // (1 << shift) if shift else word
        pair_slots.append((shifted[shift] & mask) | magic)
    bits = tg.where(slot == 0, pair_slots[0], tg.where(
        slot == 1, pair_slots[1], tg.where(slot == 2, pair_slots[2], pair_slots[3])))
    pairs = tg.bitcast(bits, dtype)
    split = tg.reshape(pairs, (row_blocks, blocks) + FRAGMENT_SPLIT)
    return tg.reshape(tg.permute(split, FRAGMENT_PERM),
                      (FRAGMENT_ROWS * row_blocks, FRAGMENT_K * blocks))


def group_constants(dtype: DType, scales: Any, zeros: Any, n: Any, group: Any,
                    groups_shape: tuple) -> tuple[Any, Any]:
    """Inside a kernel: (zero, scale) of row block `n`, group block `group`, as tiles of
    `groups_shape` in `dtype` (zeros None: the symmetric zero point 8), as loaded: the
    kernel loads them a k-step before `dequantize_in` uses them, and arithmetic on them
    here would wait for the load where it is issued."""
    from tegula.kernels.quant import SYMMETRIC_ZERO
    tv = constants_tv(*groups_shape)
    scale = tg.load(scales.tile(groups_shape, (n, group)), layout=tv)
    zero = (tg.load(zeros.tile(groups_shape, (n, group)), layout=tv) if zeros is not None
            else tg.full(groups_shape, SYMMETRIC_ZERO, dtype))
    return zero, scale


def constants_tv(rows: int, groups: int) -> Layout:
    """How a (rows, groups) tile of scales (zeros) is loaded: thread 128b + 32w + 4r + c
    holds rows 64b + 16w + r (+8), the rows its A fragments hold, each row's groups in
    consecutive registers — adjacent in memory, so one vector load a row (a 4-byte load
    for two groups a k-step) instead of one 2-byte load a value. (Tile coordinates
    column-major: row + rows·group.)"""
    return Layout(((4, 8, 4, rows // FRAGMENT_ROWS), (groups, 2)),
                  ((0, 1, 16, FRAGMENT_ROWS), (rows, 8)))


def dequantize_in(packed: Any, zero: Any, scale: Any, fractional_zero: bool = True) -> Any:
    """(w - zero) * scale in the activations' type from weights held as magic + w
    (`fragment_weights`) and `group_constants` (broadcast over each group's weights:
    trailing dims), in paired 16-bit instructions (HADD2, HMUL2). magic + zero rounds
    the zero to the magic's grid (integers: 1 for f16's 1024 and bf16's 128, 1/16 for
    f16's 64), so (magic + w) - (magic + zero) = w - round(zero) exactly; with
    `fractional_zero` (a zeros tensor: any values) its residue zero - round(zero)
    (exact; 0 for integer zeros, which so give the same bits) is subtracted next, w -
    zero rounded once, one more HADD2 a pair — without it a fractional zero point would
    be silently rounded (the bug of session 10). Then the product rounds once. Exact
    steps for zeros in [-32, 64] (f16; bf16 [-64, 128]), where the magic + zero
    differences are exact (Sterbenz); magic + zero, its residue, once per group and row.
    `fractional_zero=False`: the symmetric zero point 8, an integer. `scale` None: w -
    zero only, for a kernel that scales the MMA's f32 sums. Register arithmetic only, so
    it runs while wgmmas issued before it compute (`lower/wgmma_waits.py`)."""
    extra = (None,) * (packed.rank - zero.rank)
    (_, _, _, even), (_, _, _, odd) = NIBBLE_SLOTS[zero.dtype.name][:2]
    if odd == even:
        magic = tg.full(zero.shape, even, zero.dtype)
    else:   # rows 8-15 of each 16 hold odd slots (`NIBBLE_SLOTS`): split off the row bit
        rows, groups = zero.shape   # 3, a register's own, so the where folds (an index of
        split_shape = (rows // 16, 2, 8, groups)   # the row would not)
        odd_rows = tg.indices(split_shape, 1) == 1
        magic = tg.reshape(tg.where(odd_rows, tg.full(split_shape, odd, zero.dtype),
                                    tg.full(split_shape, even, zero.dtype)), zero.shape)
    magic_zero = zero + magic
    unscaled = packed - magic_zero[(..., *extra)]
    if fractional_zero:
        residue = zero - (magic_zero - magic)
        unscaled = unscaled - residue[(..., *extra)]
    return unscaled if scale is None else unscaled * scale[(..., *extra)]


def as_words(stored: Any) -> Any:
    """The fragment-ordered bytes (`pack_fragments`) as the (N/64, K/64, 128, 4) 32-bit
    words the kernel loads (a view: numpy or torch)."""
    words = stored.view(np.int32) if isinstance(stored, np.ndarray) else stored.view(
        _torch_int32())
    return words.reshape(tuple(stored.shape[:2]) + STORED_WORDS)


def _torch_int32() -> Any:
    import torch
    return torch.int32


def _gemm_scaled_after(acc, words, constants, activations, dtype: DType,
                       fractional_zero: bool):
    """acc + scale * ((w - zero) @ activations.T) for one part of a k-step, one group
    (SCALE_AFTER): the MMA takes w - zero (exact in 16 bits for integer zeros; a
    fractional zero's difference rounds once, `dequantize_in`) into a fresh f32 sum, and
    the row's scale multiplies that sum as it is added (BT/2 FMAs a thread instead of
    one HMUL2 a weight pair), so no scaled weight is rounded."""
    zero, scale = constants
    BN, BK = acc.shape[0], activations.shape[1]
    packed = tg.reshape(fragment_weights(words, dtype), (BN, 1, BK))
    unscaled = dequantize_in(packed, zero, None, fractional_zero)
    step = tg.zeros(acc.shape, f32)
    tg.gemm(step, tg.reshape(unscaled, (BN, BK)), activations)
    return acc + step * scale.to(f32)


def _split_slice(steps, even: bool = False):
    """(first k-step, end) of this block's slice of `steps` k-steps under split K: grid
    axis 2 holds the SPLIT slices (a launch value: one build serves any split). `even`:
    slices of an even count of steps (PAIRS: a pair never straddles two slices; only
    the last slice may end on a half pair, past K)."""
    splits = tg.num_programs(2)
    per_split = (steps + splits - 1) // splits
    if even:
        per_split = (per_split + 1) // 2 * 2
    start = tg.block_id(2) * per_split
    return start, tg.minimum(start + per_split, steps)


def _paired_register_steps(ga, gw, words_tv, sa, sb, start, steps, acc, dequantized,
                           constants, STAGES: int, scale_after: bool = False):
    """PAIRS=1 (words in registers, WSMEM=0): two k-steps an iteration, each its own
    token ring (`sa` the even steps of the slice, `sb` the odd) and its own register A
    operand (`first`, `second`). With one operand reassigned every step, the next step's
    dequantization writes the registers the in-flight wgmmas read: in the
    warp-specialized consumer (whose waits `lower/wgmma_waits.py` defers) ptxas then
    serializes every wgmma (C7513: a non-wgmma instruction defines a wgmma's A registers
    inside its pipeline stage, first wgmma to the wait; 8 waits a step in the SASS).
    With two operands the PTX dequantizes step 2p+1 between step 2p's wgmmas and the
    wait before step 2p+1's gemm (their accumulator is shared), one wait a step. The
    wait must stay: a second f32 sum for the odd steps (no wait before their gemm) gave
    16 waits a loop. But ptxas keeps its rule by itself: the SASS has the wait right
    after the HGMMAs and most of the next operand's dequantization after it, so within
    a warpgroup the dequantization does not overlap the wgmmas; what overlaps them is
    the other warpgroups' work (WG, consumers="pingpong"). `start` is even
    (`_split_slice(even=True)`); a pair past an odd step count reads zero tokens (masked
    copies past K) and masked words. The pattern of the W4 MoE kernel's `_paired_steps`
    (session 13, F). `scale_after` (one group a step): `_paired_scaled_after`."""
    if scale_after:
        return _paired_scaled_after(ga, gw, words_tv, sa, sb, start, steps, acc,
                                    dequantized, constants, STAGES)
    first = dequantized(tg.load(gw[:, :, :, :, start], layout=words_tv), constants(start))
    odd_words = tg.load(gw[:, :, :, :, start + 1], layout=words_tv)
    even_words = tg.load(gw[:, :, :, :, start + 2], layout=words_tv)
    for p in tg.pipeline(start // 2, (steps + 1) // 2, stages=STAGES):
        odd_constants, even_constants, next_odd, next_even = _pair_inputs(
            ga, gw, words_tv, sa, sb, p, constants)
        tg.gemm(acc, first, sa[p])                       # step 2p
        second = dequantized(odd_words, odd_constants)   # while step 2p's wgmmas run
        tg.gemm(acc, second, sb[p])                      # step 2p + 1
        first = dequantized(even_words, even_constants)  # while step 2p + 1's run
        odd_words, even_words = next_odd, next_even
    return acc


def _pair_inputs(ga, gw, words_tv, sa, sb, p, constants):
    """What pair p of the paired loops reads besides its operands: steps 2p and 2p+1's
    activations copied into their stages, their groups' constants, and the next pair's
    words (loaded a pair ahead; past K the loads are masked)."""
    tg.copy(ga[:, :, 2 * p], sa[p])
    tg.copy(ga[:, :, 2 * p + 1], sb[p])
    odd_constants, even_constants = constants(2 * p + 1), constants(2 * p + 2)
    next_odd = tg.load(gw[:, :, :, :, 2 * p + 3], layout=words_tv)
    next_even = tg.load(gw[:, :, :, :, 2 * p + 4], layout=words_tv)
    return odd_constants, even_constants, next_odd, next_even


def _paired_scaled_after(ga, gw, words_tv, sa, sb, start, steps, acc, dequantized,
                         constants, STAGES: int):
    """`_paired_register_steps` with the scale on each step's f32 sum (SCALE_AFTER, one
    group a step): the MMA takes w − zero into a fresh sum, which the row's scale
    multiplies as it is added — 8 FFMAs a thread at 16 tokens instead of one HMUL2 a
    weight pair (2.86 SASS a weight in the loop at 16 tokens, 3.17 without), and no
    scaled weight rounded. Step 2p's sum is added after step 2p+1's operand is
    dequantized, so its wait still closes the first gemm's pipeline stage before the
    second gemm (whose A registers the dequantization defined: C7513 otherwise); step
    2p+1's is added at the end of the body."""
    def unscaled(words, zero_scale):
        return dequantized(words, (zero_scale[0], None))

    first_zero, first_scale = constants(start)      # (names bound once: one is carried)
    first = dequantized(tg.load(gw[:, :, :, :, start], layout=words_tv), (first_zero, None))
    odd_words = tg.load(gw[:, :, :, :, start + 1], layout=words_tv)
    even_words = tg.load(gw[:, :, :, :, start + 2], layout=words_tv)
    for p in tg.pipeline(start // 2, (steps + 1) // 2, stages=STAGES):
        odd_constants, even_constants, next_odd, next_even = _pair_inputs(
            ga, gw, words_tv, sa, sb, p, constants)
        even_sum = tg.zeros(acc.shape, f32)
        tg.gemm(even_sum, first, sa[p])                      # step 2p
        second = unscaled(odd_words, odd_constants)          # while its wgmmas run
        acc = acc + even_sum * first_scale.to(f32)           # waits for them
        odd_sum = tg.zeros(acc.shape, f32)
        tg.gemm(odd_sum, second, sb[p])                      # step 2p + 1
        first = unscaled(even_words, even_constants)         # while its wgmmas run
        first_scale = even_constants[1]
        acc = acc + odd_sum * odd_constants[1].to(f32)
        odd_words, even_words = next_odd, next_even
    return acc


def _gemm_parts(acc, words_stages, activation_stages, words_tv, constants, dequantized,
                dtype: DType, scale_after: bool, fractional_zero: bool):
    """acc after one k-step's gemms from the rings' stages, part by part (one part, or
    one a group with SCALE_AFTER): acc += dequant(w) @ activations.T."""
    for part, (stage, activations) in enumerate(zip(words_stages, activation_stages)):
        words = tg.load(stage, layout=words_tv)
        if scale_after:
            acc = _gemm_scaled_after(acc, words, constants[part], activations, dtype,
                                     fractional_zero)
        else:
            tg.gemm(acc, dequantized(words, constants[part]), activations)
    return acc


@lru_cache(maxsize=None)   # one kernel object per variant: its compiled builds and replays
def w4a16_fragment_kernel(dtype: DType, has_zeros: bool, partial: bool = False,
                          fused: bool = False) -> tg.Kernel:
    """cᵀ (N, M) = dequant(w) (N, K) @ aᵀ in (64·WG, BT) tiles, the weights in fragment
    order (`pack_fragments`): each k-step one 16-byte load per thread and stored block of
    the weights (KS blocks along K), dequantized in registers into the MMA's register A
    operand; the activations (BT tokens by 64·KS k) the shared B operand, both in a
    STAGES-deep ring. WG warpgroups (threads = 128·WG, `fragment_config`) each take 64
    of the block's rows and share its activation tiles (at 128 tokens the activations
    re-read by every row block are 8x the weights' bytes). `partial`: split K, SPLIT
    slices of the k-steps (the grid's axis 2: a launch value, one build for every
    split) into an f32 workspace that `w4a16_split_sum_kernel` sums; `fused`: the same
    split, its sum by the last block of each tile to arrive (`_store_and_sum_last`: one
    launch, arguments a, w, scales, zeros, the workspace, an i32 counter a tile holding 0,
    c). SCALE_AFTER
    (cp.async weights, G ≥ 64): the scale multiplies each group's f32 sums
    (`_gemm_scaled_after`), a step of several groups taken in parts of one group
    (rings, gemm and sum each): one FMA a thread and 2 tokens instead of one HMUL2 a
    weight pair (SASS a weight at 16 tokens: benchmarks/w4a16_sass.py). INTEGER_ZEROS:
    the zeros are integers (`zeros_are_integers`), no residue step (`dequantize_in`).
    PAIRS (with WSMEM=0): two k-steps an iteration, two register A operands, so the
    warp-specialized consumer's wgmmas are not serialized (`_paired_register_steps`);
    with SCALE_AFTER (one group a step) the scale on each step's f32 sum."""
    out_type = f32 if partial else dtype
    constexpr_names = ("G", "BT", "STAGES", "WSMEM", "KS", "WG", "SCALE_AFTER",
                       "INTEGER_ZEROS", "PAIRS")
    if fused:
        @tg.kernel(threads=128)
        def w4a16_fragment_fused(a: tg.Tensor[dtype], w: tg.Tensor[i32, 4],
                                 scales: tg.Tensor[dtype], zeros: tg.Tensor[dtype],
                                 parts: tg.Tensor[f32], counters: tg.Tensor[i32, 1],
                                 c: tg.Tensor[dtype], G: tg.constexpr = 128,
                                 BT: tg.constexpr = 64, STAGES: tg.constexpr = 3,
                                 WSMEM: tg.constexpr = 1, KS: tg.constexpr = 1,
                                 WG: tg.constexpr = 1, SCALE_AFTER: tg.constexpr = 0,
                                 INTEGER_ZEROS: tg.constexpr = 0, PAIRS: tg.constexpr = 0):
            values = dict(zip(constexpr_names, (G, BT, STAGES, WSMEM, KS, WG, SCALE_AFTER,
                                                INTEGER_ZEROS, PAIRS)))
            acc, n, t = _fragment_product(a, w, scales, zeros, dtype, has_zeros, True,
                                          **values)
            _store_and_sum_last(acc, parts, counters, c, w, n, t, dtype, WG)

        return w4a16_fragment_fused

    @tg.kernel(threads=128)
    def w4a16_fragment(a: tg.Tensor[dtype], w: tg.Tensor[i32, 4], scales: tg.Tensor[dtype],
                       zeros: tg.Tensor[dtype], c: tg.Tensor[out_type], G: tg.constexpr = 128,
                       BT: tg.constexpr = 64, STAGES: tg.constexpr = 3,
                       WSMEM: tg.constexpr = 1, KS: tg.constexpr = 1, WG: tg.constexpr = 1,
                       SCALE_AFTER: tg.constexpr = 0, INTEGER_ZEROS: tg.constexpr = 0,
                       PAIRS: tg.constexpr = 0):
        values = dict(zip(constexpr_names, (G, BT, STAGES, WSMEM, KS, WG, SCALE_AFTER,
                                            INTEGER_ZEROS, PAIRS)))
        acc, n, t = _fragment_product(a, w, scales, zeros, dtype, has_zeros, partial,
                                      **values)
        _store_result(acc, c, w, n, t, dtype, partial, WG)

    return w4a16_fragment


def _fragment_product(a, w, scales, zeros, dtype: DType, has_zeros: bool, split: bool,
                      G: int, BT: int, STAGES: int, WSMEM: int, KS: int, WG: int,
                      SCALE_AFTER: int, INTEGER_ZEROS: int, PAIRS: int = 0):
    """The fragment kernel's body up to its f32 cᵀ tile (`w4a16_fragment_kernel` says
    what each constexpr does): (acc, row tile n, token tile t); `split`: this block's
    slice of the k-steps only (grid axis 2)."""
    n, t = tg.block_id(0), tg.block_id(1)
    fractional = has_zeros and not INTEGER_ZEROS   # residue step needed (`dequantize_in`)
    BN = FRAGMENT_ROWS * WG                    # weight rows per block: WG row blocks
    BK = FRAGMENT_K * KS                       # k per step: KS stored blocks
    # SCALE_AFTER: a step of several groups in parts of one group (each its own rings,
    # gemm and f32 sum); otherwise one part, S groups (2 for G = 32)
    P = max(1, BK // G) if SCALE_AFTER else 1
    PK = BK // P                               # k per part
    S = max(1, PK // G)                        # groups per part
    steps, start = a.tile((BT, BK), (t, None)).shape[2], 0
    ga = a.tile((BT, PK), (t, None))
    gw = w.tile((WG, KS // P) + STORED_WORDS, (n, None, 0, 0))
    words_tv = stored_tv(KS // P, WG)
    paired = PAIRS and not WSMEM
    if split:
        start, steps = _split_slice(steps, even=paired)
    acc = tg.zeros((BN, BT), f32)                       # cᵀ: weight rows x tokens
    sa = [tg.shared((BT, PK), dtype, stages=STAGES) for _ in range(2 if paired else P)]

    def dequantized(words, constants):   # the (BN, PK) weights of one part
        packed = tg.reshape(fragment_weights(words, dtype), (BN, S, PK // S))
        return tg.reshape(dequantize_in(packed, *constants, fractional), (BN, PK))

    def constants(k):                     # step k's zeros and scales, a part each (loads)
        return [group_constants(dtype, scales, zeros if has_zeros else None, n,
                                (k * P + part) // max(1, G // PK), (BN, S))
                for part in range(P)]

    if paired:  # two steps an iteration, two register operands
        return _paired_register_steps(ga, gw, words_tv, sa[0], sa[1], start, steps, acc,
                                      dequantized, lambda k: constants(k)[0],
                                      STAGES, bool(SCALE_AFTER)), n, t
    if WSMEM:   # copied STAGES-1 k-steps ahead like the activations (cp.async)
        sw = [tg.shared((WG, KS // P) + STORED_WORDS, i32, stages=STAGES,
                        layout=stored_shared(KS // P, WG)) for _ in range(P)]
        # scales and zeros a k-step ahead too (a DRAM miss in the step's path otherwise)
        ahead_constants = constants(start)
    else:       # in registers: step k+1 dequantized while step k's wgmmas run
        current = dequantized(tg.load(gw[:, :, :, :, start], layout=words_tv),
                              constants(start)[0])
        ahead = tg.load(gw[:, :, :, :, start + 1], layout=words_tv)
    for k in tg.pipeline(start, steps, stages=STAGES):
        for part in range(P):
            tg.copy(ga[:, :, k * P + part], sa[part][k])
        if WSMEM:
            for part in range(P):
                tg.copy(gw[:, :, :, :, k * P + part], sw[part][k])
            following_constants = constants(k + 1)              # past K: masked, unused
            acc = _gemm_parts(acc, [ring[k] for ring in sw], [ring[k] for ring in sa],
                              words_tv, ahead_constants, dequantized, dtype,
                              SCALE_AFTER, fractional)
            ahead_constants = following_constants
        else:   # loads first, then the gemm, then register work only (overlaps it)
            following_constants = constants(k + 1)[0]           # past K: masked, unused
            after = tg.load(gw[:, :, :, :, k + 2], layout=words_tv)
            tg.gemm(acc, current, sa[0][k])
            current = dequantized(ahead, following_constants)
            ahead = after
    return acc, n, t


def _store_and_sum_last(acc, parts, counters, c, w, n, t, dtype: DType, WG: int) -> None:
    """Split K in one launch: the block's f32 cᵀ tile into slice z of the workspace
    `parts`, then the tile's last block to arrive (`tg.last_arrival` on the tile's counter,
    which it leaves at 0 again) adds the SPLIT slices in slice order — the same sum, in
    the same order, as `w4a16_split_sum_kernel`, whichever block is last — rounds it once
    to `dtype` and stores it (rearranged: c's rows are tokens). Not a tuner candidate: on
    the H100 (session 13, round 1) it was slower than the two launches at every split
    pick measured — 14.9 / 13.0 µs at 16x4096x4096 split 4, 24.7 / 22.1 at 16x4096x14336,
    31.8 / 20.2 at 128x4096x4096, 37.7 / 32.5 at 64x14336x4096 (WG=2, split 2): the last
    block reads the slices one after another while every other block idles, where the
    sum kernel reads them with the whole GPU."""
    row_tiles = (w.shape[0] + WG - 1) // WG     # slice z: tile rows z·row_tiles…
    splits = tg.num_programs(2)
    tg.copy(acc, parts.tile(acc.shape, (tg.block_id(2) * row_tiles + n, t)))
    counter = counters.tile((1,), (n * tg.num_programs(1) + t,))
    with tg.if_(tg.last_arrival(counter, splits)):
        total = tg.load(parts.tile(acc.shape, (n, t)))
        for z in tg.range(1, splits):
            total = total + tg.load(parts.tile(acc.shape, (z * row_tiles + n, t)))
        tg.copy(tg.rearrange(total.to(dtype)), c.T.tile(acc.shape, (n, t)))


def _store_result(acc, c, w, n, t, dtype: DType, partial: bool, WG: int) -> None:
    """The block's (BN, BT) f32 cᵀ tile out: into split K's f32 workspace, or rounded to
    `dtype` and rearranged through shared memory (c's rows are tokens: 16-byte stores)."""
    if partial:
        row_tiles = (w.shape[0] + WG - 1) // WG     # slice z: tile rows z·row_tiles…
        tg.copy(acc, c.tile(acc.shape, (tg.block_id(2) * row_tiles + n, t)))
    else:
        tg.copy(tg.rearrange(acc.to(dtype)), c.T.tile(acc.shape, (n, t)))


def fragment_config(m: int, n: int, k: int, group_size: int, **tiles: int
                    ) -> tuple[tuple[int, ...], dict]:
    """(grid, constexprs) of the fragment kernel for an (M, N, K) product: 64·WG weight
    rows by BT tokens a block (`quant.token_tile`), SPLIT slices of K along grid axis 2;
    WG > 1 sets the block's threads to 128·WG (one warpgroup per 64 rows)."""
    from tegula.kernels.quant import token_tile
    constexprs = dict(G=group_size, BT=token_tile(m), STAGES=3, SPLIT=1)
    constexprs.update(tiles)
    if constexprs.get("SCALE_AFTER") and constexprs.get("PAIRS") and \
            FRAGMENT_K * constexprs.get("KS", 1) > group_size:
        raise ValueError(f"tegula.kernels.w4a16: SCALE_AFTER=1 with PAIRS=1 takes one group "
                         f"a k-step: KS={constexprs.get('KS', 1)} stored blocks of "
                         f"{FRAGMENT_K} k span more than group_size = {group_size}")
    if constexprs.get("SCALE_AFTER") and (group_size < FRAGMENT_K or not (
            constexprs.get("WSMEM", 1) or constexprs.get("PAIRS"))):
        raise ValueError(f"tegula.kernels.w4a16: SCALE_AFTER=1 needs groups of whole "
                         f"stored blocks (group_size = {group_size} ≥ {FRAGMENT_K}: each "
                         f"group's gemm takes 64-k blocks) and the cp.async weights "
                         f"(WSMEM=1) or PAIRS=1")
    if constexprs.get("PAIRS") and constexprs.get("WSMEM", 1):
        raise ValueError("tegula.kernels.w4a16: PAIRS=1 (two k-steps an iteration, two "
                         "register operands) takes the weights straight into registers: "
                         "pass WSMEM=0")
    row_groups = constexprs.get("WG", 1)
    if row_groups > 1:
        if constexprs.setdefault("threads", 128 * row_groups) != 128 * row_groups:
            raise ValueError(f"tegula.kernels.w4a16: WG={row_groups} warpgroups of weight "
                             f"rows need threads={128 * row_groups}, got "
                             f"threads={constexprs['threads']}")
    grid = (-(-n // (FRAGMENT_ROWS * row_groups)), -(-m // constexprs["BT"]))
    return (grid + (constexprs["SPLIT"],) if constexprs["SPLIT"] > 1 else grid), constexprs


#: Split-K factors the tuner may time, each kept where the grid gets at least one block an
#: SM and at most MAX_WAVES blocks an SM (four fit by registers at 16 tokens) and each
#: slice keeps two k-steps. The split is a launch value (the grid's axis 2): one build
#: serves them all, so each costs the tuner one timing, not a compile.
SPLITS, MAX_WAVES = (2, 3, 4, 6, 8), 8


def fragment_candidates(m: int, n: int | None = None, k: int | None = None,
                        sms: int = 132, group_size: int = 128) -> list[dict]:
    """The fragment kernel's configs worth timing (pre-packed weights) for an (M, N, K)
    product on `sms` SMs, from the H100 sweeps of sessions 8-11 (`docs/performance.md`).
    At 16 tokens the weights and activations ride a cp.async ring (session 10: the
    one-role TMA ring 20-30% slower, its per-step block barrier waiting on the issuing
    warp), four stored 64-k blocks a step (KS=4; KS=2 kept at split 4), 3 stages, split K
    by the grid (`SPLITS`: 1.7 waves of 4 blocks an SM at 16x14336x4096 with split 4, whose
    ncu shows 64% issue-active — the kernel issues about as fast as it can), and where the
    row tiles fill the SMs unsplit, a 6-stage ring in one launch (no split sum: 25.1 µs
    against ~24 split 4 at 16x14336x4096). Beyond 16 tokens both operands through the
    TMA ring (2-3 stages; split 4 best at 128x4096x4096, 21.1 µs), the weights straight
    into registers (WSMEM=0: 1.34x torch at 64x14336x4096), or a cp.async ring; 64-token
    tiles at 128. Without (N, K) the splits are session 10's fixed ones. Session 12 (group
    ≥ 128): each 16-token ring again with the scale on each group's f32 sums (SCALE_AFTER
    at KS=4: two parts a step, 3.39 SASS a weight against 3.71), and two warpgroups of
    rows a block (WG=2, 8 warps: the kernel is latency-bound at ~2 warps a scheduler;
    21.5 µs unsplit at 16x14336x4096), split where the 128-row tiles are few; WG=2 at 64
    tokens (1.39x at 64x14336x4096). (SCALE_AFTER at KS=2 lost to KS=4 in session 9.)"""
    from tegula.kernels.quant import token_tile
    from tegula.kernels.quant_gemv import gemv_candidates
    bt, base = token_tile(m), dict(FRAGMENT=1, warp_specialize=False, KS=2)
    # at one token also the CUDA-core GEMV kernel on the same words (quant_gemv: as many
    # warps as the SMs hold, where the tensor-core kernel has N/16 warps in all; ahead at
    # 1x4096x4096, behind at the wider shapes: session 13, round 1)
    gemv = gemv_candidates(m, n, k, sms, group_size)
    token_tiles = -(-m // bt)

    def splits(step_k: int, fixed: tuple) -> tuple:
        if n is None or k is None:
            return fixed
        row_tiles, steps = -(-n // FRAGMENT_ROWS) * token_tiles, -(-k // step_k)
        return tuple(s for s in SPLITS if sms <= row_tiles * s <= MAX_WAVES * sms
                     and steps >= 2 * s) or fixed

    def wide_splits() -> tuple:   # two warpgroups' 128-row tiles: at most 2 blocks an SM
        if n is None or k is None:
            return (1,)
        row_tiles, steps = -(-n // (2 * FRAGMENT_ROWS)) * token_tiles, -(-k // 256)
        return tuple(s for s in (1, 2, 4) if row_tiles * s <= 2 * sms and steps >= 2 * s)

    if bt <= 16:
        ring = dict(base, BT=bt, load_path="cp.async")
        configs = [dict(ring, KS=4, STAGES=3, SPLIT=s) for s in splits(256, (3, 4))]
        if n is not None and -(-n // FRAGMENT_ROWS) >= sms:
            configs.append(dict(ring, KS=4, STAGES=6, SPLIT=1))
        if group_size >= 128:   # the same with the scale on each group's f32 sums (two
            # parts a step): ~10% fewer SASS a weight than scaling every pair, and two
            # warpgroups of rows a block (8 warps: the kernel is latency-bound at ~2
            # warps a scheduler), unsplit or split where the 128-row tiles are few
            # (session 12, H100: 21.5 µs at 16x14336x4096, was 24.7)
            configs += [dict(c, SCALE_AFTER=1) for c in configs]
            configs += [dict(ring, KS=4, STAGES=4, WG=2, SCALE_AFTER=1, SPLIT=s)
                        for s in wide_splits()]
        if m <= 8 and n is not None and -(-n // FRAGMENT_ROWS) >= sms and group_size >= 128:
            # 8-token tiles (wgmma n8): 21.0 against 21.7 µs at 1x14336x4096 (session 14)
            configs.append(dict(ring, BT=8, KS=4, STAGES=6, SPLIT=1, SCALE_AFTER=1))
        return gemv + configs + [dict(ring, STAGES=4, SPLIT=4)]
    configs = _paired_candidates(base, bt, m, n, k, sms)
    configs += [dict(base, BT=bt, STAGES=3, SPLIT=2, WSMEM=0),
               dict(base, BT=bt, STAGES=2, SPLIT=2),
               dict(base, BT=bt, STAGES=3, SPLIT=2, load_path="cp.async")]
    configs += [dict(base, BT=bt, STAGES=3, SPLIT=s) for s in splits(128, (2, 4))]
    if bt > 64:
        configs.append(dict(base, BT=64, STAGES=3, SPLIT=4))
    else:   # 128 rows a block: half the activations' L2 re-reads (session 12: 32.5 µs at
        configs.append(dict(base, BT=bt, STAGES=3, SPLIT=2, WG=2))   # 64x14336x4096, was 35.3)
    return configs


def _paired_candidates(base: dict, bt: int, m: int, n: int | None, k: int | None,
                       sms: int) -> list[dict]:
    """Beyond 16 tokens: PAIRS (`_paired_register_steps`) on two warpgroups of rows, the
    tokens through the warp-specialized TMA ring (one block an SM by registers), unsplit or
    split K where the 128-row tiles are fewer than the SMs (slices of at least two pairs),
    and at 128 tokens 64-token tiles.
    Session 14 (H100, round 1): 29.0 µs at 64x14336x4096 against 33.6 for session 13's
    pick (1.58x torch f16); at 128x4096x4096 21.8 against 20.6 (split 4)."""
    if n is None or k is None:
        return []
    row_tiles = -(-n // (2 * FRAGMENT_ROWS)) * -(-m // bt)
    steps = -(-k // (2 * FRAGMENT_K))
    paired = dict(base, WSMEM=0, PAIRS=1, warp_specialize=True, STAGES=3, WG=2)
    configs = [dict(paired, BT=bt, SPLIT=s) for s in (1, 2, 4)
               if s == 1 or (row_tiles * s <= 2 * sms and steps >= 4 * s)]
    if bt > 64:    # 64-token tiles: twice the blocks (round 2, H200: 128-token tiles won)
        configs.append(dict(paired, BT=64, SPLIT=1))
    return configs


#: zeros_are_integers' answers: id(zeros) -> (weak reference, version, data pointer, answer)
_INTEGER_ZEROS: dict = {}


def zeros_are_integers(zeros: Any) -> bool:
    """Whether every zero point of a torch tensor is an integer (what `quantize_w4`
    writes), so that the fragment kernel may skip the residue step of `dequantize_in`
    (INTEGER_ZEROS=1: one HADD2 a weight pair less). Checked on the device once per
    tensor and version: the answer is kept with a weak reference, torch's version counter
    (bumped by every in-place write, shared by views) and the data pointer, and checked
    again when any of them changed. False (the exact path for any zeros) for what cannot
    be tracked so: inference-mode tensors (no version counter) and non-tensors."""
    import weakref
    try:
        version, pointer = zeros._version, zeros.data_ptr()
    except (AttributeError, RuntimeError):      # not a tensor; an inference tensor
        return False
    key = id(zeros)
    kept = _INTEGER_ZEROS.get(key)
    if kept is not None and kept[0]() is zeros and kept[1:3] == (version, pointer):
        return kept[3]
    try:   # NaN != NaN: a NaN zero is no integer; a wrong type is the checks' to name
        answer = bool((zeros == zeros.round()).all())
    except (RuntimeError, TypeError):
        return False
    reference = weakref.ref(zeros, lambda _: _INTEGER_ZEROS.pop(key, None))
    _INTEGER_ZEROS[key] = (reference, version, pointer, answer)
    return answer


def launch_w4a16_fragment(grid: tuple, constexprs: dict, dtype: DType, has_zeros: bool,
                          operands: tuple, c: Any, launch: Any, empty_f32: Any,
                          zeroed_counters: Any = None) -> Any:
    """Run the fragment kernel (`launch(kernel, grid, args, constexprs)`) on `operands`
    (a, fragment-ordered weights, scales, zeros) into c; with SPLIT > 1 into an f32
    workspace from `empty_f32(shape)` that `w4a16_split_sum_kernel` adds into c, or with
    FUSED=1 that the last block of each tile adds in the same launch (its counters, one
    i32 a tile, from `zeroed_counters(size)`: zeros, each launch leaves them zero; launches
    sharing them must not overlap)."""
    from tegula.kernels.quant import launch_split_sum
    split, fused = constexprs.get("SPLIT", 1), constexprs.get("FUSED", 0)
    # SPLIT is the grid's axis 2, not a kernel constexpr: one build serves every split
    constexprs = {name: value for name, value in constexprs.items()
                  if name not in ("SPLIT", "FUSED")}
    if fused and split > 1:
        if zeroed_counters is None:
            raise ValueError("tegula.kernels.w4a16: FUSED=1 needs zeroed counters (one i32 "
                             "a tile), and this caller gives none")
        m, n = c.shape
        parts = empty_f32((split * grid[0] * FRAGMENT_ROWS * constexprs.get("WG", 1), m))
        return launch(w4a16_fragment_kernel(dtype, has_zeros, partial=True, fused=True),
                      grid, (*operands, parts, zeroed_counters(grid[0] * grid[1]), c),
                      constexprs)
    if split == 1:
        return launch(w4a16_fragment_kernel(dtype, has_zeros), grid, (*operands, c),
                      constexprs)
    m, n = c.shape
    rows = FRAGMENT_ROWS * constexprs.get("WG", 1)     # per block
    parts = empty_f32((split * grid[0] * rows, m))
    launch(w4a16_fragment_kernel(dtype, has_zeros, partial=True), grid, (*operands, parts),
           constexprs)
    return launch_split_sum(dtype, split, parts, c, launch)


__all__ = ["fragment_config", "zeros_are_integers", "launch_w4a16_fragment", "fragment_candidates", "SPLITS", "FRAGMENT_ROWS", "FRAGMENT_K", "FRAGMENT_SPLIT", "FRAGMENT_PERM", "MAGIC", "as_words", "stored_tv", "stored_shared", "fragment_shape",
           "pack_fragments", "unpack_fragments", "fragment_weights", "w4a16_fragment_kernel"]
