"""Operand fences name only their own wgmma accumulators (`codegen/wgmma_fences.py`).

A fence before `wgmma.fence` names the accumulators of the wgmmas it opens; a fence after
`wgmma.wait_group` those of every wgmma that may still be in flight there. Naming every
accumulator of the kernel at every fence (codegen before session 12) kept each one alive
at each fence; these tests pin the lists on hand-made thread IR (groups, waits with groups
pending, loops, branches, roles) and on the emitted CUDA of library kernels."""
from __future__ import annotations

import re

import pytest

from tegula.build import build
from tegula.codegen import emit_cuda
from tegula.codegen.wgmma_fences import fenced_accumulators
from tegula.dtypes import f16, f32
from tegula.lower.async_ir import (Role, Roles, SmemDesc, Wgmma, WgmmaCommit, WgmmaFence,
                                   WgmmaWait)
from tegula.lower.thread_ir import TID, Assign, Const, For, If, Literal, Reg, RegArray, Var

S, O, T = RegArray("s", f32, 32), RegArray("o", f32, 32), RegArray("t", f32, 32)
DESC = SmemDesc("tile", Const(0), leading_bytes=16, stride_bytes=1024, swizzle=128)


def _gemm(acc: RegArray) -> list:
    """fence, one m64n64k16 wgmma into `acc`, commit."""
    return [WgmmaFence(),
            Wgmma("wgmma.m64n64k16.f32.f16.f16", [Reg(acc, Const(i)) for i in range(32)],
                  DESC, DESC, Const(1)),
            WgmmaCommit()]


def _write(acc: RegArray) -> Assign:
    return Assign(Reg(acc, Const(0)), Literal(0.0, f32))


def _names(fenced: dict, stmt) -> list[str]:
    return [a.name for a in fenced[id(stmt)]]


def test_each_fence_names_its_own_group():
    s_gemm, o_gemm = _gemm(S), _gemm(O)
    wait_s, wait_o = WgmmaWait(0), WgmmaWait(0)
    body = [*s_gemm, wait_s, _write(S), *o_gemm, wait_o]
    fenced = fenced_accumulators(body)
    assert _names(fenced, s_gemm[0]) == ["s"]
    assert _names(fenced, o_gemm[0]) == ["o"]        # s is not in flight, nor opened here
    assert _names(fenced, wait_s) == ["s"]
    assert _names(fenced, wait_o) == ["o"]


def test_a_wait_with_groups_pending_names_every_group_in_flight():
    s_gemm, o_gemm = _gemm(S), _gemm(O)
    wait_one, wait_all, after = WgmmaWait(1), WgmmaWait(0), WgmmaWait(0)
    body = [*s_gemm, *o_gemm, wait_one, _write(S), wait_all, after]
    fenced = fenced_accumulators(body)
    assert _names(fenced, o_gemm[0]) == ["o"]        # s in flight, but not this group's
    assert _names(fenced, wait_one) == ["s", "o"]
    assert _names(fenced, wait_all) == ["s", "o"]    # wait(1) retires nothing it can prove
    assert _names(fenced, after) == []               # nothing left in flight: no fence


def test_groups_in_flight_across_the_back_edge():
    # FlashAttention-3's order: o's group is still in flight at the top of the next
    # iteration, where s's wait(1) fence must name it; t (used only before the loop) never.
    t_gemm, s_gemm, o_gemm = _gemm(T), _gemm(S), _gemm(O)
    wait_t, wait_s, wait_end = WgmmaWait(0), WgmmaWait(1), WgmmaWait(0)
    loop = For(Var("j"), Const(0), Var("n"), 1,
               [*s_gemm, wait_s, _write(S), *o_gemm])
    body = [*t_gemm, wait_t, loop, wait_end]
    fenced = fenced_accumulators(body)
    assert _names(fenced, wait_t) == ["t"]
    assert _names(fenced, wait_s) == ["s", "o"]
    assert _names(fenced, s_gemm[0]) == ["s"] and _names(fenced, o_gemm[0]) == ["o"]
    assert _names(fenced, wait_end) == ["s", "o"]


