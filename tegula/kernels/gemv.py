"""GEMV: `y = x @ w.T` for few rows of x (M ≤ 16), x (M, K) and w (N, K), both K-major.

A matrix-vector product is memory-bound: each weight is read once and used M times, so
the kernel's job is to stream w at the copy bandwidth. There are no tensor cores in it
(an MMA operand layout would read w with 4-byte loads; see docs/compiler.md): each block
owns BN rows of w and walks K in BK-wide chunks; the (BN, BK) chunk is loaded with 16-byte
vectors, converted to f32 once, and multiplied elementwise by each row of x (a (1, BK)
tile broadcast over the chunk's rows, read from L1/L2). Every row of x keeps its own
(BN, BK) f32 accumulator, so the K loop does no cross-thread work at all; one row
reduction per x row at the end (`tg.sum(acc, 1)`, warp shuffles) gives the BN outputs.

The rows of x are a constexpr M, unrolled at trace time: M accumulators of BN·BK/threads
f32 each, which is why `gemv_config` shrinks the chunk as M grows. UNROLL chunks are loaded
before any is used (more bytes in flight per thread); with PREFETCH the next step's chunks
load before this step's multiply, so a step's loads overlap the last one's arithmetic.
Out-of-range rows of w and columns past K load as 0 and add nothing.

Measured (H100, 2026-11-24, session 9, one process): without prefetching, 51-80% of the
copy bandwidth at one row (N x K = 4096², 11008 x 4096, 14336 x 4096, 4096 x 14336) — each
step waited on its own loads; with two chunks of 16 weights, the next step prefetched,
72%, 90%, 91%, 91% (torch's cuBLAS: 59%, 78%, 88%, 83%). Session 11: four chunks of 8 on two
rows a block (the default) 73% / 90% at 4096² / 11008 x 4096. The 4096² GEMV (32 MB, ~15 µs)
is held back by the kernel's start and drain: ncu times the kernel at 13.9 µs (79% of the
copy rate) where CUDA events measure 15.8, and a torch clone of the same 32 MB reaches only
83% of the 1 GiB copy's rate (13.3 µs). Session 12 (CUPTI kernel durations against CUDA
events, `benchmarks/gemv_sweep.py --breakdown`): the kernel itself streams 4096² / 4096 x
11008 / 11008 x 4096 at 90 / 94 / 99% of the copy rate (12.3 / 31.5 / 30.2 µs); events add
2.6-3.9 µs a launch (a CUDA graph no less), as they do to torch's clone. PERSISTENT (a grid
sized to the SMs) measured no faster.

Entry points: `gemv_emulated` (numpy, the CPU emulator) and `gemv` (torch, autotuned).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, bf16, f16
from tegula.kernels import api as _api
from tegula.kernels.common import (check_array, check_same_dtype, dtype_of_array,
                                   launch_emulated, poisoned)
from tegula.runtime.autotune import Autotuner

GEMV_DTYPES = (f16, bf16)
MAX_GEMV_ROWS = 16  # more rows of x reuse each weight enough for a tensor-core GEMM
#: The most rows of x the torch entry point runs on this kernel; more go to the tensor-core
#: `tegula.kernels.matmul`. Measured on an H100 (2026-11-24, x torch's x @ w.T, N x K =
#: 4096 x 4096 / 11008 x 4096): this kernel 1.03/1.00x at 2 rows, 0.98/0.87x at 4,
#: 0.59/0.55x at 8, 0.34/0.27x at 16; matmul 1.02/1.03, 1.01/0.99, 0.93/0.97, 1.04/1.03x.
GEMV_KERNEL_ROWS = 2

# The torch entry point's autotuner, beside the library's others (winners per shape bucket).
_api.TUNERS.setdefault("gemv", Autotuner("gemv"))


def _row_block(x, w, y, n, M, BN, BK, UNROLL, PREFETCH, dtype) -> None:
    """The BN outputs of row block `n`: w's rows walked along K (traced inline)."""
    gw = w.tile((BN, BK), (n, None))                    # (BN, BK, K/BK)
    accs = [tg.zeros((BN, BK), f32) for _ in range(M)]  # one per row of x

    def chunks_and_rows(ks):
        """w's chunks ks, then the rows of x each multiplies (M per chunk)."""
        return ([tg.load(gw[:, :, k]) for k in ks],
                [tg.load(x.tile((1, BK), (r, k))) for k in ks for r in range(M)])

    if PREFETCH:  # the first step's chunks, before the loop
        ahead_w, ahead_x = chunks_and_rows(range(UNROLL))
    for step in tg.range(tg.cdiv(gw.shape[2], UNROLL)):
        # UNROLL chunks loaded before any is used: more bytes in flight per thread
        chunks = [step * UNROLL + u for u in range(UNROLL)]
        if PREFETCH:  # the next step's chunks load while this one's multiply (the last
            # step's lie past K: masked, no memory read)
            loaded_w, loaded_x = ahead_w, ahead_x
            ahead_w, ahead_x = chunks_and_rows([k + UNROLL for k in chunks])
        else:
            loaded_w, loaded_x = chunks_and_rows(chunks)
        for u, chunk in enumerate(loaded_w):
            values = chunk.to(f32)
            for r in range(M):   # each row of x broadcast over the chunk's rows
                accs[r] = accs[r] + values * loaded_x[u * M + r].to(f32)
    for r in range(M):
        tg.copy(tg.sum(accs[r], 1).to(dtype), y.T.tile((BN, 1), (n, r)))


