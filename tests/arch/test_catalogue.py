"""The instruction catalogue against an independent transcription of the PTX ISA tables."""
from __future__ import annotations

import numpy as np
import pytest

from tegula import arch
from tegula.arch import get_mma, get_target, ldmatrix, mma_for, tv_table
from tegula.dtypes import bf16, f8e4m3, f8e5m2, f16, f32, i8, i32
from tegula.errors import TegulaError


# ------------------------------------------------------------ PTX fragment formulas
# Written from the PTX ISA "Matrix fragments for mma.m16n8k*" tables: (lane, i) -> (row, col)
# of A (M x K), B (K x N), C (M x N). groupID = lane >> 2, tig = lane % 4.

def ptx_a_k16(lane, i):
    g, t = lane >> 2, lane % 4
    row = g + (8 if i in (2, 3, 6, 7) else 0)
    col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def ptx_b_k16(lane, i):
    g, t = lane >> 2, lane % 4
    return t * 2 + (i & 1) + (8 if i >= 2 else 0), g  # (k, n)


def ptx_a_k8(lane, i):
    g, t = lane >> 2, lane % 4
    return g + (8 if i >= 2 else 0), t * 2 + (i & 1)


def ptx_b_k8(lane, i):
    g, t = lane >> 2, lane % 4
    return t * 2 + i, g


def ptx_a_k32(lane, i):
    g, t = lane >> 2, lane % 4
    row = g if (i < 4 or 8 <= i < 12) else g + 8
    col = t * 4 + (i & 3) + (16 if i >= 8 else 0)
    return row, col


def ptx_b_k32(lane, i):
    g, t = lane >> 2, lane % 4
    return t * 4 + (i & 3) + (16 if i >= 4 else 0), g


def ptx_c(lane, i):
    g, t = lane >> 2, lane % 4
    return g + (8 if i >= 2 else 0), t * 2 + (i & 1)


FORMULAS = {16: (ptx_a_k16, ptx_b_k16, 8, 4), 8: (ptx_a_k8, ptx_b_k8, 4, 2),
            32: (ptx_a_k32, ptx_b_k32, 16, 8)}


@pytest.mark.parametrize("instr", arch.MMA_INSTRUCTIONS, ids=lambda i: i.name)
def test_mma_tv_layouts_match_ptx_tables(instr):
    m, n, k = instr.shape_mnk
    fa, fb, na, nb = FORMULAS[k]
    a, b, c = instr.tables()
    assert a.shape == (32, na) and b.shape == (32, nb) and c.shape == (32, 4)
    for lane in range(32):
        for i in range(na):
            row, col = fa(lane, i)
            assert a[lane, i] == row + m * col, (lane, i)
            assert instr.a_tv(lane, i) == row + m * col
        for i in range(nb):
            kk, nn = fb(lane, i)
            assert b[lane, i] == nn + n * kk, (lane, i)
        for i in range(4):
            row, col = ptx_c(lane, i)
            assert c[lane, i] == row + m * col, (lane, i)
    # Each fragment covers its tile exactly once.
    for tab, size in ((a, m * k), (b, n * k), (c, m * n)):
        assert sorted(tab.ravel().tolist()) == list(range(size))


def test_mma_register_counts_and_asm():
    instr = get_mma("mma.m16n8k16.f32.f16.f16.f32")
    assert instr.ptx == "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    assert [o.count for o in instr.operands] == [4, 4, 2, 4]
    text = instr.format_asm(d=[f"d{i}" for i in range(4)], a=[f"a{i}" for i in range(4)],
                            b=["b0", "b1"], c=[f"c{i}" for i in range(4)])
    assert text.startswith('asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 '
                           '{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};')
    assert '"=f"(d0)' in text and '"r"(a3)' in text and '"f"(c3)' in text
    i8mma = get_mma("mma.m16n8k32.s32.s8.s8.s32")
    assert [o.count for o in i8mma.operands] == [4, 4, 2, 4]
    h = get_mma("mma.m16n8k16.f16.f16.f16.f16")
    assert [o.count for o in h.operands] == [2, 4, 2, 2]
    with pytest.raises(TegulaError):
        instr.format_asm(d=["x"], a=[], b=[], c=[])