def test_branches_join_and_roles_start_from_what_is_in_flight():
    s_gemm, o_gemm = _gemm(S), _gemm(O)
    wait_role, wait_join = WgmmaWait(0), WgmmaWait(0)
    branch = If(Var("c").lt(1), [*o_gemm], [])
    roles = Roles([Role("producer", TID.ge(128), []),
                   Role("consumer", TID.lt(128), [wait_role])])
    body = [*s_gemm, branch, WgmmaWait(1), roles]
    fenced = fenced_accumulators(body)
    assert _names(fenced, wait_role) == ["s", "o"]   # o from one side of the branch
    fenced = fenced_accumulators([*s_gemm, branch, wait_join])
    assert _names(fenced, wait_join) == ["s", "o"]


def test_a_fence_without_its_commit_names_every_accumulator():
    # The group's wgmmas continue past this statement list: the fence cannot know them.
    s_gemm, o_gemm = _gemm(S), _gemm(O)
    fence = WgmmaFence()
    body = [*s_gemm, WgmmaWait(0), If(Var("c").lt(1), [fence, *o_gemm[1:2]]), o_gemm[2]]
    assert _names(fenced_accumulators(body), fence) == ["s", "o"]


_ASM_ACCUMULATORS = re.compile(r'"\+[fr]"\((?:\*reinterpret_cast<unsigned\*>\(&)?(\w+)\[')


def _fence_lists(source: str) -> list[tuple[str, set, set]]:
    """Per `wgmma.fence` / `wgmma.wait_group` line: (which, the arrays its operand fence
    names, the accumulator arrays of the wgmmas after it up to the commit)."""
    lines = source.splitlines()
    found = []
    for i, line in enumerate(lines):
        if "wgmma.fence.sync" in line:
            j, named = i - 1, set()
            while lines[j].strip().startswith('asm volatile("" :'):
                named |= set(_ASM_ACCUMULATORS.findall(lines[j]))
                j -= 1
            opened = set()
            for later in lines[i + 1:]:
                if "wgmma.commit_group" in later:
                    break
                if "wgmma.mma_async" in later:
                    opened |= {_ASM_ACCUMULATORS.findall(later)[0]}
            found.append(("fence", named, opened))
        elif "wgmma.wait_group" in line:
            j, named = i + 2, set()
            while j < len(lines) and lines[j].strip().startswith('asm volatile("" :'):
                named |= set(_ASM_ACCUMULATORS.findall(lines[j]))
                j += 1
            found.append(("wait", named, set()))
    return found


@pytest.mark.parametrize("constexprs", [
    dict(D=64, BM=64, BN=64),
    dict(D=128, BM=128, BN=128, threads=256, OVERLAP=True),
])
def test_attention_forward_fences_name_only_their_gemms(constexprs):
    from tegula.kernels.attention import attention_kernel, qk_scale
    c = dict(constexprs, QK_SCALE=qk_scale(None, constexprs["D"]))
    built = build(attention_kernel(f16), c, target="sm_90a")
    every = {r.array.name for st in _walk(built.thread_kernel.body) if isinstance(st, Wgmma)
             for r in st.d}
    assert len(every) == 2                            # the scores and the output
    lists = _fence_lists(built.cuda_source())
    fences = [(named, opened) for kind, named, opened in lists if kind == "fence"]
    assert fences and all(named == opened and len(named) == 1 for named, opened in fences)
    waits = [named for kind, named, _ in lists if kind == "wait"]
    assert waits and all(named and named <= every for named in waits)
    if constexprs.get("OVERLAP"):   # the loop's wait(1): s_{j+1} and p_j @ v_j in flight
        assert every in waits


def test_backward_fences_leave_finished_products_out():
    # The backward's dK/dV kernel has five gemms per key block: each fence before a
    # wgmma.fence names exactly the accumulators its gemm's wgmmas write.
    from tegula.kernels.attention_backward import attention_backward_dkdv_kernel
    from tegula.kernels.attention import qk_scale
    built = build(attention_backward_dkdv_kernel(f16),
                  dict(D=64, SCALE=qk_scale(None, 64), CAUSAL=False), target="sm_90a")
    lists = _fence_lists(emit_cuda(built.thread_kernel, "sm_90a"))
    fences = [(named, opened) for kind, named, opened in lists if kind == "fence"]
    assert len(fences) >= 4 and all(named == opened for named, opened in fences)
    every = set().union(*(opened for _, opened in fences))
    assert any(named != every for named, _ in fences)


def _walk(stmts):
    from tegula.lower.thread_ir import walk
    return walk(stmts)
