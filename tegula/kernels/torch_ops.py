"""The kernel library's entry points as torch custom ops: `torch.ops.tegula.matmul` (with
its fused bias + activation), `matmul_fp8`, `rms_norm`, `softmax`, `copy`, the decode
GEMMs `gemv` and `matmul_w4a16`, the MoE grouped GEMM `moe_gemm`, Mamba's
`selective_scan`, (in `tegula.kernels.torch_ops_attention`) `attention_forward` with
its backward op `attention_backward`, `attention_varlen` and `attention_decode` (each
returning o and lse), and (in `tegula.kernels.torch_ops_moe`) the 4-bit grouped GEMM
`moe_gemm_w4a16` and the whole MoE MLP `moe_mlp`.

    import tegula.kernels.torch_ops            # registers the ops (needs torch)
    y = torch.ops.tegula.rms_norm(x, w, 1e-6)  # or tegula.kernels.torch_ops.rms_norm(...)

    @torch.compile(fullgraph=True)             # traced without a graph break
    def block(x, w): return torch.ops.tegula.softmax(torch.ops.tegula.rms_norm(x, w, 1e-6))

The plain functions in `tegula.kernels` (`tk.rms_norm`, ...) stay as they are for code that
is not compiled; these ops wrap them, so a CUDA call runs the same checks, autotuner and
cached launches. What the ops add is what torch's compiler and checks need:

* a schema (`tegula::rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor`);
* a fake (meta) implementation giving the result's shape and dtype after the same
  argument checks as the CUDA path (dtype, rank, matching shapes), so tracing reports a
  bad call where the model makes it; the device check stays with the real call;
* a CPU implementation that runs the same kernels in tegula's numpy emulator — slow, for
  tests and for developing without a GPU (`torch.library.opcheck` runs end to end on CPU).

Autograd: each op registers its backward as a formula in torch ops: matmul's two
gradients are `torch.ops.tegula.matmul` calls (f32 accumulation, rounded to the inputs'
dtype, as torch's own half-precision matmul; with a fused activation, after recomputing
the pre-activation and applying the activation's derivative in f32; the bias gradient is
the column sum), attention_forward's (of o; lse is non-differentiable) is the
`attention_backward` op (tegula's backward kernels), matmul_fp8, gemv, matmul_w4a16,
moe_gemm, moe_gemm_w4a16, moe_mlp, attention_varlen, attention_decode and selective_scan
(inference kernels) are
forward-only, the row ops' gradients are computed in f32 from the saved output (softmax)
or inputs (RMSNorm) and rounded to the input's dtype, and copy passes its gradient
through.
"""
from __future__ import annotations

import torch
from typing import Optional

from torch import Tensor

from tegula.dtypes import DType
import numpy as np

from tegula.kernels import api, fp8
from tegula.runtime.torch_op import from_numpy, to_numpy

# Rows longer than one register tile run through the looped (chunked) kernels.
_MAX_ROW = api._MAX_ROW


# ---------------------------------------------------------------------------- shared checks
# One function per op: check the arguments as the CUDA entry point does (its own helpers,
# so the messages are the same) and return the tegula dtype and the result's shape.

def _matmul_checked(a: Tensor, b: Tensor, bias: Optional[Tensor] = None,
                    activation: Optional[str] = None) -> tuple[DType, tuple[int, int]]:
    dtype = api._check_tensor("matmul", "a", a, api._GEMM_DTYPES, ndim=2)
    api._check_tensor("matmul", "b", b, api._GEMM_DTYPES, ndim=2)
    api._check_same_dtype("matmul", {"a": a, "b": b})
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"tegula.kernels.matmul: inner dimensions differ: a is {tuple(a.shape)}"
                         f", b is {tuple(b.shape)} (a's columns must equal b's rows)")
    api._check_epilogue_args("matmul", bias, activation, a, b.shape[1])
    return dtype, (a.shape[0], b.shape[1])


