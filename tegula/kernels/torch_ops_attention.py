"""The attention entry points as torch custom ops (registered by `tegula.kernels.torch_ops`,
which imports this module): `torch.ops.tegula.attention_forward` (differentiable: its
backward is `torch.ops.tegula.attention_backward`, the deterministic backward kernels of
`tegula/kernels/attention_backward.py`), `attention_varlen` (packed variable-length
sequences, forward only) and `attention_decode` (a KV cache, forward only). Each returns
(o, lse). As in `torch_ops`: the CUDA implementation is the entry point, the fake one runs
its argument checks and returns the result's shapes, the CPU one runs the same kernels in
the emulator.

Rows that belong to no sequence (`attention_varlen` with `cu_seqlens_q[-1]` short of the
packed length) are left unwritten on CUDA and NaN on CPU: their values are unspecified.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tegula.dtypes import DType, i32
from tegula.kernels import api
from tegula.runtime.torch_op import from_numpy, to_numpy


# ---------------------------------------------------------------------------- attention
# The forward returns (o, lse); its gradient (of o: lse is marked non-differentiable) is
# the backward op, itself a custom op so that a compiled training step traces it too.


def _attention_checked(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float]) -> DType:
    from tegula.kernels.attention import _check_torch, check_heads, check_scale
    dtype = _check_torch("attention", 4, q=q, k=k, v=v)
    check_heads("attention", tuple(q.shape), tuple(k.shape), tuple(v.shape), 3, 1, 2)
    check_scale("attention", scale)
    return dtype


@torch.library.custom_op("tegula::attention_forward", mutates_args=(), device_types="cuda")
def attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                      scale: Optional[float] = None) -> tuple[Tensor, Tensor]:
    """FlashAttention forward (causal aligned bottom-right): `tegula.kernels.attention_forward`."""
    from tegula.kernels.attention import attention_forward as forward
    return forward(q, k, v, causal, scale)


@attention_forward.register_fake
def _attention_forward_fake(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                            scale: Optional[float] = None) -> tuple[Tensor, Tensor]:
    _attention_checked(q, k, v, scale)
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@attention_forward.register_kernel("cpu")
def _attention_forward_cpu(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                           scale: Optional[float] = None) -> tuple[Tensor, Tensor]:
    from tegula.kernels.attention import attention_emulated
    dtype = _attention_checked(q, k, v, scale)
    o, lse = attention_emulated(*(to_numpy(t, dtype) for t in (q, k, v)), causal, scale,
                                return_lse=True, dtype=dtype, target="sm_80")
    return from_numpy(o, dtype), torch.from_numpy(lse)


@torch.library.custom_op("tegula::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                       grad_o: Tensor, causal: bool = False,
                       scale: Optional[float] = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of `attention_forward`'s o, from its saved o and lse:
    `tegula.kernels.attention_backward.attention_backward`."""
    from tegula.kernels.attention_backward import attention_backward as backward
    return backward(q, k, v, o, lse, grad_o, causal, scale)


def _attention_backward_checked(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                                grad_o: Tensor, scale: Optional[float]) -> DType:
    from tegula.dtypes import f32
    from tegula.kernels.attention_backward import (_TORCH_DTYPES, check_backward_shapes,
                                                   default_scale)
    fn = "attention_backward"
    tensors = dict(q=q, k=k, v=v, o=o, do=grad_o)
    for name, t in tensors.items():
        dtype = api._check_tensor(fn, name, t, _TORCH_DTYPES, ndim=4)
    api._check_same_dtype(fn, tensors)
    api._check_tensor(fn, "lse", lse, {"float32": f32}, ndim=3)
    check_backward_shapes(fn, q, k, v, o, lse, grad_o)
    default_scale(scale, q.shape[-1], fn)
    return dtype


@attention_backward.register_fake
def _attention_backward_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                             grad_o: Tensor, causal: bool = False,
                             scale: Optional[float] = None) -> tuple[Tensor, Tensor, Tensor]:
    _attention_backward_checked(q, k, v, o, lse, grad_o, scale)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@attention_backward.register_kernel("cpu")
def _attention_backward_cpu(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                            grad_o: Tensor, causal: bool = False,
                            scale: Optional[float] = None) -> tuple[Tensor, Tensor, Tensor]:
    from tegula.kernels.attention_backward import attention_backward_emulated
    dtype = _attention_backward_checked(q, k, v, o, lse, grad_o, scale)
    grads = attention_backward_emulated(
        *(to_numpy(t, dtype) for t in (q, k, v, o)), lse.detach().float().numpy(),
        to_numpy(grad_o, dtype), causal, scale, dtype=dtype, target="sm_80")
    return tuple(from_numpy(g, dtype) for g in grads)


def _attention_setup(ctx, inputs, output) -> None:
    q, k, v, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(lse)  # what the backward kernels differentiate is o


