"""The persistent GEMM (examples/persistent_gemm.py) on sm_90a: its K pipeline, inside the
grid-stride tile loop, keeps one TMA + mbarrier ring across the tiles (`synth/copies.py`
RingPlan, `lower/hopper.py` Ring): stage and parity come from a use count that runs on
from one tile to the next, the producer warpgroup walks the same tiles, the consumer
releases the last stage before its epilogue. Emulated against numpy at ragged shapes with
more tiles than blocks and fewer, one-iteration K loops, every stage count, both role
orders and one role, bit-identical to the non-persistent README GEMM; the structure; the
rules that keep the cp.async fallback (with their reasons); an injected missing release
is a deadlock report, not a hang."""
from __future__ import annotations

import copy
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import f16, f32
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.kernels.common import poisoned, random_input
from tegula.kernels.schedule import grouped_tile
from tegula.lower.async_ir import (BulkWait, FenceProxyAsync, MBarrierArrive, MBarrierInit,
                                   MBarrierWait, Roles, TmaLoad, WgmmaWait)
from tegula.lower.thread_ir import For, If, walk

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "emulate"))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernels"))
from async_kernels import remove, role_body, run_with_deadline  # noqa: E402
from test_gemm import check_gemm  # noqa: E402


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_example",
                                                  ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PERSISTENT = _example("persistent_gemm")
KERNEL = PERSISTENT.persistent_gemm
README_GEMM = _example("gemm").gemm
#: The one-consumer (cooperative) schedule: at one warpgroup's tile synthesis would take
#: ping-pong by default, whose own tests are tests/lower/test_hopper_pingpong.py.
SMALL = dict(BM=64, BN=64, BK=32, consumers="cooperative")


def emulate(m, n, k, blocks, seed=0, role_order="listed", kernel=KERNEL, **config):
    """(a, b, c, report) of the persistent kernel on `blocks` blocks (num_sms = blocks)."""
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    config = {**SMALL, **config}
    report = run_with_deadline(lambda: tg.emulate(
        kernel, (blocks,), a, b, c, target="sm_90a", role_order=role_order, num_sms=blocks,
        **config))
    return a, b, c, report


def tiles(m, n, config=SMALL):
    return tg.cdiv(m, config["BM"]) * tg.cdiv(n, config["BN"])


def bits(x):
    return x.view(np.uint16)


# ------------------------------------------------------------------ right in the emulator

#: (M, N, K, blocks): ragged everywhere; more tiles than blocks (3, 4 or 12 tiles a block,
#: some blocks one fewer), fewer tiles than blocks (idle blocks), one block doing all.
SHAPES = [(97, 130, 72, 5), (130, 72, 328, 2), (33, 65, 40, 1), (70, 40, 96, 7),
          (200, 136, 8, 3)]


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_persistent_tma_ring_is_right_and_equals_the_readme_gemm(shape, role_order):
    m, n, k, blocks = shape
    a, b, c, report = emulate(m, n, k, blocks, seed=m + k, role_order=role_order, STAGES=3)
    assert report.threads == 128 + 128 and report.kind("TmaLoad").count > 0
    # The epilogue goes through shared memory and TMA stores where c's rows are a multiple
    # of 16 bytes, through st.global otherwise.
    assert (report.kind("TmaStore").count > 0) == (n % 8 == 0)
    check_gemm(c, a, b, f16)
    # The same k16 steps in the same order as the non-persistent README GEMM (one block a
    # tile): the very same bits, whatever tile each block ran.
    same = poisoned((m, n), f16)
    tg.emulate(README_GEMM, (tg.cdiv(m, 64), tg.cdiv(n, 64)), a, b, same, target="sm_90a",
               **SMALL, STAGES=3)
    assert np.array_equal(bits(c), bits(same))


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
@pytest.mark.parametrize("k", [32, 72, 160], ids=["1-k-tile", "3-k-tiles", "5-k-tiles"])
def test_every_stage_count_with_k_loops_shorter_and_longer_than_the_ring(stages, k):
    """K tiles 1, 3, 5 against S = 2 … 5: runs whose length is not a multiple of S move the
    ring's start stage from tile to tile (a stage counted from the pipeline's own index
    would wait on the wrong phase: a deadlock or a read of a stage not yet written)."""
    a, b, c, report = emulate(97, 130, k, 4, seed=stages * k, STAGES=stages)
    assert report.threads == 256
    check_gemm(c, a, b, f16)


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_one_role_keeps_the_ring_across_tiles_too(role_order):
    a, b, c, report = emulate(130, 72, 160, 3, seed=3, role_order=role_order, STAGES=3,
                              warp_specialize=False)
    assert report.threads == 128 and report.kind("TmaLoad").count > 0
    check_gemm(c, a, b, f16)
    _, _, specialized, _ = emulate(130, 72, 160, 3, seed=3, STAGES=3)
    assert np.array_equal(bits(c), bits(specialized))


