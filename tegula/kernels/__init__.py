"""The kernel library, written in tegula.

One module per kernel family; each holds the `@tg.kernel` (built per element type by a
cached factory, since a tensor annotation fixes its dtype), a `*_config` function that
chooses the grid and constexprs for a problem (the one place a numpy or torch entry point
needs), and a numpy entry point running the kernel on the CPU emulator:

* `copy`: `copy_emulated`, `transpose_emulated` (through shared memory)
* `elementwise`: `silu_mul_emulated` (SiLU(x)·y)
* `softmax`: `softmax_emulated` (row softmax)
* `norm`: `rms_norm_emulated` (RMSNorm)
* `gemm`: `gemm_emulated` (c = a @ b.T; shared-memory pipeline or register-only; f16/bf16
  with f32 accumulation, i8 with i32 output; fused bias + relu/gelu/silu epilogues)
* `fp8`: `matmul_fp8_emulated` (e4m3 GEMM, per-tensor or DeepSeek-style blockwise scales;
  torch: `matmul_fp8`)
* `gemv`: `gemv_emulated` (y = x @ w.T for M ≤ 16 rows of x; torch: `gemv`)
* `quant`: `w4a16_gemm_emulated` (a @ ((w_q - zeros) * scales).T, 4-bit weights in groups;
  torch: `matmul_w4a16`), `quantize_w4`, `prepack`, `unpack_w4`, `pack_fragments` (the
  weights once more in the MMA fragment's order: 16-byte loads, `quant_fragment`)
* `scan`: `selective_scan_emulated` (Mamba's selective scan forward, chunked over the
  sequence with `tg.scan`; torch: `selective_scan`)
* `moe`: `moe_gemm_emulated` (MoE grouped GEMM: rows sorted by expert times each expert's
  weight, bf16/f16 or FP8 weights, the experts' offsets read on the device; routing helpers
  `route`, `sort_by_expert`, `scatter_rows`, `gather_rows`; torch: `moe_gemm`)
* `attention`: `attention_emulated`, `attention_varlen_emulated` (FlashAttention forward:
  causal aligned bottom-right, GQA, variable lengths, the log-sum-exp for the backward;
  torch: `attention` (differentiable), `attention_forward`, `attention_varlen`)
* `attention_backward`: `attention_backward_emulated` (dQ, dK, dV from o and the
  log-sum-exp, deterministic: no atomics; torch: `attention_backward`)
* `attention_decode`: `attention_decode_emulated` (split-KV decoding of ≤ 16 query tokens
  against a long, optionally paged KV cache; torch: `attention_decode`)

The torch entry points (`api`: `matmul`, `rms_norm`, `softmax`, `copy`; `attention`:
`attention`, `attention_forward`, `attention_varlen`) are re-exported below;
`import tegula.kernels.torch_ops` (needs torch) registers them as the custom ops
`torch.ops.tegula.*` for `torch.compile`.
"""
from __future__ import annotations

from tegula.kernels.copy import copy_emulated, transpose_emulated
from tegula.kernels.elementwise import silu_mul_emulated
from tegula.kernels.fp8 import matmul_fp8_emulated
from tegula.kernels.gemm import gemm_emulated
from tegula.kernels.norm import rms_norm_emulated
from tegula.kernels.quant import (matmul_w4a16, prepack, quantize_w4, unpack_w4,
                                  w4a16_gemm_emulated)
from tegula.kernels.quant_fragment import pack_fragments
from tegula.kernels.softmax import softmax_emulated
from tegula.kernels.attention import attention_emulated, attention_varlen_emulated

__all__ = ["copy_emulated", "transpose_emulated", "silu_mul_emulated", "softmax_emulated",
           "rms_norm_emulated", "gemm_emulated", "matmul_fp8_emulated", "gemv_emulated",
           "w4a16_gemm_emulated",
           "matmul_w4a16", "quantize_w4", "prepack", "unpack_w4", "pack_fragments", "gemv"]

# Torch-facing, autotuned entry points (tegula/kernels/api.py). `copy` and `softmax` shadow
# the submodule attributes of the same names; `from tegula.kernels.copy import ...` still
# finds the modules.
from tegula.kernels.api import copy, matmul, matmul_fp8, rms_norm, softmax  # noqa: E402
from tegula.kernels.gemv import gemv, gemv_emulated  # noqa: E402  (shadows the module, as copy)
from tegula.kernels.scan import selective_scan, selective_scan_emulated  # noqa: E402

__all__ += ["matmul", "matmul_fp8", "rms_norm", "softmax", "copy"]
__all__ += ["selective_scan", "selective_scan_emulated"]
# `attention` shadows its module as well: `from tegula.kernels.attention import ...` works.
from tegula.kernels.attention import attention, attention_forward, attention_varlen  # noqa: E402,E501

__all__ += ["attention_emulated", "attention_varlen_emulated", "attention", "attention_forward",
            "attention_varlen"]
# These shadow their modules too (`from tegula.kernels.attention_decode import ...` works).
from tegula.kernels.attention_backward import (attention_backward,  # noqa: E402
                                               attention_backward_emulated)
from tegula.kernels.attention_decode import (attention_decode,  # noqa: E402
                                             attention_decode_emulated)

__all__ += ["attention_backward", "attention_backward_emulated", "attention_decode",
            "attention_decode_emulated"]
from tegula.kernels.moe import moe_gemm, moe_gemm_emulated  # noqa: E402

__all__ += ["moe_gemm", "moe_gemm_emulated"]
