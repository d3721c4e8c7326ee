"""Global atomic adds print through the catalogue's `red` entries (`arch.memory.RED_ADD`):
the helper's asm is the entry's `format_asm`, the statement names the entry's type, and
the compiled SASS holds a global reduction (or, for bf16 before sm_90 and scalar f16,
the compare-and-swap loop ptxas or the helper builds)."""
from __future__ import annotations

import re

import pytest

from tegula.arch.memory import RED_ADD
from tegula.codegen import CodegenError, emit_cuda
from tegula.dtypes import dtype_from_name, f8e4m3
from tegula.lower.thread_ir import (TID, Const, GlobalAtomicAdd, GlobalLoad, Reg, RegArray,
                                    TensorParam, ThreadKernel)
from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble


def red_kernel(dtype) -> ThreadKernel:
    r = RegArray("r", dtype, 1)
    return ThreadKernel(f"red_{dtype.name}", 64,
                        [TensorParam("x", dtype, 1), TensorParam("out", dtype, 1, True)], [r],
                        [], [GlobalLoad(Reg(r, Const(0)), "x", TID, 1),
                             GlobalAtomicAdd("out", TID % 7, Reg(r, Const(0)))])


@pytest.mark.parametrize("name", sorted(RED_ADD))
def test_atomic_add_prints_the_entry(name):
    source = emit_cuda(red_kernel(dtype_from_name(name)), "sm_90")
    assert RED_ADD[name].format_asm(addr="p", v="v") in source
    assert len(re.findall(r"red\.global\.add", source)) == 1


def test_a_type_without_an_entry_is_refused_by_name():
    with pytest.raises(CodegenError, match="no atomic add for f8e4m3 \\(tensor out\\).*"
                                           "red.global.add for f32, i32, f16, bf16"):
        emit_cuda(red_kernel(f8e4m3), "sm_90")


@pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler (NVRTC or nvcc)")
@pytest.mark.parametrize("target", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(RED_ADD))
def test_atomic_add_compiles_to_a_reduction(name, target):
    kernel = red_kernel(dtype_from_name(name))
    sass = disassemble(compile_cuda(emit_cuda(kernel, target), kernel.name, target))
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    assert re.search(r"\b(RED|REDG)\.E\.ADD|\bATOMG?\.E\.CAS", sass), sass
