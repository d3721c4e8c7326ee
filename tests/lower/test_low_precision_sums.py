"""Sums of f16/bf16/f8 tiles accumulate in f32 and round once (as torch and Triton do).

Summed in the tile's own type, every partial sum rounds, and f8e4m3 saturates at ±448, so
the result depended on the order in which lanes and warps were combined; the fuzzer found
an f8e4m3 column sum off by 432 from any rounding bound.
"""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import bf16, f8e4m3, f16, f32


def row_sum_kernel(dtype, axis: int):
    out_shape = lambda BM, BN: (BM, 1) if axis == 1 else (1, BN)  # noqa: E731

    @tg.kernel(threads=128)
    def row_sum(x: tg.Tensor[dtype], o: tg.Tensor[dtype],
                BM: tg.constexpr = 8, BN: tg.constexpr = 256):
        m = tg.block_id(0)
        s = tg.sum(tg.load(x.tile((BM, BN), (m, 0))), axis)
        tg.copy(s, o.tile(out_shape(BM, BN), (m, 0)))

    return row_sum


def test_f16_sum_keeps_the_small_terms_an_f16_accumulator_would_round_away():
    # 2048 + 1 rounds back to 2048 in f16 (its ulp there is 2); in f32 the 255 ones count.
    x = np.ones((8, 256), np.float16)
    x[:, 0] = 2048
    o = np.full((8, 1), np.nan, np.float16)
    tg.emulate(row_sum_kernel(f16, 1), (1,), x, o)
    assert np.all(o[:, 0] == np.float16(2048 + 255)), o[:, 0]


def test_f8e4m3_sum_does_not_saturate_midway():
    # 448 + 448 saturates in f8e4m3 (448 is its largest value); in f32 each column sums
    # to 96 + 3 * 0.5 = 97.5, which rounds to 96 in f8e4m3 (steps of 8 there), whatever
    # the order of the terms. Summed in f8 the order decided: 448 + 448 - 448 - 448 = 0.
    x = np.full((8, 256), 0.5, np.float32)
    x[:5, :] = np.array([448, 448, -448, -448, 96], np.float32)[:, None]
    x[:5, 1::2] = np.array([-448, 96, 448, -448, 448], np.float32)[:, None]
    o = np.full((1, 256), np.nan, np.float32)
    tg.emulate(row_sum_kernel(f8e4m3, 0), (1,), x, o, BM=8, BN=256)
    assert np.all(o[0] == np.float32(96)), np.unique(o[0])


@pytest.mark.parametrize("dtype, np_type", [(f16, np.float16), (bf16, np.float32)])
@pytest.mark.parametrize("axis", [0, 1])
def test_random_sums_match_an_f32_sum_rounded_once(dtype, np_type, axis):
    rng = np.random.default_rng(7 + axis)
    x = rng.standard_normal((16, 256)).astype(np_type)
    if dtype == bf16:  # bf16 arrays reach the emulator as float32 values rounded to bf16
        x = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
    shape = (16, 1) if axis == 1 else (1, 256)
    o = np.full(shape, np.nan, np_type)
    tg.emulate(row_sum_kernel(dtype, axis), (2,) if axis == 1 else (1,), x, o,
               BM=8 if axis == 1 else 16, BN=256)
    exact = x.astype(np.float64).sum(axis=axis, keepdims=True)
    ulp = np.spacing(np.abs(exact).astype(np.float16 if dtype == f16 else np.float32))
    ulp = ulp if dtype == f16 else ulp * 2 ** 16   # bf16 keeps 8 of f32's 24 bits
    assert np.all(np.abs(o.astype(np.float64) - exact) <= ulp), (o, exact)


def test_f32_and_integer_sums_keep_their_type():
    x = np.random.default_rng(3).integers(-50, 50, (8, 256)).astype(np.int32)
    x[x == 0] = 1
    o = np.full((8, 1), -1, np.int32)
    tg.emulate(row_sum_kernel(tg.i32, 1), (1,), x, o)
    assert np.array_equal(o, x.sum(axis=1, keepdims=True))
    y = np.random.default_rng(4).standard_normal((8, 256)).astype(np.float32)
    p = np.full((8, 1), np.nan, np.float32)
    tg.emulate(row_sum_kernel(f32, 1), (1,), y, p)
    assert np.allclose(p, y.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [f16, bf16, f8e4m3])
@pytest.mark.parametrize("target", ["sm_90a"])
def test_the_f32_accumulating_sum_compiles(dtype, target):
    from tegula.build import build
    from tegula.codegen import emit_cuda
    from tegula.runtime.compiler import available_compilers, compile_cuda

    if not available_compilers():
        pytest.skip("no NVRTC or nvcc")
    thread_kernel = build(row_sum_kernel(dtype, 1), {}, target=target).thread_kernel
    source = emit_cuda(thread_kernel, target)
    assert "float" in source  # the accumulator registers
    assert compile_cuda(source, thread_kernel.name, target)[:4] == b"\x7fELF"
