"""Warp-collective statements: mma.sync for every catalogue entry, ldmatrix, shuffles.

The kernels address memory with the PTX ISA fragment formulas written out here (not with
the catalogue's TV layouts), so these tests check the emulator + catalogue pair against an
independent transcription, element by element.
"""
from __future__ import annotations

import numpy as np
import pytest

from tegula.arch import MMA_INSTRUCTIONS
from tegula.dtypes import f16, f32, i32
from tegula.emulate import EmulationError, round_to, run_thread_kernel
from tegula.lower.thread_ir import (TID, Barrier, Const, For, GlobalLoad, GlobalStore, If, LdMatrix,
                                    Mma, Reg, RegArray, SharedBuffer, SharedStore, Shuffle,
                                    TensorParam, ThreadKernel, Var, Assign, Binary, RegRead)

RNG = np.random.default_rng(11)
LANE, WARP = TID % 32, TID // 32


# PTX fragment formulas; they work on ints and on thread-IR Exprs alike.
def frag_a(k, lane, i):
    g, t = lane // 4, lane % 4
    if k == 16:
        return g + (8 if i in (2, 3, 6, 7) else 0), t * 2 + (i % 2) + (8 if i >= 4 else 0)
    if k == 8:
        return g + (8 if i >= 2 else 0), t * 2 + (i % 2)
    return (g + (0 if (i < 4 or 8 <= i < 12) else 8), t * 4 + (i % 4) + (16 if i >= 8 else 0))


def frag_b(k, lane, i):  # -> (k index, n index)
    g, t = lane // 4, lane % 4
    if k == 16:
        return t * 2 + (i % 2) + (8 if i >= 2 else 0), g
    if k == 8:
        return t * 2 + i, g
    return t * 4 + (i % 4) + (16 if i >= 4 else 0), g


def frag_c(lane, i):
    g, t = lane // 4, lane % 4
    return g + (8 if i >= 2 else 0), t * 2 + (i % 2)


def mma_kernel(instr, warps: int = 2) -> ThreadKernel:
    """Warp w computes d[w] = a[w] @ b[w].T + c[w] with one mma, fragments loaded and stored
    element by element at the PTX formula addresses."""
    m, n, k = instr.shape_mnk
    ra = RegArray("a", instr.a_dtype, instr.a_values)
    rb = RegArray("b", instr.b_dtype, instr.b_values)
    rc = RegArray("c", instr.c_dtype, 4)
    rd = RegArray("d", instr.c_dtype, 4)

    def at(t, w, i, j):
        return w * Var(f"{t}_stride0") + i * Var(f"{t}_stride1") + j * Var(f"{t}_stride2")

    body = []
    for i in range(instr.a_values):
        row, col = frag_a(k, LANE, i)
        body.append(GlobalLoad(Reg(ra, Const(i)), "a", at("a", WARP, row, col), 1))
    for i in range(instr.b_values):
        kk, nn = frag_b(k, LANE, i)
        body.append(GlobalLoad(Reg(rb, Const(i)), "b", at("b", WARP, nn, kk), 1))
    for i in range(4):
        row, col = frag_c(LANE, i)
        body.append(GlobalLoad(Reg(rc, Const(i)), "c", at("c", WARP, row, col), 1))
    body.append(Mma(instr.name, d=[Reg(rd, Const(i)) for i in range(4)],
                    a=[Reg(ra, Const(i)) for i in range(instr.a_values)],
                    b=[Reg(rb, Const(i)) for i in range(instr.b_values)],
                    c=[Reg(rc, Const(i)) for i in range(4)]))
    for i in range(4):
        row, col = frag_c(LANE, i)
        body.append(GlobalStore("d", at("d", WARP, row, col), Reg(rd, Const(i)), 1))
    params = [TensorParam("a", instr.a_dtype, 3), TensorParam("b", instr.b_dtype, 3),
              TensorParam("c", instr.c_dtype, 3), TensorParam("d", instr.c_dtype, 3, True)]
    return ThreadKernel(f"mma_{instr.name}", 32 * warps, params, [ra, rb, rc, rd], [], body)


def _operand(dt, shape):
    """Random data exactly representable in `dt` (so every summation order agrees)."""
    if dt.is_int:
        lo, hi = (0, 255) if dt.kind == "uint" else (-128, 127)
        return RNG.integers(lo, hi + 1, size=shape).astype(dt.numpy_name)
    vals = RNG.integers(-8, 9, size=shape) / 4.0  # multiples of 1/4 up to 2: exact in f8 too
    arr = round_to(vals, dt)
    assert np.array_equal(arr.astype(np.float64), vals)
    return arr


