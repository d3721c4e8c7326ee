"""The CUDA emitter's text, names, parameter list and error reports (no compiler needed)."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tegula.codegen import CodegenError, emit_cuda, mma_instr, param_list
from tegula.codegen.expr import element_bits, element_value, float_literal, index_c
from tegula.codegen.samples import ALL_SAMPLES, mma_ldmatrix, vector_copy
from tegula.dtypes import bf16, f16, f32, f8e4m3, f8e5m2, i8
from tegula.lower.thread_ir import (
    TID, BinOp, Const, GlobalLoad, GlobalStore, Mma, Reg, RegArray, ScalarParam, Select,
    SharedBuffer, Shuffle, TensorParam, ThreadKernel, Var,
)


def test_index_printing_follows_c_precedence():
    a, b, c = Var("a"), Var("b"), Var("c")
    assert index_c((a + b) * c) == "(a + b) * c"
    assert index_c(a + b * c) == "a + b * c"
    assert index_c(a - (b - c)) == "a - (b - c)"
    assert index_c((a - b) - c) == "a - b - c"
    assert index_c(a // (b * c)) == "a / (b * c)"
    assert index_c((a % 8).lt(b).logical_and(c.ge(0))) == "a % 8 < b && c >= 0"
    assert index_c(BinOp("min", a, b + 1)) == "min(a, b + 1)"
    assert index_c(Select(a.lt(b), a, Const(-1))) == "(a < b ? a : (-1))"
    assert index_c(Const(1 << 40)) == f"{1 << 40}LL"


@pytest.mark.parametrize("value", [0.0, 1.0, -2.5, 3.14159, 1e-6, 65504.0, 1e5, -0.0])
def test_f16_bits_match_numpy(value):
    with np.errstate(over="ignore"):
        expected = int(np.array(value, np.float16).view(np.uint16))
    assert element_bits(value, f16) == expected


def test_special_bit_patterns():
    assert element_bits(1.0, bf16) == 0x3F80
    assert element_bits(1.0 + 2**-8, bf16) == 0x3F80  # tie rounds to even
    assert element_bits(1.0 + 3 * 2**-9, bf16) == 0x3F81
    assert element_bits(1.0, f8e4m3) == 0x38
    assert element_bits(448.0, f8e4m3) == 0x7E
    assert element_bits(1e9, f8e4m3) == 0x7E  # satfinite
    assert element_bits(-math.inf, f8e4m3) == 0xFE
    assert element_bits(1.0, f8e5m2) == 0x3C
    assert element_bits(2**-9, f8e4m3) == 0x01  # smallest subnormal
    assert element_bits(-1, i8) == 0xFF
    assert element_value(0.1, f16) == float(np.float16(0.1))
    assert float_literal(-math.inf) == "__int_as_float(0xff800000)"
    assert float_literal(2.0) == "2.0f"


def test_param_list_is_the_declared_signature():
    kernel = ThreadKernel("k", 32, [TensorParam("x", f16, 2), ScalarParam("alpha", f32),
                                    ScalarParam("n", i8), TensorParam("y", f32, 1, writes=True)],
                          [], [], [])
    specs = param_list(kernel)
    assert [s.name for s in specs] == ["x", "x_shape0", "x_shape1", "x_stride0", "x_stride1",
                                       "alpha", "n", "y", "y_shape0", "y_stride0"]
    assert [s.fmt for s in specs] == ["Q", "i", "i", "q", "q", "f", "i", "Q", "i", "q"]
    src = emit_cuda(kernel)
    for s in specs:
        assert s.declaration in src
    assert "const unsigned short* __restrict__ x" in src
    assert "float* y" in src


def test_source_shape():
    src = emit_cuda(vector_copy(f16, 8, threads=128))
    assert src.count('extern "C" __global__') == 1
    assert "__launch_bounds__(128)" in src
    assert "#include" not in src
    assert "// tile op: copy(x, y)" in src
    assert "one 16-byte access" in src
    src = emit_cuda(mma_ldmatrix())
    assert "extern __shared__ __align__(128) unsigned char smem[];" in src
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src


def test_unrolled_loops_get_pragma():
    src = emit_cuda(ALL_SAMPLES["shared_transpose"]())
    assert "#pragma unroll\n" in src
    assert "__syncthreads();" in src


def test_mma_names_resolve_to_catalogue_entries():
    """The emitter has no MMA table of its own: every spelling resolves to the entry."""
    from tegula.arch import MMA_INSTRUCTIONS, get_mma
    for entry in MMA_INSTRUCTIONS:
        assert mma_instr(entry.name) is entry
    instr = mma_instr("mma.m16n8k16.f32.f16.f16.f32")
    assert [instr.registers(g) for g in "abcd"] == [4, 2, 4, 4]
    assert mma_instr("mma.m16n8k16.f16.f16.f16.f16").registers("d") == 2
    assert mma_instr("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32") is \
        get_mma("mma.m16n8k32.f32.e4m3.e4m3.f32")
    assert mma_instr("mma.m16n8k32.i32.i8.u8.i32").min_cc == 80  # dtype-name spelling
    with pytest.raises(CodegenError, match="no mma.sync .* in the instruction catalogue"):
        mma_instr("mma.m16n8k16.f32.bf16.f16.f32")
    with pytest.raises(CodegenError, match="unknown operand type 'tf32'"):
        mma_instr("mma.m16n8k8.f32.tf32.tf32.f32")


def test_mma_asm_is_the_catalogue_template():
    """The printed mma statement is the entry's PTX template, operands numbered in order."""
    from tegula.codegen.samples import mma_ldmatrix
    src = emit_cuda(mma_ldmatrix(), "sm_80")
    text = mma_instr("mma.m16n8k16.f32.f16.f16.f32").asm_text()
    assert text == ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                    "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};")
    assert f'asm volatile("{text}\\n"' in src