def _matmul_fp8_checked(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor,
                        out_dtype: Optional[torch.dtype], block_scales: bool):
    """(scale_a, scale_b as the kernel's 2-D views, the tegula output type, (M, N))."""
    from tegula.kernels import fp8
    fn = "matmul_fp8"
    api._check_tensor(fn, "a", a, api._FP8_DTYPES, ndim=2)
    api._check_tensor(fn, "b", b, api._FP8_DTYPES, ndim=2)
    out_t = {torch.bfloat16: fp8.bf16, torch.float16: fp8.f16, torch.float32: fp8.f32}.get(
        torch.bfloat16 if out_dtype is None else out_dtype)
    if out_t is None:
        raise TypeError(f"tegula.kernels.{fn}: out_dtype must be torch.bfloat16, "
                        f"torch.float16 or torch.float32, got {out_dtype}")
    m, n, k = fp8.check_fp8_shapes(fn, tuple(a.shape), tuple(b.T.shape), block_scales,
                                   b_name="b.T")
    want_a, want_b = fp8.scale_shapes(m, n, k, block_scales)
    return (api._fp8_scale(fn, "scale_a", scale_a, want_a),
            api._fp8_scale(fn, "scale_b", scale_b, want_b), out_t, (m, n))


def _rms_norm_checked(x: Tensor, weight: Tensor, eps: float) -> DType:
    dtype = api._check_tensor("rms_norm", "x", x, api._FLOATS, min_ndim=1)
    api._check_tensor("rms_norm", "weight", weight, api._FLOATS, ndim=1)
    api._check_same_dtype("rms_norm", {"x": x, "weight": weight})
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"tegula.kernels.rms_norm: weight has {weight.shape[0]} elements, x's "
                         f"last dim has {x.shape[-1]}")
    if not eps >= 0:
        raise ValueError(f"tegula.kernels.rms_norm: eps must be a non-negative number, got "
                         f"{eps!r}")
    return dtype


def _softmax_checked(x: Tensor, dim: int) -> DType:
    dtype = api._check_tensor("softmax", "x", x, api._FLOATS, min_ndim=1)
    if dim not in (-1, x.dim() - 1):
        raise ValueError(f"tegula.kernels.softmax: only the last dim is supported (dim=-1), "
                         f"got dim={dim}; move the dim last with .transpose() / .movedim()")
    return dtype


def _copy_checked(x: Tensor) -> DType:
    return api._check_tensor("copy", "x", x, api._COPY_DTYPES)


# ---------------------------------------------------------------------------- the ops (CUDA)

@torch.library.custom_op("tegula::matmul", mutates_args=(), device_types="cuda")
def matmul(a: Tensor, b: Tensor, bias: Optional[Tensor] = None,
           activation: Optional[str] = None) -> Tensor:
    """`activation(a @ b + bias)` (a (M, K), b (K, N), f16/bf16, f32 accumulation, the
    epilogue fused): `tegula.kernels.matmul`."""
    return api.matmul(a, b, bias, activation)


@torch.library.custom_op("tegula::matmul_fp8", mutates_args=(), device_types="cuda")
def matmul_fp8(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor,
               out_dtype: Optional[torch.dtype] = None, block_scales: bool = False) -> Tensor:
    """`(a · scale_a) @ (b · scale_b)` for e4m3 a, b, per-tensor or blockwise scales:
    `tegula.kernels.matmul_fp8` (forward only)."""
    return api.matmul_fp8(a, b, scale_a, scale_b, out_dtype, block_scales)


@torch.library.custom_op("tegula::rms_norm", mutates_args=(), device_types="cuda")
def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last dim: `tegula.kernels.rms_norm`."""
    return api.rms_norm(x, weight, eps)


@torch.library.custom_op("tegula::softmax", mutates_args=(), device_types="cuda")
def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax along the last dim: `tegula.kernels.softmax`."""
    return api.softmax(x, dim)


@torch.library.custom_op("tegula::copy", mutates_args=(), device_types="cuda")
def copy(x: Tensor) -> Tensor:
    """A contiguous copy of `x`: `tegula.kernels.copy`."""
    return api.copy(x)


# ---------------------------------------------------------------------------- fake (meta)

@matmul.register_fake
def _matmul_fake(a: Tensor, b: Tensor, bias: Optional[Tensor] = None,
                 activation: Optional[str] = None) -> Tensor:
    _, shape = _matmul_checked(a, b, bias, activation)
    return a.new_empty(shape)


