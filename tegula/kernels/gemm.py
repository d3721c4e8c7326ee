"""GEMM: `c = a @ b.T` for a (M, K) and b (N, K), both K-major, accumulated in registers.

Two dataflows, both with every layout and instruction synthesized:

* `gemm_kernel` — the shared-memory pipeline of the README: each k-step's A and B tiles are
  copied into multi-stage shared buffers (cp.async, STAGES - 1 steps ahead) and fed to the
  tensor cores from there (ldmatrix where the layout allows).
* `gemm_registers_kernel` — no shared memory: each k-step's tiles are loaded from global
  memory straight into registers in the MMA's operand layout (synthesis derives it from the
  gemm anchor) and fed to `tg.gemm` as register operands.

Float operands (f16, bf16) accumulate in f32 and are stored in their own type; i8 operands
accumulate in i32 and are stored as i32 (exact).

Float GEMMs take a fused epilogue (`epilogue`): a bias per output column (c's type) added
to the f32 accumulator, then an activation (`ACTIVATIONS`), then one rounding to c's type —
in registers, before the store, so it costs no extra pass over c. `gemm_kernel(dtype,
activation=...)` has the README's parameters; `gemm_bias_kernel` adds the `bias` tensor,
passed as a (1, N) view.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

import tegula as tg
from tegula import f32, i32
from tegula.dtypes import DType, bf16, f16, i8
from tegula.lang.tensors import RegisterValue
from tegula.kernels.common import (check_array, check_same_dtype, dtype_of_array,
                                   launch_emulated, poisoned)
from tegula.kernels.schedule import grouped_tile

GEMM_DTYPES = (f16, bf16, i8)


def accumulator_type(dtype: DType) -> DType:
    """What the tensor cores accumulate `dtype` products in."""
    return i32 if dtype == i8 else f32


def output_type(dtype: DType) -> DType:
    """The type of c: the operands' type for floats, i32 for integers (exact)."""
    return i32 if dtype == i8 else dtype


#: Fused activations: "gelu" is exact (erf), as torch's default `F.gelu`; "gelu_tanh" is
#: `F.gelu(approximate="tanh")`; "silu" is x·sigmoid(x).
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")


def activate(z: RegisterValue, activation: str | None) -> RegisterValue:
    """`activation` of the f32 tile `z` (trace time: called inside a kernel body)."""
    if activation is None:
        return z
    if activation == "relu":
        return tg.maximum(z, 0.0)               # NaN stays NaN (max.NaN), as torch.relu
    if activation == "gelu":
        return 0.5 * z * (1.0 + tg.erf(z * 0.7071067811865476))
    if activation == "gelu_tanh":
        return 0.5 * z * (1.0 + tg.tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
    if activation == "silu":
        # z·sigmoid(z) with sigmoid = rsqrt(1 + e^-z)²: `tg.sigmoid` divides, and C's
        # IEEE division's slow path (a call) spilled 192–400 bytes per thread in the
        # 128x256 epilogues (ptxas 13, sm_90a) and cost 25% at 4096³ (H100, session 11);
        # rsqrt (≤ 2 ulp) squared is within ~5 ulp of f32, far below c's rounding.
        r = tg.rsqrt(1.0 + tg.exp(-z))
        return z * r * r
    raise ValueError(f"unknown activation {activation!r}; one of {ACTIVATIONS}")


def epilogue(acc: RegisterValue, bias_row: RegisterValue | None,
             activation: str | None) -> RegisterValue:
    """The fused epilogue on the f32 accumulator: + the bias row (broadcast over the
    block's rows, added in f32), then the activation. The caller rounds once."""
    z = acc if bias_row is None else acc + bias_row.to(f32)
    return activate(z, activation)


def pipelined_product(a, b, m, n, dtype: DType, BM: int, BN: int, BK: int,
                      STAGES: int, buffers: tuple | None = None) -> RegisterValue:
    """The (BM, BN) tile (m, n) of a @ b.T through the multi-stage shared pipeline (trace
    time; the README kernel's main loop). `buffers`: the (sa, sb) staged shared tiles to
    run through, made once outside a persistent kernel's tile loop (one ring per block);
    by default the product makes its own."""
    ga = a.tile((BM, BK), (m, None))            # (BM, BK, K/BK): the block's rows of a
    gb = b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), accumulator_type(dtype))
    sa, sb = buffers or staged_buffers(dtype, BM, BN, BK, STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])              # acc += sa @ sb.T
    return acc