def test_two_consumer_warpgroups_and_the_readme_tiles():
    """threads=256 (two consumer warpgroups: m64nN on a 2x1 grid), 128x128x64 tiles."""
    config = dict(BM=128, BN=128, BK=64, STAGES=3, threads=256)
    a, b, c, report = emulate(300, 200, 200, 2, seed=9, **config)
    assert report.threads == 256 + 128
    check_gemm(c, a, b, f16)


def test_empty_k_loop_does_not_deadlock_and_writes_zeros():
    """K = 0: no iteration, no box, no release; the epilogue writes the zero accumulator.
    (Arrays of K = 0 prove no TMA facts: run the specialized build's thread IR.)"""
    tk = build(KERNEL, dict(SMALL, STAGES=3), None, "sm_90a").thread_kernel
    assert any(isinstance(s, Roles) for s in tk.body)
    a, b = np.zeros((65, 0), np.float16), np.zeros((130, 0), np.float16)
    c = poisoned((65, 130), f16)
    run_with_deadline(lambda: run_thread_kernel(tk, (2,), {"a": a, "b": b, "c": c},
                                                num_sms=2))
    assert np.array_equal(c, np.zeros((65, 130), np.float16))


# ------------------------------------------------------------------ structure


def thread_kernel(**config):
    return build(KERNEL, {**SMALL, "STAGES": 3, **config}, None, "sm_90a").thread_kernel


def test_producer_walks_the_tile_loop_and_barriers_are_initialized_once():
    tk = thread_kernel()
    producer = role_body(tk, "producer")
    loops = [s for s in walk(producer) if isinstance(s, For)]
    assert len(loops) == 2 and loops[1] in loops[0].body       # tiles, then K
    assert sum(isinstance(s, TmaLoad) for s in walk(loops[1].body)) == 2
    # mbarrier inits only at kernel start, never inside a role: the ring is never reset.
    inits = [s for s in walk(tk.body) if isinstance(s, MBarrierInit)]
    assert len(inits) == 6 and all(not isinstance(s, MBarrierInit)
                                   for r in tk.body if isinstance(r, Roles)
                                   for role in r.roles for s in walk(role.body))


def release_in(s) -> MBarrierArrive | None:
    """The arrive of a stage release: an MBarrierArrive, or the branch of one elected
    lane per warp around one."""
    if isinstance(s, If) and len(s.then) == 1:
        s = s.then[0]
    return s if isinstance(s, MBarrierArrive) else None


def test_consumer_releases_the_last_stage_before_its_epilogue():
    """After wait_group 0 the consumer releases the stage of the tile's last iteration, so
    the producer fills it with the next tile's boxes during the epilogue."""
    consumer = role_body(thread_kernel(), "consumer")
    tile_loop = next(s for s in consumer if isinstance(s, For))
    body = tile_loop.body
    k_loop = next(i for i, s in enumerate(body) if isinstance(s, For))
    after = body[k_loop + 1:k_loop + 3]
    assert isinstance(after[0], WgmmaWait) and after[0].pending == 0
    assert release_in(after[1]) and release_in(after[1]).barrier.startswith("empty")


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_a_consumer_that_does_not_release_the_last_stage_is_a_deadlock_report(role_order):
    tk = copy.deepcopy(thread_kernel())
    consumer = role_body(tk, "consumer")
    tile_loop = next(s for s in consumer if isinstance(s, For))
    before = len(tile_loop.body)
    tile_loop.body = [s for s in tile_loop.body if not release_in(s)]
    assert len(tile_loop.body) == before - 1
    rng = np.random.default_rng(1)
    a, b = random_input(rng, (97, 72), f16), random_input(rng, (130, 72), f16)
    c = poisoned((97, 130), f16)
    with pytest.raises(EmulationError, match="(?i)deadlock") as info:
        run_with_deadline(lambda: run_thread_kernel(tk, (2,), {"a": a, "b": b, "c": c},
                                                    role_order=role_order, num_sms=2))
    assert "producer of the tg.pipeline" in str(info.value)