@matmul_fp8.register_fake
def _matmul_fp8_fake(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor,
                     out_dtype: Optional[torch.dtype] = None,
                     block_scales: bool = False) -> Tensor:
    *_, shape = _matmul_fp8_checked(a, b, scale_a, scale_b, out_dtype, block_scales)
    return a.new_empty(shape, dtype=torch.bfloat16 if out_dtype is None else out_dtype)


@rms_norm.register_fake
def _rms_norm_fake(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    _rms_norm_checked(x, weight, eps)
    return x.new_empty(x.shape)


@softmax.register_fake
def _softmax_fake(x: Tensor, dim: int = -1) -> Tensor:
    _softmax_checked(x, dim)
    return x.new_empty(x.shape)


@copy.register_fake
def _copy_fake(x: Tensor) -> Tensor:
    _copy_checked(x)
    return x.new_empty(x.shape)  # contiguous, whatever x's strides: as the CUDA path


# ---------------------------------------------------------------------------- CPU: emulator

# Small tiles keep the emulator quick; the result does not depend on them.
_EMULATED_GEMM_TILES = dict(BM=64, BN=64, BK=32, STAGES=2)


@matmul.register_kernel("cpu")
def _matmul_cpu(a: Tensor, b: Tensor, bias: Optional[Tensor] = None,
                activation: Optional[str] = None) -> Tensor:
    from tegula.kernels.gemm import gemm_emulated

    dtype, (m, n) = _matmul_checked(a, b, bias, activation)
    if m == 0 or n == 0:
        return a.new_zeros((m, n))
    if a.shape[1] == 0:  # an empty sum: the epilogue of zeros (as the CUDA path)
        z = a.new_zeros(n, dtype=torch.float32) if bias is None else bias.float()
        return api._activation_in_torch(z, activation).to(a.dtype).expand(m, n).contiguous()
    bias_np = None if bias is None else to_numpy(bias, dtype)
    c = gemm_emulated(to_numpy(a, dtype), to_numpy(b.T, dtype), dtype, bias=bias_np,
                      activation=activation, **_EMULATED_GEMM_TILES)
    return from_numpy(c, dtype)


@matmul_fp8.register_kernel("cpu")
def _matmul_fp8_cpu(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor,
                    out_dtype: Optional[torch.dtype] = None,
                    block_scales: bool = False) -> Tensor:
    from tegula.kernels.fp8 import matmul_fp8_emulated

    sa, sb, out_t, (m, n) = _matmul_fp8_checked(a, b, scale_a, scale_b, out_dtype,
                                                block_scales)
    if m == 0 or n == 0 or a.shape[1] == 0:
        return from_numpy(np.zeros((m, n), np.float32), out_t)
    c = matmul_fp8_emulated(to_numpy(a, fp8.f8e4m3), to_numpy(b.T, fp8.f8e4m3),
                            sa.numpy(), sb.numpy(), out_t, block_scales,
                            BM=64, BN=64, STAGES=2)
    return from_numpy(c, out_t)


@rms_norm.register_kernel("cpu")
def _rms_norm_cpu(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    from tegula.kernels.norm import rms_norm_emulated

    dtype = _rms_norm_checked(x, weight, eps)
    if x.numel() == 0:
        return x.new_empty(x.shape)
    y = rms_norm_emulated(to_numpy(x, dtype), to_numpy(weight, dtype), eps, dtype,
                          looped=x.shape[-1] > _MAX_ROW)
    return from_numpy(y, dtype)


@softmax.register_kernel("cpu")
def _softmax_cpu(x: Tensor, dim: int = -1) -> Tensor:
    from tegula.kernels.softmax import softmax_emulated

    dtype = _softmax_checked(x, dim)
    if x.numel() == 0:
        return x.new_empty(x.shape)
    y = softmax_emulated(to_numpy(x, dtype), dtype, looped=x.shape[-1] > _MAX_ROW)
    return from_numpy(y, dtype)


@copy.register_kernel("cpu")
def _copy_cpu(x: Tensor) -> Tensor:
    from tegula.kernels.copy import copy_emulated

    dtype = _copy_checked(x)
    if x.numel() == 0:
        return x.new_empty(x.shape)
    rows = to_numpy(x, dtype).reshape(-1, x.shape[-1] if x.dim() else 1)
    return from_numpy(copy_emulated(rows, dtype), dtype).reshape(x.shape)


# ---------------------------------------------------------------------------- autograd
# Backward formulas in torch ops, each checked against torch's own autograd in
# tests/test_torch_ops.py. `ctx.needs_input_grad` skips gradients nobody asked for.

def _matmul_setup(ctx, inputs, output) -> None:
    a, b, bias, activation = inputs
    ctx.save_for_backward(a, b, bias)
    ctx.activation = activation


def _activation_grad(z: Tensor, activation: str) -> Tensor:
    """d activation / dz at the f32 pre-activation z."""
    if activation == "relu":
        return (z > 0).float()
    if activation == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    if activation == "gelu":
        cdf = 0.5 * (1 + torch.erf(z * 0.7071067811865476))
        return cdf + z * torch.exp(-0.5 * z * z) * 0.3989422804014327
    c = 0.7978845608028654  # gelu_tanh
    t = torch.tanh(c * (z + 0.044715 * z ** 3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z)


def _matmul_backward(ctx, grad):
    """With an activation, the pre-activation z = a @ b + bias is recomputed (one more
    tegula matmul, rounded to the inputs' dtype) and grad becomes grad · act'(z) in f32."""
    a, b, bias = ctx.saved_tensors
    grad = grad.contiguous()
    if ctx.activation is not None:
        z = matmul(a, b, bias).float()
        grad = (grad.float() * _activation_grad(z, ctx.activation)).to(a.dtype)
    grad_a = matmul(grad, b.T) if ctx.needs_input_grad[0] else None   # (M, N) @ (N, K)
    grad_b = matmul(a.T, grad) if ctx.needs_input_grad[1] else None   # (K, M) @ (M, N)
    grad_bias = grad.float().sum(0).to(bias.dtype) \
        if bias is not None and ctx.needs_input_grad[2] else None
    return grad_a, grad_b, grad_bias, None


def _rms_norm_setup(ctx, inputs, output) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_backward(ctx, grad):
    """y = x r w with r = (mean(x²) + eps)^-1/2: dx = r (g w - x r² mean(g w x)),
    dw = the sum over rows of g x r."""
    x, weight = ctx.saved_tensors
    xf, gf, wf = x.float(), grad.float(), weight.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    gw = gf * wf
    grad_x = r * (gw - xf * r.pow(2) * (gw * xf).mean(-1, keepdim=True))
    grad_w = (gf * xf * r).reshape(-1, x.shape[-1]).sum(0)
    return (grad_x.to(x.dtype) if ctx.needs_input_grad[0] else None,
            grad_w.to(weight.dtype) if ctx.needs_input_grad[1] else None, None)


def _softmax_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad):
    """dx = y (g - sum(g y)) along the row."""
    (y,) = ctx.saved_tensors
    yf, gf = y.float(), grad.float()
    return (yf * (gf - (gf * yf).sum(-1, keepdim=True))).to(y.dtype), None


def _copy_backward(ctx, grad):
    return grad


matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)
rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)
softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup)
copy.register_autograd(_copy_backward)