def staged_buffers(dtype: DType, BM: int, BN: int, BK: int, STAGES: int) -> tuple:
    """The (sa, sb) shared operand tiles of `pipelined_product`, STAGES deep."""
    return (tg.shared((BM, BK), dtype, stages=STAGES),
            tg.shared((BN, BK), dtype, stages=STAGES))


def persistent_tiles(a, b, dtype: DType, BM: int, BN: int, BK: int, STAGES: int,
                     GROUP: int, finish, CLUSTER: int = 1, make_product=None) -> None:
    """The persistent GEMM's body (trace time; first in the kernel, as it declares the
    cluster): this block walks output tiles b, b + grid, b + 2·grid, … in grouped-rows
    order (`schedule.grouped_tile`, GROUP row tiles a band, so blocks running together
    share operand tiles in L2), runs each tile's K loop through one shared ring made here —
    on sm_90a one TMA + mbarrier ring for the block's life, so the producer loads the next
    tile while the consumers run `finish(acc, m, n)`, the epilogue and store of tile
    (m, n). With CLUSTER > 1 the blocks go in clusters of CLUSTER along the rows
    (`tg.cluster`): a cluster walks units of CLUSTER row tiles of one column tile, so its
    blocks load the same b tile, which TMA multicasts to all of them; a row tile past a's
    rows computes zeros and stores nothing. `make_product()` (called once, after the
    cluster is declared) returns another `product(m, n)` for the tile, making its own
    shared ring (the blockwise FP8 kernel's); by default `pipelined_product`."""
    tg.cluster(CLUSTER)
    tiles_m = tg.cdiv(tg.cdiv(a.shape[0], BM), CLUSTER)   # in units of CLUSTER row tiles
    tiles_n = tg.cdiv(b.shape[0], BN)
    if make_product is None:
        buffers = staged_buffers(dtype, BM, BN, BK, STAGES)

        def product(m, n):
            return pipelined_product(a, b, m, n, dtype, BM, BN, BK, STAGES, buffers)
    else:
        product = make_product()
    for t in tg.range(tg.block_id(0) // CLUSTER, tiles_m * tiles_n,
                      tg.num_programs(0) // CLUSTER):
        mc, n = grouped_tile(t, tiles_m, tiles_n, GROUP)
        m = mc * CLUSTER + tg.block_id(0) % CLUSTER
        finish(product(m, n), m, n)


def register_product(a, b, m, n, dtype: DType, BM: int, BN: int, BK: int) -> RegisterValue:
    """The (BM, BN) tile (m, n) of a @ b.T with operands loaded straight into registers."""
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), accumulator_type(dtype))
    for k in tg.range(ga.shape[2]):
        tg.gemm(acc, tg.load(ga[:, :, k]), tg.load(gb[:, :, k]))
    return acc


def _check_epilogue(dtype: DType, activation: str | None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"tegula.kernels.gemm: unknown activation {activation!r}; one of "
                         f"{', '.join(map(repr, ACTIVATIONS))}")
    if dtype == i8 and activation is not None:
        raise ValueError("tegula.kernels.gemm: i8 GEMMs have no epilogue (their i32 result is "
                         "exact; apply it afterwards)")


@lru_cache(maxsize=None)
def gemm_kernel(dtype: DType, activation: str | None = None,
                with_bias: bool = False) -> tg.Kernel:
    """The shared-memory pipelined GEMM for operands of `dtype` (the README kernel), with
    the fused epilogue (`with_bias`: a (1, N) `bias` tensor parameter after b).

    CLUSTER_M x CLUSTER_N > 1 (sm_90a) launches it in clusters of that many blocks
    (`tile_grid` rounds the grid up to whole clusters; a block past c's edge loads zeros
    and stores nothing): the blocks of a cluster along N share their a tile, along M their
    b tile, which TMA loads once and multicasts. For decode shapes (few rows), where narrow
    N tiles give the GPU enough blocks to stream the weights but each would read all of a
    again from L2."""
    _check_epilogue(dtype, activation)
    out_t = output_type(dtype)

    if with_bias:
        @tg.kernel(threads=128)
        def gemm_bias(a: tg.Tensor[dtype], b: tg.Tensor[dtype], bias: tg.Tensor[out_t],
                      c: tg.Tensor[out_t], BM: tg.constexpr = 128, BN: tg.constexpr = 128,
                      BK: tg.constexpr = 32, STAGES: tg.constexpr = 3,
                      CLUSTER_M: tg.constexpr = 1, CLUSTER_N: tg.constexpr = 1):
            tg.cluster(CLUSTER_M, CLUSTER_N)
            m, n = tg.block_id(0), tg.block_id(1)
            acc = pipelined_product(a, b, m, n, dtype, BM, BN, BK, STAGES)
            z = epilogue(acc, tg.load(bias.tile((1, BN), (0, n))), activation)
            tg.copy(z.to(out_t), c.tile((BM, BN), (m, n)))
        return gemm_bias

    @tg.kernel(threads=128)
    def gemm(a: tg.Tensor[dtype], b: tg.Tensor[dtype], c: tg.Tensor[out_t],
             BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
             STAGES: tg.constexpr = 3, CLUSTER_M: tg.constexpr = 1,
             CLUSTER_N: tg.constexpr = 1):
        tg.cluster(CLUSTER_M, CLUSTER_N)
        m, n = tg.block_id(0), tg.block_id(1)
        acc = pipelined_product(a, b, m, n, dtype, BM, BN, BK, STAGES)
        tg.copy(epilogue(acc, None, activation).to(out_t), c.tile((BM, BN), (m, n)))

    return gemm


