"""FP8 GEMM: `c = (a · scale_a) @ (b · scale_b).T` for e4m3 a (M, K) and b (N, K), both
K-major, accumulated in f32 and stored as bf16, f16 or f32. Two scalings:

* per-tensor (`fp8_gemm_kernel`), as `torch._scaled_mm`: one f32 scale each for a and b
  (passed as (1, 1) tensors), applied once to the f32 accumulator before the store;
* blockwise (`fp8_blockwise_gemm_kernel`), as DeepSeek-V3: a's scales are (M, ⌈K/128⌉),
  one per row and 128-wide K block (1×128); b's are (⌈N/128⌉, ⌈K/128⌉), one per 128×128
  block (a last K block shorter than 128 has its scales too; the tiles past K read zeros).
  Each 128-wide K block is multiplied into a *fresh* f32 accumulator, which is then scaled
  by its two scales and added into the main one: the scales differ per K block, so they
  must be applied per block anyway, and the promotion matters for accuracy besides — the
  Hopper FP8 wgmma keeps only ~14 bits of its running sum per k32 instruction (see
  `tegula/arch/wgmma.py`), so a sum over all of K in the tensor cores loses precision that
  the f32 additions every 128 of K keep.

FP8 tensor-core instructions exist from sm_89 (mma.sync) and on sm_90a (wgmma); on sm_80
the compiler refuses `tg.gemm` on f8 operands with an error naming the instruction.
K must be a multiple of 16 (one e4m3 row of a k-step is 16 bytes, the copy and TMA unit).
A blockwise tile's columns may reach two of b's scale blocks (BN = 192); the promotion then
takes per column one of the two block scales (`blockwise_product`). On an H100 the
128x192 blockwise tile measured slower than 192x128 (session 12: 0.59-0.76x against
0.70-0.88x the per-tensor 128x256), so the entry point keeps 192x128.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, bf16, f8e4m3, f16
from tegula.kernels.common import check_array, launch_emulated, poisoned
from tegula.kernels.gemm import persistent_grid, persistent_tiles, pipelined_product

FP8_OUT_DTYPES = (bf16, f16, f32)
#: The blockwise form's scale block along K (and along N for b): DeepSeek-V3's 128.
SCALE_BLOCK = 128
#: K alignment: one k-step row of e4m3 is 16 bytes.
K_ALIGN = 16


@lru_cache(maxsize=None)
def fp8_gemm_kernel(out_t: DType) -> tg.Kernel:
    """The per-tensor-scaled FP8 GEMM: the README's pipelined main loop on e4m3, then
    `acc · (scale_a · scale_b)` in f32, rounded once to `out_t`."""

    @tg.kernel(threads=128)
    def fp8_gemm(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3], scale_a: tg.Tensor[f32],
                 scale_b: tg.Tensor[f32], c: tg.Tensor[out_t], BM: tg.constexpr = 128,
                 BN: tg.constexpr = 128, BK: tg.constexpr = 64, STAGES: tg.constexpr = 3):
        m, n = tg.block_id(0), tg.block_id(1)
        acc = pipelined_product(a, b, m, n, f8e4m3, BM, BN, BK, STAGES)
        scale = tg.load(scale_a.tile((1, 1), (0, 0))) * tg.load(scale_b.tile((1, 1), (0, 0)))
        tg.copy((acc * scale).to(out_t), c.tile((BM, BN), (m, n)))

    return fp8_gemm


@lru_cache(maxsize=None)
def fp8_persistent_gemm_kernel(out_t: DType) -> tg.Kernel:
    """The per-tensor-scaled FP8 GEMM as a persistent kernel (`gemm.persistent_tiles`:
    one block per SM walking the tiles in grouped-rows order, one TMA ring across them on
    sm_90a), launched on `gemm.persistent_grid` blocks."""

    @tg.kernel(threads=128)
    def fp8_persistent_gemm(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3],
                            scale_a: tg.Tensor[f32], scale_b: tg.Tensor[f32],
                            c: tg.Tensor[out_t], BM: tg.constexpr = 128,
                            BN: tg.constexpr = 128, BK: tg.constexpr = 64,
                            STAGES: tg.constexpr = 3, GROUP: tg.constexpr = 8,
                            CLUSTER: tg.constexpr = 1):
        def finish(acc, m, n):
            scale = tg.load(scale_a.tile((1, 1), (0, 0))) * \
                tg.load(scale_b.tile((1, 1), (0, 0)))
            tg.copy((acc * scale).to(out_t), c.tile((BM, BN), (m, n)))
        persistent_tiles(a, b, f8e4m3, BM, BN, BK, STAGES, GROUP, finish, CLUSTER)

    return fp8_persistent_gemm


def blockwise_buffers(BM: int, BN: int, STAGES: int) -> tuple:
    """The staged shared tiles of `blockwise_product`: a's (BM, 128) and b's (BN, 128),
    STAGES deep."""
    return (tg.shared((BM, SCALE_BLOCK), f8e4m3, stages=STAGES),
            tg.shared((BN, SCALE_BLOCK), f8e4m3, stages=STAGES))


def blockwise_product(a, b, scale_a, scale_b, m, n, BM: int, BN: int, STAGES: int,
                      buffers: tuple):
    """The f32 (BM, BN) tile (m, n) of the blockwise-scaled a @ b.T (trace time). Per
    128-wide K block: a *fresh* f32 product, scaled by a's row scales times b's block
    scale and added to the accumulator (the promotion every 128 of K). The scales are
    loaded before the gemm, so their loads fly while the tensor cores run (after it they
    waited for the wgmmas: 802 against 791 TFLOP/s on an H100). A warpgroup's tensor
    cores wait through its own multiply-adds every K block; the other consumer warpgroups'
    wgmmas fill them (session 10, H100: three warpgroups on 192x128 tiles beat two on
    128x128 by 2-9%; session 11: the 192x128 kernel runs at 0.90-1.00x the per-tensor
    kernel on the same tile, so the promotion is not what it loses against per-tensor
    128x256). Measured slower and dropped: scales carried a K block ahead (session 11:
    10-14% slower even in two registers; no scale loads in the loop at all, 9-16%), the
    promotion a block late (ptxas waits for the wgmmas before the copies), two K blocks a
    stage with one promoted during the other's wgmmas (ptxas schedules the multiply-adds
    before the gemm issue), 128x256 tiles as two 128-wide parts (spills), 256x128 as two
    row halves promoted one after the other (no spills with the lowering's repeated stage
    wait, but 0.53x per-tensor: each warpgroup's two gemms serialize;
    `benchmarks/fp8_blockwise_variants.py`).
    Where BN does not divide 128 (192: the 2-warpgroup tile whose per-tensor ceiling is
    0.91-1.08x the per-tensor 128x256, but whose blockwise form measured 0.59-0.76x, below
    192x128's 0.70-0.88x on three warpgroups: with two, one warpgroup's promotion is not
    hidden by the other's wgmmas; session 12, H100; the two taking turns at the tensor
    cores, 0.70-0.82x: level with 192x128 at best, session 13, measured through a patched
    turns rule, `benchmarks/fp8_blockwise.py --turns`), a tile's columns reach two of b's
    scale blocks, the boundary at a
    run-time column that is a multiple of gcd(BN, 128): the product is promoted in chunks
    of that many columns, each taking the first or the second block's scale (DeepGEMM's
    two-scale promotion). The chunk index is a register dim of its own, so each thread
    selects per chunk, not per column (a per-column `arange(BN) < bound` kept a predicate
    a column live across the loop: 736 B of spills at 128x192)."""
    sa, sb = buffers
    ga = a.tile((BM, SCALE_BLOCK), (m, None))                  # (BM, 128, ⌈K/128⌉)
    gb = b.tile((BN, SCALE_BLOCK), (n, None))
    row_scales = scale_a.tile((BM, 1), (m, None))              # (BM, 1, ⌈K/128⌉)
    first_block = (n * BN) // SCALE_BLOCK                      # b's scale row of column 0
    block_scales = scale_b.tile((1, 1), (first_block, None))
    if SCALE_BLOCK % BN:                                       # columns span two scale rows
        next_scales = scale_b.tile((1, 1), (first_block + 1, None))
    acc = tg.zeros((BM, BN), f32)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        rows = tg.load(row_scales[:, :, k])
        scale = rows * tg.load(block_scales[:, :, k])          # (BM, 1)
        if SCALE_BLOCK % BN:
            next_scale = rows * tg.load(next_scales[:, :, k])
        part = tg.zeros((BM, BN), f32)                         # promoted every 128 of K
        tg.gemm(part, sa[k], sb[k])
        if SCALE_BLOCK % BN:                                   # per column: one of two
            chunk = math.gcd(BN, SCALE_BLOCK)                  # columns sharing a scale
            in_first = tg.arange(BN // chunk) < \
                ((first_block + 1) * SCALE_BLOCK - n * BN) // chunk
            chunked = tg.where(in_first[None, :, None], scale[:, :, None],
                               next_scale[:, :, None])         # (BM, BN / chunk, 1)
            acc += tg.reshape(tg.reshape(part, (BM, BN // chunk, chunk)) * chunked, (BM, BN))
        else:
            acc += part * scale                                # (BM, 1) scales broadcast
    return acc


@lru_cache(maxsize=None)
def fp8_blockwise_gemm_kernel(out_t: DType) -> tg.Kernel:
    """The blockwise-scaled FP8 GEMM (DeepSeek-V3), one block per (BM, BN) tile of c
    (`blockwise_product`). A tile's columns may reach two of b's scale rows at most
    (`spans_two_scale_blocks`).
    (Promoting one K block late, so the multiply-adds could run during the next block's
    wgmmas, measured slower on an H100: 702 against 802 TFLOP/s at 4096³, with a third
    live 128×128 f32 tile.)"""

    @tg.kernel(threads=128)
    def fp8_blockwise_gemm(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3],
                           scale_a: tg.Tensor[f32], scale_b: tg.Tensor[f32],
                           c: tg.Tensor[out_t], BM: tg.constexpr = 128,
                           BN: tg.constexpr = 128, STAGES: tg.constexpr = 3):
        m, n = tg.block_id(0), tg.block_id(1)
        acc = blockwise_product(a, b, scale_a, scale_b, m, n, BM, BN, STAGES,
                                blockwise_buffers(BM, BN, STAGES))
        tg.copy(acc.to(out_t), c.tile((BM, BN), (m, n)))

    return fp8_blockwise_gemm


def twin_blockwise_product(a, b, scale_a, scale_b, m, n, BM: int, BN: int, STAGES: int,
                           buffers: tuple):
    """`blockwise_product` two K blocks a stage (TWIN=1; BN must divide 128): both K
    blocks' products are fresh and issued back to back, then K block 2j is promoted
    (`wait_group 1`) while 2j+1's wgmmas still run, and 2j+1 after them. A warpgroup's
    tensor-core queue runs dry once every two K blocks, not every one. Its three f32
    tiles (the accumulator and two products, 192 registers a thread at 128x128 on two
    warpgroups) fit under the consumers' register budget; at 192x128 on three they would
    not. The products are cleared by their first wgmma (`scale_d` 0,
    `lower/fresh_accumulators.py`): zeros written into the second product's registers
    between the two issues made ptxas wait for the first product's wgmmas before issuing
    the second's (session 13's K-block pairs, 0.56-0.72x per-tensor). An odd last K
    block's twin reads zeros (TMA past K) times masked scales (zeros). On an H100
    (session 14) 128x128 S3 measured 0.73 / 0.72 / 0.79x the per-tensor 128x256 at 4096³
    / 8192³ / 4096x7168x2048, level with or below 192x128 on three warpgroups (0.72 /
    0.76 / 0.82x): the two cooperative warpgroups still drain together once a stage, so
    `matmul_fp8` does not time it."""
    sa0, sb0, sa1, sb1 = buffers
    ga = a.tile((BM, SCALE_BLOCK), (m, None))                  # (BM, 128, ⌈K/128⌉)
    gb = b.tile((BN, SCALE_BLOCK), (n, None))
    row_scales = scale_a.tile((BM, 1), (m, None))
    block_scales = scale_b.tile((1, 1), ((n * BN) // SCALE_BLOCK, None))

    def scales_of(k):                                          # past K: masked, zeros
        return tg.load(row_scales[:, :, k]) * tg.load(block_scales[:, :, k])

    acc = tg.zeros((BM, BN), f32)
    for j in tg.pipeline((ga.shape[2] + 1) // 2, stages=STAGES):
        tg.copy(ga[:, :, 2 * j], sa0[j])
        tg.copy(gb[:, :, 2 * j], sb0[j])
        tg.copy(ga[:, :, 2 * j + 1], sa1[j])
        tg.copy(gb[:, :, 2 * j + 1], sb1[j])
        even_scale, odd_scale = scales_of(2 * j), scales_of(2 * j + 1)
        even = tg.zeros((BM, BN), f32)
        odd = tg.zeros((BM, BN), f32)
        tg.gemm(even, sa0[j], sb0[j])
        tg.gemm(odd, sa1[j], sb1[j])
        acc += even * even_scale                               # while odd's wgmmas run
        acc += odd * odd_scale
    return acc


@lru_cache(maxsize=None)
def fp8_blockwise_persistent_kernel(out_t: DType) -> tg.Kernel:
    """The blockwise-scaled FP8 GEMM as a persistent kernel: `gemm.persistent_tiles`'s
    walk (one block per SM, grouped-rows order, one TMA ring for the block's life on
    sm_90a, so the producer warpgroup loads the next tile while the consumers store this
    one) around `blockwise_product`. On sm_90a the scale loads and the promotion run in
    the consumer warpgroups, between each K block's wgmma wait and the next K block. On an
    H100 its best tile is 192x128 on three consumer warpgroups (threads=384), 3 stages.
    TWIN=1: two K blocks a stage (`twin_blockwise_product`; each stage holds both)."""

    @tg.kernel(threads=128)
    def fp8_blockwise_persistent(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3],
                                 scale_a: tg.Tensor[f32], scale_b: tg.Tensor[f32],
                                 c: tg.Tensor[out_t], BM: tg.constexpr = 128,
                                 BN: tg.constexpr = 128, STAGES: tg.constexpr = 4,
                                 GROUP: tg.constexpr = 8, CLUSTER: tg.constexpr = 1,
                                 TWIN: tg.constexpr = 0):
        def make_product():
            buffers = blockwise_buffers(BM, BN, STAGES)
            if TWIN:
                buffers += blockwise_buffers(BM, BN, STAGES)
                return lambda m, n: twin_blockwise_product(a, b, scale_a, scale_b, m, n, BM,
                                                           BN, STAGES, buffers)
            return lambda m, n: blockwise_product(a, b, scale_a, scale_b, m, n, BM, BN,
                                                  STAGES, buffers)

        def finish(acc, m, n):
            tg.copy(acc.to(out_t), c.tile((BM, BN), (m, n)))
        persistent_tiles(a, b, f8e4m3, BM, BN, SCALE_BLOCK, STAGES, GROUP, finish, CLUSTER,
                         make_product)

    return fp8_blockwise_persistent


def spans_two_scale_blocks(bn: int) -> bool:
    """Whether every BN-wide tile of c's columns meets at most two of b's 128-column scale
    blocks (`blockwise_product` picks one of two scales per column). A tile starts at a
    multiple of gcd(BN, 128) within its first block."""
    return SCALE_BLOCK % bn == 0 or bn + SCALE_BLOCK - math.gcd(bn, SCALE_BLOCK) <= 2 * SCALE_BLOCK


def fp8_config(m: int, n: int, block_scales: bool, **tiles: int) -> tuple[tuple, dict]:
    """(grid, constexprs) for an FP8 GEMM: one block per (BM, BN) tile of c. Defaults:
    128×128 tiles, BK = 64 (64 bytes a row, as the f16 kernel's BK = 32) for per-tensor,
    the fixed 128 for blockwise, three stages."""
    defaults = dict(BM=128, BN=128, STAGES=3) if block_scales else \
        dict(BM=128, BN=128, BK=64, STAGES=3)
    constexprs = {**defaults, **tiles}
    if block_scales and constexprs.get("TWIN") and SCALE_BLOCK % constexprs["BN"]:
        raise ValueError(f"tegula.kernels.fp8: the blockwise kernel's TWIN=1 needs a BN "
                         f"dividing {SCALE_BLOCK} (one b scale a tile), got BN = "
                         f"{constexprs['BN']}")
    if block_scales and not spans_two_scale_blocks(constexprs["BN"]):
        raise ValueError(f"tegula.kernels.fp8: the blockwise kernel needs a BN whose tiles "
                         f"reach at most two of b's {SCALE_BLOCK}-column scale blocks (BN "
                         f"dividing {SCALE_BLOCK}, or 192, 256, ...), got BN = "
                         f"{constexprs['BN']}")
    return (tg.cdiv(m, constexprs["BM"]), tg.cdiv(n, constexprs["BN"])), constexprs


def scale_shapes(m: int, n: int, k: int, block_scales: bool) -> tuple[tuple, tuple]:
    """The shapes scale_a and scale_b must have (per-tensor: one value each)."""
    if not block_scales:
        return (1, 1), (1, 1)
    kb = -(-k // SCALE_BLOCK)                     # a last K block past K reads zeros
    return (m, kb), (-(-n // SCALE_BLOCK), kb)


def check_fp8_shapes(fn: str, a_shape: tuple, b_shape: tuple, block_scales: bool,
                     b_name: str = "b") -> tuple[int, int, int]:
    """(M, N, K) of a (M, K) and b (N, K) after the K checks, or a ValueError naming the
    argument (`b_name` says how the caller's b is laid out)."""
    (m, k), (n, k2) = a_shape, b_shape
    if k != k2:
        raise ValueError(f"tegula.kernels.{fn}: a is (M, K) and {b_name} has the same K, got "
                         f"a of shape {tuple(a_shape)}, {b_name} {tuple(b_shape)}")
    if k % K_ALIGN:
        raise ValueError(f"tegula.kernels.{fn}: K = {k} (a's columns) must be a multiple of "
                         f"{K_ALIGN} (16-byte e4m3 rows); pad a and b with zeros along K")
    return m, n, k


def check_scales(fn: str, scale_a_shape: tuple, scale_b_shape: tuple, m: int, n: int,
                 k: int, block_scales: bool) -> None:
    """The scales' shapes against `scale_shapes`, or a ValueError naming the argument."""
    want_a, want_b = scale_shapes(m, n, k, block_scales)
    form = ("blockwise (block_scales=True): scale_a is (M, ⌈K/128⌉), scale_b (⌈N/128⌉, "
            "⌈K/128⌉)"
            if block_scales else "per-tensor: one value each")
    for name, got, want in (("scale_a", scale_a_shape, want_a), ("scale_b", scale_b_shape,
                                                                 want_b)):
        flat = tuple(got) in ((), (1,)) and want == (1, 1)
        if tuple(got) != want and not flat:
            raise ValueError(f"tegula.kernels.{fn}: {name} has shape {tuple(got)}, expected "
                             f"{want} for M={m}, N={n}, K={k} ({form})")


def check_fp8_target(fn: str, target) -> None:
    """FP8 tensor-core instructions exist from sm_89 on; refuse older targets up front."""
    from tegula.arch import get_target
    t = get_target(target)
    if t.cc < 89:
        raise ValueError(f"tegula.kernels.{fn}: FP8 (e4m3) matmul needs tensor cores of sm_89 "
                         f"or newer (Ada, Hopper); target {t.name} has none")


def matmul_fp8_emulated(a: np.ndarray, b: np.ndarray, scale_a, scale_b,
                        out_dtype: DType = bf16, block_scales: bool = False,
                        target: str = "sm_90a", persistent: int = 0,
                        **tiles: int) -> np.ndarray:
    """`(a · scale_a) @ (b · scale_b).T` by the emulated FP8 kernel. a (M, K) and b (N, K)
    are e4m3 values as float32 arrays (rounded to e4m3 as the kernel loads them) or raw
    uint8 bit patterns; scales are f32: numbers or (1, 1) arrays per tensor, or the
    blockwise shapes of `scale_shapes`. `persistent` > 0: the persistent kernel on a GPU
    of that many SMs. Returns out_dtype values (bf16 as float32)."""
    fn = "matmul_fp8_emulated"
    check_fp8_target(fn, target)
    check_array(fn, "a", a, ndim=2)
    check_array(fn, "b", b, ndim=2)
    for name, x in (("a", a), ("b", b)):
        if x.dtype not in (np.float32, np.uint8):
            raise TypeError(f"tegula.kernels.{fn}: {name} must hold e4m3 values as float32 "
                            f"(rounded on load) or uint8 bit patterns, got {x.dtype}")
    if a.dtype != b.dtype:
        raise TypeError(f"tegula.kernels.{fn}: a and b must both be float32 or both uint8, "
                        f"got {a.dtype} and {b.dtype}")
    if out_dtype not in FP8_OUT_DTYPES:
        raise TypeError(f"tegula.kernels.{fn}: out_dtype must be one of "
                        f"{', '.join(map(str, FP8_OUT_DTYPES))}, got {out_dtype}")
    m, n, k = check_fp8_shapes(fn, a.shape, b.shape, block_scales)
    sa = np.atleast_2d(np.asarray(scale_a, dtype=np.float32))
    sb = np.atleast_2d(np.asarray(scale_b, dtype=np.float32))
    check_scales(fn, np.shape(scale_a), np.shape(scale_b), m, n, k, block_scales)
    c = poisoned((m, n), out_dtype)
    grid, constexprs = fp8_config(m, n, block_scales, **tiles)
    kernel = fp8_blockwise_gemm_kernel(out_dtype) if block_scales else fp8_gemm_kernel(out_dtype)
    if persistent:
        kernel = fp8_blockwise_persistent_kernel(out_dtype) if block_scales else \
            fp8_persistent_gemm_kernel(out_dtype)
        grid = persistent_grid(m, n, persistent, constexprs["BM"], constexprs["BN"],
                               constexprs.get("CLUSTER", 1))
    launch_emulated(kernel, grid, a, b, np.ascontiguousarray(sa), np.ascontiguousarray(sb), c,
                    target=target, **constexprs)
    return c


__all__ = ["fp8_gemm_kernel", "fp8_persistent_gemm_kernel", "fp8_blockwise_gemm_kernel",
           "fp8_blockwise_persistent_kernel", "blockwise_product", "twin_blockwise_product",
           "blockwise_buffers",
           "fp8_config", "scale_shapes", "spans_two_scale_blocks",
           "check_fp8_shapes", "check_scales", "check_fp8_target", "matmul_fp8_emulated", "FP8_OUT_DTYPES",
           "SCALE_BLOCK", "K_ALIGN"]
