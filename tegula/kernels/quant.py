"""W4A16: `c = a @ ((w_q - zeros) * scales).T`, 4-bit weights, f16/bf16 activations, f32
accumulation.

Weights are quantized per group of `group_size` (32, 64 or 128) consecutive elements along
K of each row of the (N, K) weight (AWQ/GPTQ style): element (n, k) has the scale and zero
point `scales[n, k // group_size]`, `zeros[n, k // group_size]`.

The layouts the kernels want (what `quantize_w4` and `prepack` write):

* `packed`: (N, K/2) uint8, tegula's u4 storage — element 2j of a row in the low nibble of
  byte j, element 2j+1 in the high nibble. The kernels read it as a `tg.Tensor[u4]` of
  (N, K) elements, 32 consecutive weights of a row per thread (two 8-byte loads today:
  the compiler's divisibility facts stop at 16 elements, so a 4-bit vector is at most 16
  nibbles; coalesced all the same). `prepack` is the one
  function that writes this order, so that a pre-packed order chosen by synthesis (issue
  11: fragment order for an MMA) changes one function and the kernels' annotations.
* `scales`: (N, K/group_size) in the activations' dtype.
* `zeros`: (N, K/group_size) in the activations' dtype, holding the integers 0..15 (a
  float zero point costs the kernel no conversion), or None for symmetric quantization
  (zero point 8: `quantize_w4(..., zero_point=False)`).

K must be a multiple of the group size (and so even): a ragged last group has no
well-defined scale in the checkpoints this format comes from, so it is refused with an
error rather than padded.

Two kernels, both dequantizing in registers (`dequantize`: w·scale − zero·scale in f32,
one multiply-add per weight after the conversion; CUDA converts the 4-bit integer to float
with the magic-number trick of `codegen/expr.py`, one LOP3 and one FADD, not an I2F at a
quarter of the FP32 rate):

* `w4a16_gemv_kernel` — few rows (M ≤ 16, decode): the GEMV dataflow of
  `tegula.kernels.gemv` (memory-bound: each (BN, BK) chunk of packed weights is 16 bytes
  per thread, UNROLL chunks loaded before any is used, multiplied elementwise by each row
  of a, one row reduction at the end). BK divides the group, so a chunk's scale and zero
  are a (BN, 1) tile that broadcasts over it.
* `w4a16_gemm_kernel` — more rows (prefill): each k-step dequantizes a (BN, BK) weight
  tile into a shared f16/bf16 tile and feeds it with the activation tile to `tg.gemm`
  (`tg.gemm` takes one operand type, so the kernel dequantizes first), in a pipelined K
  loop whose activation tiles are copied ahead.

Entry points: `w4a16_gemm_emulated` (numpy, unpacked weights: the CI entry point),
`matmul_w4a16` (torch, packed weights), `quantize_w4`, `prepack`, `unpack_w4`.
"""
from __future__ import annotations

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

W4A16_DTYPES = (f16, bf16)
GROUP_SIZES = (32, 64, 128)
SYMMETRIC_ZERO = 8  # the zero point of `quantize_w4(..., zero_point=False)`

# The torch entry point's autotuner, beside the library's others (winners per shape bucket).
_api.TUNERS.setdefault("matmul_w4a16", Autotuner("matmul_w4a16"))


def dequantize(packed: Any, scales: Any, zeros: Any, n: Any,
               group: Any, rows: int) -> Any:
    """(w - zero) * scale in f32 for a loaded (rows, BK) tile of 4-bit weights lying in one
    group, read inside a kernel (trace time): the row block `n`'s scales and zeros of
    `group` are (rows, 1) tiles broadcast along the chunk. Written w·s - z·s, so that each
    weight costs one multiply-add after its conversion (z·s is per row)."""
    scale = tg.load(scales.tile((rows, 1), (n, group))).to(f32)
    if zeros is not None:
        zero = tg.load(zeros.tile((rows, 1), (n, group))).to(f32)
    else:
        zero = tg.full((rows, 1), SYMMETRIC_ZERO, f32)
    return packed.to(f32) * scale - zero * scale