def test_cp_async_and_ldmatrix_print_their_entries():
    """cp.async (predicated: src-size 0 and the tensor base where off), its commit/wait and
    ldmatrix are the entries' own format_asm, not a second copy of their PTX."""
    from tegula.arch import CP_ASYNC_COMMIT, cp_async, cp_async_asm, cp_async_wait, ldmatrix
    from tegula.codegen.samples import cp_async_pipeline, mma_ldmatrix
    src = emit_cuda(cp_async_pipeline(), "sm_80")
    assert CP_ASYNC_COMMIT.format_asm() in src and cp_async_wait(1).format_asm() in src
    copy = cp_async_asm(cp_async(16), "stage0_saddr + (unsigned)((tid + j * 128) / 8 * 64 + "
                        "(tid + j * 128) % 8 * 8) * 2u", "tg_p ? (x + ((tid + j * 128) / 8 * "
                        "x_stride0 + (tid + j * 128) % 8 * 8 * x_stride1)) : x", pred="tg_p")
    assert copy in src
    src = emit_cuda(mma_ldmatrix(), "sm_80")
    assert ldmatrix(4).format_asm(d=["tg_lm3", "tg_lm4", "tg_lm5", "tg_lm6"],
                                  addr="sa_saddr + (unsigned)(tid % 16 * 16 + tid / 16 * 8) * 2u"
                                  ) in src


def _one_stmt_kernel(stmt, regs, params=None, shared=()):
    params = params or [TensorParam("x", f16, 1), TensorParam("y", f16, 1, writes=True)]
    return ThreadKernel("k", 32, params, regs, list(shared), [stmt])


def test_shuffles_print_the_catalogue_entry():
    """Each thread-IR shuffle mode prints its catalogue entry's asm (PTX mode, clamp)."""
    from tegula.arch import shuffle
    r = RegArray("r", f32, 2)
    for mode, ptx_mode, clamp in (("xor", "bfly", "0x1f"), ("idx", "idx", "0x1f"),
                                  ("down", "down", "0x1f"), ("up", "up", "0x0")):
        src = emit_cuda(_one_stmt_kernel(Shuffle(Reg(r, Const(1)), Reg(r, Const(0)), mode,
                                                 Const(3)), [r]))
        line = next(x.strip() for x in src.splitlines() if "shfl.sync" in x)
        assert f"shfl.sync.{ptx_mode}.b32 %0, %1, %2, {clamp}, 0xffffffff;" in line
        temp = re.search(r'"=r"\((\w+)\)', line).group(1)
        assert line == shuffle(mode).format_asm(d=temp, a="__float_as_uint(r[0])",
                                                b="(int)(3)"), line
    with pytest.raises(CodegenError, match="unknown shuffle mode 'sideways'"):
        emit_cuda(_one_stmt_kernel(Shuffle(Reg(r, Const(1)), Reg(r, Const(0)), "sideways",
                                           Const(3)), [r]))


