"""wgmma in the emulator outside warp roles: A from registers (the entry's `a_tv`
fragment), B written to shared memory by ordinary stores and read through a descriptor —
so the generic-to-async proxy fence is what makes it right — and the accumulator stored
from the `acc_tv` fragment. Checked against numpy, then with one rule broken at a time."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.arch.smem_matrix import canonical_byte_addresses, operand_descriptor
from tegula.arch.wgmma import get_wgmma
from tegula.dtypes import f16, f32
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.emulate.exprs import compile_expr
from tegula.lower.async_ir import (FenceProxyAsync, Role, Roles, SmemDesc, Wgmma, WgmmaCommit,
                                   WgmmaFence, WgmmaWait)
from tegula.lower.thread_ir import (TID, Barrier, Const, For, GlobalLoad, GlobalStore, Reg,
                                    If, RegArray, SharedBuffer, SharedStore, TensorParam,
                                    ThreadKernel, Var, all_of)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_kernels import run_with_deadline  # noqa: E402

N, K = 16, 16
INSTR = get_wgmma(f"wgmma.m64n{N}k16.f32.f16.f16")


def _fragment_coords(v: Var, t=TID):
    """(row, col) of value v of thread t in the 64-row fragments (PTX ISA formulas)."""
    w, lane = (t % 128) // 32, t % 32
    row = w * 16 + lane // 4 + ((v // 2) % 2) * 8
    col = (lane % 4) * 2 + v % 2 + (v // 4) * 8
    return row, col


def _kernel(threads: int = 128, fence: bool = True, wait: bool = True,
            wgmma_fence: bool = True, wgmma_threads: int | None = None,
            barrier: bool = True, trans_b: int = 0, then=None) -> ThreadKernel:
    """c (M x N, M <= 64) = a (M x K) @ b (N x K)^T, one block. B lands in the canonical
    unswizzled K-major buffer: element (r, k) at the byte `canonical_byte_addresses` says.
    `then(acc, a_regs, b, p)`: statements issued right after the wgmma, before its commit
    and wait (`p`: a spare f16 array of 8 registers)."""
    a_regs, acc, bv = RegArray("a", f16, 8), RegArray("acc", f32, N // 2), RegArray("bv", f16, 1)
    spare = RegArray("p", f16, 8)
    sb = SharedBuffer("sb", f16, N * K, 0)
    desc = operand_descriptor(N, K, f16, 0, 0, k_major=not trans_b)
    v, i = Var("v"), Var("i")
    row, col = _fragment_coords(v)
    rows_in = row.lt(Var("a_shape0"))
    load_a = For(v, Const(0), Const(8), 1, [
        GlobalLoad(Reg(a_regs, v), "a", row * Var("a_stride0") + col, 1, pred=rows_in)],
        unroll=True)
    # Thread t stores elements t, t + threads, … of b (row-major) where the canonical
    # layout puts them: K-major (k // 8) * N * 8 + r * 8 + k % 8; MN-major (trans_b)
    # (r // 8) * K * 8 + k * 8 + r % 8.
    element = i * threads + TID
    br, bk = element // K, element % K
    place = ((br // 8) * K * 8 + bk * 8 + br % 8) if trans_b else \
        ((bk // 8) * N * 8 + br * 8 + bk % 8)
    store_b = For(i, Const(0), Const(N * K // threads), 1, [
        GlobalLoad(Reg(bv, Const(0)), "b", br * Var("b_stride0") + bk, 1),
        SharedStore("sb", place, Reg(bv, Const(0)), 1)])
    mma = [WgmmaFence()] if wgmma_fence else []
    mma += [Wgmma(INSTR.name, d=[Reg(acc, Const(x)) for x in range(N // 2)],
                  a=[Reg(a_regs, Const(x)) for x in range(8)],
                  b=SmemDesc("sb", Const(0), desc.leading_bytes, desc.stride_bytes, 0),
                  scale_d=Const(0), trans_b=trans_b)]
    if then is not None:
        mma += then(acc, a_regs, SmemDesc("sb", Const(0), desc.leading_bytes,
                                          desc.stride_bytes, 0), spare)
    mma += [WgmmaCommit()]
    mma += [WgmmaWait(0)] if wait else []
    if wgmma_threads is not None:
        mma = [If(TID.lt(wgmma_threads), mma)]
    out_row, out_col = _fragment_coords(v)
    store_c = For(v, Const(0), Const(N // 2), 1, [
        GlobalStore("c", out_row * Var("c_stride0") + out_col, Reg(acc, v), 1,
                    pred=all_of([out_row.lt(Var("c_shape0")), TID.lt(128)]))], unroll=True)
    body = [load_a, store_b] + ([FenceProxyAsync()] if fence else []) + \
        ([Barrier()] if barrier else []) + mma + [store_c]
    return ThreadKernel("wgmma_regs", threads,
                        [TensorParam("a", f16, 2), TensorParam("b", f16, 2),
                         TensorParam("c", f32, 2, writes=True)],
                        [a_regs, acc, bv, spare], [sb], body)


def _inputs(m: int = 50, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    return a, b, np.full((m, N), np.nan, dtype=np.float32)


def _run(kernel, a, b, c):
    return run_with_deadline(lambda: run_thread_kernel(kernel, 1, {"a": a, "b": b, "c": c}))


def test_the_kernel_stores_b_where_the_canonical_layout_says():
    r, k = np.meshgrid(np.arange(N), np.arange(K), indexing="ij")
    assert np.array_equal(canonical_byte_addresses(N, K, f16, 0, 0),
                          ((k // 8) * N * 8 + r * 8 + k % 8) * 2)
    assert np.array_equal(canonical_byte_addresses(N, K, f16, 0, 0, k_major=False),
                          ((r // 8) * K * 8 + k * 8 + r % 8) * 2)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("m", [64, 50, 1])
def test_wgmma_with_a_from_registers_matches_numpy(m, trans_b):
    a, b, c = _inputs(m, seed=m)
    report = _run(_kernel(trans_b=trans_b), a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.allclose(c, ref, rtol=1e-6, atol=1e-6) and not np.isnan(c).any()
    assert report.kind("Wgmma").count == 4


def test_the_fragments_are_the_catalogue_layouts():
    """The hand-written fragment formulas equal the entry's acc_tv and a_tv tables."""
    acc_table, a_table = INSTR.tables()
    t = np.arange(128)
    for table, values, rows in ((acc_table, N // 2, 64), (a_table, 8, 64)):
        for v in range(values):
            env = {"tid": t, "v": v}
            row, col = (np.asarray(compile_expr(x)(env)) for x in _fragment_coords(Var("v")))
            assert np.array_equal(table[:, v], row + rows * col)


def test_generic_writes_read_by_wgmma_need_the_proxy_fence():
    a, b, c = _inputs()
    with pytest.raises(EmulationError, match="no fence.proxy.async after the write"):
        _run(_kernel(fence=False), a, b, c)


def test_generic_writes_read_by_wgmma_need_a_barrier():
    """Each thread fenced its own stores, but the warpgroup reads all of them: without a
    barrier after the stores, other threads' writes may not have happened yet."""
    a, b, c = _inputs()
    with pytest.raises(EmulationError, match="wrote it with no barrier before this wgmma"):
        _run(_kernel(barrier=False), a, b, c)


def test_reading_the_accumulator_before_the_wait_is_reported():
    a, b, c = _inputs()
    with pytest.raises(EmulationError, match=r"register acc\[0\], an accumulator of Wgmma"):
        _run(_kernel(wait=False), a, b, c)


def test_first_wgmma_needs_a_fence():
    a, b, c = _inputs()
    with pytest.raises(EmulationError, match="no wgmma.fence"):
        _run(_kernel(wgmma_fence=False), a, b, c)


def test_wgmma_needs_whole_warpgroups():
    a, b, c = _inputs()
    with pytest.raises(EmulationError, match="not a multiple of 128"):
        _run(_kernel(threads=64), a, b, c)
    with pytest.raises(EmulationError, match="warpgroup 0 executes a warpgroup-collective "
                                             "instruction with only 64 of its 128 threads"):
        _run(_kernel(wgmma_threads=64), a, b, c)


def _again(instr=INSTR.name, d=lambda acc: [Reg(acc, Const(x)) for x in range(N // 2)],
           a=lambda a_regs, p: [Reg(a_regs, Const(x)) for x in range(8)]):
    """`then` for `_kernel`: a second wgmma (scale-d 1) with no wait after the first."""
    def then(acc, a_regs, b, p):
        return [Wgmma(instr, d=d(acc) if callable(d) else d(p), a=a(a_regs, p), b=b,
                      scale_d=Const(1))]
    return then


def test_a_second_wgmma_of_one_shape_into_the_busy_accumulator_needs_no_wait():
    """PTX (wgmma.fence): accumulator accesses across wgmmas of one shape are ordered."""
    a, b, c = _inputs()
    _run(_kernel(then=_again()), a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.allclose(c, 2 * ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["positions swapped", "another shape", "busy A"])
def test_a_wgmma_on_busy_registers_other_than_its_own_shape_is_reported(case):
    """Session 14 (G defers wgmma waits): a wgmma may accumulate into an in-flight wgmma's
    registers only with the same instruction and each register at its position."""
    swapped = lambda acc: [Reg(acc, Const(x ^ 1)) for x in range(N // 2)]  # noqa: E731
    narrow = lambda acc: [Reg(acc, Const(x)) for x in range(4)]            # noqa: E731
    then = {"positions swapped": _again(d=swapped),
            "another shape": _again("wgmma.m64n8k16.f32.f16.f16", d=narrow),
            # the first wgmma accumulates f16 into p; the second reads p as its A
            "busy A": lambda acc, a_regs, b, p: [
                Wgmma("wgmma.m64n16k16.f16.f16.f16", d=[Reg(p, Const(x)) for x in range(8)],
                      a=[Reg(a_regs, Const(x)) for x in range(8)], b=b, scale_d=Const(0)),
                Wgmma(INSTR.name, d=[Reg(acc, Const(x)) for x in range(N // 2)],
                      a=[Reg(p, Const(x)) for x in range(8)], b=b, scale_d=Const(1))]}[case]
    a, b, c = _inputs()
    match = r"register p\[0\], an accumulator" if case == "busy A" else \
        "PTX orders accumulator registers between in-flight wgmmas of one shape"
    with pytest.raises(EmulationError, match=match):
        _run(_kernel(then=then), a, b, c)


def _two_group_kernel() -> ThreadKernel:
    """Two warpgroups in a role (a third one idle, so the role's mask is not the whole
    block): warpgroup g multiplies A by its own B_g = b[g*N:(g+1)*N] (stored as two
    canonical blocks; its descriptor offset depends on the thread index) into columns
    g*N … of c. A is the same for both."""
    threads = 384
    a_regs, acc, bv = RegArray("a", f16, 8), RegArray("acc", f32, N // 2), RegArray("bv", f16, 1)
    sb = SharedBuffer("sb", f16, 2 * N * K, 0)
    desc = operand_descriptor(N, K, f16, 0, 0)
    v, group = Var("v"), TID // 128
    row, col = _fragment_coords(v)
    load_a = For(v, Const(0), Const(8), 1, [
        GlobalLoad(Reg(a_regs, v), "a", row * Var("a_stride0") + col, 1,
                   pred=row.lt(Var("a_shape0")))], unroll=True)
    # Thread t stores element t of each B_g (N x K = 256 elements) into block g.
    br, bk = TID // K, TID % K
    store_b = [s for g in range(2) for s in (
        GlobalLoad(Reg(bv, Const(0)), "b", (g * N + br) * Var("b_stride0") + bk, 1),
        SharedStore("sb", g * N * K + (bk // 8) * N * 8 + br * 8 + bk % 8, Reg(bv, Const(0)),
                    1))]
    mma = [WgmmaFence(),
           Wgmma(INSTR.name, d=[Reg(acc, Const(x)) for x in range(N // 2)],
                 a=[Reg(a_regs, Const(x)) for x in range(8)],
                 b=SmemDesc("sb", group * N * K, desc.leading_bytes, desc.stride_bytes, 0),
                 scale_d=Const(0)), WgmmaCommit(), WgmmaWait(0)]
    out_row, out_col = _fragment_coords(v)
    store_c = For(v, Const(0), Const(N // 2), 1, [
        GlobalStore("c", out_row * Var("c_stride0") + group * N + out_col, Reg(acc, v), 1,
                    pred=out_row.lt(Var("c_shape0")))], unroll=True)
    body = [load_a, If(TID.lt(256), store_b), FenceProxyAsync(), Barrier(),
            Roles([Role("consumers", TID.lt(256), [*mma, store_c]),
                   Role("idle", TID.ge(256), [])])]
    return ThreadKernel("wgmma_two_groups", threads,
                        [TensorParam("a", f16, 2), TensorParam("b", f16, 2),
                         TensorParam("c", f32, 2, writes=True)],
                        [a_regs, acc, bv], [sb], body)


def test_two_warpgroups_address_their_own_operands():
    rng = np.random.default_rng(8)
    a = rng.standard_normal((40, K)).astype(np.float16)
    b = rng.standard_normal((2 * N, K)).astype(np.float16)
    c = np.full((40, 2 * N), np.nan, dtype=np.float32)
    report = _run(_two_group_kernel(), a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.allclose(c, ref, rtol=1e-6, atol=1e-6) and not np.isnan(c).any()
    assert report.kind("Wgmma").count == 8