def _attention_forward_backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.tegula.attention_backward(q, k, v, o, lse, grad_o.contiguous(),
                                                     ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


attention_forward.register_autograd(_attention_forward_backward,
                                    setup_context=_attention_setup)


# ---------------------------------------------------------------------------- varlen
# Packed variable-length sequences (flash-attn's layout), forward only (the backward
# kernels take the padded layout).

def _varlen_checked(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                    cu_seqlens_k: Tensor, max_seqlen_q: int,
                    scale: Optional[float]) -> DType:
    """`tegula.kernels.attention_varlen`'s checks but the device (the offsets' values stay
    on the device there; the CPU implementation's emulated entry checks them)."""
    from tegula.kernels.attention import _check_torch, check_heads, check_scale
    fn = "attention_varlen"
    dtype = _check_torch(fn, 3, q=q, k=k, v=v)
    check_heads(fn, tuple(q.shape), tuple(k.shape), tuple(v.shape), 2, 1, 0)
    check_scale(fn, scale)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        api._check_tensor(fn, name, t, {"int32": i32}, ndim=1)
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.shape[0] < 1:
        raise ValueError(f"tegula.kernels.{fn}: cu_seqlens_q {tuple(cu_seqlens_q.shape)} and "
                         f"cu_seqlens_k {tuple(cu_seqlens_k.shape)} must both hold sequences "
                         f"+ 1 offsets")
    if max_seqlen_q < 0:
        raise ValueError(f"tegula.kernels.{fn}: max_seqlen_q must be a non-negative int, got "
                         f"{max_seqlen_q!r}")
    return dtype


@torch.library.custom_op("tegula::attention_varlen", mutates_args=(), device_types="cuda")
def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: Optional[int] = None, causal: bool = False,
                     scale: Optional[float] = None) -> tuple[Tensor, Tensor]:
    """(o (total_q, H, D), lse (H, total_q) f32) of packed sequences:
    `tegula.kernels.attention_varlen(..., return_lse=True)`."""
    from tegula.kernels.attention import attention_varlen as run
    return run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
               scale, return_lse=True)


@attention_varlen.register_fake
def _attention_varlen_fake(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                           cu_seqlens_k: Tensor, max_seqlen_q: int,
                           max_seqlen_k: Optional[int] = None, causal: bool = False,
                           scale: Optional[float] = None) -> tuple[Tensor, Tensor]:
    _varlen_checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, scale)
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@attention_varlen.register_kernel("cpu")
def _attention_varlen_cpu(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, max_seqlen_q: int,
                          max_seqlen_k: Optional[int] = None, causal: bool = False,
                          scale: Optional[float] = None) -> tuple[Tensor, Tensor]:
    from tegula.kernels.attention import attention_varlen_emulated
    dtype = _varlen_checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, scale)
    o, lse = attention_varlen_emulated(
        *(to_numpy(t, dtype) for t in (q, k, v)), cu_seqlens_q.numpy(), cu_seqlens_k.numpy(),
        max_seqlen_q, causal, scale, return_lse=True, dtype=dtype, target="sm_80")
    return from_numpy(o, dtype), torch.from_numpy(lse)


# ---------------------------------------------------------------------------- decode
# Decoding attention over a KV cache, forward only.

def _decode_checked(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                    block_table: Optional[Tensor], scale: Optional[float]) -> DType:
    from tegula.kernels.attention_backward import default_scale
    from tegula.kernels.attention_decode import check_decode_shapes
    fn = "attention_decode"
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache)
    for name, t in tensors.items():
        dtype = api._check_tensor(fn, name, t, api._GEMM_DTYPES, ndim=4)
    api._check_same_dtype(fn, tensors)
    api._check_tensor(fn, "cache_seqlens", cache_seqlens, {"int32": i32}, ndim=1)
    if block_table is not None:
        api._check_tensor(fn, "block_table", block_table, {"int32": i32}, ndim=2)
    check_decode_shapes(fn, q, k_cache, v_cache, cache_seqlens, block_table)
    default_scale(scale, q.shape[-1], fn)
    return dtype


@torch.library.custom_op("tegula::attention_decode", mutates_args=(), device_types="cuda")
def attention_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                     block_table: Optional[Tensor] = None, scale: Optional[float] = None,
                     causal: bool = False) -> tuple[Tensor, Tensor]:
    """Decoding attention over a KV cache (contiguous, or paged with `block_table`),
    returning (o, lse): `tegula.kernels.attention_decode(..., return_lse=True)`."""
    from tegula.kernels.attention_decode import attention_decode as run
    return run(q, k_cache, v_cache, cache_seqlens, block_table, scale, causal,
               return_lse=True)


@attention_decode.register_fake
def _attention_decode_fake(q: Tensor, k_cache: Tensor, v_cache: Tensor,
                           cache_seqlens: Tensor, block_table: Optional[Tensor] = None,
                           scale: Optional[float] = None,
                           causal: bool = False) -> tuple[Tensor, Tensor]:
    _decode_checked(q, k_cache, v_cache, cache_seqlens, block_table, scale)
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@attention_decode.register_kernel("cpu")
def _attention_decode_cpu(q: Tensor, k_cache: Tensor, v_cache: Tensor,
                          cache_seqlens: Tensor, block_table: Optional[Tensor] = None,
                          scale: Optional[float] = None,
                          causal: bool = False) -> tuple[Tensor, Tensor]:
    from tegula.kernels.attention_decode import attention_decode_emulated
    dtype = _decode_checked(q, k_cache, v_cache, cache_seqlens, block_table, scale)
    o, lse = attention_decode_emulated(
        *(to_numpy(t, dtype) for t in (q, k_cache, v_cache)), cache_seqlens.numpy(),
        None if block_table is None else block_table.numpy(), scale, causal, dtype=dtype,
        target="sm_80", return_lse=True)
    return from_numpy(o, dtype), torch.from_numpy(lse)


OPS = {"attention_forward": attention_forward, "attention_backward": attention_backward,
       "attention_varlen": attention_varlen, "attention_decode": attention_decode}

__all__ = list(OPS) + ["OPS"]