@pytest.mark.parametrize("instr", MMA_INSTRUCTIONS, ids=lambda i: i.name)
def test_mma_every_element(instr):
    m, n, k = instr.shape_mnk
    w = 2
    a = _operand(instr.a_dtype, (w, m, k))
    b = _operand(instr.b_dtype, (w, n, k))
    c = _operand(instr.c_dtype, (w, m, n)) if instr.c_dtype.is_float else \
        RNG.integers(-1000, 1000, size=(w, m, n)).astype(np.int32)
    d = np.zeros_like(c)
    rep = run_thread_kernel(mma_kernel(instr, w), 1, {"a": a, "b": b, "c": c, "d": d})
    ref = np.einsum("wmk,wnk->wmn", a.astype(np.float64), b.astype(np.float64)) + c
    assert np.array_equal(d.astype(np.float64), ref), instr.name
    assert rep.kind("Mma").count == w


def test_mma_int32_wraparound_and_f16_accumulator_rounding():
    instr = next(i for i in MMA_INSTRUCTIONS if i.name == "mma.m16n8k32.s32.s8.s8.s32")
    a = np.full((1, 16, 32), 127, np.int8)
    b = np.full((1, 8, 32), 127, np.int8)
    c = np.full((1, 16, 8), 2**31 - 1000, np.int32)
    d = np.zeros_like(c)
    run_thread_kernel(mma_kernel(instr, 1), 1, {"a": a, "b": b, "c": c, "d": d})
    want = ((2**31 - 1000 + 127 * 127 * 32 + 2**31) % 2**32) - 2**31
    assert (d == want).all()
    h = next(i for i in MMA_INSTRUCTIONS if i.name == "mma.m16n8k16.f16.f16.f16.f16")
    a = round_to(RNG.standard_normal((1, 16, 16)), f16)
    b = round_to(RNG.standard_normal((1, 8, 16)), f16)
    c = round_to(RNG.standard_normal((1, 16, 8)), f16)
    d = np.zeros_like(c)
    run_thread_kernel(mma_kernel(h, 1), 1, {"a": a, "b": b, "c": c, "d": d})
    ref = np.einsum("wmk,wnk->wmn", a.astype(np.float64), b.astype(np.float64)) + c
    assert d.dtype == np.float16 and np.array_equal(d, ref.astype(np.float16))


def test_mma_needs_whole_warps():
    instr = MMA_INSTRUCTIONS[0]
    k = mma_kernel(instr, 1)
    mma = next(s for s in k.body if isinstance(s, Mma))
    k.body = [If(LANE.lt(16), [mma])]
    with pytest.raises(EmulationError, match="part of its lanes"):
        run_thread_kernel(k, 1, {"a": np.zeros((1, 16, 16), np.float16),
                                 "b": np.zeros((1, 8, 16), np.float16),
                                 "c": np.zeros((1, 16, 8), np.float32),
                                 "d": np.zeros((1, 16, 8), np.float32)})


# ---------------------------------------------------------------- ldmatrix

ROW = 24  # elements per padded shared row: 48 bytes, 16-byte aligned


