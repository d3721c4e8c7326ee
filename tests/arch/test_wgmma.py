"""wgmma catalogue entries and shared-memory matrix addressing, checked on the CPU against
formulas re-derived here from the PTX ISA (not read from the entries)."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.arch import catalogue, get_instruction, get_target
from tegula.arch.instructions import template_groups, tv_table
from tegula.arch.smem_matrix import (MatrixDescriptor, byte_swizzle, canonical_byte_addresses,
                                     canonical_smem_layout, decode_descriptor,
                                     descriptor_element_addresses, encode_descriptor,
                                     operand_descriptor, swizzle_bytes_address)
from tegula.arch.tma import tma_box_addresses, tma_box_copy
from tegula.arch.wgmma import (WGMMA_INSTRUCTIONS, WGMMA_N, get_wgmma, wgmma_for)
from tegula.dtypes import bf16, f8e4m3, f8e5m2, f16, f32
from tegula.errors import TegulaError

SWIZZLES = (0, 32, 64, 128)


# ------------------------------------------------------------------ fragments (PTX ISA)

def _isa_acc(t: int, v: int) -> int:
    """wgmma D fragment: warp w rows 16w.., groupID/tig as in mma.m16n8, column block v//4."""
    w, lane = t // 32, t % 32
    g, tig = lane >> 2, lane % 4
    j, i = v // 4, v % 4
    row = 16 * w + g + 8 * (i >= 2)
    col = 8 * j + 2 * tig + (i & 1)
    return row + 64 * col


