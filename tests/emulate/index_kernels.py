"""Kernels written the way a Triton user writes masks, broadcasts and argmax, shared by the
emulator tests (against numpy), the compile tests (NVRTC) and the GPU tests (against torch).

Each `*_case` returns (kernel, grid, inputs, outputs, constexprs, reference outputs) so that
every consumer runs exactly the same launch.
"""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula.dtypes import DType, f32, i8, i32
from tegula.emulate.values import round_to
from tegula.kernels.common import poisoned


def causal_mask_kernel(threads: int):
    """out = where(row >= col and col < N, x, 0) + col, on (BM, BN) blocks: tile
    coordinates from tg.arange with a block-origin offset and from kernel scalars."""
    @tg.kernel(threads=threads)
    def causal_mask(x: tg.Tensor[f32], out: tg.Tensor[f32], BM: tg.constexpr = 16,
                    BN: tg.constexpr = 64):
        m, n = tg.block_id(0), tg.block_id(1)
        t = tg.load(x.tile((BM, BN), (m, n)))
        rows = tg.arange(BM, offset=m * BM)          # offset argument
        cols = n * BN + tg.arange(BN)                 # kernel scalar + tile
        keep = (rows[:, None] >= cols[None, :]) & (x.shape[1] > cols)  # scalar on the left
        y = tg.where(keep, t, 0.0) + cols.to(f32)     # (BM, BN) + (BN,): numpy promotion
        tg.copy(y, out.tile((BM, BN), (m, n)))
    return causal_mask


def causal_mask_case(rng, shape, threads, BM, BN):
    x = rng.standard_normal(shape).astype(np.float32)
    rows, cols = np.indices(shape)
    ref = (np.where(rows >= cols, x, 0) + cols).astype(np.float32)
    grid = (tg.cdiv(shape[0], BM), tg.cdiv(shape[1], BN))
    return causal_mask_kernel(threads), grid, [x], [poisoned(shape, f32)], \
        dict(BM=BM, BN=BN), [ref]


def indices_kernel(threads: int):
    """Both coordinates of a 2-D tile, offset by the block origin along each axis, and a
    run-time int parameter `shift` added through tile arithmetic."""
    @tg.kernel(threads=threads)
    def coordinates(rows: tg.Tensor[i32], cols: tg.Tensor[i32], shift: int,
                    BM: tg.constexpr = 8, BN: tg.constexpr = 32):
        m, n = tg.block_id(0), tg.block_id(1)
        r = tg.indices((BM, BN), 0, offset=m * BM)
        c = tg.indices((BM, BN), -1) + n * BN
        tg.copy(r * 1000 + shift, rows.tile((BM, BN), (m, n)))
        tg.copy(shift - c, cols.tile((BM, BN), (m, n)))
    return coordinates


def indices_case(rng, shape, threads, BM, BN):
    shift = int(rng.integers(-50, 50))
    r, c = np.indices(shape, dtype=np.int64)
    refs = [(r * 1000 + shift).astype(np.int32), (shift - c).astype(np.int32)]
    grid = (tg.cdiv(shape[0], BM), tg.cdiv(shape[1], BN))
    outs = [poisoned(shape, i32), poisoned(shape, i32)]
    return indices_kernel(threads), grid, [], outs + [shift], dict(BM=BM, BN=BN), refs


def broadcast_kernel(threads: int):
    """x * w[None, :] + b[:, None] - max(x, 1) (one block column: BN >= N), and the row
    maxima stored as a 1-D tensor through `[:, 0]`: 1-D tiles loaded from 1-D tensors
    meet 2-D ones."""
    @tg.kernel(threads=threads)
    def broadcast(x: tg.Tensor[f32], w: tg.Tensor[f32, 1], b: tg.Tensor[f32, 1],
                  out: tg.Tensor[f32], row_max: tg.Tensor[f32, 1],
                  BM: tg.constexpr = 16, BN: tg.constexpr = 64):
        m = tg.block_id(0)
        t = tg.load(x.tile((BM, BN), (m, 0)), fill=-float("inf"))
        wt = tg.load(w.tile((BN,), (0,)))
        bt = tg.load(b.tile((BM,), (m,)))
        biggest = tg.max(t, 1)
        y = t * wt[None, :] + bt[:, None] - biggest
        tg.copy(y, out.tile((BM, BN), (m, 0)))
        tg.copy(biggest[:, 0], row_max.tile((BM,), (m,)))
    return broadcast


def broadcast_case(rng, shape, threads, BM, BN):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    b = rng.standard_normal(shape[0]).astype(np.float32)
    biggest = x.max(axis=1)
    ref = ((x * w[None, :] + b[:, None]).astype(np.float32) - biggest[:, None])
    grid = (tg.cdiv(shape[0], BM),)
    outs = [poisoned(shape, f32), poisoned((shape[0],), f32)]
    return broadcast_kernel(threads), grid, [x, w, b], outs, dict(BM=BM, BN=BN), \
        [ref.astype(np.float32), biggest]