@lru_cache(maxsize=None)
def w4a16_gemv_kernel(dtype: DType, has_zeros: bool) -> tg.Kernel:
    """c (M, N) = a (M, K) @ dequant(w).T for M ≤ 16 (a constexpr, unrolled). BK divides
    the group size G, so k-chunk k lies in group k // (G // BK). Each iteration loads
    UNROLL chunks before using any (UNROLL 16-byte loads in flight per thread: a 4-bit
    chunk is small, and bandwidth needs bytes in flight); chunks past K load as zeros."""

    @tg.kernel(threads=128)
    def w4a16_gemv(a: tg.Tensor[dtype], w: tg.Tensor[u4], scales: tg.Tensor[dtype],
                   zeros: tg.Tensor[dtype], c: tg.Tensor[dtype],
                   M: tg.constexpr = 1, G: tg.constexpr = 128,
                   BN: tg.constexpr = 32, BK: tg.constexpr = 128, UNROLL: tg.constexpr = 2):
        n = tg.block_id(0)
        gw = w.tile((BN, BK), (n, None))                    # (BN, BK, K/BK) packed weights
        accs = [tg.zeros((BN, BK), f32) for _ in range(M)]  # one per row of a
        for step in tg.range(tg.cdiv(gw.shape[2], UNROLL)):
            chunks = [step * UNROLL + u for u in range(UNROLL)]
            packed = [tg.load(gw[:, :, k]) for k in chunks]
            for k, q in zip(chunks, packed):
                weights = dequantize(q, scales, zeros if has_zeros else None, n,
                                     k // (G // BK), BN)
                for r in range(M):
                    row = tg.load(a.tile((1, BK), (r, k))).to(f32)  # broadcast over rows
                    accs[r] = accs[r] + weights * row
        for r in range(M):
            tg.copy(tg.sum(accs[r], 1).to(dtype), c.T.tile((BN, 1), (n, r)))

    return w4a16_gemv


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
        sw = tg.shared((BN, BK), dtype, stages=STAGES)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            weights = dequantize(tg.load(gw[:, :, k]), scales, zeros if has_zeros else None,
                                 n, k // (G // BK), BN)
            tg.copy(weights.to(dtype), sw[k])
            tg.gemm(acc, sa[k], sw[k])                      # acc += sa @ sw.T
        tg.copy(acc.to(dtype), c.tile((BM, BN), (m, n)))

    return w4a16_gemm


def w4a16_config(m: int, n: int, k: int, group_size: int, **tiles: int
                 ) -> tuple[str, tuple[int, ...], dict]:
    """(kernel kind "gemv" or "gemm", grid, constexprs) for an (M, N, K) W4A16 product.
    GEMV (M ≤ 16 and no BM given): BK = the group, BN such that each of the 128 threads
    holds 32 weights of a chunk (one 16-byte load) for up to 4 rows of a, 16 beyond (M
    accumulators of that size). GEMM: 64x64 tiles, BK = 64 or the group if smaller, a
    3-stage pipeline."""
    if m <= MAX_GEMV_ROWS and not {"BM"} & set(tiles):
        per_thread = 32 if m <= 4 else 16
        BK = tiles.pop("BK", min(group_size, 128))
        BN = tiles.pop("BN", max(1, per_thread * 128 // BK))
        _check_chunk(BK, group_size)
        return "gemv", (tg.cdiv(n, BN),), dict(M=m, G=group_size, BN=BN, BK=BK, **tiles)
    constexprs = dict(G=group_size, BM=64, BN=64, BK=min(group_size, 64), STAGES=3)
    constexprs.update(tiles)
    _check_chunk(constexprs["BK"], group_size)
    grid = (tg.cdiv(m, constexprs["BM"]), tg.cdiv(n, constexprs["BN"]))
    return "gemm", grid, constexprs


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
    factory = w4a16_gemv_kernel if kind == "gemv" else w4a16_gemm_kernel
    options = {} if target is None else {"target": target}
    launch_emulated(factory(dtype, zeros is not None), grid, np.ascontiguousarray(a),
                    prepack(w_q), np.ascontiguousarray(scales, dtype=storage), zeros_arg, c,
                    **constexprs, **options)
    return c


# --------------------------------------------------------------------------------------
# torch entry point
# --------------------------------------------------------------------------------------

def w4a16_candidates(m: int, group_size: int) -> list[dict]:
    """Configurations worth timing: GEMV chunks (BK dividing the group, 128 or 256
    threads, 2 or 4 chunks loaded per iteration) for M ≤ 16; GEMM tiles beyond (BK
    dividing the group, pipelined 3 deep or not)."""
    if m <= MAX_GEMV_ROWS:
        per_thread = 32 if m <= 4 else 16
        return [dict(BN=per_thread * threads // bk, BK=bk, UNROLL=unroll, threads=threads)
                for threads in (128, 256) for bk in (32, 64, 128) for unroll in (2, 4)
                if bk <= group_size and group_size % bk == 0]
    tiles = [dict(BM=64, BN=64), dict(BM=64, BN=128), dict(BM=128, BN=64),
             dict(BM=128, BN=128, threads=256)]
    return [dict(t, BK=bk, STAGES=stages) for t in tiles for bk in (32, 64)
            for stages in (1, 3) if bk <= group_size]


def matmul_w4a16(a: Any, packed: Any, scales: Any, zeros: Any, group_size: int, *,
                 out: Any = None) -> Any:
    """`a @ ((w_q - zeros) * scales).T` for CUDA tensors: a (M, K) f16 or bf16, `packed`
    (N, K/2) uint8 as `quantize_w4`/`prepack` write it, scales and zeros (N, K/group_size)
    in a's dtype (zeros None: zero point 8). Accumulates in f32; returns (M, N) in a's
    dtype (or writes `out`). Autotuned per (M, N, K) bucket, group size and GPU; later
    calls with the same shapes, strides, dtypes and group size replay the chosen launch."""
    from tegula.kernels import api
    from tegula.runtime.autotune import Config

    fn = "matmul_w4a16"
    given = (a, packed, scales) + ((zeros,) if zeros is not None else ())
    head = (fn, type(group_size), group_size, zeros is None)
    replay = api._replay_of(given, *head) if out is None else None
    if replay is not None:
        return replay(*given)
    signature = api._signature(head[0], given, *head[1:]) if out is None else None
    torch = api._torch()
    dtype = api._check_tensor(fn, "a", a, api._GEMM_DTYPES, ndim=2)
    api._check_tensor(fn, "packed", packed, {"uint8": u4}, ndim=2)
    api._check_tensor(fn, "scales", scales, api._GEMM_DTYPES, ndim=2)
    tensors = {"a": a, "packed": packed, "scales": scales}
    if zeros is not None:
        api._check_tensor(fn, "zeros", zeros, api._GEMM_DTYPES, ndim=2)
        tensors["zeros"] = zeros
    api._check_same_dtype(fn, {n: t for n, t in tensors.items() if n != "packed"})
    n, k = packed.shape[0], 2 * packed.shape[1]
    m = check_w4a16_shapes(fn, tuple(a.shape), n, k, tuple(scales.shape),
                           None if zeros is None else tuple(zeros.shape), group_size)
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
    configs = tuple(Config.of(c) for c in w4a16_candidates(m, group_size))

    def run(config: Config) -> Any:
        kind, grid, constexprs = w4a16_config(m, n, k, group_size, **config.kwargs)
        factory = w4a16_gemv_kernel if kind == "gemv" else w4a16_gemm_kernel
        return api._launch(factory(dtype, zeros is not None), grid, (*args, out),
                           constexprs, config.threads), grid

    ck, grid = api._tune_and_run(fn, a.device.index, configs, (m, n, k),
                                 f"{dtype}/g{group_size}/{'z' if zeros is not None else 'sym'}",
                                 run)
    if signature is not None and api._views_of(args[:len(given)], given):
        launch = api._replayer(ck, grid, (*args, out))
        unread = args[3]  # the zeros argument when there are none: kept alive here

        def replay_w4a16(a: Any, packed: Any, scales: Any, zeros: Any = unread) -> Any:
            c = api._torch().empty((m, n), dtype=a.dtype, device=a.device)
            launch((a.data_ptr(), packed.data_ptr(), scales.data_ptr(), zeros.data_ptr(),
                    c.data_ptr()))
            return c
        api._remember(signature, replay_w4a16)
    return out


__all__ = ["w4a16_gemv_kernel", "w4a16_gemm_kernel", "w4a16_config", "check_w4a16_shapes",
           "prepack", "unpack_w4", "quantize_w4", "dequantize_w4", "w4a16_gemm_emulated",
           "w4a16_candidates", "matmul_w4a16", "W4A16_DTYPES", "GROUP_SIZES",
           "SYMMETRIC_ZERO"]
