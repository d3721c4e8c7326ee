"""GEMM: `c = a @ b.T` for a (M, K) and b (N, K), both K-major, accumulated in registers.

Two dataflows, both with every layout and instruction synthesized:

* `gemm_kernel` — the shared-memory pipeline of DESIGN.md: each k-step's A and B tiles are
  copied into multi-stage shared buffers (cp.async, STAGES - 1 steps ahead) and fed to the
  tensor cores from there (ldmatrix where the layout allows).
* `gemm_registers_kernel` — no shared memory: each k-step's tiles are loaded from global
  memory straight into registers in the MMA's operand layout (synthesis derives it from the
  gemm anchor) and fed to `tg.gemm` as register operands.

Float operands (f16, bf16) accumulate in f32 and are stored in their own type; i8 operands
accumulate in i32 and are stored as i32 (exact).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

import tegula as tg
from tegula import f32, i32
from tegula.dtypes import DType, bf16, f16, i8
from tegula.kernels.common import dtype_of_array, launch_emulated, poisoned

GEMM_DTYPES = (f16, bf16, i8)


def accumulator_type(dtype: DType) -> DType:
    """What the tensor cores accumulate `dtype` products in."""
    return i32 if dtype == i8 else f32


def output_type(dtype: DType) -> DType:
    """The type of c: the operands' type for floats, i32 for integers (exact)."""
    return i32 if dtype == i8 else dtype


@lru_cache(maxsize=None)
def gemm_kernel(dtype: DType) -> tg.Kernel:
    """The shared-memory pipelined GEMM for operands of `dtype`."""
    acc_t, out_t = accumulator_type(dtype), output_type(dtype)

    @tg.kernel(threads=128)
    def gemm(a: tg.Tensor[dtype], b: tg.Tensor[dtype], c: tg.Tensor[out_t],
             BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
             STAGES: tg.constexpr = 3):
        m, n = tg.block_id(0), tg.block_id(1)
        ga = a.tile((BM, BK), (m, None))            # (BM, BK, K/BK): the block's rows of a
        gb = b.tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), acc_t)
        sa = tg.shared((BM, BK), dtype, stages=STAGES)
        sb = tg.shared((BN, BK), dtype, stages=STAGES)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])              # acc += sa @ sb.T
        tg.copy(acc.to(out_t), c.tile((BM, BN), (m, n)))

    return gemm


@lru_cache(maxsize=None)
def gemm_registers_kernel(dtype: DType) -> tg.Kernel:
    """The register-only GEMM for operands of `dtype`: global -> registers -> MMA."""
    acc_t, out_t = accumulator_type(dtype), output_type(dtype)

    @tg.kernel(threads=128)
    def gemm_registers(a: tg.Tensor[dtype], b: tg.Tensor[dtype], c: tg.Tensor[out_t],
                       BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32):
        m, n = tg.block_id(0), tg.block_id(1)
        ga = a.tile((BM, BK), (m, None))
        gb = b.tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), acc_t)
        for k in tg.range(ga.shape[2]):
            tg.gemm(acc, tg.load(ga[:, :, k]), tg.load(gb[:, :, k]))
        tg.copy(acc.to(out_t), c.tile((BM, BN), (m, n)))

    return gemm_registers


def gemm_config(m: int, n: int, k: int, dtype: DType, shared: bool = True,
                **tiles: int) -> tuple[tuple[int, int], dict]:
    """(grid, constexprs) for an (M, N, K) GEMM: one block per (BM, BN) tile of c.
    Defaults: 128x128 tiles in three shared stages, 64x64 for the register dataflow (every
    register holds its own operands there); BK=32, or 64 for i8 so a k-step moves the same
    64 bytes per row."""
    bk = 64 if dtype == i8 else 32
    defaults = dict(BM=128, BN=128, BK=bk, STAGES=3) if shared else dict(BM=64, BN=64, BK=bk)
    constexprs = {**defaults, **tiles}
    return (tg.cdiv(m, constexprs["BM"]), tg.cdiv(n, constexprs["BN"])), constexprs


def gemm_emulated(a: np.ndarray, b: np.ndarray, dtype: DType | None = None,
                  shared: bool = True, **tiles: int) -> np.ndarray:
    """`a @ b.T` by the emulated kernel (`shared=False`: the register-only dataflow)."""
    dtype = dtype or dtype_of_array(a)
    (m, k), (n, k2) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"gemm needs a (M, K) and b (N, K), got {a.shape} and {b.shape}")
    c = poisoned((m, n), output_type(dtype))
    grid, constexprs = gemm_config(m, n, k, dtype, shared, **tiles)
    kernel = gemm_kernel(dtype) if shared else gemm_registers_kernel(dtype)
    launch_emulated(kernel, grid, a, b, c, **constexprs)
    return c


__all__ = ["gemm_kernel", "gemm_registers_kernel", "gemm_config", "gemm_emulated",
           "accumulator_type", "output_type", "GEMM_DTYPES"]
