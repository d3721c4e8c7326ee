"""Every library kernel's generated CUDA compiles for sm_80 and sm_90a (NVRTC or nvcc).

The emulator tests prove the thread IR right; this proves the same thread IR, printed as
CUDA, is accepted by the real compiler for both the Ampere and the Hopper target.
"""
from __future__ import annotations

import pytest

from tegula.build import build
from tegula.dtypes import ALL_DTYPES
from tegula.kernels.copy import TRANSPOSE_DTYPES, copy_kernel, transpose_kernel
from tegula.kernels.elementwise import SILU_MUL_DTYPES, silu_mul_kernel
from tegula.kernels.gemm import GEMM_DTYPES, gemm_kernel, gemm_registers_kernel
from tegula.kernels.norm import RMS_NORM_DTYPES, rms_norm_kernel, rms_norm_looped_kernel
from tegula.kernels.softmax import SOFTMAX_DTYPES, softmax_kernel, softmax_looped_kernel
from tegula.runtime.compiler import available_compilers, compile_cuda

pytestmark = pytest.mark.skipif(not available_compilers(),
                                reason="no CUDA compiler (NVRTC or nvcc) installed")


def library() -> list:
    """(id, kernel, constexprs) for every kernel family and dtype: default tiles, but
    64x64 GEMM tiles (the same code at a quarter of the unrolled size, to keep this fast)."""
    cases = [(f"copy-{d}", copy_kernel(d), {}) for d in ALL_DTYPES]
    cases += [(f"transpose-{d}", transpose_kernel(d), {}) for d in TRANSPOSE_DTYPES]
    cases += [(f"silu_mul-{d}", silu_mul_kernel(d), {}) for d in SILU_MUL_DTYPES]
    cases += [(f"softmax-{d}", softmax_kernel(d), {}) for d in SOFTMAX_DTYPES]
    cases += [(f"softmax_looped-{d}", softmax_looped_kernel(d), {}) for d in SOFTMAX_DTYPES]
    cases += [(f"rms_norm-{d}", rms_norm_kernel(d), dict(N=4096)) for d in RMS_NORM_DTYPES]
    cases += [(f"rms_norm_looped-{d}", rms_norm_looped_kernel(d), dict(N=20000))
              for d in RMS_NORM_DTYPES]
    small = dict(BM=64, BN=64)
    cases += [(f"gemm-{d}", gemm_kernel(d), small) for d in GEMM_DTYPES]
    cases += [(f"gemm_registers-{d}", gemm_registers_kernel(d), small) for d in GEMM_DTYPES]
    return cases


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("name,kernel,constexprs", library(), ids=[c[0] for c in library()])
def test_library_kernel_compiles(name: str, kernel, constexprs: dict, target: str):
    source = build(kernel, constexprs, target=target).cuda_source()
    assert compile_cuda(source, kernel.name, target)  # a cubin, or CompileError with the log