@lru_cache(maxsize=None)
def gemm_registers_kernel(dtype: DType, activation: str | None = None,
                          with_bias: bool = False) -> tg.Kernel:
    """The register-only GEMM for operands of `dtype`: global -> registers -> MMA, with the
    fused epilogue (`with_bias`: a (1, N) `bias` tensor parameter after b)."""
    _check_epilogue(dtype, activation)
    out_t = output_type(dtype)

    if with_bias:
        @tg.kernel(threads=128)
        def gemm_registers_bias(a: tg.Tensor[dtype], b: tg.Tensor[dtype],
                                bias: tg.Tensor[out_t], c: tg.Tensor[out_t],
                                BM: tg.constexpr = 64, BN: tg.constexpr = 64,
                                BK: tg.constexpr = 32):
            m, n = tg.block_id(0), tg.block_id(1)
            acc = register_product(a, b, m, n, dtype, BM, BN, BK)
            z = epilogue(acc, tg.load(bias.tile((1, BN), (0, n))), activation)
            tg.copy(z.to(out_t), c.tile((BM, BN), (m, n)))
        return gemm_registers_bias

    @tg.kernel(threads=128)
    def gemm_registers(a: tg.Tensor[dtype], b: tg.Tensor[dtype], c: tg.Tensor[out_t],
                       BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32):
        m, n = tg.block_id(0), tg.block_id(1)
        acc = register_product(a, b, m, n, dtype, BM, BN, BK)
        tg.copy(epilogue(acc, None, activation).to(out_t), c.tile((BM, BN), (m, n)))

    return gemm_registers


@lru_cache(maxsize=None)
def staged_gemm_kernel(dtype: DType, activation: str | None = None,
                       with_bias: bool = False) -> tg.Kernel:
    """One block per (BM, BN) tile of c, as `gemm_kernel`, with the persistent kernel's
    epilogue: on sm_90a the tile goes to c through swizzled shared-memory boxes and TMA
    stores (whole 128-byte lines) where `gemm_kernel` stores registers (4-byte pieces of
    8 rows a warp instruction), and the block's tile comes from its grid position, with
    none of the persistent loop's divisions before the first load (`tile_grid`). For
    shapes with no more tiles than SMs (2048³: 128 tiles of 128×256), where the
    persistent kernel runs one tile a block anyway; `with_bias`: a (1, N) `bias`
    parameter after b."""
    _check_epilogue(dtype, activation)
    out_t = output_type(dtype)

    def tile(a, b, bias, c, BM, BN, BK, STAGES):
        # A loop of one trip around the tile: the TMA ring then runs across an enclosing
        # loop, which is what synthesis stages register -> global copies through shared
        # memory for (`copies.plan_tma_stores`); one trip, so nothing else changes.
        for _ in tg.range(0, 1):
            m, n = tg.block_id(0), tg.block_id(1)
            acc = pipelined_product(a, b, m, n, dtype, BM, BN, BK, STAGES)
            row = None if bias is None else tg.load(bias.tile((1, BN), (0, n)))
            tg.copy(epilogue(acc, row, activation).to(out_t), c.tile((BM, BN), (m, n)))

    if with_bias:
        @tg.kernel(threads=128)
        def staged_gemm_bias(a: tg.Tensor[dtype], b: tg.Tensor[dtype], bias: tg.Tensor[out_t],
                             c: tg.Tensor[out_t], BM: tg.constexpr = 128,
                             BN: tg.constexpr = 128, BK: tg.constexpr = 64,
                             STAGES: tg.constexpr = 4):
            tile(a, b, bias, c, BM, BN, BK, STAGES)
        return staged_gemm_bias

    @tg.kernel(threads=128)
    def staged_gemm(a: tg.Tensor[dtype], b: tg.Tensor[dtype], c: tg.Tensor[out_t],
                    BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 64,
                    STAGES: tg.constexpr = 4):
        tile(a, b, None, c, BM, BN, BK, STAGES)
    return staged_gemm


