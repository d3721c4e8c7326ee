"""Conversion and 16-bit float arithmetic entries (`arch.convert`): pure (plain `asm`, which
the compiler may schedule), their operands and minimum SM as the PTX ISA states them; the
emitter's helpers print them."""
from __future__ import annotations

import pytest

from tegula.arch.catalogue import get_instruction
from tegula.arch.convert import CONVERT_INSTRUCTIONS, cvt
from tegula.codegen.ptx import prelude
from tegula.errors import TegulaError


def test_conversions_print_as_plain_asm():
    for instr in CONVERT_INSTRUCTIONS:
        assert instr.pure and instr.kind in ("cvt", "half") and instr.pipe == "alu"
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
             "tg_f32x2_to_bf16x2"}
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