def ldmatrix_kernel(num: int, trans: bool) -> ThreadKernel:
    size = num * 8 * ROW
    tmp, dst = RegArray("tmp", f16, 1), RegArray("frag", f16, 2 * num)
    i = Var("i")
    e = TID + i * 32
    body = [For(i, Const(0), Const(-(-size // 32)), 1, [
        If(e.lt(size), [GlobalLoad(Reg(tmp, Const(0)), "m", e, 1),
                        SharedStore("s", e, Reg(tmp, Const(0)), 1)])]),
            Barrier(),
            # lane 8j + r addresses row r of matrix j, i.e. padded row 8j + r
            LdMatrix(Reg(dst, Const(0)), num, trans, "s", (LANE % (8 * num)) * ROW)]
    body += [GlobalStore("o", TID * (2 * num) + v, Reg(dst, Const(v)), 1) for v in range(2 * num)]
    return ThreadKernel("ldm", 32, [TensorParam("m", f16, 2), TensorParam("o", f16, 2, True)],
                        [tmp, dst], [SharedBuffer("s", f16, size, 0)], body)


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_against_ptx(num, trans):
    m = round_to(RNG.standard_normal((num * 8, ROW)), f16)
    o = np.zeros((32, 2 * num), np.float16)
    rep = run_thread_kernel(ldmatrix_kernel(num, trans), 1, {"m": m, "o": o})
    for lane in range(32):
        for j in range(num):
            for v in range(2):
                # PTX: lane t gets row t/4, cols 2(t%4)+v; .trans swaps row and column
                r, c = (2 * (lane % 4) + v, lane // 4) if trans else (lane // 4, 2 * (lane % 4) + v)
                assert o[lane, 2 * j + v] == m[8 * j + r, c], (lane, j, v)
    st = rep.kind("LdMatrix")
    assert st.count == 1 and st.bytes == 128 * num
    # 48-byte rows: 8 rows of a matrix hit words 12r..12r+3 -> conflict-free
    assert st.wavefronts == num == st.ideal_wavefronts


# ---------------------------------------------------------------- shuffles

def shuffle_kernel(mode: str, arg) -> ThreadKernel:
    v, w = RegArray("v", f32, 1), RegArray("w", f32, 1)
    return ThreadKernel("shfl", 64, [TensorParam("x", f32, 1), TensorParam("y", f32, 1, True)],
                        [v, w], [],
                        [GlobalLoad(Reg(v, Const(0)), "x", TID, 1),
                         Shuffle(Reg(w, Const(0)), Reg(v, Const(0)), mode, arg),
                         GlobalStore("y", TID, Reg(w, Const(0)), 1)])


@pytest.mark.parametrize("mode,arg,src", [
    ("xor", 5, lambda l: l ^ 5),
    ("idx", 7, lambda l: np.full_like(l, 7)),
    ("down", 3, lambda l: np.where(l + 3 < 32, l + 3, l)),
    ("up", 3, lambda l: np.where(l - 3 >= 0, l - 3, l)),
])
def test_shuffle_modes(mode, arg, src):
    x = RNG.standard_normal(64).astype(np.float32)
    y = np.zeros(64, np.float32)
    run_thread_kernel(shuffle_kernel(mode, Const(arg)), 1, {"x": x, "y": y})
    lanes = np.arange(32)
    for w in range(2):
        assert np.array_equal(y[32 * w:32 * w + 32], x[32 * w + src(lanes)])


def test_shuffle_per_thread_index():
    x = RNG.standard_normal(64).astype(np.float32)
    y = np.zeros(64, np.float32)
    run_thread_kernel(shuffle_kernel("idx", (LANE * 3) % 32), 1, {"x": x, "y": y})
    lanes = np.arange(32)
    assert np.array_equal(y[32:], x[32 + (lanes * 3) % 32])


def test_warp_reduction():
    v, w = RegArray("v", f32, 1), RegArray("w", f32, 1)
    own, other = Reg(v, Const(0)), Reg(w, Const(0))
    body = [GlobalLoad(own, "x", TID, 1)]
    for off in (16, 8, 4, 2, 1):
        body += [Shuffle(other, own, "xor", Const(off)),
                 Assign(own, Binary("add", RegRead(own), RegRead(other), f32))]
    body.append(If((LANE).eq(0), [GlobalStore("y", WARP, own, 1)]))
    k = ThreadKernel("wsum", 128, [TensorParam("x", f32, 1), TensorParam("y", f32, 1, True)],
                     [v, w], [], body)
    x = RNG.integers(-100, 100, 128).astype(np.float32)
    y = np.zeros(4, np.float32)
    rep = run_thread_kernel(k, 1, {"x": x, "y": y})
    assert np.array_equal(y, x.reshape(4, 32).sum(1))
    assert rep.kind("Shuffle").count == 20


def test_int_shuffle_keeps_type():
    v, w = RegArray("v", i32, 1), RegArray("w", i32, 1)
    k = ThreadKernel("ishfl", 32, [TensorParam("x", i32, 1), TensorParam("y", i32, 1, True)],
                     [v, w], [], [GlobalLoad(Reg(v, Const(0)), "x", TID, 1),
                                  Shuffle(Reg(w, Const(0)), Reg(v, Const(0)), "xor", Const(1)),
                                  GlobalStore("y", TID, Reg(w, Const(0)), 1)])
    x = RNG.integers(-2**31, 2**31 - 1, 32).astype(np.int32)
    y = np.zeros(32, np.int32)
    run_thread_kernel(k, 1, {"x": x, "y": y})
    assert np.array_equal(y, x[np.arange(32) ^ 1])