@lru_cache(maxsize=None)
def persistent_gemm_kernel(dtype: DType, activation: str | None = None,
                           with_bias: bool = False) -> tg.Kernel:
    """The persistent GEMM (`persistent_tiles`) for operands of `dtype`, with the fused
    epilogue (`with_bias`: a (1, N) `bias` tensor parameter after b). Launched on
    `persistent_grid` blocks; on an H100 its tiles are BM=128, BN=256, BK=64, STAGES=4 at
    threads=256 (two cooperative consumer warpgroups, plus the producer warpgroup
    synthesis adds), or 64x256 at threads=128, where synthesis makes two ping-pong
    consumer warpgroups taking alternate tiles (`synth/roles.py`)."""
    _check_epilogue(dtype, activation)
    out_t = output_type(dtype)

    if with_bias:
        @tg.kernel(threads=128)
        def persistent_gemm_bias(a: tg.Tensor[dtype], b: tg.Tensor[dtype],
                                 bias: tg.Tensor[out_t], c: tg.Tensor[out_t],
                                 BM: tg.constexpr = 128, BN: tg.constexpr = 128,
                                 BK: tg.constexpr = 32, STAGES: tg.constexpr = 3,
                                 GROUP: tg.constexpr = 8, CLUSTER: tg.constexpr = 1):
            def finish(acc, m, n):
                z = epilogue(acc, tg.load(bias.tile((1, BN), (0, n))), activation)
                tg.copy(z.to(out_t), c.tile((BM, BN), (m, n)))
            persistent_tiles(a, b, dtype, BM, BN, BK, STAGES, GROUP, finish, CLUSTER)
        return persistent_gemm_bias

    @tg.kernel(threads=128)
    def persistent_gemm(a: tg.Tensor[dtype], b: tg.Tensor[dtype], c: tg.Tensor[out_t],
                        BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
                        STAGES: tg.constexpr = 3, GROUP: tg.constexpr = 8,
                        CLUSTER: tg.constexpr = 1):
        def finish(acc, m, n):
            tg.copy(epilogue(acc, None, activation).to(out_t), c.tile((BM, BN), (m, n)))
        persistent_tiles(a, b, dtype, BM, BN, BK, STAGES, GROUP, finish, CLUSTER)

    return persistent_gemm


