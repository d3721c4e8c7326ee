"""The thread IR of the sm_90a GEMM path, checked statement by statement against the arch's
one definition of shared-memory matrices (`tegula.arch.smem_matrix`, `tegula.arch.tma`):
every wgmma descriptor reads exactly the 64 x 16 (or n x 16) block of the stage it
multiplies, into the accumulator registers of those rows and columns; every TMA box lands
where the buffer's layout puts the tile; barriers, phases and stages follow the ring."""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

from tegula.arch.smem_matrix import MatrixDescriptor, descriptor_element_addresses
from tegula.arch.tma import tma_box_addresses
from tegula.arch.wgmma import get_wgmma
from tegula.build import build
from tegula.dtypes import f16
from tegula.ir.ops import Gemm, walk_ops
from tegula.layout.tv import tv_coords, tv_table
from tegula.lower.async_ir import (Elect, FenceBarrierInit, FenceProxyAsync, MBarrierArrive,
                                   MBarrierInit, MBarrierWait, TensorMapParam, TmaLoad, Wgmma,
                                   WgmmaCommit, WgmmaFence, WgmmaWait)
from tegula.lower.thread_ir import (_FOLD, Barrier, BinOp, Const, CpAsync, For, If, Let,
                                    TensorParam, Var, walk)
from tegula.synth.facts import TensorFacts
from tegula.synth.shared import evaluate_offsets

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from examples.gemm import gemm as readme_gemm  # noqa: E402


def value(expr, env: dict) -> int:
    if isinstance(expr, int):
        return expr
    if isinstance(expr, Elect):  # elect.sync over a whole warp: its lane 0
        return int(env["tid"] % 32 == 0)
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Var):
        return env[expr.name]
    if isinstance(expr, BinOp):
        return _FOLD[expr.op](value(expr.lhs, env), value(expr.rhs, env))
    raise TypeError(expr)


def run_one_thread(stmts, env: dict, loop_iteration: int, found: list) -> None:
    """Walk the body as thread `env['tid']` would, binding Lets, taking branches, entering
    the k-loop once with `loop_iteration`; collect (statement, env) of what it executes."""
    for s in stmts:
        if isinstance(s, Let):
            env[s.var.name] = value(s.value, env)
        elif isinstance(s, For):
            if s.unroll:
                raise AssertionError("no unrolled loops expected here")
            inner = dict(env)
            inner[s.var.name] = loop_iteration
            run_one_thread(s.body, inner, loop_iteration, found)
        elif isinstance(s, If):
            run_one_thread(s.then if value(s.cond, env) else s.otherwise, env, loop_iteration,
                           found)
        else:
            found.append((s, dict(env)))


def environment(result, tid: int, bid=(1, 1), shapes=None) -> dict:
    env = {"tid": tid, "bid_x": bid[0], "bid_y": bid[1], "bid_z": 0}
    for p in result.thread_kernel.params:
        if isinstance(p, TensorParam):
            shape = shapes[p.name]
            for d in range(p.rank):
                env[f"{p.name}_shape{d}"] = shape[d]
                env[f"{p.name}_stride{d}"] = int(np.prod(shape[d + 1:]))
    return env


SHAPES = {"a": (200, 72 * 4), "b": (136, 72 * 4), "c": (200, 136)}


@pytest.fixture(scope="module")
def two_warpgroups():
    # The single-role ring (the warp-specialized form: tests/lower/test_hopper_roles.py).
    return build(readme_gemm, dict(BM=128, BN=64, BK=32, STAGES=3, threads=256,
                                   warp_specialize=False), None, "sm_90a")


def test_thread_ir_has_the_async_pipeline(two_warpgroups):
    tk = two_warpgroups.thread_kernel
    kinds = {type(s) for s in walk(tk.body)}
    for needed in (MBarrierInit, FenceBarrierInit, MBarrierArrive, TmaLoad, MBarrierWait,
                   WgmmaFence, Wgmma, WgmmaCommit, WgmmaWait):
        assert needed in kinds, needed.__name__
    assert CpAsync not in kinds and FenceProxyAsync not in kinds   # TMA path: no generic writes
    names = [p.name for p in tk.params]
    maps = [p for p in tk.params if isinstance(p, TensorMapParam)]
    assert [(m.tensor, m.box, m.swizzle) for m in maps] == [("a", (32, 128), 64),
                                                              ("b", (32, 64), 64)]
    assert names.index("a_tmap") == names.index("a") + 1
    assert [(m.count, m.byte_offset % 8) for m in tk.mbarriers] == [(3, 0)]
    assert tk.mbarriers[0].byte_offset >= max(b.byte_offset for b in tk.shared)
    assert all(b.byte_offset % 1024 == 0 for b in tk.shared)