def test_mma_for_and_targets():
    got = mma_for(f16, f16, f32, "sm_80")
    assert [i.shape_mnk for i in got] == [(16, 8, 16), (16, 8, 8)]
    assert mma_for(f8e4m3, f8e5m2, f32, "sm_80") == []
    assert [i.name for i in mma_for(f8e4m3, f8e5m2, f32, "sm_90a")] == \
        ["mma.m16n8k32.f32.e4m3.e5m2.f32"]
    assert mma_for(i8, i8, i32, "sm_89")[0].shape_mnk == (16, 8, 32)
    assert mma_for(bf16, bf16, f32, "h100")[0].name == "mma.m16n8k16.f32.bf16.bf16.f32"
    h100 = get_target("h100")
    assert h100.sm_count == 132 and h100.smem_per_block_max == 227 * 1024
    assert h100.gencode == "-gencode=arch=compute_90a,code=sm_90a"
    assert get_target("sm_80").smem_per_block_max == 163 * 1024
    issue, latency = get_mma("mma.m16n8k16.f32.f16.f16.f32").timing(get_target("sm_80"))
    assert issue == 8.0 and latency > issue
    with pytest.raises(TegulaError):
        get_target("sm_70")
    names = {i.name for i in arch.catalogue("sm_80")}
    assert "ldmatrix.x4" in names and "stmatrix.x4" not in names
    assert "stmatrix.x4" in {i.name for i in arch.catalogue("sm_90a")}


def ldmatrix_reference(lane, value, trans):
    """PTX ldmatrix: without .trans lane t gets row t/4, elements 2(t%4), 2(t%4)+1 of
    each matrix; .trans delivers the transposed matrix. Returns (matrix, row, col)."""
    j, v = value // 2, value % 2
    if trans:
        return j, 2 * (lane % 4) + v, lane // 4
    return j, lane // 4, 2 * (lane % 4) + v


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_tv(num, trans):
    instr = ldmatrix(num, trans)
    tab = instr.table()
    assert tab.shape == (32, 2 * num)
    for lane in range(32):
        for value in range(2 * num):
            j, r, c = ldmatrix_reference(lane, value, trans)
            assert tab[lane, value] == r + 8 * c + 64 * j
    assert sorted(tab.ravel().tolist()) == list(range(64 * num))
    assert instr.address_lanes == 8 * num and instr.align_bytes == 16
    st = arch.stmatrix(num, trans)
    assert st.min_cc == 90 and np.array_equal(st.table(), tab)


def test_memory_entries():
    v4 = arch.vector_access("ld", "global", 16)
    assert v4.name == "ld.global.v4.b32" and v4.align_bytes == 16 and v4.regs == 4
    text = v4.format_asm(d=["x0", "x1", "x2", "x3"], addr="p")
    assert "ld.global.v4.b32 {%0, %1, %2, %3}, [%4];" in text and '"l"(p)' in text
    ptext = v4.format_asm(d=["x0", "x1", "x2", "x3"], addr="p", pred="ok")
    assert "@p ld.global.v4.b32" in ptext and '"+r"(x0)' in ptext and '"r"((int)(ok))' in ptext
    st = arch.vector_access("st", "shared", 2)
    assert '"h"(v)' in st.format_asm(addr="a", s="v")
    assert arch.cp_async(16).name == "cp.async.cg.shared.global.16"
    assert arch.cp_async(4).name == "cp.async.ca.shared.global.4"
    with pytest.raises(TegulaError):
        arch.cp_async(8, "cg")
    cp = arch.cp_async_asm(arch.cp_async(16), "s", "g", pred="k < n")
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in cp and "? 16 : 0" in cp
    assert arch.get_instruction("cp.async.wait_group.1").template == "cp.async.wait_group 1;"
    sh = arch.shuffle("xor")
    assert sh.ptx == "shfl.sync.bfly.b32"
    lanes = np.arange(32)
    assert np.array_equal(sh.source_lane(lanes, 1), lanes ^ 1)
    down = arch.shuffle("down").source_lane(lanes, 4)
    assert down[27] == 31 and down[28] == 28
    up = arch.shuffle("up").source_lane(lanes, 2)
    assert up[1] == 1 and up[5] == 3


