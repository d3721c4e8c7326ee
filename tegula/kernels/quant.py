"""W4A16: `c = a @ ((w_q - zeros) * scales).T`, 4-bit weights, f16/bf16 activations, f32
accumulation.

Weights are quantized per group of `group_size` (32, 64 or 128) consecutive elements along
K of each row of the (N, K) weight (AWQ/GPTQ style): element (n, k) has the scale and zero
point `scales[n, k // group_size]`, `zeros[n, k // group_size]`.

The layouts the kernels want (what `quantize_w4` and `prepack` write):

* `packed`: (N, K/2) uint8, tegula's u4 storage — element 2j of a row in the low nibble of
  byte j, element 2j+1 in the high nibble. The kernels read it as a `tg.Tensor[u4]`, 32
  consecutive weights of a row per thread: one 16-byte load (the divisibility facts of
  4-bit tensors go up to 32 elements, `synth/facts.py`). `prepack` is the one function
  that writes this order, so that a pre-packed order chosen by synthesis (the MMA's
  fragment order, issue 13) changes one function and the kernels' annotations.
* `scales`: (N, K/group_size) in the activations' dtype.
* `zeros`: (N, K/group_size) in the activations' dtype (a float zero point costs the
  kernel no conversion): `quantize_w4` writes the integers 0..15, and fractional zero
  points (HQQ style) are computed as exactly as integer ones (`quant_fragment.
  dequantize_in`), at one more HADD2 a weight pair, which the fragment kernel skips where
  every zero is an integer (`quant_fragment.zeros_are_integers`, checked once per tensor
  version); or None for symmetric quantization (zero point 8:
  `quantize_w4(..., zero_point=False)`).

K must be a multiple of the group size (and so even): a ragged last group has no
well-defined scale in the checkpoints this format comes from, so it is refused with an
error rather than padded.

Three kernels, all dequantizing in registers (`dequantize`: w·s − z·s in f32, one
multiply-add per weight after the conversion; CUDA converts the 4-bit integer to float
with the magic-number trick of `codegen/expr.py`, one LOP3 and one FADD, not an I2F at a
quarter of the FP32 rate):

* `w4a16_rows_kernel` — few rows (M ≤ MAX_ROWS_KERNEL_M = 8, decode), on the CUDA cores.
  Weights and activations are viewed 4-D, (rows, K/G, G/32, 32) (`w4a16_operands`), so
  a thread's 32 weights of a row (one 16-byte load) meet its 32 activations and their
  products are summed in the thread: one f32 accumulator per row of a per thread, and a
  weight tile of BN rows × S whole groups, so that BN is small and the grid large (the
  old chunk of one group needed BN = 32 rows per block: 128 blocks for N = 4096, fewer
  than the SMs). R tiles per block share each activation load and conversion.
* `w4a16_gemm_kernel` — more rows (prefill, and 9-16 rows with BM = 16): each k-step
  dequantizes a (BN, BK) weight tile into a shared f16/bf16 tile and feeds it with the
  activation tile to `tg.gemm` (`tg.gemm` takes one operand type, so the kernel
  dequantizes first), in a pipelined K loop whose activation tiles are copied ahead and
  whose weights are loaded one k-step before they are used (a register carried across
  iterations: the load was the latency every k-step waited on).
* `w4a16_swapped_kernel` — from 9 rows, the other orientation: cᵀ = dequant(w)·aᵀ, the
  weights as the MMA's A operand (64 rows a warpgroup) and up to 128 tokens as its N, so
  each weight is dequantized once per block; options for the A operand's path
  (registers, or shared memory: ASMEM), the packed weights' path (registers, or a
  cp.async ring: WSMEM) and split K (SPLIT, with `w4a16_split_sum_kernel`). Configs are
  the kind "swapped" ("split" when SPLIT > 1) of `w4a16_config`; `launch_w4a16` runs any
  kind. On an H100 it beat the GEMM kernel at every M = 16-128 shape measured (session 7,
  docs/performance.md), short of issue 13's targets.
* `w4a16_fragment_kernel` (`quant_fragment.py`, kind "fragment", `FRAGMENT=1`) — the
  swapped orientation on weights pre-packed in the MMA fragment's order
  (`pack_fragments`): one 16-byte load per thread and k-step, dequantized two weights a
  time in f16x2 (magic number, HADD2, HMUL2). `matmul_w4a16` takes such 6-D weights.

Entry points: `w4a16_gemm_emulated` (numpy, unpacked weights: the CI entry point),
`matmul_w4a16` (torch, packed weights), `quantize_w4`, `prepack`, `unpack_w4`,
`quant_fragment.pack_fragments`.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

import tegula as tg
from tegula import f32, u4
from tegula.dtypes import DType, bf16, f16
from tegula.kernels.common import check_array, dtype_of_array, launch_emulated, poisoned
from tegula.kernels import api as _api
from tegula.kernels.gemv import MAX_GEMV_ROWS
from tegula.runtime.autotune import Autotuner
from tegula.kernels.quant_fragment import fragment_candidates  # re-exported: it lives by its kernel
from tegula.kernels.quant_fragment import zeros_are_integers
from tegula.runtime.arrivals import arrival_counters

W4A16_DTYPES = (f16, bf16)
GROUP_SIZES = (32, 64, 128)
SYMMETRIC_ZERO = 8  # the zero point of `quantize_w4(..., zero_point=False)`

# The torch entry point's autotuner, beside the library's others (winners per shape bucket).
_api.TUNERS.setdefault("matmul_w4a16", Autotuner("matmul_w4a16"))


def dequantize(packed: Any, scales: Any, zeros: Any, n: Any, group: Any,
               groups_shape: tuple) -> Any:
    """(w - zero) * scale in f32 for a loaded tile of 4-bit weights, inside a kernel (trace
    time): the scales and zeros of row block `n`, group block `group` are a tile of
    `groups_shape` ((rows, 1) for a chunk of one group, (rows, S) for S groups), broadcast
    over the weights of each group (trailing size-1 dims added to match the weights'
    rank). Written w·s - z·s, so that each weight costs one multiply-add after its
    conversion (z·s is per group row)."""
    extra = (None,) * (packed.rank - len(groups_shape))
    scale = tg.load(scales.tile(groups_shape, (n, group))).to(f32)[(..., *extra)]
    if zeros is not None:
        zero = tg.load(zeros.tile(groups_shape, (n, group))).to(f32)[(..., *extra)]
    else:
        zero = tg.full(tuple(groups_shape) + (1,) * len(extra), SYMMETRIC_ZERO, f32)
    return packed.to(f32) * scale - zero * scale


@lru_cache(maxsize=None)
def w4a16_gemm_kernel(dtype: DType, has_zeros: bool) -> tg.Kernel:
    """c (M, N) = a (M, K) @ dequant(w).T in (BM, BN) tiles: each k-step dequantizes a
    (BN, BK) weight tile into shared memory (rounded to `dtype`, the MMA's operand type)
    and runs `tg.gemm` on it and the activation tile. BK divides the group size G. The K
    loop is a STAGES-deep `tg.pipeline`: the activation tiles are copied ahead (cp.async;
    TMA from a producer warpgroup on sm_90a), the weights are loaded and dequantized by
    the threads in the iteration that uses them; STAGES=1 is a plain loop."""

    @tg.kernel(threads=128)
    def w4a16_gemm(a: tg.Tensor[dtype], w: tg.Tensor[u4], scales: tg.Tensor[dtype],
                   zeros: tg.Tensor[dtype], c: tg.Tensor[dtype], G: tg.constexpr = 128,
                   BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 64,
                   STAGES: tg.constexpr = 3):
        m, n = tg.block_id(0), tg.block_id(1)
        ga = a.tile((BM, BK), (m, None))
        gw = w.tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), f32)
        sa = tg.shared((BM, BK), dtype, stages=STAGES)
        sw = tg.shared((BN, BK), dtype)
        ahead = tg.load(gw[:, :, 0])    # the next k-step's weights, loaded one step early
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            packed = ahead
            ahead = tg.load(gw[:, :, k + 1])                # past K: masked, never used
            weights = dequantize(packed, scales, zeros if has_zeros else None,
                                 n, k // (G // BK), (BN, 1))
            tg.copy(weights.to(dtype), sw)
            tg.gemm(acc, sa[k], sw)                         # acc += sa @ sw.T
        tg.copy(acc.to(dtype), c.tile((BM, BN), (m, n)))

    return w4a16_gemm


@lru_cache(maxsize=None)
def w4a16_swapped_kernel(dtype: DType, has_zeros: bool, partial: bool = False) -> tg.Kernel:
    """cᵀ (N, M) = dequant(w) (N, K) @ aᵀ in (BN, BT) tiles — the GEMM the other way round
    (CUTLASS's mixed-input "Machete" orientation): the dequantized (BN, BK) weight tile is
    the MMA's *register* A operand (wgmma's A fragment on sm_90a: no f16 weight ever goes
    through shared memory) and the activation tile, BT tokens by BK, the shared B operand
    (K-major, TMA into a STAGES-deep ring on sm_90a), so M = 16…128 tokens fit one block's
    MMA N and each weight is dequantized once per BT tokens. Synthesis loads the packed
    weights into the A fragment's layout (each thread's two consecutive k of a row are one
    byte): straight from global memory one k-step ahead of their use, or with WSMEM=1
    from a STAGES-deep shared ring that cp.async fills as far ahead as the activations'
    (more bytes in flight where few blocks run, e.g. 64 weight tiles at N = 4096; TMA
    takes only wgmma operand buffers, so the activations then ride cp.async too). With
    ASMEM=1 the dequantized tile goes through shared memory as the MMA's A operand
    instead, so the packed weights are loaded in 16-byte vectors along K (the A
    fragment's byte pairs cost one load and its address each). BK divides the group
    size G; c is written through its transpose, rearranged (through shared memory) so
    that its stores are 16-byte vectors along N.

    `partial` (split K, SPLIT blocks along grid axis 2): block z sums its slice of the
    k-steps and writes the f32 partial cᵀ tile into `c`, an (SPLIT · Np, M) f32 workspace
    (Np = N rounded up to BN: slice z's rows start at z · Np); `w4a16_split_sum_kernel`
    adds the slices in order. At N = 4096 only 64 weight tiles exist, fewer than the SMs."""
    out_type = f32 if partial else dtype

    @tg.kernel(threads=128)
    def w4a16_swapped(a: tg.Tensor[dtype], w: tg.Tensor[u4], scales: tg.Tensor[dtype],
                      zeros: tg.Tensor[dtype], c: tg.Tensor[out_type], G: tg.constexpr = 128,
                      BN: tg.constexpr = 64, BT: tg.constexpr = 64, BK: tg.constexpr = 64,
                      STAGES: tg.constexpr = 3, WSMEM: tg.constexpr = 0,
                      ASMEM: tg.constexpr = 0, SPLIT: tg.constexpr = 1):
        n, t = tg.block_id(0), tg.block_id(1)
        ga = a.tile((BT, BK), (t, None))
        gw = w.tile((BN, BK), (n, None))
        steps, start = ga.shape[2], 0
        if partial:                  # this block's slice of the k-steps
            per_split = (steps + SPLIT - 1) // SPLIT
            start = tg.block_id(2) * per_split
            steps = tg.minimum(start + per_split, steps)
        acc = tg.zeros((BN, BT), f32)                       # cᵀ: weight rows x tokens
        sa = tg.shared((BT, BK), dtype, stages=STAGES)
        if WSMEM:   # packed weights copied STAGES-1 k-steps ahead, like the activations
            sw = tg.shared((BN, BK), u4, stages=STAGES)
        else:       # straight into registers, one k-step ahead
            ahead = tg.load(gw[:, :, start])
        if ASMEM:   # the dequantized tile: the MMA's A operand from shared memory
            sdq = tg.shared((BN, BK), dtype)
        for k in tg.pipeline(start, steps, stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            if WSMEM:
                tg.copy(gw[:, :, k], sw[k])
                packed = tg.load(sw[k])
            else:
                packed = ahead
                ahead = tg.load(gw[:, :, k + 1])            # past K: masked, never used
            weights = dequantize(packed, scales, zeros if has_zeros else None,
                                 n, k // (G // BK), (BN, 1))
            if ASMEM:
                tg.copy(weights.to(dtype), sdq)
                tg.gemm(acc, sdq, sa[k])
            else:
                tg.gemm(acc, weights.to(dtype), sa[k])      # acc += w @ sa.T
        if partial:
            row_tiles = (w.shape[0] + BN - 1) // BN
            tg.copy(acc, c.tile((BN, BT), (tg.block_id(2) * row_tiles + n, t)))
        else:   # rearranged through shared memory: c's rows are tokens, 16-byte stores
            tg.copy(tg.rearrange(acc.to(dtype)), c.T.tile((BN, BT), (n, t)))

    return w4a16_swapped


@lru_cache(maxsize=None)
def w4a16_split_sum_kernel(dtype: DType) -> tg.Kernel:
    """c (M, N) = the sum of the SPLIT f32 partial cᵀ slices of `w4a16_swapped_kernel(...,
    partial=True)` (an (SPLIT · Np, M) workspace, slice z at rows z · Np; Np a multiple of
    BN), added in slice order in f32 and rounded once to `dtype`. Its (BN, BT) tile is its
    own (`SUM_TILE`): small, so that the grid has blocks enough to keep the reads in
    flight (the producer's 64-128 x 128 tiles gave 224 blocks for N = 14336: 5-20 µs)."""

    @tg.kernel(threads=128)
    def w4a16_split_sum(parts: tg.Tensor[f32], c: tg.Tensor[dtype], SPLIT: tg.constexpr = 2,
                        BN: tg.constexpr = 64, BT: tg.constexpr = 64):
        n, t = tg.block_id(0), tg.block_id(1)
        row_tiles = parts.shape[0] // SPLIT // BN        # slice z: tile rows z·row_tiles…
        total = tg.load(parts.tile((BN, BT), (n, t)))
        for z in range(1, SPLIT):
            total = total + tg.load(parts.tile((BN, BT), (z * row_tiles + n, t)))
        # read along the tokens, written along N: the rearrangement (through shared
        # memory) makes both 16-byte vectors; strided 2-byte stores cost more than the sum
        tg.copy(tg.rearrange(total.to(dtype)), c.T.tile((BN, BT), (n, t)))

    return w4a16_split_sum


@lru_cache(maxsize=None)
def w4a16_rows_kernel(dtype: DType, has_zeros: bool) -> tg.Kernel:
    """c (M, N) = a (M, K) @ dequant(w).T for few rows (M a constexpr, unrolled), on the
    CUDA cores. Weights and activations are viewed 4-D, (rows, K/G, G/32, 32): a thread
    loads 32 consecutive weights of a row (one 16-byte load) and the 32 activations they
    meet, so the product's sum over the last dim stays in the thread and each row of a
    keeps one f32 register per thread per weight tile, whatever M. A weight tile spans S
    groups of BN rows (BN·S·G/32 threads), so BN can be small (many blocks); a block
    takes R such tiles of consecutive rows, which its threads read at the same K
    positions, so each activation is loaded and converted once for R weights; UNROLL
    k-chunks are loaded before any is used (R·UNROLL 16-byte loads in flight)."""

    @tg.kernel(threads=128)
    def w4a16_rows(a: tg.Tensor[dtype, 4], w: tg.Tensor[u4, 4], scales: tg.Tensor[dtype],
                   zeros: tg.Tensor[dtype], c: tg.Tensor[dtype],
                   M: tg.constexpr = 1, G: tg.constexpr = 128, BN: tg.constexpr = 4,
                   S: tg.constexpr = 8, R: tg.constexpr = 1, UNROLL: tg.constexpr = 2):
        block = tg.block_id(0)
        V = G // 32                                          # 16-byte loads per group
        tiles = [w.tile((BN, S, V, 32), (block * R + i, None, 0, 0)) for i in range(R)]
        # one accumulator per (row of a, weight tile), flat: carried lists are one level
        accs = [tg.zeros((BN, S, V, 1), f32) for _ in range(M * R)]
        for step in tg.range(tg.cdiv(tiles[0].shape[4], UNROLL)):
            chunks = [step * UNROLL + u for u in range(UNROLL)]
            packed = [[tg.load(gw[:, :, :, :, k]) for gw in tiles] for k in chunks]
            for k, qs in zip(chunks, packed):
                weights = [dequantize(q, scales, zeros if has_zeros else None,
                                      block * R + i, k, (BN, S)) for i, q in enumerate(qs)]
                for r in range(M):
                    row = tg.load(a.tile((1, S, V, 32), (r, k, 0, 0))).to(f32)
                    for i in range(R):
                        accs[r * R + i] = accs[r * R + i] + tg.sum(weights[i] * row, 3)
        for r in range(M):
            for i in range(R):
                total = tg.sum(tg.sum(accs[r * R + i], 2), 1)[:, 0, 0, 0]
                tg.copy(total.to(dtype), c.T.tile((BN, 1), (block * R + i, r))[:, 0])

    return w4a16_rows


# The rows kernel's reach: beyond this many rows of a, the tensor-core GEMM kernel (one
# dequantization per weight for all rows) beats one f32 multiply-add per row per weight.
MAX_ROWS_KERNEL_M = 8


def w4a16_config(m: int, n: int, k: int, group_size: int, **tiles: int
                 ) -> tuple[str, tuple[int, ...], dict]:
    """(kernel kind, grid, constexprs) for an (M, N, K) W4A16 product. A BT (token tile)
    picks the swapped kernel: kind "swapped", or "split" with SPLIT > 1 (grid axis 2 the
    K slices); BN=64 weight rows, BK = the group up to 64, 3 stages by default.
    Rows (M ≤ MAX_ROWS_KERNEL_M and no BM given): BN=4 rows by S groups per weight tile
    (one 16-byte load per thread of 128), R tiles per block (2 for M ≤ 2, else 4). GEMM:
    BM=16 rows for M ≤ 16, else 64x64 tiles; BK = the group up to 128 (64 beyond 16
    rows), weights loaded one k-step ahead, a 3-stage activation pipeline."""
    threads = tiles.get("threads", 128)
    if tiles.get("GEMV"):        # CUDA cores on the fragment-ordered weights (quant_gemv)
        from tegula.kernels.quant_gemv import gemv_config
        grid, constexprs = gemv_config(m, n, k, group_size, **{
            name: value for name, value in tiles.items() if name not in ("GEMV", "FRAGMENT")})
        return "gemv", grid, constexprs
    if tiles.get("FRAGMENT"):    # weights in the MMA fragment's order (quant_fragment)
        from tegula.kernels.quant_fragment import fragment_config
        grid, constexprs = fragment_config(m, n, k, group_size, **{
            name: value for name, value in tiles.items() if name != "FRAGMENT"})
        return "fragment", grid, constexprs
    if "BT" in tiles:
        constexprs = dict(G=group_size, BN=64, BT=token_tile(m), BK=min(group_size, 64),
                          STAGES=3)
        constexprs.update(tiles)
        _check_chunk(constexprs["BK"], group_size)
        if constexprs.get("WSMEM") and constexprs.get("ASMEM"):
            # the packed tile read from shared memory gets its layout from the (BN, 1)
            # scales, which splits byte pairs: synthesis refuses the 4-bit copy
            raise ValueError("tegula.kernels.w4a16: WSMEM=1 and ASMEM=1 together are not "
                             "supported (the shared 4-bit tile's read would split bytes)")
        grid = (tg.cdiv(n, constexprs["BN"]), tg.cdiv(m, constexprs["BT"]))
        if constexprs.get("SPLIT", 1) > 1:
            return "split", grid + (constexprs["SPLIT"],), constexprs
        return "swapped", grid, constexprs
    if m <= MAX_ROWS_KERNEL_M and "BM" not in tiles:
        constexprs = dict(M=m, G=group_size, BN=4, R=2 if m <= 2 else 4,
                          UNROLL=2 if m <= 2 else 1)
        constexprs.update(tiles)  # `threads` too: a build option, passed on with the rest
        loads_per_group = group_size // 32
        per_tile = constexprs["BN"] * loads_per_group
        if "S" not in constexprs:  # a power of two: odd tiles build slowly, into big code
            constexprs["S"] = 1 << max(0, (threads // per_tile).bit_length() - 1)
        rows_per_block = constexprs["BN"] * constexprs["R"]
        return "rows", (tg.cdiv(n, rows_per_block),), constexprs
    small = m <= MAX_GEMV_ROWS
    constexprs = dict(G=group_size, BM=16 if small else 64, BN=32 if small else 64,
                      BK=min(group_size, 128 if small else 64), STAGES=3)
    constexprs.update(tiles)
    _check_chunk(constexprs["BK"], group_size)
    grid = (tg.cdiv(m, constexprs["BM"]), tg.cdiv(n, constexprs["BN"]))
    return "gemm", grid, constexprs


def token_tile(m: int) -> int:
    """The swapped kernel's default token tile BT for m rows of activations: the smallest
    power of two from 16 (wgmma's N of an f16 MMA; TMA and swizzle want whole 8-row
    groups) that holds them, at most 128."""
    return min(128, max(16, 1 << max(0, m - 1).bit_length()))


def w4a16_kernel(kind: str, dtype: DType, has_zeros: bool) -> tg.Kernel:
    """The (first) kernel of a config kind ("rows", "gemm", "swapped" or "split", from
    `w4a16_config`)."""
    if kind == "split":
        return w4a16_swapped_kernel(dtype, has_zeros, partial=True)
    if kind == "fragment":
        from tegula.kernels.quant_fragment import w4a16_fragment_kernel
        return w4a16_fragment_kernel(dtype, has_zeros)
    if kind == "gemv":
        from tegula.kernels.quant_gemv import w4a16_fragment_gemv_kernel
        return w4a16_fragment_gemv_kernel(dtype, has_zeros)
    factory = {"rows": w4a16_rows_kernel, "gemm": w4a16_gemm_kernel,
               "swapped": w4a16_swapped_kernel}[kind]
    return factory(dtype, has_zeros)


def launch_w4a16(kind: str, grid: tuple, constexprs: dict, dtype: DType, has_zeros: bool,
                 operands: tuple, c: Any, launch: Any, empty_f32: Any,
                 zeroed_counters: Any = None) -> Any:
    """Run one config: `launch(kernel, grid, args, constexprs)` of its kernel on
    `operands` (a, packed, scales, zeros as `w4a16_operands` gives them) and the output c;
    for split K ("split") the partial products go to an f32 workspace from
    `empty_f32(shape)` and `w4a16_split_sum_kernel` adds them into c (the fragment kind
    does the same through `quant_fragment.launch_w4a16_fragment`, or with FUSED=1 in one
    launch on counters from `zeroed_counters(size)`). Returns the last launch's result."""
    if kind == "fragment":
        from tegula.kernels.quant_fragment import launch_w4a16_fragment
        return launch_w4a16_fragment(grid, constexprs, dtype, has_zeros, operands, c, launch,
                                     empty_f32, zeroed_counters)
    if kind == "gemv":
        from tegula.kernels.quant_gemv import launch_w4a16_gemv
        return launch_w4a16_gemv(grid, constexprs, dtype, has_zeros, operands, c, launch,
                                 empty_f32)
    if kind != "split":
        return launch(w4a16_kernel(kind, dtype, has_zeros), grid, (*operands, c), constexprs)
    split, bn = constexprs["SPLIT"], constexprs["BN"]
    m, n = c.shape
    parts = empty_f32((split * tg.cdiv(n, bn) * bn, m))
    launch(w4a16_kernel(kind, dtype, has_zeros), grid, (*operands, parts), constexprs)
    return launch_split_sum(dtype, split, parts, c, launch)


#: The split sum's (BN, BT) tile: 4 values a thread, so many blocks.
SUM_TILE = (32, 16)


def launch_split_sum(dtype: DType, split: int, parts: Any, c: Any, launch: Any) -> Any:
    """`w4a16_split_sum_kernel` adding the SPLIT slices of `parts` into c (its tile's rows
    divide a slice's: the producer's row tile, 64 or more)."""
    (m, n), bt = c.shape, SUM_TILE[1]
    bn = math.gcd(SUM_TILE[0], parts.shape[0] // split)
    grid = (tg.cdiv(n, bn), tg.cdiv(m, bt))
    return launch(w4a16_split_sum_kernel(dtype), grid, (parts, c),
                  dict(SPLIT=split, BN=bn, BT=bt))


def w4a16_operands(kind: str, a: Any, packed: Any, group_size: int) -> tuple[Any, Any]:
    """The activation and packed-weight arguments a kernel kind takes (numpy or torch,
    contiguous): the GEMM kernel's (M, K) and (N, K/2) bytes as they are, the rows
    kernel's 4-D views (rows, K/G, G/32, 32 elements) of the same memory, the fragment
    and GEMV kernels' weights in fragment order (`pack_fragments`: a copy, unless `packed`
    is already 6-D, pre-packed), the GEMV kernel's activations as (M, K/16, 2, 8) (a
    view)."""
    if kind in ("fragment", "gemv"):
        from tegula.kernels.quant_fragment import as_words, pack_fragments
        from tegula.kernels.quant_gemv import activation_quads
        words = as_words(packed if len(packed.shape) == 6 else pack_fragments(packed))
        return (activation_quads(a) if kind == "gemv" else a), words
    if kind != "rows":
        return a, packed
    (m, k), n = a.shape, packed.shape[0]
    shape = (k // group_size, group_size // 32)
    return a.reshape(m, *shape, 32), packed.reshape(n, *shape, 16)


def _check_chunk(bk: int, group_size: int) -> None:
    if bk <= 0 or group_size % bk:
        raise ValueError(f"tegula.kernels.w4a16: BK={bk} must divide the group size "
                         f"{group_size} (one scale per row per k-chunk)")


def check_w4a16_shapes(fn: str, a_shape: tuple, n: int, k: int, scales_shape: tuple,
                       zeros_shape: tuple | None, group_size: Any) -> int:
    """M, after checking a (M, K), weights (N, K), scales/zeros (N, K / group_size) and the
    group size; a ValueError naming the argument and its shape otherwise."""
    where = f"tegula.kernels.{fn}"
    if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise ValueError(f"{where}: group_size must be one of {GROUP_SIZES}, got "
                         f"{group_size!r}")
    if len(a_shape) != 2:
        raise ValueError(f"{where}: a must be 2-D (M, K), got shape {tuple(a_shape)}")
    if a_shape[1] != k:
        raise ValueError(f"{where}: a is (M, K) and the weights (N, K) with one K: a has "
                         f"shape {tuple(a_shape)}, the weights {(n, k)}")
    if k % group_size:
        raise ValueError(f"{where}: K = {k} is not a multiple of group_size = {group_size} "
                         f"(every group needs its {group_size} weights; pad K)")
    groups = (n, k // group_size)
    if tuple(scales_shape) != groups:
        raise ValueError(f"{where}: scales must have shape (N, K / group_size) = {groups}, "
                         f"got {tuple(scales_shape)}")
    if zeros_shape is not None and tuple(zeros_shape) != groups:
        raise ValueError(f"{where}: zeros must have shape (N, K / group_size) = {groups}, "
                         f"got {tuple(zeros_shape)}")
    return a_shape[0]


# --------------------------------------------------------------------------------------
# Host-side quantization and packing (numpy or torch, whichever the weights are)
# --------------------------------------------------------------------------------------

def prepack(w_q: Any) -> Any:
    """Unpacked 4-bit weights (N, K) of integers 0..15 (uint8) -> the kernels' packed
    layout, (N, K/2) uint8 with element 2j in the low nibble of byte j. numpy or torch in,
    the same out. K must be even."""
    if w_q.shape[-1] % 2:
        raise ValueError(f"tegula.kernels.prepack: K = {w_q.shape[-1]} must be even (two "
                         f"weights a byte), got w_q of shape {tuple(w_q.shape)}")
    low, high = w_q[..., 0::2], w_q[..., 1::2]
    return (low & 15) | ((high & 15) << 4)


def unpack_w4(packed: Any) -> Any:
    """The inverse of `prepack`: (N, K/2) bytes -> (N, K) uint8 values 0..15."""
    if isinstance(packed, np.ndarray):
        out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), dtype=np.uint8)
    else:
        out = packed.new_empty(tuple(packed.shape[:-1]) + (2 * packed.shape[-1],))
    out[..., 0::2] = packed & 15
    out[..., 1::2] = packed >> 4
    return out


def quantize_w4(w: Any, group_size: int = 128, zero_point: bool = True
                ) -> tuple[Any, Any, Any]:
    """Quantize an (N, K) float weight (torch tensor or numpy array) to 4 bits per group of
    `group_size` along K: returns (packed (N, K/2) uint8, scales (N, K/G), zeros (N, K/G)
    or None), scales and zeros in w's dtype (float32 for numpy float32).

    With `zero_point` (asymmetric, AWQ style) each group maps [min, max] onto 0..15:
    scale = (max - min) / 15, zero = round(-min / scale); without it (symmetric)
    scale = max|w| / 7 and the zero point is 8 (zeros is None). w_q = clamp(round(w /
    scale) + zero, 0, 15); a group of equal values gets scale 1 (any scale is exact)."""
    fn = "tegula.kernels.quantize_w4"
    if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise ValueError(f"{fn}: group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    if len(w.shape) != 2:
        raise ValueError(f"{fn}: w must be 2-D (N, K), got shape {tuple(w.shape)}")
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"{fn}: K = {k} is not a multiple of group_size = {group_size}")
    is_numpy = isinstance(w, np.ndarray)
    values = w.astype(np.float32) if is_numpy else w.float()
    groups = values.reshape(n, k // group_size, group_size)
    if is_numpy:
        low, high = groups.min(axis=2), groups.max(axis=2)
        absmax = np.abs(groups).max(axis=2)
    else:
        low, high = groups.amin(dim=2), groups.amax(dim=2)
        absmax = groups.abs().amax(dim=2)
    if zero_point:
        scale = (high - low) / 15
        scale = scale + (scale == 0) * 1.0
        zero = _round(-low / scale, is_numpy).clip(0, 15)
    else:
        scale = absmax / 7
        scale = scale + (scale == 0) * 1.0
        zero = None
    shift = zero[..., None] if zero is not None else SYMMETRIC_ZERO
    q = (_round(groups / scale[..., None], is_numpy) + shift).clip(0, 15)
    q = q.reshape(n, k)
    q = q.astype(np.uint8) if is_numpy else q.to(_torch_uint8())
    out_type = (lambda t: t.astype(w.dtype)) if is_numpy else (lambda t: t.to(w.dtype))
    return prepack(q), out_type(scale), (out_type(zero) if zero is not None else None)


def _round(x: Any, is_numpy: bool) -> Any:
    return np.rint(x) if is_numpy else x.round()


def _torch_uint8() -> Any:
    import torch
    return torch.uint8


def dequantize_w4(w_q: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None,
                  group_size: int) -> np.ndarray:
    """The reference dequantization in float64: (w_q - zeros) * scales, per group."""
    zero = SYMMETRIC_ZERO if zeros is None else np.repeat(
        np.asarray(zeros, np.float64), group_size, axis=1)
    return (w_q.astype(np.float64) - zero) * np.repeat(np.asarray(scales, np.float64),
                                                       group_size, axis=1)


# --------------------------------------------------------------------------------------
# numpy entry point (the emulator)
# --------------------------------------------------------------------------------------

def w4a16_gemm_emulated(a: np.ndarray, w_q: np.ndarray, scales: np.ndarray,
                        zeros: np.ndarray | None, group_size: int,
                        dtype: DType | None = None, target: str | None = None,
                        **tiles: int) -> np.ndarray:
    """`a @ ((w_q - zeros) * scales).T` by the emulated W4A16 kernel, with UNPACKED
    weights: a (M, K) f16 (or float32 holding bf16 values with `dtype=bf16`), w_q (N, K)
    uint8 values 0..15, scales and zeros (N, K / group_size) (zeros None: zero point 8).
    M ≤ 16 takes the GEMV kernel, more rows the dequantize-to-shared GEMM; `tiles`
    override the config (a BM picks the GEMM kernel)."""
    fn = "w4a16_gemm_emulated"
    check_array(fn, "a", a, ndim=2)
    check_array(fn, "w_q", w_q, ndim=2)
    check_array(fn, "scales", scales, ndim=2)
    if zeros is not None:
        check_array(fn, "zeros", zeros, ndim=2)
    dtype = dtype or dtype_of_array(a, fn, "a")
    if dtype not in W4A16_DTYPES:
        raise TypeError(f"tegula.kernels.{fn}: a must be f16 or bf16 (float32 arrays with "
                        f"dtype=bf16), got {dtype}")
    if w_q.dtype != np.uint8 or (w_q.size and int(w_q.max()) > 15):
        raise ValueError(f"tegula.kernels.{fn}: w_q must be uint8 values 0..15 (unpacked), "
                         f"got {w_q.dtype}" + (f" up to {int(w_q.max())}" if w_q.size else ""))
    n, k = w_q.shape
    m = check_w4a16_shapes(fn, a.shape, n, k, scales.shape,
                           None if zeros is None else zeros.shape, group_size)
    storage = a.dtype
    c = poisoned((m, n), dtype)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return np.zeros_like(c)
    zeros_arg = (np.ascontiguousarray(zeros, dtype=storage) if zeros is not None
                 else np.zeros((1, 1), dtype=storage))  # unread: the kernel uses 8
    kind, grid, constexprs = w4a16_config(m, n, k, group_size, **tiles)
    if kind in ("fragment", "gemv"):   # integer zeros skip the residue step; fractional need it
        integer = zeros is not None and bool(np.all(zeros == np.round(zeros)))
        if constexprs.get("INTEGER_ZEROS") and not integer:
            raise ValueError(f"tegula.kernels.{fn}: INTEGER_ZEROS=1 needs integer zero "
                             f"points (a zeros tensor of integers), got "
                             f"{'no zeros' if zeros is None else 'fractional zeros'}")
        constexprs.setdefault("INTEGER_ZEROS", int(integer))
    options = {} if target is None else {"target": target}
    operands = (*w4a16_operands(kind, np.ascontiguousarray(a), prepack(w_q), group_size),
                np.ascontiguousarray(scales, dtype=storage), zeros_arg)
    launch_w4a16(kind, grid, constexprs, dtype, zeros is not None, operands, c,
                 lambda kernel, grid, args, cx: launch_emulated(kernel, grid, *args, **cx,
                                                                **options),
                 lambda shape: np.full(shape, np.nan, np.float32),
                 lambda size: np.zeros(size, np.int32))
    return c


# --------------------------------------------------------------------------------------
# torch entry point
# --------------------------------------------------------------------------------------

def w4a16_candidates(m: int, group_size: int) -> list[dict]:
    """Configurations worth timing: for M ≤ MAX_ROWS_KERNEL_M the rows kernel (1, 2 or 4
    weight tiles per block, 1 or 2 chunks loaded ahead) and, from 3 rows on, the 16-row
    GEMM; beyond, the GEMM's tiles (16 rows up to 16, else up to 128x128) and the swapped
    kernel (`_swapped_candidates`); BK 64 or 128, or the group where it is smaller."""
    chunks = sorted({min(group_size, 64), min(group_size, 128)})  # BK divides the group
    small_gemm = [dict(BM=16, BN=bn, BK=bk, STAGES=3) for bn in (32, 64) for bk in chunks]
    small_gemm.append(dict(BM=16, BN=16, BK=min(group_size, 128), STAGES=3, threads=64))
    if m <= MAX_ROWS_KERNEL_M:
        rows = [dict(R=r, UNROLL=u) for r in (1, 2, 4) for u in (1, 2)]
        return rows + (small_gemm if m > 2 else [])
    if m <= MAX_GEMV_ROWS:
        return small_gemm + _swapped_candidates(m, group_size)
    wide = min(group_size, 128)
    gemm = [dict(BM=64, BN=64, BK=min(group_size, 64), STAGES=3)] + [
        dict(t, BK=wide, STAGES=3) for t in (dict(BM=64, BN=64), dict(BM=128, BN=64),
                                              dict(BM=128, BN=128, threads=256))]
    return gemm + _swapped_candidates(m, group_size)


def _swapped_candidates(m: int, group_size: int) -> list[dict]:
    """The swapped kernel's configs worth timing (H100 rounds of session 7,
    `docs/performance.md`). Up to 16 tokens the weights' bytes in flight decide: the
    packed weights through a 6-8-deep cp.async ring (WSMEM), split K in 2 or 4 where N
    gives few weight tiles (N = 4096: 64 tiles for 132 SMs), or the shared A operand
    split 8 ways. Beyond, the dequantized tile as a shared A operand (16-byte weight
    loads, ASMEM) with BK = the group up to 128, 2 or 3 stages (2 leaves room for two
    blocks an SM), split K in 2 or 4, or 64 tokens a block split in 2. The register A
    operand (neither flag) lost to these at every measured shape."""
    wide = min(group_size, 128)
    one_role = dict(warp_specialize=False)
    bt = token_tile(m)
    if m <= MAX_GEMV_ROWS:
        return [dict(one_role, BT=bt, BK=wide, STAGES=8, WSMEM=1),
                dict(one_role, BT=bt, BK=wide, STAGES=8, WSMEM=1, SPLIT=2),
                dict(one_role, BT=bt, BK=wide, STAGES=6, WSMEM=1, SPLIT=4),
                dict(one_role, BT=bt, BK=wide, STAGES=3, ASMEM=1, SPLIT=8)]
    configs = [dict(one_role, BT=bt, BK=wide, STAGES=2, ASMEM=1),
               dict(one_role, BT=bt, BK=wide, STAGES=3, ASMEM=1),
               dict(one_role, BT=bt, BK=wide, STAGES=3, ASMEM=1, SPLIT=2),
               dict(one_role, BT=bt, BK=wide, STAGES=2, ASMEM=1, SPLIT=4)]
    if bt > 64:
        configs.append(dict(one_role, BT=64, BK=wide, STAGES=3, ASMEM=1, SPLIT=2))
    return configs


def matmul_w4a16(a: Any, packed: Any, scales: Any, zeros: Any, group_size: int, *,
                 out: Any = None) -> Any:
    """`a @ ((w_q - zeros) * scales).T` for CUDA tensors: a (M, K) f16 or bf16, `packed`
    (N, K/2) uint8 as `quantize_w4`/`prepack` write it (or pre-packed once more in the
    MMA fragment's order by `pack_fragments`: 6-D, read by the fragment kernel with
    16-byte loads at every M), scales and zeros (N, K/group_size)
    in a's dtype (zeros None: zero point 8). Accumulates in f32; returns (M, N) in a's
    dtype (or writes `out`). Autotuned per (M, N, K) bucket, group size and GPU; later
    calls with the same shapes, strides, dtypes and group size replay the chosen launch."""
    from tegula.kernels import api
    from tegula.runtime.autotune import Config

    fn = "matmul_w4a16"
    fragment = getattr(packed, "dim", lambda: 2)() == 6   # pre-packed: `pack_fragments`
    given = (a, packed, scales) + ((zeros,) if zeros is not None else ())
    # integer zeros (quantize_w4's) let the fragment kernel skip the residue step
    integer_zeros = fragment and zeros is not None and zeros_are_integers(zeros)
    head = (fn, type(group_size), group_size, zeros is None, integer_zeros)
    replay = api._replay_of(given, *head) if out is None else None
    if replay is not None:
        return replay(*given)
    signature = api._signature(head[0], given, *head[1:]) if out is None else None
    torch = api._torch()
    dtype, (m, n, k) = check_w4a16_args(fn, a, packed, scales, zeros, group_size)
    tensors = {"a": a, "packed": packed, "scales": scales}
    if zeros is not None:
        tensors["zeros"] = zeros
    api._check_cuda(fn, tensors)
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    else:
        api._check_out(fn, out, (m, n), a)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    args = [t.contiguous() for t in (a, packed, scales)]
    args.append(zeros.contiguous() if zeros is not None
                else torch.zeros((1, 1), dtype=a.dtype, device=a.device))  # unread
    zeros_kind = "iz" if integer_zeros else "z" if zeros is not None else "sym"
    candidates = (fragment_candidates(m, n, k, _sm_count(torch, a.device), group_size)
                  if fragment
                  else w4a16_candidates(m, group_size))
    configs = tuple(Config.of(c) for c in candidates)

    def run(config: Config) -> Any:
        kind, grid, constexprs = w4a16_config(m, n, k, group_size, **config.kwargs)
        if integer_zeros:
            constexprs["INTEGER_ZEROS"] = 1
        operands = (*w4a16_operands(kind, args[0], args[1], group_size), *args[2:])
        launched = []

        def launch(kernel: Any, grid: tuple, kernel_args: tuple, cx: dict) -> Any:
            ck = api._launch(kernel, grid, kernel_args, cx, config.threads)
            launched.append((ck, grid, kernel_args))
            return ck

        launch_w4a16(kind, grid, constexprs, dtype, zeros is not None, operands, out, launch,
                     lambda shape: torch.empty(shape, dtype=torch.float32, device=a.device),
                     lambda size: arrival_counters(a.device, size))
        return launched

    launched = api._tune_and_run(
        fn, a.device.index, configs, (m, n, k),
        f"{dtype}/g{group_size}/{zeros_kind}", run)
    if signature is not None and api._views_of(args[:len(given)], given):
        # the rows kernel's 4-D operands are views of args: the same data pointers
        api._remember(signature, _w4a16_replay(launched, m, n, args[3]))
    return out


def _sm_count(torch: Any, device: Any) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_w4a16_args(fn: str, a: Any, packed: Any, scales: Any, zeros: Any,
                     group_size: Any) -> tuple[DType, tuple[int, int, int]]:
    """(a's tegula dtype, (M, N, K)) after checking `matmul_w4a16`'s torch arguments
    (types, ranks, dtypes, shapes; not the device): `packed` 2-D (N, K/2), or 6-D in the
    fragment order (`pack_fragments`: padded to 64 x 64 blocks, so N comes from the
    scales and K from a). The CUDA entry point and the torch op's fake and CPU
    implementations all check through this."""
    fragment = getattr(packed, "dim", lambda: 2)() == 6
    dtype = _api._check_tensor(fn, "a", a, _api._GEMM_DTYPES, ndim=2)
    _api._check_tensor(fn, "packed", packed, {"uint8": u4}, ndim=6 if fragment else 2)
    _api._check_tensor(fn, "scales", scales, _api._GEMM_DTYPES, ndim=2)
    floats = {"a": a, "scales": scales}
    if zeros is not None:
        _api._check_tensor(fn, "zeros", zeros, _api._GEMM_DTYPES, ndim=2)
        floats["zeros"] = zeros
    _api._check_same_dtype(fn, floats)
    n, k = packed.shape[0], 2 * packed.shape[1]
    if fragment:
        n, k = scales.shape[0], a.shape[-1]
        _check_fragment_shape(fn, tuple(packed.shape), n, k)
    m = check_w4a16_shapes(fn, tuple(a.shape), n, k, tuple(scales.shape),
                           None if zeros is None else tuple(zeros.shape), group_size)
    return dtype, (m, n, k)


def _check_fragment_shape(fn: str, shape: tuple, n: int, k: int) -> None:
    from tegula.kernels.quant_fragment import fragment_shape
    want = fragment_shape(n, k)[:5] + (16,)
    if shape != want:
        raise ValueError(f"tegula.kernels.{fn}: pre-packed weights (6-D, from "
                         f"pack_fragments) for N = {n} (scales' rows) and K = {k} (a's "
                         f"columns) have shape {want}, got {shape}")


def _w4a16_replay(launched: list, m: int, n: int, unread: Any) -> Any:
    """A replay of `matmul_w4a16`'s launches (each (compiled kernel, grid, args)) for new
    tensors of the same signature: the kernel on (a, packed, scales, zeros) into a new c,
    or for split K the partial products into a new f32 workspace, then their sum into c.
    `unread` is the zeros argument of a call without zeros, kept alive here."""
    from tegula.kernels import api

    prepared = [api._replayer(ck, grid, args) for ck, grid, args in launched]
    fused = len(launched[0][2]) == 7     # a, w, scales, zeros, parts, counters, c
    workspace = launched[0][2][4] if fused else launched[0][2][-1]
    new_parts = (api.fast_empty(launched[0][2][0], tuple(workspace.shape), workspace.dtype)
                 if len(launched) == 2 or fused else None)
    if fused:
        torch, counters = api._torch(), launched[0][2][5]

    def replay_w4a16(a: Any, packed: Any, scales: Any, zeros: Any = unread) -> Any:
        c = a.new_empty((m, n))  # torch.empty(..., device=) costs ~5 µs more
        inputs = (a.data_ptr(), packed.data_ptr(), scales.data_ptr(), zeros.data_ptr())
        if fused:   # the current stream's counters: launches on two streams may overlap
            own = arrival_counters(a.device, counters.numel())
            prepared[0]((*inputs, new_parts(a).data_ptr(), own.data_ptr(), c.data_ptr()))
            return c
        if new_parts is None:
            prepared[0]((*inputs, c.data_ptr()))
            return c
        parts = new_parts(a)
        prepared[0]((*inputs, parts.data_ptr()))
        prepared[1]((parts.data_ptr(), c.data_ptr()))
        return c
    return replay_w4a16


__all__ = ["w4a16_rows_kernel", "w4a16_gemm_kernel", "w4a16_swapped_kernel", "w4a16_kernel",
           "w4a16_split_sum_kernel", "launch_w4a16", "launch_split_sum", "SUM_TILE",
           "token_tile", "w4a16_operands", "MAX_ROWS_KERNEL_M", "w4a16_config", "check_w4a16_shapes",
           "prepack", "unpack_w4", "quantize_w4", "dequantize_w4", "w4a16_gemm_emulated",
           "w4a16_candidates", "fragment_candidates", "matmul_w4a16", "W4A16_DTYPES",
           "GROUP_SIZES",
           "SYMMETRIC_ZERO"]
