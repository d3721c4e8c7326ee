"""`tg.bitcast` between 32-bit types keeps all 32 bits in the emitted CUDA.

Session 10 (found on the H100 by tests/idioms): the emitter's pairing of adjacent 16-bit
roundings into one 32-bit word (`ValuePrinter.store_pair`) also took two adjacent
elements of an i32 (or f32) register array written by a bitcast, and packed them as
16-bit halves — every element truncated to its low 16 bits, on the GPU only (the
emulator runs the thread IR, which is right). Only 16-bit arrays pair now."""
import re

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32, i32
from tegula.build import build
from tegula.codegen import emit_cuda


@tg.kernel(threads=32)
def f32_bits(x: tg.Tensor[f32], z: tg.Tensor[i32], BM: tg.constexpr = 4, BN: tg.constexpr = 8):
    m = tg.block_id(0)
    tg.copy(tg.bitcast(tg.load(x.tile((BM, BN), (m, 0))), i32), z.tile((BM, BN), (m, 0)))


@tg.kernel(threads=32)
def i32_as_f32(x: tg.Tensor[i32], z: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 8):
    m = tg.block_id(0)
    tg.copy(tg.bitcast(tg.load(x.tile((BM, BN), (m, 0))), f32), z.tile((BM, BN), (m, 0)))


@tg.kernel(threads=32)
def i32_as_halves(x: tg.Tensor[i32], z: tg.Tensor[f16, 3], BM: tg.constexpr = 4,
                  BN: tg.constexpr = 8):
    m = tg.block_id(0)
    halves = tg.bitcast(tg.load(x.tile((BM, BN), (m, 0))), f16)       # (BM, BN, 2)
    tg.copy(halves, z.tile((BM, BN, 2), (m, 0, 0)))


def _bitcast_lines(kernel, target):
    source = emit_cuda(build(kernel, {}, None, target).thread_kernel)
    start = source.index("// tile op: bitcast")
    return source[start:source.index("// tile op:", start + 1)]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("kernel", [f32_bits, i32_as_f32])
def test_a_32_bit_bitcast_assigns_whole_words(kernel, target):
    lines = _bitcast_lines(kernel, target)
    assert "<< 16" not in lines and "0xffff" not in lines and "unsigned short" not in lines, lines
    assert len(re.findall(r"r\d+\[\d+\] = ", lines)) == 4, lines


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_halves_of_a_word_still_split_in_16_bits(target):
    lines = _bitcast_lines(i32_as_halves, target)
    assert "unsigned short" in lines, lines


def test_the_emulator_agrees_with_numpy():
    x = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    z = np.zeros((8, 8), np.int32)
    tg.emulate(f32_bits, (2,), x, z)
    assert np.array_equal(z, x.view(np.int32))