OPS = {"matmul": matmul, "matmul_fp8": matmul_fp8, "rms_norm": rms_norm, "softmax": softmax,
       "copy": copy}

__all__ = ["matmul", "matmul_fp8", "rms_norm", "softmax", "copy", "OPS"]


# ---------------------------------------------------------------------------- decode GEMMs
# `gemv` (x @ w.T for up to 16 rows) and `matmul_w4a16` (4-bit weights, 16-bit
# activations): inference kernels, forward only (as matmul_fp8).

def _gemv_checked(x: Tensor, w: Tensor) -> tuple[DType, tuple[int, ...]]:
    from tegula.kernels.gemv import _check_gemv_shapes
    dtype = api._check_tensor("gemv", "x", x, api._GEMM_DTYPES)
    api._check_tensor("gemv", "w", w, api._GEMM_DTYPES, ndim=2)
    api._check_same_dtype("gemv", {"x": x, "w": w})
    _check_gemv_shapes("gemv", tuple(x.shape), tuple(w.shape))
    return dtype, tuple(x.shape[:-1]) + (w.shape[0],)


@torch.library.custom_op("tegula::gemv", mutates_args=(), device_types="cuda")
def gemv(x: Tensor, w: Tensor) -> Tensor:
    """`x @ w.T` for x (K,) or (M, K) with M ≤ 16 and w (N, K), f16/bf16:
    `tegula.kernels.gemv`."""
    from tegula.kernels.gemv import gemv as run
    return run(x, w)