def test_errors_name_the_problem():
    r = RegArray("r", f16, 4)
    with pytest.raises(CodegenError, match="outside its 4 elements"):
        emit_cuda(_one_stmt_kernel(GlobalLoad(Reg(r, Const(0)), "x", TID, 8), [r]))
    with pytest.raises(CodegenError, match="not one access"):
        emit_cuda(_one_stmt_kernel(GlobalLoad(Reg(r, Const(0)), "x", TID, 3), [r]))
    with pytest.raises(CodegenError, match="read-only"):
        emit_cuda(_one_stmt_kernel(GlobalStore("x", TID, Reg(r, Const(0)), 4), [r]))
    with pytest.raises(CodegenError, match="no parameter"):
        emit_cuda(_one_stmt_kernel(GlobalLoad(Reg(r, Const(0)), "z", TID, 4), [r]))
    dup = RegArray("x", f16, 4)
    with pytest.raises(CodegenError, match="used twice"):
        emit_cuda(_one_stmt_kernel(GlobalLoad(Reg(dup, Const(0)), "x", TID, 4), [dup]))
    wide = RegArray("w", f32, 4)
    with pytest.raises(CodegenError, match="holds f32"):
        emit_cuda(_one_stmt_kernel(GlobalLoad(Reg(wide, Const(0)), "x", TID, 4), [wide]))


def test_mma_target_and_operand_checks():
    a, b, c = RegArray("a", f8e4m3, 16), RegArray("b", f8e4m3, 8), RegArray("c", f32, 4)
    regs = lambda arr: [Reg(arr, Const(i)) for i in range(arr.size)]  # noqa: E731
    mma = Mma("mma.m16n8k32.f32.e4m3.e4m3.f32", regs(c), regs(a), regs(b), regs(c))
    kernel = _one_stmt_kernel(mma, [a, b, c])
    assert "e4m3.e4m3.f32" in emit_cuda(kernel, "sm_90a")
    with pytest.raises(CodegenError, match="needs sm_89"):
        emit_cuda(kernel, "sm_80")
    bad = Mma("mma.m16n8k16.f32.f16.f16.f32", regs(c), regs(c), regs(c), regs(c))
    with pytest.raises(CodegenError, match="operand a has 4 registers"):
        emit_cuda(_one_stmt_kernel(bad, [c]))


def test_unknown_target():
    with pytest.raises(CodegenError, match="unknown target"):
        emit_cuda(vector_copy(), "gfx90a")


def test_catalogue_entries_have_emitters():
    """Every entry of the instruction catalogue (tegula.arch) has a printing rule here:
    mma entries print their own template; the other families map to statements."""
    catalogue = pytest.importorskip("tegula.arch.catalogue")
    printed_kinds = {"ld.global", "st.global", "ld.shared", "st.shared", "cp.async",
                     "cp.async.commit", "cp.async.wait", "ldmatrix", "shfl", "red.global", "cvt",
                     "half",  # 16-bit float arithmetic: helpers (tests/codegen/test_half_ops.py)
                     "minmax",  # float max/min helpers (tests/arch/test_minmax_entries.py)
                     "logic",  # lop3 of two chained bitwise ops (tests/codegen/test_lop3.py)
                     "sfu",  # tg.log2's helper (tests/arch/test_lg2_entry.py)
                     # tg.last_arrival's statement (tests/lang/test_last_arrival.py)
                     "atom.inc", "bar.red",
                     # async_stmts.py (tests/codegen/test_async_emit.py compiles each)
                     "wgmma", "tma.load", "tma.store", "bulk.commit", "bulk.wait",
                     "tma.reduce",  # TmaStore(reduce="add") (tests/lower/test_bulk_add.py)
                     "tma.prefetch",  # PrefetchTensorMap
                     "mbarrier.init", "mbarrier.arrive", "mbarrier.arrive_tx",
                     "mbarrier.wait", "fence.proxy_async", "fence.mbarrier_init",
                     "wgmma.fence", "wgmma.commit", "wgmma.wait", "bar.named", "setmaxnreg",
                     "mbarrier.arrive_remote", "cluster.arrive", "cluster.wait", "stmatrix"}
    # Lowering writes single-thread predicates instead of elect.sync (async_ir's
    # convention).
    no_statement_yet = {"elect"}
    for instr in catalogue.ALL_INSTRUCTIONS:
        if instr.kind == "mma":
            assert mma_instr(instr.name) is instr
        else:
            assert instr.kind in printed_kinds | no_statement_yet, instr.name


def test_let_binds_a_thread_constant():
    from tegula.lower.thread_ir import Let
    r = RegArray("r", f16, 8)
    base = Var("row_base")
    kernel = ThreadKernel("k", 32, [TensorParam("x", f16, 1)], [r], [],
                          [Let(base, TID * 8), GlobalLoad(Reg(r, Const(0)), "x", base, 8)])
    src = emit_cuda(kernel)
    assert "const int row_base = tid * 8;" in src
    assert "(x + (row_base))" in src