def test_explain_shows_the_persistent_ring():
    text = tg.explain(KERNEL, target="sm_90a", BM=128, BN=256, BK=64, STAGES=4, threads=256)
    assert "TMA boxes into an mbarrier ring of 4" in text
    assert "TMA not used" not in text
    assert ("epilogue through shared memory: 4 swizzled 128x64 boxes (128 B swizzle) staged 2 "
            "at a time in 32768 B at byte 196608 (2 rounds of stmatrix.x4, fence.proxy.async, "
            "TMA store clipped at the tensor's edge)") in text
    # the tile loop is the library's (kernels.gemm.persistent_tiles), which the example calls
    source = (ROOT / "tegula" / "kernels" / "gemm.py").read_text().splitlines()
    line = next(i + 1 for i, s in enumerate(source) if "for t in tg.range(" in s)
    assert (f"both roles walk the enclosing loops and their scalar code (the producer only "
            f"issues), and the ring runs across the enclosing loop (line {line}): stage and "
            f"phase from a use count that continues from one run of the pipeline to the "
            f"next") in text


@tg.kernel(threads=128)
def rows_then_columns(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16]):
    """Two enclosing loops: block-strided row tiles, and inside, the column tiles counted
    from 3 in steps of 2, then the K pipeline: the ring's run index is row iteration *
    column tiles + column iteration ((index - 3) // 2)."""
    tiles_n = tg.cdiv(b.shape[0], 64)
    sa, sb = tg.shared((64, 32), f16, stages=3), tg.shared((64, 32), f16, stages=3)
    for m in tg.range(tg.block_id(0), tg.cdiv(a.shape[0], 64), tg.num_programs(0)):
        for n2 in tg.range(3, 3 + 2 * tiles_n, 2):
            n = (n2 - 3) // 2
            ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
            acc = tg.zeros((64, 64), f32)
            for k in tg.pipeline(ga.shape[2], stages=3):
                tg.copy(ga[:, :, k], sa[k])
                tg.copy(gb[:, :, k], sb[k])
                tg.gemm(acc, sa[k], sb[k])
            tg.copy(acc.to(f16), c.tile((64, 64), (m, n)))


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
@pytest.mark.parametrize("roles", [None, False], ids=["specialized", "one-role"])
def test_a_ring_across_two_enclosing_loops_one_stepping_by_two(roles, role_order):
    result = build(rows_then_columns, {}, None, "sm_90a")
    from tegula.ir.ops import ForLoop, walk_ops
    pipeline = next(op for op in walk_ops(result.traced.body)
                    if isinstance(op, ForLoop) and op.stages > 1)
    assert len(pipeline.choices["ring"].enclosing) == 2
    rng = np.random.default_rng(6)
    # 5 k-tiles on 3 stages (runs not a multiple of 2 x 3 long): a wrong run index moves
    # the stages and parities (with 6 k-tiles it could hide).
    a, b = random_input(rng, (200, 136), f16), random_input(rng, (136, 136), f16)
    c = poisoned((200, 136), f16)
    report = run_with_deadline(lambda: tg.emulate(
        rows_then_columns, (2,), a, b, c, target="sm_90a", warp_specialize=roles,
        role_order=role_order))
    assert report.kind("TmaLoad").count > 0 and report.kind("TmaStore").count > 0
    assert report.threads == (256 if roles is None else 128)
    check_gemm(c, a, b, f16)


# ------------------------------------------------------------------ TMA-store epilogue


