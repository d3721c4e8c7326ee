"""Triton reference kernels for the GPU benchmark suites: a standard tiled matmul with a
few autotuned configurations, a persistent TMA matmul (Hopper), RMSNorm, row softmax and
copy.

They are the usual way to write each kernel in Triton (the matmul follows the Triton
tutorial: grouped tile order, f32 accumulation, masked edges), so "tegula / Triton" reads
as "tegula against a competent kernel in a peer language", not against a tuned library.
Importing this module needs triton; the suites import it only when triton imports.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def _matmul_configs() -> list[triton.Config]:
    """Tutorial-style configurations: large tiles for big problems, narrow-M tiles for
    decode shapes (tl.dot needs at least 16 rows)."""
    def cfg(bm: int, bn: int, bk: int, stages: int, warps: int) -> triton.Config:
        return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                             num_stages=stages, num_warps=warps)
    return [cfg(128, 256, 64, 3, 8), cfg(256, 128, 64, 3, 8), cfg(128, 128, 64, 4, 4),
            cfg(128, 128, 32, 4, 4), cfg(64, 128, 64, 4, 4), cfg(64, 64, 128, 4, 4),
            cfg(16, 128, 128, 4, 4), cfg(32, 64, 128, 4, 4)]


def _prune_matmul(configs, named_args, **kwargs):
    """Keep decode-sized tiles for few rows and large tiles for many (halves tuning time)."""
    m = named_args["M"]
    small = [c for c in configs if c.kwargs["BLOCK_M"] <= 64]
    large = [c for c in configs if c.kwargs["BLOCK_M"] >= 64]
    return small if m <= 128 else large


@triton.autotune(configs=_matmul_configs(), key=["M", "N", "K"],
                 prune_configs_by={"early_config_prune": _prune_matmul})
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                   stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row tiles share their column tiles of b in L2.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` for (M, K) and (K, N) f16/bf16 tensors of any strides."""
    (m, k), (_, n) = a.shape, b.shape
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    _matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                         c.stride(0), c.stride(1))
    return c


def _tma_block_shapes(nargs: dict) -> None:
    """Autotuner pre-hook: each TMA descriptor's box is the configuration's tile."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk] if nargs["B_NK"] else [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn]


def _persistent_configs() -> list[triton.Config]:
    """Hopper-sized tiles (wgmma's 64-row steps): 128x256 / 128x128 on 8 warps for big
    problems, 64-row tiles with narrow N and deep rings for decode shapes."""
    def cfg(bm: int, bn: int, bk: int, stages: int, warps: int) -> triton.Config:
        return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                             num_stages=stages, num_warps=warps, pre_hook=_tma_block_shapes)
    return [cfg(128, 256, 64, 3, 8), cfg(128, 256, 64, 4, 8), cfg(128, 128, 64, 4, 8),
            cfg(128, 128, 64, 5, 4), cfg(64, 64, 128, 4, 4), cfg(64, 32, 128, 6, 4),
            cfg(64, 128, 64, 6, 4), cfg(64, 64, 64, 8, 4)]


def _prune_persistent(configs, named_args, **kwargs):
    """64-row tiles for up to 128 rows, 128-row tiles for more."""
    m = named_args["M"]
    return [c for c in configs if (c.kwargs["BLOCK_M"] == 64) == (m <= 128)]


@triton.autotune(configs=_persistent_configs(), key=["M", "N", "K", "B_NK"],
                 prune_configs_by={"early_config_prune": _prune_persistent})
@triton.jit
def _matmul_tma_persistent_kernel(a_desc, b_desc, c_desc, M, N, K, NUM_SMS: tl.constexpr,
                                  B_NK: tl.constexpr, BLOCK_M: tl.constexpr,
                                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                  GROUP_M: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_pid_in_group = GROUP_M * num_pid_n
    # One program per SM walks the tiles pid, pid + NUM_SMS, ... in grouped order.
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        group_id = tile // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        row = (first_pid_m + (tile % group_size_m)) * BLOCK_M
        col = ((tile % num_pid_in_group) // group_size_m) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            a = a_desc.load([row, kt * BLOCK_K])     # TMA: out-of-bounds boxes read zeros
            if B_NK:
                b = b_desc.load([col, kt * BLOCK_K]).T
            else:
                b = b_desc.load([kt * BLOCK_K, col])
            acc = tl.dot(a, b, acc)
        c_desc.store([row, col], acc.to(c_desc.dtype))  # TMA store clips the edges


def matmul_tma_persistent(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` for (M, K) and (K, N) f16/bf16 tensors by the persistent TMA kernel (the
    fastest Triton formulation on Hopper: one program per SM, TMA descriptors for the
    operands and the result, autotuned tiles); b is read through a descriptor of the
    (N, K) tensor it is the transpose of when it is one (`w.T`), else of b itself (made
    contiguous). Rows must be 16-byte aligned (K and N multiples of 8)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    (m, k), (_, n) = a.shape, b.shape
    a = a.contiguous()
    b_nk = b.stride(0) == 1 and b.stride(1) == k
    source = b.T if b_nk else b.contiguous()
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    boxes = [TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, source, c)]  # pre-hook sets

    def grid(meta):
        return (min(sms, triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])),)

    _matmul_tma_persistent_kernel[grid](*boxes, m, n, k, NUM_SMS=sms, B_NK=b_nk)
    return c


def _row_warps(block: int) -> int:
    """Warps for one row of `block` elements per program: about 8 to 16 per thread."""
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, N, eps,
                     BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(y_ptr + row * stride_y + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim, one row per program, computed in f32."""
    rows = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(rows)
    block = triton.next_power_of_2(rows.shape[1])
    _rms_norm_kernel[(rows.shape[0],)](rows, w, y, rows.stride(0), y.stride(0), rows.shape[1],
                                       eps, BLOCK_N=block, num_warps=_row_warps(block))
    return y.view(x.shape)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, stride_x, stride_y, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride_y + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty),
             mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, one row per program, computed in f32."""
    rows = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(rows)
    block = triton.next_power_of_2(rows.shape[1])
    _softmax_kernel[(rows.shape[0],)](rows, y, rows.stride(0), y.stride(0), rows.shape[1],
                                      BLOCK_N=block, num_warps=_row_warps(block))
    return y.view(x.shape)


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4),
                          triton.Config({"BLOCK": 4096}, num_warps=4),
                          triton.Config({"BLOCK": 8192}, num_warps=8)], key=["n"])
@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def copy(x: torch.Tensor) -> torch.Tensor:
    """A copy of contiguous `x`, as a flat stream of elements."""
    src = x.contiguous()
    y = torch.empty_like(src)
    n = src.numel()
    _copy_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](src, y, n)
    return y


__all__ = ["matmul", "matmul_tma_persistent", "rms_norm", "softmax", "copy"]
