"""The CUDA of tile coordinates, broadcasts, kernel scalars in tile arithmetic and
argmax/argmin compiles for sm_80 and sm_90a (the emulator tests prove the same thread IR
right), and a kernel scalar entering f16 arithmetic is rounded to f16 as the emulator does."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import bf16, f8e4m3, f16, f32, i8
from tegula.runtime.compiler import available_compilers, compile_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "emulate"))
from index_kernels import (arg_kernel, broadcast_kernel, causal_mask_kernel,  # noqa: E402
                           indices_kernel, looped_argmax, scalar_operands)

pytestmark = pytest.mark.skipif(not available_compilers(),
                                reason="no CUDA compiler (NVRTC or nvcc) installed")


def kernels():
    cases = [("causal_mask", causal_mask_kernel(128), {}),
             ("causal_mask_96_threads", causal_mask_kernel(96), dict(BM=16, BN=32)),
             ("indices", indices_kernel(128), {}),
             ("broadcast", broadcast_kernel(128), {}),
             ("looped_argmax", looped_argmax, {}),
             ("scalar_operands", scalar_operands, {})]
    # Every type's compare-and-select, both axes (lanes only / lanes and warps), both kinds.
    for kind, axis, dtype in (("argmax", 0, f32), ("argmin", 1, f16), ("argmin", 0, bf16),
                              ("argmax", 1, i8), ("argmax", 0, f8e4m3)):
        cases.append((f"{kind}-{dtype}-axis{axis}", arg_kernel(kind, axis, dtype, 256),
                      dict(BM=32, BN=32)))
    return cases


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("name,kernel,constexprs", kernels(), ids=[c[0] for c in kernels()])
def test_index_and_arg_reduce_kernels_compile(name, kernel, constexprs, target):
    source = build(kernel, constexprs, target=target).cuda_source()
    assert compile_cuda(source, kernel.name, target)[:4] == b"\x7fELF"


@tg.kernel(threads=32)
def scale_by_scalar(x: tg.Tensor[f16, 1], y: tg.Tensor[f16, 1], n: int, B: tg.constexpr = 32):
    t = tg.load(x.tile((B,), (tg.block_id(0),)))
    tg.copy(t * n, y.tile((B,), (tg.block_id(0),)))


def test_kernel_scalar_in_f16_arithmetic_is_rounded_to_f16_in_cuda_and_emulator():
    """2049 is not an f16: the emulator rounds it to 2048 before the multiply (3 * 2048 =
    6144), so the CUDA must too (unrounded, 3 * 2049 = 6147 would round to 6148)."""
    source = build(scale_by_scalar, {}).cuda_source()
    assert "tg_f32_to_f16(tg_i32_to_f32((n)))" in source  # cvt.rn.f32.s32, then to f16
    x, y = np.full(32, 3.0, np.float16), np.zeros(32, np.float16)
    tg.emulate(scale_by_scalar, (1,), x, y, 2049)
    assert np.all(y == np.float16(6144.0))