@gemv.register_fake
def _gemv_fake(x: Tensor, w: Tensor) -> Tensor:
    return x.new_empty(_gemv_checked(x, w)[1])


@gemv.register_kernel("cpu")
def _gemv_cpu(x: Tensor, w: Tensor) -> Tensor:
    from tegula.kernels.gemv import gemv_emulated
    dtype, shape = _gemv_checked(x, w)
    if 0 in shape or x.shape[-1] == 0:
        return x.new_zeros(shape)
    return from_numpy(gemv_emulated(to_numpy(x, dtype), to_numpy(w, dtype), dtype), dtype)


def _w4a16_checked(a: Tensor, packed: Tensor, scales: Tensor, zeros: Optional[Tensor],
                   group_size: int) -> tuple[DType, tuple[int, int, int]]:
    """(dtype, (M, N, K)): the CUDA entry point's own checks (`packed` 2-D, or 6-D in the
    fragment order of `pack_fragments`)."""
    from tegula.kernels.quant import check_w4a16_args
    return check_w4a16_args("matmul_w4a16", a, packed, scales, zeros, group_size)


@torch.library.custom_op("tegula::matmul_w4a16", mutates_args=(), device_types="cuda")
def matmul_w4a16(a: Tensor, packed: Tensor, scales: Tensor, zeros: Optional[Tensor],
                 group_size: int) -> Tensor:
    """`a @ ((w_q - zeros) * scales).T` with `packed` (N, K/2) uint8 4-bit weights, or
    pre-packed in the MMA fragment order (6-D, `tegula.kernels.pack_fragments`):
    `tegula.kernels.matmul_w4a16`."""
    from tegula.kernels.quant import matmul_w4a16 as run
    return run(a, packed, scales, zeros, group_size)


@matmul_w4a16.register_fake
def _matmul_w4a16_fake(a: Tensor, packed: Tensor, scales: Tensor, zeros: Optional[Tensor],
                       group_size: int) -> Tensor:
    m, n, _ = _w4a16_checked(a, packed, scales, zeros, group_size)[1]
    return a.new_empty((m, n))


@matmul_w4a16.register_kernel("cpu")
def _matmul_w4a16_cpu(a: Tensor, packed: Tensor, scales: Tensor, zeros: Optional[Tensor],
                      group_size: int) -> Tensor:
    from tegula.kernels.quant import unpack_w4, w4a16_gemm_emulated
    from tegula.kernels.quant_fragment import unpack_fragments
    dtype, (m, n, k) = _w4a16_checked(a, packed, scales, zeros, group_size)
    if m == 0 or n == 0 or k == 0:
        return a.new_zeros((m, n))
    rows = packed.numpy() if packed.dim() == 2 else unpack_fragments(packed.numpy(), n, k)
    c = w4a16_gemm_emulated(to_numpy(a, dtype), unpack_w4(rows),
                            to_numpy(scales, dtype),
                            None if zeros is None else to_numpy(zeros, dtype), group_size,
                            dtype)
    return from_numpy(c, dtype)


# ---------------------------------------------------------------------------- selective scan
# Mamba's selective scan forward (`tegula.kernels.selective_scan`), forward only.

@torch.library.custom_op("tegula::selective_scan", mutates_args=(), device_types="cuda")
def selective_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   D: Optional[Tensor] = None, z: Optional[Tensor] = None,
                   delta_bias: Optional[Tensor] = None,
                   delta_softplus: bool = False) -> Tensor:
    """`out` (batch, dim, L) of u's dtype: `tegula.kernels.selective_scan`."""
    from tegula.kernels.scan import selective_scan as run
    return run(u, delta, A, B, C, D, z, delta_bias, delta_softplus)


