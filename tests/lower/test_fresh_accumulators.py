"""`lower/fresh_accumulators.py`: a wgmma product zeroed before another gemm's group and
its own gemm is cleared by its first wgmma (`scale_d` 0) and its zero writes dropped, only
where nothing between names those registers; everything else keeps its zeros."""
from __future__ import annotations

from tegula.dtypes import f32
from tegula.lower.async_ir import SmemDesc, Wgmma, WgmmaCommit, WgmmaFence
from tegula.lower.fresh_accumulators import clear_fresh_accumulators
from tegula.lower.thread_ir import (Assign, Binary, Comment, Const, For, Literal, Reg,
                                    RegArray, RegRead, Var)

P, Q, ACC = RegArray("p", f32, 4), RegArray("q", f32, 4), RegArray("acc", f32, 4)
INSTR = "wgmma.m64n8k32.f32.e4m3.e4m3"


def zeros(arr):
    return [Assign(Reg(arr, Const(i)), Literal(0.0, f32)) for i in range(arr.size)]


def wgmma(arr, scale=1):
    desc = SmemDesc("s", Const(0), 16, 1024, 128)
    return Wgmma(INSTR, [Reg(arr, Const(i)) for i in range(arr.size)], desc, desc,
                 scale_d=Const(scale))


def promote(arr):
    return [Assign(Reg(ACC, Const(i)), Binary("add", RegRead(Reg(ACC, Const(i))),
                                              RegRead(Reg(arr, Const(i))), f32))
            for i in range(arr.size)]


def scales(stmts):
    return [s.scale_d.value for s in stmts if isinstance(s, Wgmma)]


def zero_writes(stmts, arr):
    return [s for s in stmts if isinstance(s, Assign) and s.dst.array is arr]


def test_the_second_of_two_fresh_products_is_cleared_by_its_first_wgmma():
    """P's group is committed between Q's zeros and Q's gemm: Q is cleared by scale_d 0.
    P, a lone fresh product when issued, keeps its zeros (ptxas folds those itself)."""
    body = zeros(P) + zeros(Q) + [Comment("gemm"), WgmmaFence(), wgmma(P), wgmma(P),
                                  WgmmaCommit(), WgmmaFence(), wgmma(Q), wgmma(Q),
                                  WgmmaCommit()] + promote(P) + promote(Q)
    out = clear_fresh_accumulators([For(Var("k"), Const(0), Var("n"), 1, body)])[0].body
    assert scales(out) == [1, 1, 0, 1]         # Q's second k-step accumulates
    assert len(zero_writes(out, P)) == P.size and not zero_writes(out, Q)


def test_a_lone_fresh_product_keeps_its_zeros():
    out = clear_fresh_accumulators(zeros(P) + [WgmmaFence(), wgmma(P), WgmmaCommit()])
    assert scales(out) == [1] and len(zero_writes(out, P)) == P.size


def test_a_read_between_keeps_the_zeros():
    body = zeros(P) + [WgmmaFence(), wgmma(Q), WgmmaCommit()] + promote(P) + \
        [WgmmaFence(), wgmma(P), WgmmaCommit()]
    out = clear_fresh_accumulators(body)
    assert scales(out) == [1, 1]
    assert len(zero_writes(out, P)) == P.size


def test_a_loop_between_zeros_and_wgmma_keeps_them():
    """The K loop's accumulator: zeroed before the loop, accumulated inside it."""
    loop = For(Var("k"), Const(0), Var("n"), 1, [WgmmaFence(), wgmma(P), WgmmaCommit()])
    out = clear_fresh_accumulators(zeros(P) + [loop])
    assert scales(out[-1].body) == [1]
    assert len(zero_writes(out, P)) == P.size


def test_a_partly_fresh_product_keeps_its_zeros():
    body = zeros(P)[:2] + [WgmmaFence(), wgmma(Q), WgmmaCommit(), WgmmaFence(), wgmma(P),
                           WgmmaCommit()]
    out = clear_fresh_accumulators(body)
    assert scales(out) == [1, 1] and len(zero_writes(out, P)) == 2
