"""Float -> i8/u8 casts saturate in the CUDA as in the emulator (found by tegula.fuzz's
GPU mode: the CUDA converted through (int) and then stored 8 bits, so 300.0 -> i8 gave
44 on the GPU and 127 emulated; -inf gave 0, not -128)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.build import build, emulate
from tegula.dtypes import f32, i8, u8
from tegula.runtime.compiler import available_compilers, compile_cuda

VALUES = np.array([300.0, -300.0, np.nan, np.inf, -np.inf, 3.7, -3.7, 127.9, 255.5, -0.5,
                   1e10, -1e10, 128.0, -129.0, 0.0, 42.0], dtype=np.float32).reshape(1, 16)


def _cast_kernel(dtype):
    @tg.kernel(threads=32)
    def cast_to(x: tg.Tensor[f32], out: tg.Tensor[dtype]):
        v = tg.load(x.tile((1, 16), (0, 0)))
        tg.copy(v.to(dtype), out.tile((1, 16), (0, 0)))
    return cast_to


@pytest.mark.parametrize("dtype,low,high", [(i8, -128, 127), (u8, 0, 255)], ids=str)
def test_emitted_conversion_clamps_to_the_type(dtype, low, high):
    source = build(_cast_kernel(dtype)).cuda_source()
    assert f"max({low}, min({high}, tg_f32_to_i32(" in source  # cvt.rzi.s32.f32, clamped
    assert "cvt.rzi.s32.f32" in source
    if available_compilers():
        assert compile_cuda(source, "cast_to", "sm_90a")[:4] == b"\x7fELF"


@pytest.mark.parametrize("dtype", [i8, u8], ids=str)
def test_emulator_saturates(dtype):
    out = np.zeros((1, 16), dtype=np.dtype(dtype.numpy_name))
    emulate(_cast_kernel(dtype), (1,), VALUES, out)
    info = np.iinfo(out.dtype)
    expected = np.clip(np.trunc(np.nan_to_num(VALUES.astype(np.float64), nan=0.0,
                                              posinf=info.max, neginf=info.min)),
                       info.min, info.max)
    assert np.array_equal(out.astype(np.float64), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [i8, u8], ids=str)
def test_gpu_saturates_like_the_emulator(dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    kernel = _cast_kernel(dtype)
    emulated = np.zeros((1, 16), dtype=np.dtype(dtype.numpy_name))
    emulate(kernel, (1,), VALUES, emulated)
    x = torch.from_numpy(VALUES).cuda()
    out = torch.zeros((1, 16), dtype=getattr(torch, "int8" if dtype == i8 else "uint8"),
                      device="cuda")
    kernel[(1,)](x, out)
    torch.cuda.synchronize()
    assert np.array_equal(out.cpu().numpy(), emulated)


def test_a_float_scalar_parameter_is_not_converted_as_an_integer():
    """Session 11: once int -> float casts went through the cvt.rn.f32.s32 entry, an
    IndexValue over the f32 parameter `alpha` (codegen sample `elementwise_zoo`) was printed
    `tg_i32_to_f32((alpha))`, so 0.25 compared as 0 on the GPU (the H100 run of
    tests/runtime/test_gpu_launch.py found it). An IndexValue says its expression's type."""
    from tegula.codegen import emit_cuda
    from tegula.codegen.samples import elementwise_zoo
    emitted = emit_cuda(elementwise_zoo())
    source = emitted if isinstance(emitted, str) else emitted.source
    assert "tg_i32_to_f32((alpha))" not in source
    assert "> (alpha))" in source
    assert "tg_i32_to_f32(nv[0])" in source  # the i32 register still converts by the entry