def persistent_grid(m: int, n: int, num_sms: int, bm: int = 128, bn: int = 128,
                    cluster: int = 1) -> tuple[int]:
    """A persistent kernel's grid: one block per SM, fewer when there are fewer tiles;
    whole clusters of `cluster` blocks, each cluster walking units of `cluster` row
    tiles."""
    units = tg.cdiv(tg.cdiv(m, bm), cluster) * tg.cdiv(n, bn)
    return (max(1, min(units, num_sms // cluster)) * cluster,)


@lru_cache(maxsize=None)
def gemm_split_k_kernel(dtype: DType) -> tg.Kernel:
    """The shared-memory GEMM with K split SPLIT ways (grid axis 2): block (m, n, s)
    accumulates k-tiles [s·per, (s+1)·per) and stores its f32 (or i32) partial sum into
    rows s·Mt·BM + m·BM … of `partial` ((SPLIT·Mt·BM, N), Mt = cdiv(M, BM)), for
    `split_k_reduce_kernel` to add up. For few-row GEMMs whose (M/BM)·(N/BN) tiles cannot
    fill the GPU (128×4096 in 64×128 tiles is 64 blocks for 132 SMs); summing partials
    in a fixed order keeps results deterministic, unlike atomics."""
    acc_t = accumulator_type(dtype)

    @tg.kernel(threads=128)
    def gemm_split_k(a: tg.Tensor[dtype], b: tg.Tensor[dtype], partial: tg.Tensor[acc_t],
                     BM: tg.constexpr = 64, BN: tg.constexpr = 128, BK: tg.constexpr = 64,
                     STAGES: tg.constexpr = 4, SPLIT: tg.constexpr = 2):
        m, n, s = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        ga = a.tile((BM, BK), (m, None))
        gb = b.tile((BN, BK), (n, None))
        per = tg.cdiv(ga.shape[2], SPLIT)           # k-tiles per split (the last may run
        acc = tg.zeros((BM, BN), acc_t)             # past K: those tiles load as zeros)
        sa = tg.shared((BM, BK), dtype, stages=STAGES)
        sb = tg.shared((BN, BK), dtype, stages=STAGES)
        for k in tg.pipeline(s * per, s * per + per, stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        m_tiles = tg.cdiv(a.shape[0], BM)
        tg.copy(acc, partial.tile((BM, BN), (s * m_tiles + m, n)))

    return gemm_split_k


@lru_cache(maxsize=None)
def split_k_reduce_kernel(dtype: DType, activation: str | None = None,
                          with_bias: bool = False) -> tg.Kernel:
    """c = the sum of `gemm_split_k_kernel`'s SPLIT partials, in split order, through the
    fused epilogue (`with_bias`: a (1, N) `bias` parameter after `partial`), rounded to
    c's type once. `partial` is (SPLIT·Mt·BM, N) with Mt·BM ≥ M rows per split."""
    _check_epilogue(dtype, activation)
    acc_t, out_t = accumulator_type(dtype), output_type(dtype)

    def total_of(partial, m, n, ROWS, SPLIT, BM, BN):
        row_tiles = ROWS // BM                      # tiles per split (BM divides ROWS)
        total = tg.load(partial.tile((BM, BN), (m, n)))
        for s in range(1, SPLIT):
            total += tg.load(partial.tile((BM, BN), (s * row_tiles + m, n)))
        return total

    if with_bias:
        @tg.kernel(threads=128)
        def split_k_reduce_bias(partial: tg.Tensor[acc_t], bias: tg.Tensor[out_t],
                                c: tg.Tensor[out_t], ROWS: tg.constexpr,
                                SPLIT: tg.constexpr = 2, BM: tg.constexpr = 16,
                                BN: tg.constexpr = 256):
            m, n = tg.block_id(0), tg.block_id(1)
            total = total_of(partial, m, n, ROWS, SPLIT, BM, BN)
            z = epilogue(total, tg.load(bias.tile((1, BN), (0, n))), activation)
            tg.copy(z.to(out_t), c.tile((BM, BN), (m, n)))
        return split_k_reduce_bias

    @tg.kernel(threads=128)
    def split_k_reduce(partial: tg.Tensor[acc_t], c: tg.Tensor[out_t],
                       ROWS: tg.constexpr, SPLIT: tg.constexpr = 2,
                       BM: tg.constexpr = 16, BN: tg.constexpr = 256):
        m, n = tg.block_id(0), tg.block_id(1)
        total = total_of(partial, m, n, ROWS, SPLIT, BM, BN)
        tg.copy(epilogue(total, None, activation).to(out_t), c.tile((BM, BN), (m, n)))

    return split_k_reduce


def split_k_rows(m: int, bm: int) -> int:
    """Rows of `partial` per split: M rounded up to whole BM tiles."""
    return tg.cdiv(m, bm) * bm


def gemm_config(m: int, n: int, k: int, dtype: DType, shared: bool = True,
                **tiles: int) -> tuple[tuple[int, int], dict]:
    """(grid, constexprs) for an (M, N, K) GEMM: one block per (BM, BN) tile of c
    (`tile_grid`). Defaults: 128x128 tiles in three shared stages, 64x64 for the register
    dataflow (every register holds its own operands there); BK=32, or 64 for i8 so a
    k-step moves the same 64 bytes per row."""
    bk = 64 if dtype == i8 else 32
    defaults = dict(BM=128, BN=128, BK=bk, STAGES=3) if shared else dict(BM=64, BN=64, BK=bk)
    constexprs = {**defaults, **tiles}
    return tile_grid(m, n, constexprs["BM"], constexprs["BN"], constexprs.get("CLUSTER_M", 1),
                     constexprs.get("CLUSTER_N", 1)), constexprs


def tile_grid(m: int, n: int, bm: int, bn: int, cluster_m: int = 1,
              cluster_n: int = 1) -> tuple[int, int]:
    """One block per (bm, bn) tile of an (m, n) result, each axis rounded up to whole
    clusters (`gemm_kernel`'s CLUSTER_M x CLUSTER_N)."""
    return (tg.cdiv(tg.cdiv(m, bm), cluster_m) * cluster_m,
            tg.cdiv(tg.cdiv(n, bn), cluster_n) * cluster_n)


def gemm_emulated(a: np.ndarray, b: np.ndarray, dtype: DType | None = None,
                  shared: bool = True, split: int = 1, bias: np.ndarray | None = None,
                  activation: str | None = None, target: str = "sm_90a",
                  persistent: int = 0, staged: bool = False, **tiles: int) -> np.ndarray:
    """`activation(a @ b.T + bias)` by the emulated kernel (`shared=False`: the
    register-only dataflow; `split` > 1: K split that many ways, then the partials reduced
    with the epilogue; `persistent` > 0: the persistent kernel on a GPU of that many SMs;
    `staged`: `staged_gemm_kernel`, one block per tile).
    `bias` is (N,) in c's type (f32 arrays for bf16, as everywhere)."""
    fn = "gemm_emulated"
    check_array(fn, "a", a, ndim=2)
    check_array(fn, "b", b, ndim=2)
    check_same_dtype(fn, a=a, b=b)
    dtype = dtype or dtype_of_array(a, fn, "a")
    if dtype not in GEMM_DTYPES:
        raise TypeError(f"tegula.kernels.{fn}: operands of type {dtype} are not supported "
                        f"(one of {', '.join(map(str, GEMM_DTYPES))}); FP8 GEMMs are "
                        f"tegula.kernels.fp8.matmul_fp8_emulated")
    (m, k), (n, k2) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"tegula.kernels.{fn}: a is (M, K) and b is (N, K) with one K, got "
                         f"a of shape {a.shape} and b of shape {b.shape}")
    _check_epilogue(dtype, activation)
    bias_args = ()
    if bias is not None:
        if dtype == i8:
            raise ValueError(f"tegula.kernels.{fn}: i8 GEMMs take no bias")
        check_array(fn, "bias", bias, ndim=1)
        check_same_dtype(fn, a=a, bias=bias)
        if bias.shape[0] != n:
            raise ValueError(f"tegula.kernels.{fn}: bias must have one value per column of "
                             f"c (N = {n}), got shape {bias.shape}")
        bias_args = (bias.reshape(1, n),)
    with_bias = bias is not None
    c = poisoned((m, n), output_type(dtype))
    if split > 1:
        constexprs = {**dict(BM=64, BN=128, BK=64 if dtype != i8 else 128, STAGES=4), **tiles}
        rows = split_k_rows(m, constexprs["BM"])
        partial = poisoned((split * rows, n), accumulator_type(dtype))
        grid = (tg.cdiv(m, constexprs["BM"]), tg.cdiv(n, constexprs["BN"]), split)
        launch_emulated(gemm_split_k_kernel(dtype), grid, a, b, partial, SPLIT=split,
                        target=target, **constexprs)
        launch_emulated(split_k_reduce_kernel(dtype, activation, with_bias),
                        split_k_reduce_grid(m, n), partial, *bias_args, c, ROWS=rows,
                        SPLIT=split, target=target)
        return c
    grid, constexprs = gemm_config(m, n, k, dtype, shared, **tiles)
    factory = staged_gemm_kernel if staged else gemm_kernel if shared else gemm_registers_kernel
    if persistent:
        factory = persistent_gemm_kernel
        grid = persistent_grid(m, n, persistent, constexprs["BM"], constexprs["BN"],
                               constexprs.get("CLUSTER", 1))
    launch_emulated(factory(dtype, activation, with_bias), grid, a, b, *bias_args, c,
                    target=target, **constexprs)
    return c


def split_k_reduce_grid(m: int, n: int, bm: int = 16, bn: int = 256) -> tuple[int, int]:
    """The reduce kernel's grid for an (M, N) result in its default (BM, BN) tiles."""
    return tg.cdiv(m, bm), tg.cdiv(n, bn)


__all__ = ["gemm_kernel", "gemm_registers_kernel", "persistent_gemm_kernel",
           "staged_gemm_kernel", "persistent_tiles", "persistent_grid", "staged_buffers", "gemm_split_k_kernel",
           "split_k_reduce_kernel", "split_k_rows", "split_k_reduce_grid", "gemm_config",
           "tile_grid",
           "gemm_emulated", "pipelined_product", "register_product", "epilogue", "activate",
           "ACTIVATIONS", "accumulator_type", "output_type", "GEMM_DTYPES"]