def test_tv_table_orientation():
    lay = arch.get_mma("mma.m16n8k8.f32.f16.f16.f32").b_tv
    tab = tv_table(lay)
    assert tab[5, 1] == lay(5, 1)


def test_describe_mma_svg():
    svg = arch.describe_mma("mma.m16n8k16.f32.f16.f16.f32")
    assert svg.startswith("<svg") and "T0V0" in svg


def test_cp_async_sizes_are_the_entries():
    """Synthesis, the emulator and the emitter ask `cp_async_sizes` which cp.async widths
    exist; the answer is read off the entries (.ca 4/8/16, .cg 16), and the entry for a
    width is the one the emitter prints (.cg for 16 bytes, .ca below)."""
    from tegula.arch import cp_async, cp_async_sizes
    for target in ("sm_80", "sm_89", "sm_90a", None):
        assert cp_async_sizes(target) == (4, 8, 16)
    assert [cp_async(n).cache for n in (4, 8, 16)] == ["ca", "ca", "cg"]
    assert all(cp_async(n).nbytes == n == cp_async(n).align_bytes for n in (4, 8, 16))


def test_mma_execute_is_the_ptx_fragment_semantics():
    """`MmaInstr.execute` (what the emulator runs) against the PTX ISA's m16n8k16 fragment
    formulas written out independently: groupID g = lane >> 2, tig t = lane % 4."""
    import numpy as np

    from tegula.arch import get_mma
    rng = np.random.default_rng(5)
    A, B, C = rng.normal(size=(16, 16)), rng.normal(size=(8, 16)), rng.normal(size=(16, 8))
    a = np.zeros((1, 32, 8)); b = np.zeros((1, 32, 4)); c = np.zeros((1, 32, 4))
    want = np.zeros((1, 32, 4))
    D = A @ B.T + C
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            a[0, lane, i] = A[g + 8 * ((i // 2) % 2), 2 * t + i % 2 + 8 * (i // 4)]
        for i in range(4):
            b[0, lane, i] = B[g, 2 * t + i % 2 + 8 * (i // 2)]
            c[0, lane, i] = C[g + 8 * (i // 2), 2 * t + i % 2]
            want[0, lane, i] = D[g + 8 * (i // 2), 2 * t + i % 2]
    got = get_mma("mma.m16n8k16.f32.f16.f16.f32").execute(a, b, c)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_ldmatrix_load_is_the_ptx_fragment_semantics():
    """`MatrixInstr.load` against the PTX ISA: without .trans lane t gets (row t/4, cols
    2(t%4), 2(t%4)+1) of each matrix; with .trans (rows 2(t%4), 2(t%4)+1, col t/4)."""
    import numpy as np

    from tegula.arch import ldmatrix
    rng = np.random.default_rng(6)
    for num in (1, 2, 4):
        rows = rng.integers(0, 2 ** 16, size=(2, num, 8, 8), dtype=np.uint16)
        for trans in (False, True):
            got = ldmatrix(num, trans).load(rows)
            for w in range(2):
                for lane in range(32):
                    for j in range(num):
                        for v in range(2):
                            r, col = (2 * (lane % 4) + v, lane // 4) if trans else \
                                (lane // 4, 2 * (lane % 4) + v)
                            assert got[w, lane, 2 * j + v] == rows[w, j, r, col]
