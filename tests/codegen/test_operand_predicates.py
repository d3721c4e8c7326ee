"""Operand predicates live on catalogue entries (issue 9 §1): the emitter and the emulator
ask the same entry whether it moves an operand, and refuse with its reason naming the
statement — before, the emitter printed an ldmatrix of 8-bit elements that the emulator
refused (the two checks had drifted)."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.arch.catalogue import ALL_INSTRUCTIONS, ldmatrix, vector_access
from tegula.arch.instructions import MatrixInstr, MemInstr
from tegula.codegen import emit_cuda
from tegula.codegen.expr import CodegenError
from tegula.dtypes import bf16, f16, f32, i8, u8
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.lower.thread_ir import (TID, Const, GlobalLoad, GlobalStore, LdMatrix, Reg, RegArray,
                                    SharedBuffer, TensorParam, ThreadKernel)


def _ldmatrix_of(dtype, reg_dtype=None) -> ThreadKernel:
    reg_dtype = reg_dtype or dtype
    frag = RegArray("frag", reg_dtype, 8)
    body = [LdMatrix(Reg(frag, Const(0)), 4, False, "s", (TID % 32) * 8),
            GlobalStore("o", TID, Reg(frag, Const(0)), 1)]
    return ThreadKernel("ldm", 32, [TensorParam("o", reg_dtype, 1, True)], [frag],
                        [SharedBuffer("s", dtype, 512, 0)], body)


@pytest.mark.parametrize("dtype,reg_dtype", [(i8, i8), (u8, u8), (f32, f32), (f16, i8)])
def test_emitter_and_emulator_refuse_the_same_ldmatrix(dtype, reg_dtype):
    kernel = _ldmatrix_of(dtype, reg_dtype)
    reason = "ldmatrix moves 16-bit elements"
    with pytest.raises(CodegenError, match=f"ldmatrix from s \\({dtype}\\).*{reason}"):
        emit_cuda(kernel, "sm_80")
    out = np.zeros(32, dtype={f32: np.float32, i8: np.int8, u8: np.uint8}[reg_dtype])
    with pytest.raises(EmulationError, match=f"ldmatrix from s \\({dtype}\\).*{reason}"):
        run_thread_kernel(kernel, 1, {"o": out})


@pytest.mark.parametrize("dtype", [f16, bf16])
def test_sixteen_bit_ldmatrix_is_accepted_by_both(dtype):
    kernel = _ldmatrix_of(dtype)
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in emit_cuda(kernel, "sm_80")


def test_entry_predicates():
    for instr in ALL_INSTRUCTIONS:
        if isinstance(instr, MatrixInstr):
            assert instr.accepts(16) and not instr.accepts(8) and not instr.accepts(32)
            assert "16-bit" in instr.operand_refusal(8)
        elif isinstance(instr, MemInstr) and instr.nbytes:
            n = instr.nbytes
            assert instr.accepts(8, n) and instr.accepts(8 * n)
            assert not instr.accepts(8, n + 1) and not instr.accepts(16, n)
    assert "16 bytes per thread" in vector_access("ld", "global", 16).operand_refusal(32, 3)
    assert ldmatrix(1, True).operand_refusal(16) is None


@pytest.mark.parametrize("count", [3, 5, 16])
def test_emitter_and_emulator_refuse_the_same_vector_width(count):
    """3 x f16 = 6 bytes, 5 x f16 = 10, 16 x f16 = 32: no ld/st entry moves them."""
    regs = RegArray("r", f16, 16)
    kernel = ThreadKernel("vec", 32, [TensorParam("x", f16, 1, True)], [regs], [],
                          [GlobalLoad(Reg(regs, Const(0)), "x", TID * count, count)])
    reason = (f"\\(f16\\): {count} x 16-bit elements are {count * 2} bytes, not one "
              f"access of 1, 2, 4, 8, 16 bytes")
    with pytest.raises(CodegenError, match=reason):
        emit_cuda(kernel, "sm_80")
    with pytest.raises(EmulationError, match=reason):
        run_thread_kernel(kernel, 1, {"x": np.ones(32 * count, np.float16)})
