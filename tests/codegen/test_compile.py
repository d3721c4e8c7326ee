"""Generated CUDA compiles for sm_80 and sm_90a with every compiler present, and its SASS
contains the instructions the thread IR asked for (a golden check of the emitter)."""
from __future__ import annotations

import re

import pytest

from tegula.arch import MMA_INSTRUCTIONS
from tegula.codegen import emit_cuda, mma_instr
from tegula.codegen.samples import (
    ALL_SAMPLES, cp_async_pipeline, mma_ldmatrix, shared_transpose, vector_copy,
    warp_sum_of_squares,
)
from tegula.dtypes import bf16, f16, f32, f8e4m3, f8e5m2, i8, i32, u8
from tegula.lower.thread_ir import (
    TID, Const, GlobalLoad, GlobalStore, LdMatrix, Mma, Reg, RegArray, SharedBuffer, Shuffle,
    TensorParam, ThreadKernel,
)
from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble

COMPILERS = available_compilers()
TARGETS = ("sm_80", "sm_90a")

pytestmark = pytest.mark.skipif(
    not COMPILERS, reason="neither NVRTC (cuda-bindings + nvidia-cuda-nvrtc) nor nvcc found")


def _compilers():
    """One pytest param per compiler kind, skipped (with the reason) where it is missing."""
    kinds = {c.kind: c for c in COMPILERS}
    return [pytest.param(kinds.get(k), id=k,
                         marks=pytest.mark.skipif(k not in kinds, reason=f"{k} not available"))
            for k in ("nvrtc", "nvcc")]


@pytest.mark.parametrize("compiler", _compilers())
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("sample", sorted(ALL_SAMPLES))
def test_sample_compiles(sample, target, compiler):
    kernel = ALL_SAMPLES[sample]()
    cubin = compile_cuda(emit_cuda(kernel, target), kernel.name, target, compiler=compiler)
    assert cubin[:4] == b"\x7fELF"  # a cubin is an ELF image, not PTX text


def _sass(kernel: ThreadKernel, target: str) -> str:
    text = disassemble(compile_cuda(emit_cuda(kernel, target), kernel.name, target))
    if text is None:
        pytest.skip("cuobjdump/nvdisasm not available (pip install nvidia-cuda-cuobjdump "
                    "nvidia-cuda-nvdisasm)")
    return text


def _no_local_memory(sass: str) -> None:
    """Register arrays must stay in registers: no local loads/stores (spills or arrays)."""
    assert not re.search(r"\b(LDL|STL)\b", sass), "register array fell back to local memory"


@pytest.mark.parametrize("target", TARGETS)
def test_sass_vector_copy_is_128_bit(target):
    sass = _sass(vector_copy(f16, 8), target)
    assert "LDG.E.128" in sass and "STG.E.128" in sass
    _no_local_memory(sass)


@pytest.mark.parametrize("target", TARGETS)
def test_sass_mma_ldmatrix(target):
    sass = _sass(mma_ldmatrix(f16), target)
    assert "HMMA.16816.F32" in sass
    assert "LDSM.16.M88.4" in sass and "LDSM.16.M88.2" in sass
    assert "LDG.E.128" in sass and "STS.128" in sass
    _no_local_memory(sass)


@pytest.mark.parametrize("target", TARGETS)
def test_sass_cp_async_and_shuffle(target):
    sass = _sass(cp_async_pipeline(), target)
    assert "LDGSTS.E.BYPASS.LTC128B.128" in sass or "LDGSTS.E.BYPASS.128" in sass
    assert "LDGDEPBAR" in sass and "DEPBAR" in sass
    assert "LDS.128" in sass
    _no_local_memory(sass)
    sass = _sass(warp_sum_of_squares(), target)
    assert "SHFL.BFLY" in sass and "RED" in sass
    _no_local_memory(sass)


@pytest.mark.parametrize("target", TARGETS)
def test_sass_transpose_barrier(target):
    sass = _sass(shared_transpose(), target)
    assert "BAR.SYNC" in sass and "STS" in sass and "LDS" in sass
    _no_local_memory(sass)


def _all_mma_kernel(names: list[str]) -> ThreadKernel:
    """One warp issuing every named mma once (operands uninitialized: compile-only)."""
    regs, body, params = [], [], []
    for n, name in enumerate(names):
        instr = mma_instr(name)
        dtypes = {"a": instr.a_dtype, "b": instr.b_dtype, "c": instr.c_dtype, "d": instr.d_dtype}
        arrays = {op: RegArray(f"{op}{n}", dtypes[op], instr.values(op)) for op in "abcd"}
        regs += arrays.values()
        operands = {op: [Reg(arr, Const(i)) for i in range(arr.size)] for op, arr in arrays.items()}
        body.append(Mma(name, **operands))
        # Keep the result alive (the mma asm is not volatile): store d's first element.
        params.append(TensorParam(f"out{n}", arrays["d"].dtype, 1, writes=True))
        body.append(GlobalStore(f"out{n}", TID, operands["d"][0], 1))
    return ThreadKernel("tg_all_mma", 32, params, regs, [], body)


@pytest.mark.parametrize("target", TARGETS)
def test_every_mma_of_the_catalogue_compiles(target):
    names = [i.name for i in MMA_INSTRUCTIONS if i.min_cc <= int(target[3:5])]
    kernel = _all_mma_kernel(names)
    sass = _sass(kernel, target)
    assert len(re.findall(r"\b[HIQ]MMA\.", sass)) >= len(names)


def _ldmatrix_shuffle_kernel() -> ThreadKernel:
    """Every ldmatrix shape (x1/x2/x4, plain and .trans) and shuffle mode, stored out."""
    buf = SharedBuffer("s", f16, 32 * 8 * 4, 0)
    regs = RegArray("m", f16, 8)
    f = RegArray("f", f32, 2)
    body = []  # every result goes to its own address, so none is dead code
    for num in (1, 2, 4):
        for trans in (False, True):
            slot = 2 * num + trans
            body.append(LdMatrix(Reg(regs, Const(0)), num, trans, "s", TID * 8))
            body.append(GlobalStore("out", TID * 8 + slot * 256, Reg(regs, Const(0)), 8))
    body.append(GlobalLoad(Reg(f, Const(0)), "x", TID, 1))
    for slot, (mode, arg) in enumerate((("xor", 1), ("idx", 0), ("down", 2), ("up", 3))):
        body.append(Shuffle(Reg(f, Const(1)), Reg(f, Const(0)), mode, Const(arg)))
        body.append(GlobalStore("y", TID + slot * 32, Reg(f, Const(1)), 1))
    return ThreadKernel("tg_ldsm_shfl", 32, [TensorParam("out", f16, 1, writes=True),
                                             TensorParam("x", f32, 1),
                                             TensorParam("y", f32, 1, writes=True)],
                        [regs, f], [buf], body)


@pytest.mark.parametrize("target", TARGETS)
def test_every_ldmatrix_and_shuffle_form(target):
    sass = _sass(_ldmatrix_shuffle_kernel(), target)
    for form in ("LDSM.16.M88 ", "LDSM.16.M88.2", "LDSM.16.M88.4", "LDSM.16.MT88 ",
                 "LDSM.16.MT88.2", "LDSM.16.MT88.4"):
        assert form in sass, form
    for mode in ("SHFL.BFLY", "SHFL.IDX", "SHFL.DOWN", "SHFL.UP"):
        assert mode in sass, mode