@selective_scan.register_fake
def _selective_scan_fake(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                         D: Optional[Tensor] = None, z: Optional[Tensor] = None,
                         delta_bias: Optional[Tensor] = None,
                         delta_softplus: bool = False) -> Tensor:
    from tegula.kernels.scan import check_selective_scan
    check_selective_scan("selective_scan", u, delta, A, B, C, D, z, delta_bias)
    return u.new_empty(u.shape)


@selective_scan.register_kernel("cpu")
def _selective_scan_cpu(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                        D: Optional[Tensor] = None, z: Optional[Tensor] = None,
                        delta_bias: Optional[Tensor] = None,
                        delta_softplus: bool = False) -> Tensor:
    from tegula.kernels.scan import check_selective_scan, selective_scan_emulated
    dtype, bc_dtype = check_selective_scan("selective_scan", u, delta, A, B, C, D, z,
                                           delta_bias)
    if u.numel() == 0:
        return u.new_empty(u.shape)
    f32 = lambda t: None if t is None else t.float().numpy()  # noqa: E731 (A, D, bias)
    out = selective_scan_emulated(
        to_numpy(u, dtype), to_numpy(delta, dtype), f32(A), to_numpy(B, bc_dtype),
        to_numpy(C, bc_dtype), f32(D), None if z is None else to_numpy(z, dtype),
        f32(delta_bias), delta_softplus, dtype, bc_dtype)
    return from_numpy(out, dtype)


# ---------------------------------------------------------------------------- MoE
# The grouped GEMM of a mixture of experts (`tegula.kernels.moe.moe_gemm`), forward only.

@torch.library.custom_op("tegula::moe_gemm", mutates_args=(), device_types="cuda")
def moe_gemm(x_sorted: Tensor, w: Tensor, expert_offsets: Tensor,
             w_scale: Optional[Tensor] = None) -> Tensor:
    """`out[p] = x_sorted[p] @ w[e].T` for the rows p of each expert e (R, N), in x's dtype;
    rows past `expert_offsets[E]` are unspecified: `tegula.kernels.moe.moe_gemm`."""
    from tegula.kernels.moe import moe_gemm as run
    return run(x_sorted, w, expert_offsets, w_scale)


@moe_gemm.register_fake
def _moe_gemm_fake(x_sorted: Tensor, w: Tensor, expert_offsets: Tensor,
                   w_scale: Optional[Tensor] = None) -> Tensor:
    from tegula.kernels.moe import check_moe_gemm
    _, (rows, n, _, _) = check_moe_gemm("moe_gemm", x_sorted, w, expert_offsets, w_scale)
    return x_sorted.new_empty((rows, n))


@moe_gemm.register_kernel("cpu")
def _moe_gemm_cpu(x_sorted: Tensor, w: Tensor, expert_offsets: Tensor,
                  w_scale: Optional[Tensor] = None) -> Tensor:
    from tegula.kernels.moe import check_moe_gemm, moe_gemm_emulated
    dtype, _ = check_moe_gemm("moe_gemm", x_sorted, w, expert_offsets, w_scale)
    out = moe_gemm_emulated(
        to_numpy(x_sorted, dtype), to_numpy(w, fp8.f8e4m3 if w_scale is not None else dtype),
        expert_offsets.numpy(), None if w_scale is None else w_scale.numpy(), dtype=dtype)
    return from_numpy(out, dtype)


# The attention ops (attention_forward with its backward, attention_varlen,
# attention_decode) and the MoE ones built on the grouped GEMM (moe_gemm_w4a16, moe_mlp)
# live in their own modules.
from tegula.kernels import torch_ops_attention, torch_ops_moe  # noqa: E402

OPS.update(gemv=gemv, matmul_w4a16=matmul_w4a16, selective_scan=selective_scan,
           moe_gemm=moe_gemm, **torch_ops_attention.OPS, **torch_ops_moe.OPS)
attention_forward = torch_ops_attention.attention_forward
attention_backward = torch_ops_attention.attention_backward
attention_varlen = torch_ops_attention.attention_varlen
attention_decode = torch_ops_attention.attention_decode
moe_gemm_w4a16 = torch_ops_moe.moe_gemm_w4a16
moe_mlp = torch_ops_moe.moe_mlp
__all__ += ["gemv", "matmul_w4a16", "selective_scan", "moe_gemm",
            *torch_ops_attention.OPS, *torch_ops_moe.OPS]