def alloc_bytes_of(result, buffer_name: str, stage: int, rows: np.ndarray, cols: np.ndarray):
    """Byte address of (row, col) of `stage` of the buffer, from the synthesized layout."""
    tk, traced = result.thread_kernel, result.traced
    buffer = next(b for b in tk.shared if b.name == buffer_name)
    alloc = next(a for a in traced.shared_allocs if f"smem_{a.name}" == buffer_name)
    coords = np.stack([rows, cols], -1)
    stage_elems = int(np.prod(alloc.shape))
    return buffer.byte_offset + 2 * (stage * stage_elems + evaluate_offsets(alloc.layout, coords))


def block_read(result, desc, rows: int, stage: int, env: dict) -> tuple[int, int]:
    """(first row, first k) of the block a descriptor reads, checking that it reads exactly
    the rows x 16 block of the stage from there, element by element."""
    buffer = next(b for b in result.thread_kernel.shared if b.name == desc.buffer)
    start = buffer.byte_offset + 2 * value(desc.offset, env)
    fields = MatrixDescriptor(start, desc.leading_bytes, desc.stride_bytes, desc.swizzle)
    read = descriptor_element_addresses(fields, rows, 16, f16)
    alloc = next(a for a in result.traced.shared_allocs if f"smem_{a.name}" == desc.buffer)
    all_rows, all_cols = np.meshgrid(np.arange(alloc.shape[0]), np.arange(alloc.shape[1]),
                                     indexing="ij")
    where = {int(x): (r, c) for x, r, c in zip(
        alloc_bytes_of(result, desc.buffer, stage, all_rows, all_cols).ravel(),
        all_rows.ravel(), all_cols.ravel())}
    r0, k0 = where[int(read[0, 0])]
    assert r0 % rows == 0 and k0 % 16 == 0
    expected = alloc_bytes_of(result, desc.buffer, stage, *np.meshgrid(
        np.arange(r0, r0 + rows), np.arange(k0, k0 + 16), indexing="ij"))
    assert np.array_equal(read, expected)
    return r0, k0