@lru_cache(maxsize=None)
def gemv_kernel(dtype: DType) -> tg.Kernel:
    """y (M, N) = x (M, K) @ w (N, K).T in f32, stored in `dtype`; M is a constexpr. With
    PERSISTENT each block walks row blocks block_id, block_id + grid, ... (a grid sized to
    the SMs, `gemv_config`), else one row block a block."""

    @tg.kernel(threads=128)
    def gemv(x: tg.Tensor[dtype], w: tg.Tensor[dtype], y: tg.Tensor[dtype],
             M: tg.constexpr = 1, BN: tg.constexpr = 8, BK: tg.constexpr = 512,
             UNROLL: tg.constexpr = 1, PREFETCH: tg.constexpr = False,
             PERSISTENT: tg.constexpr = False):
        if PERSISTENT:
            for n in tg.range(tg.block_id(0), tg.cdiv(w.shape[0], BN), tg.num_programs(0)):
                _row_block(x, w, y, n, M, BN, BK, UNROLL, PREFETCH, dtype)
        else:
            _row_block(x, w, y, tg.block_id(0), M, BN, BK, UNROLL, PREFETCH, dtype)

    return gemv


def gemv_config(m: int, n: int, k: int, BN: int | None = None, BK: int | None = None,
                threads: int = 128, UNROLL: int | None = None,
                PREFETCH: bool | None = None, PERSISTENT: bool = False,
                blocks: int = 8 * 132) -> tuple[tuple[int], dict]:
    """(grid, constexprs) for an (M, N, K) GEMV: one block per BN rows of w. Defaults keep
    32 weights (four 16-byte f16 loads) per thread per step for one row of x — four chunks
    of 8 (UNROLL=4: BN=2 rows a block of 4 warps, 512 columns a chunk), the next step's
    loading while this one's multiply (PREFETCH) — 16 for up to 4 rows and 8 beyond, so
    the M accumulators stay near 32-128 registers. One row's default measured best on an
    H100 (session 11 round 1, L2 flushed): 15.2 / 33.0 µs at 4096² / 11008 x 4096 (73% /
    90% of the 1 GiB copy, 88% / 87% of a clone of the same bytes) against 15.8 / 34.0 µs
    for session 9's two chunks of 16 on 4 rows (where one chunk of 32 without prefetching
    streamed at 51-80%). PERSISTENT: a grid of at most `blocks` blocks (default eight an SM
    of an H100), each walking row blocks by the grid, in place of one block a row block."""
    if not 1 <= m <= MAX_GEMV_ROWS:
        raise ValueError(f"tegula.kernels.gemv: x has {m} rows; the GEMV kernel takes 1 to "
                         f"{MAX_GEMV_ROWS} (use tegula.kernels.matmul for more)")
    if UNROLL is None:
        UNROLL = 4 if m == 1 else 1
    if PREFETCH is None:
        PREFETCH = m == 1
    per_thread = 32 // UNROLL if m == 1 else 16 if m <= 4 else 8
    if BK is None:
        BK = 512 if k >= 512 else 256
    if BN is None:
        BN = max(1, per_thread * threads // BK)
    tiles = tg.cdiv(n, BN)
    grid = (max(1, min(tiles, blocks)),) if PERSISTENT else (tiles,)
    return grid, dict(M=m, BN=BN, BK=BK, UNROLL=UNROLL, PREFETCH=bool(PREFETCH),
                      PERSISTENT=bool(PERSISTENT))


def _check_gemv_shapes(fn: str, x_shape: tuple, w_shape: tuple) -> tuple[int, int, int]:
    """(M, N, K) of a GEMV of x (K,) or (M, K) with w (N, K), or a ValueError naming both."""
    if len(x_shape) not in (1, 2) or len(w_shape) != 2:
        raise ValueError(f"tegula.kernels.{fn}: x must be (K,) or (M, K) and w (N, K), got "
                         f"x of shape {tuple(x_shape)} and w of shape {tuple(w_shape)}")
    m, k = (1, x_shape[0]) if len(x_shape) == 1 else tuple(x_shape)
    n, k2 = w_shape
    if k != k2:
        raise ValueError(f"tegula.kernels.{fn}: x's last dim ({k}) must equal w's (N, K) K "
                         f"({k2}): x of shape {tuple(x_shape)}, w of shape {tuple(w_shape)}")
    if not 1 <= m <= MAX_GEMV_ROWS:
        raise ValueError(f"tegula.kernels.{fn}: x has {m} rows; the GEMV kernel takes 1 to "
                         f"{MAX_GEMV_ROWS} (use tegula.kernels.matmul for more)")
    return m, n, k


def gemv_emulated(x: np.ndarray, w: np.ndarray, dtype: DType | None = None,
                  target: str | None = None, **tiles: int) -> np.ndarray:
    """`x @ w.T` by the emulated GEMV kernel: x (K,) or (M, K) with M ≤ 16, w (N, K);
    returns (N,) or (M, N). f16 arrays, or float32 ones holding bf16 values with
    `dtype=bf16`."""
    fn = "gemv_emulated"
    check_array(fn, "x", x)
    check_array(fn, "w", w, ndim=2)
    check_same_dtype(fn, x=x, w=w)
    dtype = dtype or dtype_of_array(x, fn, "x")
    if dtype not in GEMV_DTYPES:
        raise TypeError(f"tegula.kernels.{fn}: x and w must be f16 or bf16, got {dtype}")
    m, n, k = _check_gemv_shapes(fn, x.shape, w.shape)
    rows = np.ascontiguousarray(x.reshape(m, k))
    y = poisoned((m, n), dtype)
    if n == 0:
        return y.reshape(x.shape[:-1] + (n,))
    if k == 0:
        return np.zeros_like(y).reshape(x.shape[:-1] + (n,))
    grid, constexprs = gemv_config(m, n, k, **tiles)
    options = {} if target is None else {"target": target}
    launch_emulated(gemv_kernel(dtype), grid, rows, np.ascontiguousarray(w), y,
                    **constexprs, **options)
    return y.reshape(x.shape[:-1] + (n,))


# --------------------------------------------------------------------------------------
# torch entry point
# --------------------------------------------------------------------------------------

def gemv_candidates(m: int) -> list[dict]:
    """Configurations worth timing for M rows of x: for one row, the prefetching chunk
    shapes that streamed at 70-92% of the copy bandwidth on an H100 (sessions 9 and 11;
    the default first); otherwise chunk shapes around the default's register budget and
    256 threads (more bytes in flight per block), for two rows with prefetching too."""
    if m == 1:
        return [dict(BN=2, BK=512, UNROLL=4, PREFETCH=True),
                dict(BN=2, BK=1024, UNROLL=2, PREFETCH=True),
                dict(BN=4, BK=512, UNROLL=2, PREFETCH=True),
                dict(BN=8, BK=512, PREFETCH=True)]
    out = []
    per_thread = 16 if m <= 4 else 8
    for threads in (128, 256):
        for bk in (128, 256, 512):
            bn = per_thread * threads // bk
            if bn >= 1:
                out.append(dict(BN=bn, BK=bk, threads=threads))
    if m == 2:
        out += [dict(BN=4, BK=512, PREFETCH=True), dict(BN=2, BK=512, UNROLL=2, PREFETCH=True)]
    return out


def gemv(x: Any, w: Any, *, out: Any = None) -> Any:
    """`x @ w.T` for CUDA tensors x (K,) or (M, K) with M ≤ 16 and w (N, K) (an
    `nn.Linear` weight), f16 or bf16, accumulated in f32; returns (N,) or (M, N) in x's
    dtype (or writes `out`, contiguous). Up to `GEMV_KERNEL_ROWS` rows run the GEMV kernel,
    autotuned per (M, N, K) bucket and GPU; later calls with the same shapes, strides and
    dtypes replay the chosen launch (the host path of a 10-µs GEMV matters). More rows
    run `tegula.kernels.matmul` on `w.T` (tensor cores; the GEMV kernel's FMAs per weight
    grow with the rows, see `GEMV_KERNEL_ROWS`)."""
    from tegula.kernels import api
    from tegula.runtime.autotune import Config

    fn = "gemv"
    # With out= too: its first call's full path (checks, the tuner's lookup) cost ~80 µs of
    # host time a call on an H100 host against a ~12 µs kernel (session 12, round 1).
    found = api._replay_entry((x, w) if out is None else (x, w, out), fn, out is None)
    if type(found) is not tuple:
        return found  # replayed
    signature = found[0]
    dtype = api._check_tensor(fn, "x", x, api._GEMM_DTYPES)
    api._check_tensor(fn, "w", w, api._GEMM_DTYPES, ndim=2)
    api._check_same_dtype(fn, {"x": x, "w": w})
    m, n, k = _check_gemv_shapes(fn, tuple(x.shape), tuple(w.shape))
    api._check_cuda(fn, {"x": x, "w": w})
    torch = api._torch()
    shape = tuple(x.shape[:-1]) + (n,)
    if m > GEMV_KERNEL_ROWS:  # x is (M, K) here: a vector is one row
        from tegula.kernels.api_matmul import matmul
        if out is None:
            if signature is not None:  # later calls skip these checks (matmul replays)
                api._remember(signature, lambda tensors, pointers: matmul(tensors[0],
                                                                          tensors[1].T))
            return matmul(x, w.T)
        api._check_out(fn, out, shape, x)
        matmul(x, w.T, out=out)
        return out
    given = out
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    else:
        api._check_out(fn, out, shape, x)
    if n == 0:
        return out
    if k == 0:
        return out.zero_()
    rows = x.reshape(m, k).contiguous()
    weight = w.contiguous()  # rows of w are read with 16-byte vectors along K
    y = out.view(m, n)
    kernel = gemv_kernel(dtype)
    configs = tuple(Config.of(c) for c in gemv_candidates(m))

    def run(config: Config) -> Any:
        values = config.kwargs
        grid, constexprs = gemv_config(m, n, k, threads=config.threads or 128, **values)
        return api._launch(kernel, grid, (rows, weight, y), constexprs, config.threads), grid

    ck, grid = api._tune_and_run(fn, x.device.index, configs, (m, n, k), str(dtype), run)
    if signature is not None and api._views_of((rows, weight, y), (x, w, out)):
        api._remember(signature, api.EntryReplay(
            ck, grid, (rows, weight, y), api.fast_empty(x, shape) if given is None else None))
    return out


__all__ = ["gemv_kernel", "gemv_config", "gemv_emulated", "gemv_candidates", "gemv",
           "GEMV_DTYPES", "MAX_GEMV_ROWS", "GEMV_KERNEL_ROWS"]
