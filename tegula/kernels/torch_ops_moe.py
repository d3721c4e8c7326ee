"""The MoE entry points built on the grouped GEMM as torch custom ops (registered by
`tegula.kernels.torch_ops`, which imports this module): `torch.ops.tegula.moe_gemm_w4a16`
(4-bit expert weights, `tegula.kernels.moe_w4.moe_gemm_w4a16`) and `moe_mlp` (the whole
Mixtral-style MLP: fused gate/up grouped GEMM, down grouped GEMM, weighted gather;
`tegula.kernels.moe_layer.moe_mlp`). As in `torch_ops`: the CUDA implementation is the
entry point, the fake one runs its argument checks and returns the result's shape, the CPU
one runs the same kernels in the emulator. Both are inference kernels: forward only.

Rows of `moe_gemm_w4a16`'s result past `expert_offsets[-1]` belong to no expert: left
unwritten on CUDA and NaN on CPU (unspecified, as `moe_gemm`'s).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tegula.runtime.torch_op import from_numpy, to_numpy


@torch.library.custom_op("tegula::moe_gemm_w4a16", mutates_args=(), device_types="cuda")
def moe_gemm_w4a16(x_sorted: Tensor, packed: Tensor, scales: Tensor, zeros: Optional[Tensor],
                   group_size: int, expert_offsets: Tensor) -> Tensor:
    """`out[p] = x_sorted[p] @ dequantized(w[e]).T` for the rows p of each expert e, with
    packed (E, N, K/2) uint8 4-bit weights (`quantize_experts_w4`):
    `tegula.kernels.moe_w4.moe_gemm_w4a16`."""
    from tegula.kernels.moe_w4 import moe_gemm_w4a16 as run
    return run(x_sorted, packed, scales, zeros, group_size, expert_offsets)


@moe_gemm_w4a16.register_fake
def _moe_gemm_w4a16_fake(x_sorted: Tensor, packed: Tensor, scales: Tensor,
                         zeros: Optional[Tensor], group_size: int,
                         expert_offsets: Tensor) -> Tensor:
    from tegula.kernels.moe_w4 import check_w4_args
    _, (rows, n, _, _) = check_w4_args("moe_gemm_w4a16", x_sorted, packed, scales, zeros,
                                       group_size, expert_offsets)
    return x_sorted.new_empty((rows, n))


@moe_gemm_w4a16.register_kernel("cpu")
def _moe_gemm_w4a16_cpu(x_sorted: Tensor, packed: Tensor, scales: Tensor,
                        zeros: Optional[Tensor], group_size: int,
                        expert_offsets: Tensor) -> Tensor:
    from tegula.kernels.moe_w4 import check_w4_args, moe_gemm_w4a16_emulated
    from tegula.kernels.quant import unpack_w4
    dtype, _ = check_w4_args("moe_gemm_w4a16", x_sorted, packed, scales, zeros, group_size,
                             expert_offsets)
    out = moe_gemm_w4a16_emulated(
        to_numpy(x_sorted, dtype), unpack_w4(packed.numpy()), to_numpy(scales, dtype),
        None if zeros is None else to_numpy(zeros, dtype), group_size,
        expert_offsets.numpy(), dtype=dtype)
    return from_numpy(out, dtype)


@torch.library.custom_op("tegula::moe_mlp", mutates_args=(), device_types="cuda")
def moe_mlp(x: Tensor, w13: Tensor, w2: Tensor, topk_ids: Tensor,
            topk_weights: Tensor) -> Tensor:
    """The MoE MLP: x (T, H), w13 (E, 2I, H) (gate rows, then up rows), w2 (E, H, I),
    topk_ids and topk_weights (T, k) (`tegula.kernels.moe.route`): `moe_layer.moe_mlp`."""
    from tegula.kernels.moe_layer import moe_mlp as run
    return run(x, w13, w2, topk_ids, topk_weights)


@moe_mlp.register_fake
def _moe_mlp_fake(x: Tensor, w13: Tensor, w2: Tensor, topk_ids: Tensor,
                  topk_weights: Tensor) -> Tensor:
    from tegula.kernels.moe_layer import check_mlp_args
    check_mlp_args("moe_mlp", x, w13, w2, topk_ids, topk_weights)
    return x.new_empty(x.shape)


@moe_mlp.register_kernel("cpu")
def _moe_mlp_cpu(x: Tensor, w13: Tensor, w2: Tensor, topk_ids: Tensor,
                 topk_weights: Tensor) -> Tensor:
    from tegula.kernels.moe_layer import check_mlp_args, moe_mlp_emulated
    dtype, _, _ = check_mlp_args("moe_mlp", x, w13, w2, topk_ids, topk_weights)
    y = moe_mlp_emulated(to_numpy(x, dtype), to_numpy(w13, dtype), to_numpy(w2, dtype),
                         topk_ids.numpy(), topk_weights.float().numpy(), dtype)
    return from_numpy(y, dtype)


OPS = {"moe_gemm_w4a16": moe_gemm_w4a16, "moe_mlp": moe_mlp}