def test_epilogue_in_rounds_when_the_staging_buffer_holds_fewer_boxes(monkeypatch):
    """A 64x128 tile is two 64x64 boxes; with room for one box the epilogue runs two
    rounds through the same staging box (the second waits for the first store's reads).
    Right, and bit-identical to the one-round build."""
    from tegula.synth import copies
    from tegula.ir.ops import Copy, walk_ops
    config = dict(BM=64, BN=128, BK=32, STAGES=3, consumers="cooperative")
    a, b, one_round, report = emulate(130, 264, 96, 2, seed=8, **config)
    assert report.kind("TmaStore").count == 2 * tiles(130, 264, config)
    built = build(KERNEL, config, None, "sm_90a")
    plan = next(op.choices["tma_store"] for op in walk_ops(built.traced.body)
                if isinstance(op, Copy) and "tma_store" in op.choices)
    assert (plan.boxes, plan.slots) == (2, 2)
    limit = built.target.smem_per_block_max
    monkeypatch.setattr(copies, "_MBARRIER_HEADROOM", limit - plan.offset - plan.box_bytes)
    fresh = _example("persistent_gemm").persistent_gemm             # an empty build cache
    plan = next(op.choices["tma_store"] for op in walk_ops(
        build(fresh, config, None, "sm_90a").traced.body)
        if isinstance(op, Copy) and "tma_store" in op.choices)
    assert (plan.boxes, plan.slots) == (2, 1) and "2 rounds" in plan.describe()
    _, _, c, report = emulate(130, 264, 96, 2, seed=8, kernel=fresh, **config)
    assert report.kind("TmaStore").count == 2 * tiles(130, 264, config)
    check_gemm(c, a, b, f16)
    assert np.array_equal(bits(c), bits(one_round))


def _nth_bulk_wait(n: int):
    """A predicate true for the n-th `BulkWait` met in program order: the consumer's first
    is its epilogue's (in the tile loop, before the staging buffer is rewritten; it waits
    for the earlier tile's writes too), its second the one before the block ends."""
    seen = [0]

    def pred(s) -> bool:
        seen[0] += isinstance(s, BulkWait)
        return isinstance(s, BulkWait) and seen[0] == n
    return pred


INJECTED = {"a missing fence.proxy.async": (lambda: lambda s: isinstance(s, FenceProxyAsync),
                                            "generic proxy with no fence.proxy.async"),
            "no wait before rewriting the staging buffer": (
                lambda: _nth_bulk_wait(1), "while a wgmma or TMA store still reads it"),
            "no wait before the block ends": (
                lambda: _nth_bulk_wait(2), "TMA stores not waited for")}


@pytest.mark.parametrize("bug", INJECTED)
def test_an_epilogue_missing_a_fence_or_a_wait_is_reported(bug):
    make_drop, message = INJECTED[bug]
    drop = make_drop()
    tk = copy.deepcopy(thread_kernel())
    assert remove(role_body(tk, "consumer"), drop) == 1
    rng = np.random.default_rng(2)
    a, b = random_input(rng, (150, 152), f16), random_input(rng, (232, 152), f16)
    c = poisoned((150, 232), f16)
    with pytest.raises(EmulationError, match=message):
        run_with_deadline(lambda: run_thread_kernel(tk, (3,), {"a": a, "b": b, "c": c},
                                                    num_sms=3))


# ------------------------------------------------------------------ where the rule says no


@tg.kernel(threads=128)
def k_depends_on_tile(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16]):
    """Tile t accumulates only its first t % 3 + 1 k-tiles: the K loop's trip count
    depends on the tile index, so no running count is known (cp.async, one role)."""
    tiles_n = tg.cdiv(b.shape[0], 64)
    sa, sb = tg.shared((64, 32), f16, stages=2), tg.shared((64, 32), f16, stages=2)
    for t in tg.range(tg.block_id(0), tg.cdiv(a.shape[0], 64) * tiles_n, tg.num_programs(0)):
        m, n = t // tiles_n, t % tiles_n
        ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
        acc = tg.zeros((64, 64), f32)
        for k in tg.pipeline(tg.minimum(t % 3 + 1, ga.shape[2]), stages=2):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), c.tile((64, 64), (m, n)))


