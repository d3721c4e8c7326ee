"""Dequantization's integer -> float conversion in CUDA, and the W4A16 / GEMV kernels
through NVRTC on both targets (so a codegen mistake shows in CI, before any GPU run).

Narrow integers (u4, i4, u8, i8) convert to float by the magic-number trick (one LOP3 or
IADD and one FADD) rather than `(float)`, an I2F at a quarter of the FP32 rate that caps a
4-bit GEMV well below the memory bandwidth; the GPU test of every value is in
tests/gpu/test_quant_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import bf16, f16, f32, i4, i8, u4, u8
from tegula.runtime.compiler import available_compilers, compile_cuda


def _magic(values: np.ndarray, signed: bool) -> np.ndarray:
    """What the CUDA expressions compute, in numpy: int bits -> float, minus the magic."""
    bits = (0x4B400000 + values) if signed else (0x4B000000 | values)
    return bits.astype(np.int32).view(np.float32) - np.float32(12582912.0 if signed
                                                               else 8388608.0)


@pytest.mark.parametrize("low,high,signed", [(0, 15, False), (0, 255, False),
                                             (-8, 7, True), (-128, 127, True)])
def test_magic_number_conversion_is_exact_for_every_value(low, high, signed):
    values = np.arange(low, high + 1, dtype=np.int64)
    assert np.array_equal(_magic(values, signed), values.astype(np.float32))


def cast_kernel(src):
    @tg.kernel(threads=32)
    def cast_to_float(x: tg.Tensor[src, 1], y: tg.Tensor[f32, 1], z: tg.Tensor[f16, 1],
                      B: tg.constexpr = 32):
        t = tg.load(x.tile((B,), (tg.block_id(0),)))
        tg.copy(t.to(f32), y.tile((B,), (tg.block_id(0),)))
        tg.copy(t.to(f16), z.tile((B,), (tg.block_id(0),)))
    return cast_to_float


def every_value(src):
    """(host array of the type holding every value, the values as int64)."""
    if src.is_packed:
        nibbles = np.arange(16, dtype=np.uint8)
        values = (nibbles ^ 8).astype(np.int64) - 8 if src == i4 else nibbles.astype(np.int64)
        return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8), values
    values = np.arange(256, dtype=np.int64) - (128 if src == i8 else 0)
    return values.astype(np.int8 if src == i8 else np.uint8), values


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("src", [u4, i4, u8, i8], ids=str)
def test_emulated_conversion_of_every_value(src, target):
    """i4 nibbles 8..15 are -8..-1 (the emulator used to convert the nibble 0..15 itself,
    while CUDA sign-extends)."""
    host, values = every_value(src)
    y = np.full(values.size, np.nan, np.float32)
    z = np.full(values.size, np.nan, np.float16)
    tg.emulate(cast_kernel(src), (tg.cdiv(values.size, 32),), host, y, z, target=target)
    assert np.array_equal(y, values.astype(np.float32))
    assert np.array_equal(z, values.astype(np.float16))


@pytest.mark.parametrize("src", [u4, i4, u8, i8], ids=str)
def test_narrow_integers_convert_without_i2f(src):
    source = build(cast_kernel(src), {}).cuda_source()
    magic = "0x4B400000 +" if src.kind == "int" else "0x4B000000 |"
    assert source.count(magic) >= 2, "both casts use the magic-number conversion"
    assert "(float)(" not in source


needs_compiler = pytest.mark.skipif(not available_compilers(),
                                    reason="needs NVRTC or nvcc to compile CUDA")


@needs_compiler
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_cast_kernels_compile(target):
    for src in (u4, i4, u8, i8):
        kernel = cast_kernel(src)
        source = build(kernel, {}, target=target).cuda_source()
        assert compile_cuda(source, kernel.name, target)[:4] == b"\x7fELF"


def _library_builds():
    from tegula.kernels.gemv import gemv_kernel
    from tegula.kernels.quant import w4a16_gemm_kernel, w4a16_rows_kernel
    yield "gemv-f16-M1", gemv_kernel(f16), dict(M=1, BN=8, BK=512, UNROLL=2)
    yield "gemv-bf16-M16", gemv_kernel(bf16), dict(M=16, BN=8, BK=128)
    yield "w4a16-rows-zeros", w4a16_rows_kernel(f16, True), dict(M=1, G=128, BN=4, S=8, R=2)
    yield "w4a16-rows-sym-M5", w4a16_rows_kernel(bf16, False), dict(M=5, G=64, BN=4, S=16,
                                                                     R=4, UNROLL=1)
    yield "w4a16-gemm-zeros", w4a16_gemm_kernel(f16, True), dict(G=128, BM=64, BN=64, BK=64)
    yield "w4a16-gemm-sym", w4a16_gemm_kernel(bf16, False), dict(G=32, BM=64, BN=128, BK=32)


@needs_compiler
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("name,kernel,constexprs", list(_library_builds()),
                         ids=[b[0] for b in _library_builds()])
def test_quant_and_gemv_kernels_compile(name, kernel, constexprs, target):
    source = build(kernel, constexprs, target=target).cuda_source()
    assert compile_cuda(source, kernel.name, target)[:4] == b"\x7fELF"