def _isa_a(t: int, v: int, bits: int) -> int:
    w, lane = t // 32, t % 32
    g, tig = lane >> 2, lane % 4
    if bits == 16:  # a0..a7: (g, 2tig+i&1), +8 rows for 2,3,6,7, +8 cols for 4..7
        row = 16 * w + g + 8 * ((v // 2) % 2)
        col = 2 * tig + (v & 1) + 8 * (v // 4)
    else:  # 8-bit, a0..a15: cols 4tig + (v&3), +8 rows for 4..7,12..15, +16 cols for 8..15
        row = 16 * w + g + 8 * ((v // 4) % 2)
        col = 4 * tig + (v & 3) + 16 * (v // 8)
    return row + 64 * col


@pytest.mark.parametrize("n", WGMMA_N)
def test_acc_fragment_is_the_isa_figure(n):
    instr = wgmma_for(f16, f16, f32, n)
    table = tv_table(instr.acc_tv, 128)
    want = np.array([[_isa_acc(t, v) for v in range(n // 2)] for t in range(128)])
    assert np.array_equal(table, want)
    assert sorted(table.ravel()) == list(range(64 * n))  # every D element exactly once


@pytest.mark.parametrize("a,b", [(f16, f16), (bf16, bf16), (f8e4m3, f8e5m2)])
def test_a_register_fragment_is_the_isa_figure(a, b):
    instr = wgmma_for(a, b, f32, 64)
    values = 8 if a.bits == 16 else 16
    table = tv_table(instr.a_tv, 128)
    want = np.array([[_isa_a(t, v, a.bits) for v in range(values)] for t in range(128)])
    assert np.array_equal(table, want)
    assert sorted(table.ravel()) == list(range(64 * instr.k))


def test_entries_shapes_registers_and_targets():
    assert len(WGMMA_INSTRUCTIONS) == 8 * 32  # 7 type combinations + f32 data as tf32
    sm80, sm90 = get_target("sm_80"), get_target("sm_90a")
    for i in WGMMA_INSTRUCTIONS:
        assert (i.m, i.k) == (64, 256 // i.a_dtype.bits)
        assert i.acc_regs == i.n // 2 * i.acc_dtype.bits // 32 and i.a_regs == 4
        assert template_groups(i.template) == {o.name for o in i.operands}
        assert i.name == f"wgmma.m64n{i.n}k{i.k}." + i.name.split(".", 2)[2]
        assert get_instruction(i.name) is i and get_wgmma(i.name) is i
        assert not i.available_on(sm80) and i.available_on(sm90) and i.pipe == "tensor"
    names = {x.name for x in catalogue("sm_90a")}
    assert "wgmma.m64n256k16.f32.bf16.bf16" in names
    assert not any(n.startswith("wgmma") for n in (x.name for x in catalogue("sm_80")))


def test_timing_reads_the_targets_wgmma_rate():
    h100 = get_target("h100")
    issue, latency = get_wgmma("wgmma.m64n256k16.f32.f16.f16").timing(h100)
    assert issue == 64 * 256 * 16 / 2048 and latency > issue
    issue8, _ = get_wgmma("wgmma.m64n256k32.f32.e4m3.e4m3").timing(h100)
    assert issue8 == issue  # twice the K at twice the rate
    assert get_wgmma("wgmma.m64n8k16.f32.f16.f16").timing(get_target("sm_80"))[0] == float("inf")


def test_lookups_refuse_what_does_not_exist():
    with pytest.raises(TegulaError, match="N=12"):
        wgmma_for(f16, f16, f32, 12)
    with pytest.raises(TegulaError, match="bf16 x bf16 into f16"):
        wgmma_for(bf16, bf16, f16, 64)
    with pytest.raises(TegulaError, match="no wgmma instruction"):
        get_wgmma("wgmma.m64n64k16.f32.f32.f32")


# ------------------------------------------------------------------ format_asm

def test_format_asm_shared_and_register_forms():
    i = get_wgmma("wgmma.m64n16k16.f32.f16.f16")
    d = [f"d{j}" for j in range(8)]
    ss = i.format_asm(d=d, a="da", b="db", scale_d="first", trans_b=1)
    assert ('{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 1; }' in ss)
    assert 'setp.ne.b32 p, %10, 0;' in ss and '"+f"(d7)' in ss and '"l"(da)' in ss
    assert '"r"((int)(first))' in ss
    rs = i.format_asm(d=d, a=["a0", "a1", "a2", "a3"], b="db", scale_d="1")
    assert '{%8, %9, %10, %11}, %12, p, 1, 1, 0; }' in rs  # no trans-a with A in registers
    h = get_wgmma("wgmma.m64n16k16.f16.f16.f16")
    assert '"+r"(d3)' in h.format_asm(d=d[:4], a="da", b="db", scale_d="1")
    f8 = get_wgmma("wgmma.m64n16k32.f32.e4m3.e5m2")
    assert 'p, 1, 1; }' in f8.format_asm(d=d, a="da", b="db", scale_d="1")


@pytest.mark.parametrize("kw,match", [
    (dict(d=["x"] * 7), "8 accumulator"),
    (dict(a=["a"] * 3), "4 registers"),
    (dict(trans_a=1, a=["a"] * 4), "cannot be transposed"),
    (dict(trans_b=2), "trans_b=2"),
])
def test_format_asm_refuses_bad_operands(kw, match):
    args = dict(d=["x"] * 8, a="da", b="db", scale_d="1")
    args.update(kw)
    with pytest.raises(TegulaError, match=match):
        get_wgmma("wgmma.m64n16k16.f32.f16.f16").format_asm(**args)
    with pytest.raises(TegulaError, match="only for f16/bf16"):
        get_wgmma("wgmma.m64n16k32.f32.e4m3.e4m3").format_asm(
            d=["x"] * 8, a="da", b="db", scale_d="1", trans_b=1)


# ------------------------------------------------------------------ semantics

def test_execute_is_a_times_b_transposed_plus_d_with_nan_and_inf():
    rng = np.random.default_rng(7)
    i = get_wgmma("wgmma.m64n24k16.f32.bf16.bf16")
    a = rng.normal(size=(64, 16)).astype(np.float32)
    b = rng.normal(size=(24, 16)).astype(np.float32)
    d = rng.normal(size=(64, 24)).astype(np.float32)
    a[3, 5], b[7, 2], a[10, 1], b[11, 1], d[20, 20] = np.nan, np.inf, 0.0, np.inf, -np.inf
    got = i.execute(d, a, b, 1)
    want = np.einsum("mk,nk->mn", a.astype(np.float64), b.astype(np.float64)) + d
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.isnan(got[3]).all() and np.isnan(got[10, 11])  # NaN row; Inf * 0 = NaN
    assert np.isinf(got[:, 7][~np.isnan(got[:, 7])]).all() and got[20, 20] == -np.inf
    # scale-d 0: D is not read at all (NaN there must not leak)
    cleared = i.execute(np.full((64, 24), np.nan), a, b, 0)
    with np.errstate(invalid="ignore"):
        want0 = (a.astype(np.float64) @ b.T).astype(np.float32)
    np.testing.assert_array_equal(cleared, want0)


def test_execute_rounds_once_to_the_accumulator_type():
    i = get_wgmma("wgmma.m64n8k16.f16.f16.f16")
    a = np.full((64, 16), 1.0)
    b = np.full((8, 16), 2.0 ** -11)  # each product below half an f16 ulp of 1
    got = i.execute(np.ones((64, 8)), a, b, 1)
    assert got.dtype == np.float16 and np.all(got == np.float16(1.0 + 16 * 2.0 ** -11))
    with pytest.raises(TegulaError, match=r"\(64, 16\)"):
        i.execute(None, np.ones((64, 8)), b, 0)


# ------------------------------------------------------------------ swizzles, descriptors

def _isa_swizzle(addr: np.ndarray, swizzle: int) -> np.ndarray:
    """PTX swizzle modes written out: the 16-byte chunk index within a 128-byte line XOR the
    line index within the repeating pattern (8 lines; 4 for 64 B, 2 for 32 B)."""
    if swizzle == 0:
        return addr
    lines = {32: 2, 64: 4, 128: 8}[swizzle]
    chunk = (addr >> 4) & (lines - 1)
    line = (addr >> 7) & (lines - 1)
    return (addr & ~((lines - 1) << 4)) | ((chunk ^ line) << 4)


@pytest.mark.parametrize("swizzle", SWIZZLES)
def test_swizzle_is_the_isa_pattern_and_cute_swizzle(swizzle):
    addr = np.arange(8192, dtype=np.int64)
    got = swizzle_bytes_address(addr, swizzle)
    assert np.array_equal(got, _isa_swizzle(addr, swizzle))
    assert np.array_equal(got, byte_swizzle(swizzle)(addr))
    assert sorted(got) == list(addr)


def test_descriptor_bits():
    value = encode_descriptor(0x400, 16, 1024, 128)
    assert value == 0x40 | (1 << 16) | (64 << 32) | (1 << 62)
    assert encode_descriptor(0x3FFF0, 0x3FFF0, 0x3FFF0, 32, 7) == (
        0x3FFF | 0x3FFF << 16 | 0x3FFF << 32 | 7 << 49 | 3 << 62)
    assert encode_descriptor(0, 0, 0, 64) == 2 << 62 and encode_descriptor(0, 0, 0, 0) == 0
    rng = np.random.default_rng(1)
    for _ in range(200):
        f = MatrixDescriptor(*(int(x) * 16 for x in rng.integers(0, 1 << 14, 3)),
                             swizzle=int(rng.choice(SWIZZLES)), base_offset=int(rng.integers(8)))
        assert decode_descriptor(f.encode()) == f
    for bad in (dict(start_address=8), dict(stride_bytes=1 << 18), dict(swizzle=16),
                dict(base_offset=8)):
        args = dict(start_address=0, leading_bytes=16, stride_bytes=16, swizzle=0)
        args.update(bad)
        with pytest.raises(TegulaError):
            encode_descriptor(**args)


@pytest.mark.parametrize("swizzle", SWIZZLES)
@pytest.mark.parametrize("dtype", [f16, f8e4m3])
@pytest.mark.parametrize("rows", [64, 24])
def test_layout_descriptor_and_tma_box_agree(swizzle, dtype, rows):
    """The canonical buffer (as a tegula layout and as bytes), what each wgmma k-step's
    descriptor reads, and where the TMA boxes that fill it write, are the same addresses;
    and a matrix written by TMA boxes comes back through the descriptors."""
    eb = dtype.bits // 8
    w = max(swizzle, 16) // eb
    k_instr = 32 // eb
    k = 2 * max(w, k_instr)
    base = 3 * 1024
    addr = canonical_byte_addresses(rows, k, dtype, swizzle, base)
    assert sorted(addr.ravel()) == list(range(base, base + rows * k * eb, eb))  # a bijection
    layout = canonical_smem_layout(rows, k, dtype, swizzle)
    from_layout = np.array([[layout((r, kk)) for kk in range(k)] for r in range(rows)])
    assert np.array_equal(base + from_layout * eb, addr)
    for s in range(k // k_instr):
        desc = operand_descriptor(rows, k, dtype, swizzle, base, s * k_instr)
        read = descriptor_element_addresses(desc.encode(), rows, k_instr, dtype)
        assert np.array_equal(read, addr[:, s * k_instr:(s + 1) * k_instr]), f"k-step {s}"
    rng = np.random.default_rng(rows + swizzle)
    matrix = rng.integers(1, 250, size=(rows, k))
    smem = np.zeros(base + rows * k * eb, dtype=np.int64)
    for blk in range(k // w):
        box_base = base + blk * rows * w * eb
        written = tma_box_addresses((w, rows), dtype, swizzle, box_base)
        assert np.array_equal(written, addr[:, blk * w:(blk + 1) * w])
        smem[written] = tma_box_copy(matrix, (blk * w, 0), (w, rows))
    for s in range(k // k_instr):
        desc = operand_descriptor(rows, k, dtype, swizzle, base, s * k_instr)
        read = descriptor_element_addresses(desc, rows, k_instr, dtype)
        assert np.array_equal(smem[read], matrix[:, s * k_instr:(s + 1) * k_instr])


def _isa_mn_major(desc: MatrixDescriptor, rows: int, k: int) -> np.ndarray:
    """16-bit MN-major addresses from CUTLASS's canonical forms written out (in 16-byte
    units T = 8 elements): INTERLEAVE ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)),
    B32/64/128 ((T,W,m),(8,k)):((1,T,LBO),(W*T,SBO)) with W = swizzle / 16."""
    out = np.zeros((rows, k), dtype=np.int64)
    for r in range(rows):
        for kk in range(k):
            if desc.swizzle == 0:
                a = (desc.start_address + (r // 8) * desc.stride_bytes + (r % 8) * 2
                     + (kk % 8) * 16 + (kk // 8) * desc.leading_bytes)
            else:
                w = desc.swizzle // 2  # elements per span
                a = (desc.start_address + (r // w) * desc.leading_bytes + (r % w) * 2
                     + (kk % 8) * desc.swizzle + (kk // 8) * desc.stride_bytes)
            out[r, kk] = _isa_swizzle(np.int64(a), desc.swizzle)
    return out


@pytest.mark.parametrize("swizzle", SWIZZLES)
def test_mn_major_layout_descriptor_and_tma_box_agree(swizzle):
    """MN-major (transposed, 16-bit) operands: the canonical buffer, the addresses each
    k-step's descriptor reads (also against CUTLASS's forms written out), and the TMA boxes
    (inner dim along MN) that fill it agree; a matrix written by boxes reads back."""
    w = max(swizzle, 16) // 2
    rows, k, base = 2 * max(w, 64), 48, 2048
    addr = canonical_byte_addresses(rows, k, f16, swizzle, base, k_major=False)
    assert sorted(addr.ravel()) == list(range(base, base + rows * k * 2, 2))
    layout = canonical_smem_layout(rows, k, f16, swizzle, k_major=False)
    from_layout = np.array([[layout((r, kk)) for kk in range(k)] for r in range(rows)])
    assert np.array_equal(base + from_layout * 2, addr)
    rng = np.random.default_rng(swizzle)
    matrix = rng.integers(1, 250, size=(rows, k))
    smem = np.zeros(base + rows * k * 2, dtype=np.int64)
    for blk in range(rows // w):  # global memory holds the operand transposed: (k, rows)
        written = tma_box_addresses((w, k), f16, swizzle, base + blk * k * w * 2)
        assert np.array_equal(written, addr[blk * w:(blk + 1) * w, :].T)
        smem[written] = tma_box_copy(matrix.T, (blk * w, 0), (w, k))
    for s in range(k // 16):
        desc = operand_descriptor(rows, k, f16, swizzle, base, 16 * s, k_major=False)
        read = descriptor_element_addresses(desc, rows, 16, f16, k_major=False)
        assert np.array_equal(read, addr[:, 16 * s:16 * s + 16]), f"k-step {s}"
        assert np.array_equal(read, _isa_mn_major(desc, rows, 16))
        assert np.array_equal(smem[read], matrix[:, 16 * s:16 * s + 16])


def test_descriptor_addressing_refuses_what_it_does_not_model():
    desc = MatrixDescriptor(0, 16, 1024, 128)
    with pytest.raises(TegulaError, match="MN-major"):
        descriptor_element_addresses(desc, 64, 32, f8e4m3, k_major=False)
    with pytest.raises(TegulaError, match="rows a multiple of 64 and K a multiple of 8"):
        canonical_smem_layout(32, 16, f16, 128, k_major=False)
    with pytest.raises(TegulaError, match="base offset"):
        descriptor_element_addresses(MatrixDescriptor(0, 16, 1024, 128, 1), 64, 16, f16)
    with pytest.raises(TegulaError, match="first 128-byte line"):
        descriptor_element_addresses(MatrixDescriptor(128, 16, 1024, 128), 64, 16, f16)
    with pytest.raises(TegulaError, match="exceed the 32-byte swizzle"):
        descriptor_element_addresses(MatrixDescriptor(0, 16, 256, 32), 64, 32, f16)
    with pytest.raises(TegulaError, match="rows a multiple of 8"):
        descriptor_element_addresses(desc, 60, 16, f16)
    with pytest.raises(TegulaError, match="aligned to the 1024-byte swizzle atom"):
        operand_descriptor(64, 64, f16, 128, 512)
    with pytest.raises(TegulaError, match="K a multiple of 64"):
        canonical_smem_layout(64, 32, f16, 128)
    with pytest.raises(TegulaError, match="multiple of 16"):
        operand_descriptor(64, 64, f16, 128, 0, k_offset=8)