@tg.kernel(threads=128)
def counted_steps(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16]):
    """More than the gemm in a nested pipeline's body, the stages read by the wgmma only:
    the TMA ring runs across the tiles, its running stage given to the descriptors."""
    tiles_n = tg.cdiv(b.shape[0], 64)
    sa, sb = tg.shared((64, 32), f16, stages=2), tg.shared((64, 32), f16, stages=2)
    for t in tg.range(tg.block_id(0), tg.cdiv(a.shape[0], 64) * tiles_n, tg.num_programs(0)):
        m, n = grouped_tile(t, tg.cdiv(a.shape[0], 64), tiles_n, 2)
        ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
        acc = tg.zeros((64, 64), f32)
        for k in tg.pipeline(ga.shape[2], stages=2):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
            acc = acc * 1.0
        tg.copy(acc.to(f16), c.tile((64, 64), (m, n)))


def skipped_reasons(kernel) -> set:
    result = build(kernel, {}, None, "sm_90a")
    from tegula.ir.ops import Copy, walk_ops
    return {op.choices.get("tma_skipped") for op in walk_ops(result.traced.body)
            if isinstance(op, Copy) and op.choices.get("tma_skipped")}


def test_a_k_loop_whose_length_depends_on_the_tile_keeps_cp_async_and_is_right():
    reasons = skipped_reasons(k_depends_on_tile)
    assert any("trip count depends on the index of an enclosing loop" in r for r in reasons)
    m, n, k = 130, 100, 120
    rng = np.random.default_rng(4)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    run_with_deadline(lambda: tg.emulate(k_depends_on_tile, (2,), a, b, c, target="sm_90a"))
    tiles_n = tg.cdiv(n, 64)
    for t in range(tg.cdiv(m, 64) * tiles_n):
        tm, tn, kk = t // tiles_n, t % tiles_n, min(t % 3 + 1, tg.cdiv(k, 32)) * 32
        rows, cols = slice(tm * 64, tm * 64 + 64), slice(tn * 64, tn * 64 + 64)
        check_gemm(c[rows, cols], a[rows, :kk], b[cols, :kk], f16)


@tg.kernel(threads=128)
def stage_read_in_registers(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16]):
    """A nested pipeline whose a stage is also loaded into registers (not through a wgmma
    descriptor: ordinary shared addressing reads stage k % S, not the ring's running
    stage), so it keeps cp.async, with the reason. The load adds 0 · (row sums of a)."""
    tiles_n = tg.cdiv(b.shape[0], 64)
    sa, sb = tg.shared((64, 32), f16, stages=2), tg.shared((64, 32), f16, stages=2)
    for t in tg.range(tg.block_id(0), tg.cdiv(a.shape[0], 64) * tiles_n, tg.num_programs(0)):
        m, n = grouped_tile(t, tg.cdiv(a.shape[0], 64), tiles_n, 2)
        ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
        acc = tg.zeros((64, 64), f32)
        for k in tg.pipeline(ga.shape[2], stages=2):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
            acc = acc + tg.sum(tg.load(sa[k]).to(f32), 1) * 0.0     # (64, 1) broadcast
        tg.copy(acc.to(f16), c.tile((64, 64), (m, n)))


@pytest.mark.parametrize("role_order", [None, "random:3"])
def test_a_nested_body_with_more_than_the_gemm_keeps_the_ring_and_is_right(role_order):
    """Session 10: the stage of a nested ring is the ring's running count for every wgmma
    of the body (the blockwise FP8 GEMM's scaled promotion), not only a lone gemm's; three
    blocks walk 6 tiles of 3 k-steps each over a 2-stage ring, so the running stage differs
    from k % 2 on every other tile."""
    assert not skipped_reasons(counted_steps)
    source = build(counted_steps, {}, None, "sm_90a").cuda_source()
    assert "cp.async.bulk.tensor" in source and "cp.async.cg" not in source
    rng = np.random.default_rng(5)
    a, b = random_input(rng, (130, 72), f16), random_input(rng, (100, 72), f16)
    c = poisoned((130, 100), f16)
    options = {"role_order": role_order} if role_order else {}
    run_with_deadline(lambda: tg.emulate(counted_steps, (3,), a, b, c, target="sm_90a",
                                         **options))
    check_gemm(c, a, b, f16)


