"""Conversion and 16-bit float arithmetic entries (`arch.convert`): pure (plain `asm`, which
the compiler may schedule), their operands and minimum SM as the PTX ISA states them; the
emitter's helpers print them."""
from __future__ import annotations

import pytest

from tegula.arch.catalogue import get_instruction
import numpy as np

from tegula.arch.convert import CONVERT_INSTRUCTIONS, FLOAT_TO_INT, INT_TO_FLOAT, cvt
from tegula.codegen.ptx import prelude
from tegula.errors import TegulaError


def test_conversions_print_as_plain_asm():
    for instr in CONVERT_INSTRUCTIONS:
        assert instr.pure and instr.kind in ("cvt", "half")
        # f32 <-> s32 run at the special-function unit's rate; the others on the ALUs
        assert instr.pipe == ("sfu" if instr in (FLOAT_TO_INT, INT_TO_FLOAT) else "alu")
        assert get_instruction(instr.name) is instr
        text = instr.format_asm(**{o.name: "x" for o in instr.operands})
        assert text.startswith(f'asm("{instr.ptx} ') and "volatile" not in text
    assert get_instruction("ld.global.b32").format_asm(d="r", addr="p").startswith(
        "asm volatile(")


def test_min_cc_and_operands():
    assert cvt("cvt.rn.bf16.f32").min_cc == 80
    assert cvt("cvt.rn.satfinite.e4m3x2.f32").min_cc == 89
    assert [o.constraint for o in cvt("cvt.rn.satfinite.e5m2x2.f32").operands] == ["h", "f", "f"]
    assert [o.constraint for o in cvt("cvt.rn.f16x2.e4m3x2").operands] == ["r", "h"]
    with pytest.raises(TegulaError, match="no conversion 'cvt.rn.f32.f64'"):
        cvt("cvt.rn.f32.f64")
    assert cvt("sub.rn.f16").min_cc == 53 and cvt("mul.rn.bf16x2").min_cc == 90
    assert [o.constraint for o in cvt("add.rn.bf16").operands] == ["h", "h", "h"]
    assert [o.constraint for o in cvt("mul.rn.f16x2").operands] == ["r", "r", "r"]


def test_helpers_print_the_entries():
    names = {"tg_f16_to_f32", "tg_f32_to_f16", "tg_f32_to_bf16", "tg_f32_to_e4m3",
             "tg_f32_to_e5m2", "tg_e4m3_to_f32", "tg_e5m2_to_f32", "tg_f32x2_to_f16x2",
             "tg_f32x2_to_bf16x2", "tg_f32_to_i32", "tg_i32_to_f32"}
    source = prelude(names)
    for instr in CONVERT_INSTRUCTIONS:
        if instr.kind == "cvt":
            assert f'asm("{instr.ptx} ' in source, instr.name
    # the hardware f8 forms are guarded by the entries' min_cc
    assert source.count("__CUDA_ARCH__ >= 890") == 4
    assert source.count("__CUDA_ARCH__ >= 800") == 1  # the paired f16 form (sm_80 on)
    half = prelude({f"tg_{t}{x2}_{op}" for t in ("f16", "bf16") for x2 in ("", "x2")
                    for op in ("add", "sub", "mul")})
    for instr in CONVERT_INSTRUCTIONS:
        if instr.kind == "half":
            assert f'asm("{instr.ptx} ' in half, instr.name
    assert half.count("__CUDA_ARCH__ >= 530") == 6 and half.count("__CUDA_ARCH__ >= 900") == 6


def test_integer_conversions_state_what_they_compute():
    """f32 -> s32 toward zero, saturating, NaN -> 0 (PTX's default for float-to-integer);
    s32 -> f32 to nearest even (2^24 + 1 ties to 2^24, 2^24 + 3 to 2^24 + 4); a quarter of
    the FP32 rate: 16 a clock per SM."""
    assert FLOAT_TO_INT.asm_text() == "cvt.rzi.s32.f32 %0, %1;"
    assert INT_TO_FLOAT.asm_text() == "cvt.rn.f32.s32 %0, %1;"
    x = np.array([np.nan, np.inf, -np.inf, -2.7, 2.7, -0.5, 3e9, -3e9, 2147483520.0],
                 np.float32)
    assert FLOAT_TO_INT.convert(x).tolist() == [0, 2**31 - 1, -2**31, -2, 2, 0, 2**31 - 1,
                                                -2**31, 2147483520]
    ints = np.array([16777217, 16777219, -16777217, 2**31 - 1, -2**31, 7], np.int32)
    assert INT_TO_FLOAT.convert(ints).tolist() == [16777216.0, 16777220.0, -16777216.0,
                                                   2.0**31, -2.0**31, 7.0]
    from tegula.arch.targets import get_target
    for target in ("sm_80", "sm_90a"):
        assert 32 * FLOAT_TO_INT.throughput(get_target(target)) == 16