def arg_kernel(kind: str, axis: int, dtype: DType, threads: int):
    """argmax/argmin of (BM, BN) tiles along `axis`; out-of-bounds elements read as the
    fill that never wins (the type's lowest value for argmax, its highest for argmin)."""
    fill = _losing_fill(kind, dtype)

    @tg.kernel(threads=threads)
    def arg_reduce(x: tg.Tensor[dtype], out: tg.Tensor[i32], BM: tg.constexpr = 16,
                   BN: tg.constexpr = 64):
        m, n = tg.block_id(0), tg.block_id(1)
        t = tg.load(x.tile((BM, BN), (m, n)), fill=fill)
        found = tg.argmax(t, axis) if kind == "argmax" else tg.argmin(t, axis)
        if axis == 1:   # positions within the tile, made global with the block's origin
            tg.copy(found + n * BN, out.tile((BM, 1), (m, n)))
        else:
            tg.copy(found + m * BM, out.tile((1, BN), (m, n)))
    return arg_reduce


def _losing_fill(kind: str, dtype: DType) -> float:
    if dtype.is_float:
        return -float("inf") if kind == "argmax" else float("inf")
    info = np.iinfo(np.dtype(dtype.numpy_name))
    return float(info.min if kind == "argmax" else info.max)


def special_values(rng, shape, dtype: DType) -> np.ndarray:
    """Small integers (many ties), with NaN, +inf and -inf sprinkled in for float types."""
    x = rng.integers(-3, 4, size=shape).astype(np.float64)
    if dtype.is_float:
        spread = rng.random(shape) < 0.3
        x[spread] = rng.standard_normal(np.count_nonzero(spread))
        for value, p in ((np.nan, 0.04), (np.inf, 0.04), (-np.inf, 0.04)):
            x[rng.random(shape) < p] = value
        return round_to(x.astype(np.float32), dtype)
    return x.astype(np.dtype(dtype.numpy_name))


def arg_case(rng, shape, kind, axis, dtype, threads, BM, BN):
    """Positions within each BM x BN block (one output per block row/column), compared
    with numpy on each block: argmax within the tile, plus the block's origin."""
    x = special_values(rng, shape, dtype)
    grid = (tg.cdiv(shape[0], BM), tg.cdiv(shape[1], BN))
    if axis == 1:
        out_shape, ref = (shape[0], grid[1]), np.empty((shape[0], grid[1]), np.int32)
        for n in range(grid[1]):
            block = x[:, n * BN:(n + 1) * BN].astype(np.float64)
            ref[:, n] = getattr(np, kind)(block, axis=1) + n * BN
    else:
        out_shape, ref = (grid[0], shape[1]), np.empty((grid[0], shape[1]), np.int32)
        for m in range(grid[0]):
            block = x[m * BM:(m + 1) * BM].astype(np.float64)
            ref[m] = getattr(np, kind)(block, axis=0) + m * BM
    return arg_kernel(kind, axis, dtype, threads), grid, [x], [poisoned(out_shape, i32)], \
        dict(BM=BM, BN=BN), [ref]


@tg.kernel(threads=128)
def looped_argmax(x: tg.Tensor[f32], out: tg.Tensor[i32], BM: tg.constexpr = 4,
                  BN: tg.constexpr = 64):
    """argmax of rows of any length, chunk by chunk: each chunk's tg.argmax plus the loop
    index's origin, kept where the chunk's maximum beats the running one (a NaN beats any
    number, and the first NaN stays)."""
    m = tg.block_id(0)
    best_val = tg.full((BM, 1), -float("inf"), f32)
    best_idx = tg.zeros((BM, 1), i32)
    for j in tg.range(tg.cdiv(x.shape[1], BN)):
        t = tg.load(x.tile((BM, BN), (m, j)), fill=-float("inf"))
        v = tg.max(t, 1)
        better = (v > best_val) | ((v != v) & (best_val == best_val))
        best_idx = tg.where(better, tg.argmax(t, 1) + j * BN, best_idx)
        best_val = tg.where(better, v, best_val)
    tg.copy(best_idx, out.tile((BM, 1), (m, 0)))


@tg.kernel(threads=64)
def scalar_operands(x: tg.Tensor[f32], y: tg.Tensor[f32], z: tg.Tensor[i8], n: int,
                    BM: tg.constexpr = 8, BN: tg.constexpr = 16):
    """Kernel scalars as a tg.where value, a tg.maximum operand, an in-place operand, and
    in i8 arithmetic (converted to i8, products wrap as in C)."""
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m, 0)))
    u = tg.maximum(tg.where(t > 0, t, n), m)
    u += n
    tg.copy(u, y.tile((BM, BN), (m, 0)))
    tg.copy(tg.indices((BM, BN), 1).to(i8) * n, z.tile((BM, BN), (m, 0)))


def scalar_operands_case(rng, rows: int, n: int):
    x = rng.standard_normal((rows, 16)).astype(np.float32)
    block = (np.arange(rows) // 8)[:, None]
    ref_y = (np.maximum(np.where(x > 0, x, np.float32(n)), block) + n).astype(np.float32)
    ref_z = (np.indices((rows, 16))[1] * n).astype(np.int64).astype(np.int8)
    outs = [poisoned((rows, 16), f32), poisoned((rows, 16), i8), n]
    return scalar_operands, (tg.cdiv(rows, 8),), [x], outs, {}, [ref_y, ref_z]