def test_a_nested_stage_read_outside_a_wgmma_keeps_cp_async_and_is_right():
    reasons = skipped_reasons(stage_read_in_registers)
    assert any("something other than a wgmma gemm reads its staged tiles" in r
               for r in reasons)
    rng = np.random.default_rng(6)
    a, b = random_input(rng, (130, 72), f16), random_input(rng, (100, 72), f16)
    c = poisoned((130, 100), f16)
    run_with_deadline(lambda: tg.emulate(stage_read_in_registers, (3,), a, b, c,
                                         target="sm_90a"))
    check_gemm(c, a, b, f16)


def test_sm80_keeps_the_ampere_path_with_the_same_results():
    a, b, c, _ = emulate(97, 130, 72, 5, seed=2, STAGES=3)
    ampere = poisoned((97, 130), f16)
    run_with_deadline(lambda: tg.emulate(KERNEL, (5,), a, b, ampere, target="sm_80",
                                         num_sms=5, **SMALL, STAGES=3))
    check_gemm(ampere, a, b, f16)
    assert np.array_equal(bits(c), bits(ampere))


def test_the_readme_tiles_compile_to_hgmma_and_tma_without_spills():
    """NVRTC/nvcc for sm_90a, 128x256x64, 4 stages, two consumer warpgroups: HGMMA 64x256,
    TMA loads and stores, mbarrier waits, setmaxnreg, and no local memory (the producer's copies of
    the tile loop fit its 40 registers)."""
    import re

    from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble
    if not available_compilers():
        pytest.skip("neither NVRTC nor nvcc found")
    result = build(KERNEL, dict(BM=128, BN=256, BK=64, STAGES=4, threads=256), None, "sm_90a")
    sass = disassemble(compile_cuda(result.cuda_source(), result.thread_kernel.name, "sm_90a"))
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    for op in ("HGMMA.64x256x16", "UTMALDG.2D", "UTMASTG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT",
               "USETMAXREG"):
        assert op in sass, op
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


@tg.kernel(threads=128)
def accumulate_into_c(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
    """c += a @ b.T tile by tile: the epilogue reads c before writing it, so its store
    stays st.global (a TMA store would land after a later read of the same tile)."""
    tiles_n = tg.cdiv(b.shape[0], 64)
    sa, sb = tg.shared((64, 32), f16, stages=2), tg.shared((64, 32), f16, stages=2)
    for t in tg.range(tg.block_id(0), tg.cdiv(a.shape[0], 64) * tiles_n, tg.num_programs(0)):
        m, n = t // tiles_n, t % tiles_n
        ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
        acc = tg.zeros((64, 64), f32)
        for k in tg.pipeline(ga.shape[2], stages=2):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        old = tg.load(c.tile((64, 64), (m, n)))
        tg.copy(acc + old, c.tile((64, 64), (m, n)))


def test_an_output_the_kernel_also_reads_keeps_st_global():
    result = build(accumulate_into_c, {}, None, "sm_90a")
    from tegula.ir.ops import Copy, walk_ops
    reasons = [op.choices["tma_store_skipped"] for op in walk_ops(result.traced.body)
               if isinstance(op, Copy) and "tma_store_skipped" in op.choices]
    assert len(reasons) == 1 and "c is also accessed at line" in reasons[0]
    rng = np.random.default_rng(3)
    a, b = random_input(rng, (130, 64), f16), random_input(rng, (72, 64), f16)
    c0 = rng.standard_normal((130, 72)).astype(np.float32)
    c = c0.copy()
    report = run_with_deadline(lambda: tg.emulate(accumulate_into_c, (2,), a, b, c,
                                                  target="sm_90a"))
    assert report.kind("TmaStore").count == 0 and report.kind("TmaLoad").count > 0
    ref = a.astype(np.float64) @ b.astype(np.float64).T + c0
    bound = 64 * 2.0 ** -23 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
                               + np.abs(c0))
    assert np.all(np.abs(c - ref) <= bound)