@pytest.mark.parametrize("tid", [0, 77, 128, 255])
@pytest.mark.parametrize("iteration", [0, 4])
def test_every_wgmma_reads_its_block_into_the_right_accumulators(two_warpgroups, tid, iteration):
    result = two_warpgroups
    gemm = next(op for op in walk_ops(result.traced.body) if isinstance(op, Gemm))
    plan = gemm.choices["plan"]
    executed: list = []
    run_one_thread(result.thread_kernel.body, environment(result, tid, shapes=SHAPES),
                   iteration, executed)
    wgmmas = [(s, env) for s, env in executed if isinstance(s, Wgmma)]
    rm, rn, rk = plan.repeats
    assert len(wgmmas) == rm * rn * rk
    atom = get_wgmma(wgmmas[0][0].instr)
    acc_coords = tv_coords(gemm.c.layout, tuple(gemm.c.shape))[tid]        # (values, 2)
    atom_table = tv_table(atom.acc_tv)[tid % 128]                          # m + 64 n
    ks = set()
    for s, env in wgmmas:
        stage = iteration % 3
        m0, ka = block_read(result, s.a, 64, stage, env)
        n0, kb = block_read(result, s.b, atom.n, stage, env)
        assert ka == kb
        ks.add((m0, n0, ka))
        held = acc_coords[[int(r.index.value) for r in s.d]]
        assert np.array_equal(held[:, 0], m0 + atom_table % 64)
        assert np.array_equal(held[:, 1], n0 + atom_table // 64)
    assert {k for _, _, k in ks} == {0, 16}
    assert len(ks) == len(wgmmas)                      # no block multiplied twice


def test_tma_boxes_land_where_the_layout_puts_the_tile(two_warpgroups):
    result = two_warpgroups
    executed: list = []
    run_one_thread(result.thread_kernel.body, environment(result, 0, shapes=SHAPES), 5,
                   executed)
    loads = [(s, env) for s, env in executed if isinstance(s, TmaLoad)]
    maps = {p.name: p for p in result.thread_kernel.params if isinstance(p, TensorMapParam)}
    # prologue: iterations 0, 1; loop iteration 5 issues iteration 7 (stage 1)
    issued = [(s.tensor_map, [value(c, env) for c in s.coords]) for s, env in loads]
    assert issued == [("a_tmap", [0, 128]), ("b_tmap", [0, 64]),
                      ("a_tmap", [32, 128]), ("b_tmap", [32, 64]),
                      ("a_tmap", [7 * 32, 128]), ("b_tmap", [7 * 32, 64])]
    for s, env in loads:
        tmap = maps[s.tensor_map]
        slot = value(s.offset, env) // (tmap.box[0] * tmap.box[1])
        assert value(s.barrier_index, env) == slot
        buffer = next(b for b in result.thread_kernel.shared if b.name == s.buffer)
        landed = tma_box_addresses(tmap.box, f16, tmap.swizzle,
                                   buffer.byte_offset + 2 * value(s.offset, env))
        rows, cols = np.meshgrid(np.arange(tmap.box[1]), np.arange(tmap.box[0]), indexing="ij")
        assert np.array_equal(landed, alloc_bytes_of(result, s.buffer, slot, rows, cols))
    arrives = [(s, env) for s, env in executed if isinstance(s, MBarrierArrive)]
    assert [s.tx_bytes for s, _ in arrives] == [(128 + 64) * 32 * 2] * 3


def test_waits_follow_the_ring_phases(two_warpgroups):
    result = two_warpgroups
    for k in range(7):
        executed: list = []
        run_one_thread(result.thread_kernel.body, environment(result, 5, shapes=SHAPES), k,
                       executed)
        (wait, env), = [(s, e) for s, e in executed if isinstance(s, MBarrierWait)]
        assert (value(wait.index, env), value(wait.parity, env)) == (k % 3, (k // 3) % 2)
        issuing = [s for s, _ in executed if isinstance(s, TmaLoad)]
        assert issuing == []                     # only thread 0 issues


def test_a_stage_is_refilled_only_after_its_wgmmas_retired_and_a_block_barrier(two_warpgroups):
    """Iteration k refills stage (k-1) % S, which iteration k-1's wgmmas read: each
    warpgroup's wait_group 1 after this iteration's wgmmas retires those, and a block
    barrier orders every warpgroup's wait before thread 0's copy (the emulator runs the
    warpgroups of one role in lockstep, so only this structural check sees a missing
    barrier). After the loop, wait_group 0 completes the accumulator."""
    top = two_warpgroups.thread_kernel.body
    loop = next(s for s in top if isinstance(s, For))
    body = loop.body
    first_issue = next(i for i, s in enumerate(body)
                       if isinstance(s, If) and any(isinstance(t, TmaLoad) for t in s.then))
    waits = [i for i, s in enumerate(body) if isinstance(s, WgmmaWait)]
    assert waits and all(body[i].pending <= 1 for i in waits)
    assert any(isinstance(s, Barrier) for s in body[max(waits):first_issue])
    after = top[top.index(loop) + 1:]
    assert isinstance(after[0], WgmmaWait) and after[0].pending == 0


def test_last_iterations_issue_no_copy_past_the_loop(two_warpgroups):
    """K = 288 is 9 k-tiles: iterations 7 and 8 must not issue iterations 9 and 10 (a copy
    still in flight when the block exits)."""
    result = two_warpgroups
    for k, expected in ((6, 1), (7, 0), (8, 0)):
        executed: list = []
        run_one_thread(result.thread_kernel.body, environment(result, 0, shapes=SHAPES), k,
                       executed)
        in_loop = [s for s, _ in executed if isinstance(s, MBarrierArrive)][2:]
        assert len(in_loop) == expected


def test_generic_writes_into_wgmma_buffers_are_fenced():
    """When TMA is not proven (here: a row stride of 8 bytes), the copies stay cp.async and
    every barrier before the wgmma reads is preceded by fence.proxy.async."""
    facts = {n: TensorFacts.assume_row_major(2) for n in "abc"}
    facts["a"] = TensorFacts(2, 1, (16, 4), (4, 1), 16, 32)
    tk = build(readme_gemm, dict(BM=64, BN=64), facts, "sm_90a").thread_kernel
    kinds = [type(s) for s in walk(tk.body)]
    assert TmaLoad not in kinds and CpAsync in kinds and Wgmma in kinds
    body = [s for s in walk(tk.body)]
    barriers = [i for i, s in enumerate(body) if isinstance(s, Barrier)]
    assert barriers and all(isinstance(body[i - 1], FenceProxyAsync) for i in barriers)


def test_sm90a_gemm_compiles_in_under_a_second():
    start = time.perf_counter()
    readme_gemm.__dict__.pop("_builds", None)
    build(readme_gemm, dict(BM=128, BN=128, BK=32), None, "sm_90a")
    assert time.perf_counter() - start < 1.0
