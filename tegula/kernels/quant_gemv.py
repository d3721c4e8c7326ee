"""W4A16 for one to a few tokens on the CUDA cores, on the weights `pack_fragments` stores
for the tensor-core kernel (issue 13): the GEMV of the pre-packed format.

At one token the fragment kernel (`quant_fragment.w4a16_fragment_kernel`) pads the
tokens to wgmma's 16 and gives each warp 16 weight rows over all of K: N/16 warps in all
(896 at N = 14336, 1.7 a scheduler), each a chain of dependent steps, so the H100 issues
at ~45% and the weights stream at ~48% of copy (session 12). Here the products are f32
multiply-adds on the CUDA cores, so nothing ties a thread to a wgmma tile: a block takes
16·RW weight rows (RW of the four warps' row quarters of a stored 64-row block) by KS
stored 64-k blocks a step, thread (run, kb) the run of block kb — the same 16-byte load
of 32 nibbles as the tensor-core kernel, two rows by 16 k — so the K of each step is
split over KS warps and the block's threads, 32·RW·KS, are as many as the SM can hold.
Each thread sums its own products in f32 across the steps; the sum over the threads of
a row (four lanes, and the KS warps) happens once, after the loop.

A weight: one lop3 a pair (magic + w in f16x2, as `quant_fragment.fragment_weights`), one
HSUB2 a pair (w − round(zero), exact), one conversion to f32 (and for fractional zeros
one FADD of the residue), and one FFMA a token; the scale multiplies each group's f32
sums. w − zero is exact and the sums are f32 throughout: no dequantized weight, product
or partial sum is rounded to 16 bits (the tensor-core kernels round each dequantized
weight once).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import tegula as tg
from tegula import f32, i32
from tegula.dtypes import DType
from tegula.layout.cute import Layout
from tegula.kernels.quant_fragment import FRAGMENT_K, NIBBLE_SLOTS, STORED_WORDS

#: Weight rows of one warp's quarter of a stored 64-row block (runs 32w … 32w + 31): a block's.
QUARTER_ROWS = 16


def words_tv(blocks: int, warps: int) -> Layout:
    """How a (1, KS, 32, 4) tile of words (KS stored blocks along K, one row quarter's 32
    runs) is spread over 32·KW threads: lane `run` of warp kw holds that run's four words
    of blocks U·kw … U·kw + U − 1 (U = KS/KW; one 16-byte load each); a warp's lanes read
    512 consecutive bytes a block. (Tile coordinates column-major: row block, block, run,
    word.)"""
    per_warp = blocks // warps
    return Layout(((32, warps), (4, per_warp)), ((blocks, per_warp), (32 * blocks, 1)))


def constants_tv(blocks: int, warps: int, groups: int) -> Layout:
    """How an (8, S) tile of scales (zeros) — rows 8i … 8i + 7 of the quarter, S groups a
    step — is loaded: lane 4r + c of warp kw holds row r of the groups of its blocks, what
    `_slot_pairs` wants: no conversion in the loop. (Coordinates column-major: row +
    8·group.)"""
    per_warp, per_group = blocks // warps, blocks // groups
    if per_warp <= per_group:    # a warp's blocks in one group: per_group/per_warp warps share it
        return Layout(((4, 8, per_group // per_warp, groups), 1), ((0, 1, 0, 8), 0))
    spanned = per_warp // per_group                  # groups a warp's blocks span
    return Layout(((4, 8, warps), spanned), ((0, 1, 8 * spanned), 8))


def activations_tv(blocks: int, warps: int) -> Layout:
    """How one token's (1, 4·KS, 1, 8) activations of a step and pair half h are loaded
    (a's (M, K/16, 2, 8) view: k = 16q + 8h + 2c + j, q = 4·kb + s): lane 4r + c of warp
    kw holds the 8 k of each of its blocks kb that its weights meet, 64·kb + 16s + 8h +
    2c + j (pairs j adjacent: 4-byte loads), the same for the lanes of every r."""
    per_warp = blocks // warps
    return Layout(((4, 8, warps), (2, 4, per_warp)),
                  ((8 * blocks, 0, 4 * per_warp), (4 * blocks, 1, 4)))


def _slot_pairs(words: Any, dtype: DType, slot: int, groups: int) -> Any:
    """Pair slot p = 2h + i of the loaded (1, KS, 32, 4) words as magic + w in `dtype`,
    shaped (S, KS/S, r 8, c 4, s 4, j 2): weight row 8i + r of the quarter, k = 64·kb +
    16s + 8h + 2c + j of the step. One lop3 a word after at most one shift
    (`NIBBLE_SLOTS`)."""
    shift, mask, magic, _ = NIBBLE_SLOTS[dtype.name][slot]
    blocks = words.shape[1]
    words = tg.reshape(words, (blocks, 8, 4, 4))
    bits = ((words // (1 << shift) if shift else words) & mask) | magic
    return tg.reshape(tg.bitcast(bits, dtype), (groups, blocks // groups, 8, 4, 4, 2))


def _unscaled(pairs: Any, zero: Any, slot: int, fractional: bool) -> Any:
    """w − zero in f32, exact: (magic + w) − (magic + zero) in 16 bits with the slot's
    magic (f16: 1024 or 64, read in place; bf16 128) — one HSUB2 a pair, exact: magic +
    zero rounds the zero to the magic's grid (the reasoning of
    `quant_fragment.dequantize_in`) — converted to f32, then a fractional zero's residue
    zero − round(zero) subtracted in f32 (one FADD a weight: in 16 bits w − zero would
    round where the zero has more fraction bits than 16 bits hold beside w)."""
    magic = NIBBLE_SLOTS[zero.dtype.name][slot][3]
    magic_zero = zero + magic
    unscaled = (pairs - magic_zero).to(f32)
    if fractional:
        unscaled = unscaled - (zero - (magic_zero - magic)).to(f32)
    return unscaled


def _row_constants(tile: Any) -> Any:
    """A loaded (8, S) tile of per-row, per-group values arranged to broadcast against
    `_slot_pairs`: (S, 1, 8, 1, 1, 1)."""
    return tg.permute(tile, (1, 0))[:, None, :, None, None, None]


def _row_scale(tile: Any) -> Any:
    """A loaded (8, S) tile of scales in f32, arranged against a row's per-step sums (S,
    KS/S, 8, c 4, 1)."""
    return tg.permute(tile.to(f32), (1, 0))[:, None, :, None, None]


def _activations(tile: Any, groups: int, blocks: int) -> Any:
    """A loaded (1, 4·KS, 1, 8) activation tile (`activations_tv`) in f32, arranged to
    broadcast against `_slot_pairs`: (S, KS/S, 1, c 4, s 4, j 2)."""
    row = tg.reshape(tile.to(f32), (groups, blocks // groups, 4, 4, 2))   # (.., s, c, j)
    return tg.permute(row, (0, 1, 3, 2, 4))[:, :, None, :, :, :]


def activation_quads(a: Any) -> Any:
    """a (M, K) as the (M, K/16, 2, 8) view the GEMV kernel reads (numpy or torch; K a
    multiple of 16, which whole groups give)."""
    m, k = a.shape
    return a.reshape(m, k // 16, 2, 8)


def _row_half_constants(scales: Any, zeros: Any, dtype: DType, b: Any, group: Any,
                        groups: int, layout: Layout) -> list:
    """[zero, scale] of rows 0-7, then of rows 8-15, of quarter `b`: (8, S) tiles at group
    block `group` (S = `groups` a step), loaded as `constants_tv` says (zeros None: the
    symmetric zero point)."""
    from tegula.kernels.quant import SYMMETRIC_ZERO
    shape, loaded = (8, groups), []
    for i in range(2):
        scale = tg.load(scales.tile(shape, (2 * b + i, group)), layout=layout)
        zero = (tg.load(zeros.tile(shape, (2 * b + i, group)), layout=layout)
                if zeros is not None else tg.full(shape, SYMMETRIC_ZERO, dtype, layout=layout))
        loaded += [zero, scale]
    return loaded


def _step_sums(sums: list, words: Any, constants: list, acts: list, dtype: DType,
               groups: int, fractional: bool) -> list:
    """The per-(token, row half) f32 sums after one k-step: per pair slot, w − zero times
    the activations summed over the thread's (s, j) — one axis, so one FFMA chain (two
    sums would add the pairs' sums with FADDs) — and the row's scale on the step's sum."""
    blocks = words.shape[1]
    flat = (groups, blocks // groups, 8, 4, 8)
    sums = list(sums)
    for i in range(2):                                 # rows 8i + r of the quarter
        zero, scale = _row_constants(constants[2 * i]), _row_scale(constants[2 * i + 1])
        unscaled = [_unscaled(_slot_pairs(words, dtype, 2 * h + i, groups), zero, 2 * h + i,
                              fractional) for h in range(2)]
        for t, token_acts in enumerate(acts):
            part = None
            for h in range(2):
                products = tg.sum(tg.reshape(unscaled[h] * token_acts[h], flat), 4)
                part = products if part is None else part + products
            sums[2 * t + i] = sums[2 * t + i] + part * scale
    return sums


def _store_sums(sums: list, c: Any, n: Any, quarters: list, tokens: int, row_quarters: int,
                dtype: DType, partial: bool) -> None:
    """Each quarter's rows out, once: a row's sums added over the threads holding it (four
    lanes c, the KW warps) and the step's blocks, rounded once to `dtype` into c, or
    (`partial`) into slice z of the f32 workspace (rows of a slice: N rounded up to the
    block's 16·RW)."""
    row_tiles = tg.cdiv(n, QUARTER_ROWS * row_quarters) * 2 * row_quarters   # 8-row tiles
    for v, q in enumerate(quarters):
        for t in range(tokens):
            for i in range(2):
                summed = sums[2 * tokens * v + 2 * t + i]
                total = tg.reshape(tg.sum(tg.sum(tg.sum(summed, 3), 1), 0), (8,))
                if partial:
                    tg.copy(total, c.tile((8, 1), (tg.block_id(2) * row_tiles + 2 * q + i,
                                                   t))[:, 0])
                else:
                    tg.copy(total.to(dtype), c.T.tile((8, 1), (2 * q + i, t))[:, 0])


def _step_activations(ga, sa, loaded, k, pairs, acts_tv) -> tuple[list, list | None]:
    """Step k's activation tiles of `w4a16_fragment_gemv_kernel`, and with AHEAD the next
    step's: copied through the cp.async ring `sa` and read back (ASTAGES), the tiles
    `loaded` a step ago (AHEAD: the next step's loads issued now), or loaded now."""
    if sa is not None:
        for t, h in pairs:
            tg.copy(ga[t][h][:, :, :, :, k], sa[t][h][k])
        return [tg.load(sa[t][h][k], layout=acts_tv) for t, h in pairs], None
    if loaded is not None:
        return loaded, [tg.load(ga[t][h][:, :, :, :, k + 1], layout=acts_tv)
                        for t, h in pairs]
    return [tg.load(ga[t][h][:, :, :, :, k], layout=acts_tv) for t, h in pairs], None


@lru_cache(maxsize=None)   # one kernel object per variant: its compiled builds and replays
def w4a16_fragment_gemv_kernel(dtype: DType, has_zeros: bool, partial: bool = False
                               ) -> tg.Kernel:
    """c (M, N) = a @ dequant(w).T for M ≤ MT tokens on the CUDA cores, the weights in
    fragment order (`pack_fragments`, read as `as_words`), a as `activation_quads`. A
    block: RW quarters (16 rows each) of stored 64-row blocks by KS stored blocks a
    k-step, KW warps (threads 32·KW, `words_tv`) of KS/KW blocks each, a thread one run
    of each quarter at the same k (RW runs meet one load and conversion of its
    activations); the words two steps ahead
    in registers; the activations loaded from global memory each step, or with ASTAGES ≥
    2 through an ASTAGES-deep cp.async ring (read with ldmatrix; a block barrier a step),
    or with AHEAD=1 into registers a step before their use (their L2 latency off the
    step's path, ~13 registers more).
    Groups of G ≥ 64 (a stored block within one group). `partial`: split K over grid axis
    2 into an f32 workspace (`w4a16_split_sum_kernel` sums it)."""
    out_type = f32 if partial else dtype

    @tg.kernel(threads=128)
    def w4a16_fragment_gemv(a: tg.Tensor[dtype, 4], w: tg.Tensor[i32, 4],
                            scales: tg.Tensor[dtype], zeros: tg.Tensor[dtype],
                            c: tg.Tensor[out_type], G: tg.constexpr = 128,
                            MT: tg.constexpr = 1, KS: tg.constexpr = 4,
                            KW: tg.constexpr = 4, RW: tg.constexpr = 1,
                            INTEGER_ZEROS: tg.constexpr = 0,
                            ASTAGES: tg.constexpr = 0, AHEAD: tg.constexpr = 0):
        quarters = [tg.block_id(0) * RW + v for v in range(RW)]   # 16-row quarters
        BK = FRAGMENT_K * KS
        S = max(1, BK // G)                                 # groups a step
        fractional = has_zeros and not INTEGER_ZEROS
        gws = [w.tile((1, KS, 32, STORED_WORDS[1]), (q // 4, None, q % 4, 0))
               for q in quarters]
        ga = [[a.tile((1, 4 * KS, 1, 8), (t, None, h, 0)) for h in range(2)]
              for t in range(MT)]
        tv, acts_tv = words_tv(KS, KW), activations_tv(KS, KW)
        rows_tv = constants_tv(KS, KW, S)
        steps, start = gws[0].shape[4], 0
        if partial:
            splits = tg.num_programs(2)
            per_split = (steps + splits - 1) // splits
            start = tg.block_id(2) * per_split
            steps = tg.minimum(start + per_split, steps)

        def constants(k):   # step k's (zero, scale) tiles per quarter and row half; past K:
            group = k // max(1, G // BK) if S == 1 else k               # masked, unused
            return [x for q in quarters for x in _row_half_constants(
                scales, zeros if has_zeros else None, dtype, q, group, S, rows_tv)]

        sums = [tg.zeros((S, KS // S, 8, 4, 1), f32) for _ in range(2 * MT * RW)]
        pairs = [(t, h) for t in range(MT) for h in range(2)]
        # ASTAGES: activations through a cp.async ring (shared loads, no per-load address)
        sa = [[tg.shared((1, 4 * KS, 1, 8), dtype, stages=ASTAGES) for _ in range(2)]
              for _ in range(MT)] if ASTAGES else None
        current = [tg.load(gw[:, :, :, :, start], layout=tv) for gw in gws]
        ahead = [tg.load(gw[:, :, :, :, start + 1], layout=tv) for gw in gws]
        current_constants = constants(start)
        # AHEAD: a step's activations loaded a step ahead too (an L2 round trip)
        loaded = [tg.load(ga[t][h][:, :, :, :, start], layout=acts_tv)
                  for t, h in pairs] if AHEAD else None
        for k in (tg.pipeline(start, steps, stages=ASTAGES) if ASTAGES
                  else tg.range(start, steps)):
            after = [tg.load(gw[:, :, :, :, k + 2], layout=tv) for gw in gws]  # past K: masked
            following_constants = constants(k + 1)
            now, following_acts = _step_activations(ga, sa, loaded, k, pairs, acts_tv)
            acts = [[_activations(now[2 * t + h], S, KS) for h in range(2)]
                    for t in range(MT)]
            for v in range(RW):   # each quarter's runs meet the same activations
                own = slice(2 * MT * v, 2 * MT * (v + 1))
                sums[own] = _step_sums(sums[own], current[v],
                                       current_constants[4 * v:4 * v + 4], acts, dtype, S,
                                       fractional)
            for now_tile, following in zip(current + ahead + current_constants,
                                           ahead + after + following_constants):
                now_tile.assign(following)      # (register moves: loop-carried tiles)
            if AHEAD:
                for now_tile, following in zip(loaded, following_acts):
                    now_tile.assign(following)
        _store_sums(sums, c, scales.shape[0], quarters, MT, RW, dtype, partial)

    return w4a16_fragment_gemv


def gemv_config(m: int, n: int, k: int, group_size: int, **tiles: int
                ) -> tuple[tuple[int, ...], dict]:
    """(grid, constexprs) of the GEMV kernel for an (M, N, K) product: 16 weight rows by
    KS stored blocks a block, KW warps of KS/KW blocks each (threads 32·KW), SPLIT slices
    of K along grid axis 2."""
    constexprs = dict(G=group_size, MT=m, KS=8, SPLIT=1)
    constexprs.update(tiles)
    ks = constexprs["KS"]
    kw = constexprs.setdefault("KW", ks)
    powers = (1, 2, 4, 8, 16, 32, 64)
    if group_size < FRAGMENT_K or ks not in powers or kw not in powers or kw > ks:
        raise ValueError(f"tegula.kernels.w4a16: the GEMV kernel takes groups of whole "
                         f"stored blocks (group_size ≥ {FRAGMENT_K}, got {group_size}), KS "
                         f"stored blocks a step and KW ≤ KS warps, powers of two (got "
                         f"KS={ks}, KW={kw})")
    if constexprs["MT"] < m:
        raise ValueError(f"tegula.kernels.w4a16: the GEMV kernel's MT={constexprs['MT']} "
                         f"tokens are fewer than a's {m} rows")
    constexprs.setdefault("threads", 32 * kw)
    if constexprs["threads"] != 32 * kw:
        raise ValueError(f"tegula.kernels.w4a16: the GEMV kernel's KW={kw} warps need "
                         f"threads={32 * kw}, got threads={constexprs['threads']}")
    rw = constexprs.setdefault("RW", 1)
    if rw not in (1, 2, 4):
        raise ValueError(f"tegula.kernels.w4a16: the GEMV kernel's RW={rw} row quarters a "
                         f"block must be 1, 2 or 4")
    grid = (-(-n // (QUARTER_ROWS * rw)),)
    split = constexprs["SPLIT"]
    return (grid + (1, split) if split > 1 else grid), constexprs




#: Tokens up to which the GEMV kernel is offered: each token costs a thread one FFMA a
#: weight (and its activations' loads and conversions), where the tensor-core kernel
#: pays for 16 tokens at once (H100, session 13 round 1: 2 tokens 36.8 µs at 14336x4096,
#: the tensor-core kernel ~21 µs at 1-4).
MAX_GEMV_TOKENS = 1


def gemv_candidates(m: int, n: int | None, k: int | None, sms: int = 132,
                    group_size: int = 128) -> list[dict]:
    """The GEMV kernel's configs worth timing for an (M, N, K) product on pre-packed
    weights: none beyond MAX_GEMV_TOKENS or for groups of 32 (a stored block would span
    two). From the H100 sweep of session 13 (round 1, one token, against the tensor-core
    kernel's 13.7 / 21.5 / 22.1 / 19.9 µs): at 4096x4096 KS=8 over 8 warps 11.9 µs (1.57x
    torch f16), KS=16 over 4 warps 12.6, with the activations' 3-stage ring (ASTAGES) over
    8 warps 12.3; at 14336x4096 24.3 µs, 4096x14336 26.5 (ring, 4 warps), 11008x4096 26.7:
    there the tensor-core kernel stays ahead, and the tuner keeps it. KS=32 and split K
    lost everywhere. Round 2: two row quarters a thread (RW=2: 6.0 SASS a weight against
    7.3, its activations loaded and converted once for two runs; 96-98 registers) level
    at 14336x4096 (24.3 µs against 24.5); the activations a step ahead (AHEAD, +13
    registers) and 4-warp blocks (one wave at N = 14336) slower (25.5-51 µs): not offered.
    The entry point picked KS=8 over 8 warps at 1x4096x4096: 1.65x torch f16."""
    if m > MAX_GEMV_TOKENS or group_size < FRAGMENT_K:
        return []
    return [dict(GEMV=1, KS=8, KW=8), dict(GEMV=1, KS=4, KW=4, RW=2),
            dict(GEMV=1, KS=8, KW=8, RW=2), dict(GEMV=1, KS=16, KW=8, ASTAGES=3)]


def launch_w4a16_gemv(grid: tuple, constexprs: dict, dtype: DType, has_zeros: bool,
                      operands: tuple, c: Any, launch: Any, empty_f32: Any) -> Any:
    """Run the GEMV kernel (`launch(kernel, grid, args, constexprs)`) on `operands` (a as
    `activation_quads`, the words, scales, zeros) into c; with SPLIT > 1 into an f32
    workspace that `w4a16_split_sum_kernel` adds into c."""
    from tegula.kernels.quant import launch_split_sum
    split = constexprs.get("SPLIT", 1)
    constexprs = {name: value for name, value in constexprs.items()
                  if name not in ("SPLIT", "GEMV")}
    if split == 1:
        return launch(w4a16_fragment_gemv_kernel(dtype, has_zeros), grid, (*operands, c),
                      constexprs)
    m, n = c.shape
    rows = QUARTER_ROWS * constexprs.get("RW", 1)          # a block's
    parts = empty_f32((split * -(-n // rows) * rows, m))
    launch(w4a16_fragment_gemv_kernel(dtype, has_zeros, partial=True), grid,
           (*operands, parts), constexprs)
    return launch_split_sum(dtype, split, parts, c, launch)


__all__ = ["w4a16_fragment_gemv_kernel", "gemv_config", "gemv_candidates", "launch_w4a16_gemv",
           "words_tv", "constants_tv", "activations_tv", "activation_quads", "QUARTER_ROWS",
           "MAX_GEMV_TOKENS"]
