"""Warp roles written in the source (`with tg.producer(): …` / `with tg.consumer(): …`,
tegula/lang/roles.py) compile onto the same role machinery synthesis uses on its own:

* the README GEMM and the persistent (ping-pong) GEMM with role blocks emit the same CUDA
  as the same kernels without them (only the kernel's name and source-line comments
  differ), and the same bits in the emulator;
* stated budgets reach `setmaxnreg` (other values than synthesis's own: the CUDA says so);
* emulated for sm_90a against numpy at shapes that divide no tile, under the listed,
  reversed and random role orders;
* misuse synthesis can see is a SynthesisError at the block's line: an sm_80 target,
  warp_specialize=False, copies that cannot be TMA boxes, budgets over the register
  file, a stage buffer read outside the pipeline.
"""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.build import build
from tegula.errors import SynthesisError
from tegula.kernels.common import poisoned, random_input
from tegula.kernels.gemm import persistent_grid

HERE = os.path.dirname(__file__)
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(HERE, "..", "emulate"))
sys.path.insert(0, os.path.join(HERE, "..", "lang"))
from async_kernels import run_with_deadline  # noqa: E402
from examples.gemm import gemm as readme_gemm  # noqa: E402
from examples.persistent_gemm import persistent_gemm  # noqa: E402
from examples.warp_roles_gemm import warp_roles_gemm  # noqa: E402
from source_lines import marked_line  # noqa: E402


@tg.kernel(threads=128)
def stated_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
                STAGES: tg.constexpr = 3, P: tg.constexpr = None, C: tg.constexpr = None):
    """The README GEMM (examples/gemm.py) with its pipeline body in role blocks."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        with tg.producer(regs=P):  # MARK-producer
            tg.copy(ga[:, :, k], sa[k])  # MARK-copy-a
            tg.copy(gb[:, :, k], sb[k])
        with tg.consumer(regs=C):  # MARK-consumer
            tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


def code(kernel, **options) -> str:
    """The kernel's CUDA for sm_90a without what names the source: the kernel's name and
    the comments (they carry file names and line numbers)."""
    source = build(kernel, options, None, "sm_90a").cuda_source()
    source = re.sub(r"//[^\n]*", "", source).replace(kernel.name, "KERNEL")
    return "\n".join(line.rstrip() for line in source.splitlines())


@pytest.mark.parametrize("tiles", [
    dict(),                                                   # 128x128: one warpgroup
    dict(BM=128, BN=256, BK=64, STAGES=4, threads=256),       # two: setmaxnreg.inc 232
    dict(BM=64, BN=64, BK=32, STAGES=2),
], ids=["128x128x32", "128x256x64-2wg", "64x64x32"])
def test_stated_roles_compile_to_the_synthesized_split(tiles):
    stated = code(stated_gemm, **tiles)
    assert "setmaxnreg" in stated or tiles.get("threads", 128) == 128
    # Forced: the synthesized split the stated blocks are compared with (the cost model
    # keeps some of these tiles in one role by default).
    assert stated == code(readme_gemm, warp_specialize=True, **tiles)


@pytest.mark.parametrize("config", [
    dict(BM=128, BN=128, BK=64, STAGES=4),                    # ping-pong: 384 threads
    dict(BM=64, BN=64, BK=32, STAGES=3, GROUP=3),
    dict(BM=128, BN=256, BK=64, STAGES=4, threads=256),       # cooperative, 384 threads
], ids=["128x128-pingpong", "64x64-pingpong", "128x256-cooperative"])
def test_the_persistent_example_compiles_to_the_synthesized_split(config):
    """examples/warp_roles_gemm.py is examples/persistent_gemm.py's loop written out with
    role blocks (its 40 / 232 budgets are the ones synthesis picks for both schedules)."""
    stated = code(warp_roles_gemm, **config)
    assert "setmaxnreg.dec.sync.aligned.u32 40" in stated
    assert "setmaxnreg.inc.sync.aligned.u32 232" in stated
    assert stated == code(persistent_gemm, **config)


def test_stated_budgets_reach_setmaxnreg_and_explain():
    source = build(stated_gemm, dict(BM=128, BN=256, BK=64, STAGES=4, threads=256, P=24,
                                     C=240), None, "sm_90a").cuda_source()
    assert "setmaxnreg.dec.sync.aligned.u32 24" in source
    assert "setmaxnreg.inc.sync.aligned.u32 240" in source
    # One warpgroup's tile: 256 threads' share is 248, so a consumer budget of 200 lowers it.
    text = tg.explain(stated_gemm, target="sm_90a", P=32, C=200)
    assert "setmaxnreg.dec 32 registers" in text and "setmaxnreg.dec 200 registers" in text
    line_p, line_c = marked_line(__file__, "MARK-producer"), marked_line(__file__, "MARK-consumer")
    assert (f"roles stated in the source: tg.producer(regs=32) at line {line_p}, "
            f"tg.consumer(regs=200) at line {line_c}") in text


def _emulate(kernel, grid, m, n, k, seed, role_order, **options):
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    report = run_with_deadline(lambda: tg.emulate(kernel, grid, a, b, c, target="sm_90a",
                                                  role_order=role_order, **options))
    return a, b, c, report


def _check(c, a, b):
    """Every element within one f16 rounding of the result plus f32 accumulation over K."""
    af, bf = a.astype(np.float64), b.astype(np.float64)
    ref = af @ bf.T
    bound = 2.0 ** -10 * np.abs(ref) + a.shape[1] * 2.0 ** -23 * (np.abs(af) @ np.abs(bf).T)
    assert not np.isnan(c).any()
    assert np.all(np.abs(c.astype(np.float64) - ref) <= bound)


ORDERS = ["listed", "reversed", "random:3", "random:11"]


@pytest.mark.parametrize("role_order", ORDERS)
def test_the_stated_readme_gemm_is_right_under_every_role_order(role_order):
    """70 x 100 x 328 on 64 x 64 x 32 tiles, 2 stages (11 k-tiles: each stage reused
    five times), a custom budget; bit-identical to the synthesized split."""
    tiles = dict(BM=64, BN=64, BK=32, STAGES=2)
    grid = (tg.cdiv(70, 64), tg.cdiv(100, 64))
    a, b, c, report = _emulate(stated_gemm, grid, 70, 100, 328, 1, role_order, P=24, **tiles)
    assert report.threads == 256 and report.kind("TmaLoad").count > 0
    _check(c, a, b)
    _, _, plain, _ = _emulate(readme_gemm, grid, 70, 100, 328, 1, role_order, **tiles)
    assert np.array_equal(c.view(np.uint16), plain.view(np.uint16))


@pytest.mark.parametrize("role_order", ORDERS)
@pytest.mark.parametrize("m, n, k, sms", [(97, 130, 200, 5), (33, 17, 96, 3)],
                         ids=["10tiles-5blocks", "1tile"])
def test_the_persistent_example_is_right_under_every_role_order(role_order, m, n, k, sms):
    """Ping-pong consumers (384 threads) over more tiles than blocks, and one tile (the
    second consumer warpgroup idle); the bits of examples/persistent_gemm.py's build."""
    tiles = dict(BM=64, BN=32, BK=32, STAGES=3, GROUP=3)
    grid = persistent_grid(m, n, sms, 64, 32)
    a, b, c, report = _emulate(warp_roles_gemm, grid, m, n, k, 2, role_order, num_sms=sms,
                               **tiles)
    assert report.threads == 384
    _check(c, a, b)
    _, _, plain, _ = _emulate(persistent_gemm, grid, m, n, k, 2, role_order, num_sms=sms,
                              **tiles)
    assert np.array_equal(c.view(np.uint16), plain.view(np.uint16))


def _refused(kernel, marker, *phrases, target="sm_90a", **options):
    with pytest.raises(SynthesisError) as info:
        build(kernel, options, None, target)
    err = info.value
    assert err.loc is not None and err.loc.lineno == marked_line(__file__, marker), str(err)
    for phrase in phrases:
        assert phrase in err.message, (phrase, err.message)
    assert "internal" not in err.message
    return err


@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_90"])
def test_role_blocks_on_a_target_without_them_are_refused(target):
    _refused(stated_gemm, "MARK-producer", "warp roles need sm_90a", f"the target is {target}",
             target=target)


def test_warp_specialize_false_contradicts_the_blocks():
    _refused(stated_gemm, "MARK-producer", "warp_specialize=False", warp_specialize=False)


def test_copies_that_cannot_be_tma_boxes_are_refused_at_their_line():
    err = _refused(stated_gemm, "MARK-copy-a", "tg.producer", "not a TMA box",
                   "load_path='cp.async'", load_path="cp.async")
    assert err.other_loc.lineno == marked_line(__file__, "MARK-producer")


@pytest.mark.parametrize("tiles, regs, marker", [
    (dict(BM=128, BN=256, BK=64, STAGES=4, threads=256), dict(C=248), "MARK-consumer"),
    (dict(), dict(P=256, C=248), "MARK-consumer"),
    (dict(), dict(P=256), "MARK-producer"),
], ids=["2wg-consumer-248", "producer-256-consumer-248", "producer-256"])
def test_budgets_over_the_register_file_are_refused(tiles, regs, marker):
    """384 threads hold 384 x 168 registers: 128 x 40 + 256 x 248 do not fit; 256 threads
    hold 256 x 248: 128 x 256 + 128 x 248 do not (a consumer stating no budget keeps its
    248, so the producer's 256 alone is too many)."""
    _refused(stated_gemm, marker, "registers, over the", "Lower a budget", **tiles, **regs)


def test_the_largest_budgets_that_fit_are_taken():
    """At the edge: 128 x 40 + 256 x 232 = 64512 = 384 x 168 exactly."""
    source = build(stated_gemm, dict(BM=128, BN=256, BK=64, STAGES=4, threads=256, P=40,
                                     C=232), None, "sm_90a").cuda_source()
    assert "setmaxnreg.inc.sync.aligned.u32 232" in source


@tg.kernel(threads=128)
def stage_read_after(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16]):
    ga = a.tile((64, 32), (tg.block_id(0), None))
    gb = b.tile((64, 32), (tg.block_id(1), None))
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((64, 32), f16, stages=2)
    sb = tg.shared((64, 32), f16, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=2):
        with tg.producer():  # MARK-raced-producer
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
        with tg.consumer():
            tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc.to(f16), c.tile((64, 64), (tg.block_id(0), tg.block_id(1))))
    tg.copy(sa[0], c.tile((64, 32), (tg.block_id(0), 0)))  # the producer may still write it


def test_a_stage_buffer_used_after_the_pipeline_is_refused():
    _refused(stage_read_after, "MARK-raced-producer", "cannot be warp-specialized",
             "also used outside the pipeline")



def test_arguments_that_rule_out_tma_are_refused_not_run_on_one_role():
    """K = 70: a's rows are 140 bytes, not a multiple of 16, so no tensor map: the plain
    kernel would fall back to cp.async, the stated roles cannot and say why."""
    a, b = np.ones((64, 70), np.float16), np.ones((64, 70), np.float16)
    c = np.zeros((64, 64), np.float16)
    with pytest.raises(SynthesisError) as info:
        tg.emulate(stated_gemm, (1, 1), a, b, c, BM=64, BN=64, target="sm_90a")
    assert info.value.loc.lineno == marked_line(__file__, "MARK-copy-a")
    assert "not a TMA box" in info.value.message and "multiple of 16 bytes" in info.value.message


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_a_consumer_that_never_releases_a_stage_is_a_deadlock_naming_both_roles(role_order):
    """An injected bug in a stated-roles kernel is reported like one in a synthesized
    split: a deadlock naming each role, at its tg.producer / tg.consumer line, and the
    barrier the producer waits on."""
    import copy

    from async_kernels import remove, role_body

    from tegula.emulate import EmulationError, run_thread_kernel
    from tegula.lower.async_ir import MBarrierArrive
    tk = copy.deepcopy(build(stated_gemm, dict(BM=64, BN=64, STAGES=2), None,
                             "sm_90a").thread_kernel)
    empty = next(m.name for m in tk.mbarriers if m.name.startswith("empty"))
    assert remove(role_body(tk, "consumer"),
                  lambda s: isinstance(s, MBarrierArrive) and s.barrier == empty) == 1
    rng = np.random.default_rng(4)
    a, b = random_input(rng, (70, 160), f16), random_input(rng, (60, 160), f16)
    with pytest.raises(EmulationError) as info:                    # 5 k-tiles > 2 stages
        run_with_deadline(lambda: run_thread_kernel(
            tk, (2, 1), {"a": a, "b": b, "c": poisoned((70, 60), f16)},
            role_order=role_order))
    text = str(info.value)
    assert "deadlock" in text.lower() and empty in text
    for role in ("consumer", "producer"):  # each named at its own block's line
        line = marked_line(__file__, f"MARK-{role}")
        assert f"test_stated_roles.py:{line}: {role} of the tg.pipeline" in text, text


@tg.kernel(threads=128)
def stated_cluster_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                        BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
                        STAGES: tg.constexpr = 3, GROUP: tg.constexpr = 8,
                        CLUSTER: tg.constexpr = 2):
    """examples/persistent_gemm.py's loop (tegula.kernels.gemm.persistent_tiles) with its
    clusters, written out with role blocks: the blocks of a cluster share b's boxes."""
    from tegula.kernels.schedule import grouped_tile
    tg.cluster(CLUSTER)
    tiles_m = tg.cdiv(tg.cdiv(a.shape[0], BM), CLUSTER)
    tiles_n = tg.cdiv(b.shape[0], BN)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for t in tg.range(tg.block_id(0) // CLUSTER, tiles_m * tiles_n,
                      tg.num_programs(0) // CLUSTER):
        mc, n = grouped_tile(t, tiles_m, tiles_n, GROUP)
        m = mc * CLUSTER + tg.block_id(0) % CLUSTER
        ga = a.tile((BM, BK), (m, None))
        gb = b.tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), f32)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            with tg.producer():
                tg.copy(ga[:, :, k], sa[k])
                tg.copy(gb[:, :, k], sb[k])
            with tg.consumer():
                tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


@pytest.mark.parametrize("role_order", ["random:5"])
def test_stated_roles_in_clusters_multicast_like_the_synthesized_split(role_order):
    """Two-block clusters: b's box multicast, a stage released on both blocks; the same
    CUDA as examples/persistent_gemm.py at CLUSTER=2, and the same bits."""
    tiles = dict(BM=64, BN=64, BK=32, STAGES=3, GROUP=2, CLUSTER=2)
    assert code(stated_cluster_gemm, **tiles) == code(persistent_gemm, **tiles)
    assert ".multicast::cluster" in build(stated_cluster_gemm, tiles, None,
                                          "sm_90a").cuda_source()
    m, n, k, sms = 200, 150, 136, 4
    grid = persistent_grid(m, n, sms, 64, 64, cluster=2)
    a, b, c, report = _emulate(stated_cluster_gemm, grid, m, n, k, 6, role_order,
                               num_sms=sms, **tiles)
    _check(c, a, b)
    _, _, plain, _ = _emulate(persistent_gemm, grid, m, n, k, 6, role_order, num_sms=sms,
                              **tiles)
    assert np.array_equal(c.view(np.uint16), plain.view(np.uint16))


def _count_staged(stated: bool):
    """More than the gemm in the consumer (the wgmmas retire inside each iteration and
    every consumer thread releases the stage) and an epilogue through a shared buffer of
    the consumer's own (its barriers become named barriers of the consumer role)."""

    @tg.kernel(threads=128)
    def count_staged(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                     steps: tg.Tensor[f32]):
        m, n = tg.block_id(0), tg.block_id(1)
        ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
        acc = tg.zeros((64, 64), f32)
        count = tg.zeros((64, 64), f32)
        sa, sb = tg.shared((64, 32), f16, stages=3), tg.shared((64, 32), f16, stages=3)
        for k in tg.pipeline(ga.shape[2], stages=3):
            if stated:
                with tg.producer():
                    tg.copy(ga[:, :, k], sa[k])
                    tg.copy(gb[:, :, k], sb[k])
                with tg.consumer(regs=200):
                    tg.gemm(acc, sa[k], sb[k])
                    count = count + 1.0
            else:
                tg.copy(ga[:, :, k], sa[k])
                tg.copy(gb[:, :, k], sb[k])
                tg.gemm(acc, sa[k], sb[k])
                count = count + 1.0
        staged = tg.shared((64, 64), f16)
        tg.copy(acc.to(f16), staged)
        tg.copy(staged, c.tile((64, 64), (m, n)))
        tg.copy(count, steps.tile((64, 64), (m, n)))

    return count_staged


def test_a_consumer_block_with_more_than_the_gemm_and_a_loop_carried_tile():
    """`count = count + 1.0` rebinds a tile inside the consumer block: carried like in any
    loop (the carry's copy lands after the blocks, in the consumer). The same CUDA as the
    plain kernel but for the consumer's budget, and right in the emulator."""
    stated, plain = _count_staged(True), _count_staged(False)
    source = code(stated)
    assert "setmaxnreg.dec.sync.aligned.u32 200" in source
    def without_budgets(text):
        return "\n".join(line for line in text.splitlines() if "setmaxnreg" not in line)
    assert without_budgets(source) == without_budgets(code(plain, warp_specialize=True))
    rng = np.random.default_rng(7)
    a, b = random_input(rng, (100, 328), f16), random_input(rng, (70, 328), f16)
    c, steps = poisoned((100, 70), f16), poisoned((100, 70), f32)
    run_with_deadline(lambda: tg.emulate(stated, (2, 2), a, b, c, steps, target="sm_90a",
                                         role_order="random:2"))
    _check(c, a, b)
    assert np.all(steps == 11)                                      # ceil(328 / 32)


@tg.kernel(threads=128)
def stated_odd(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
               STAGES: tg.constexpr = 2, GEMM: tg.constexpr = True):
    """Stated roles where the stage loads cannot be TMA boxes for a reason TMA planning
    does not record on the copy: one stage, no gemm, or a gemm that is not on wgmma."""
    ga = a.tile((64, 32), (tg.block_id(0), None))
    gb = b.tile((64, 32), (tg.block_id(1), None))
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((64, 32), f16, stages=2)
    sb = tg.shared((64, 32), f16, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        with tg.producer():
            tg.copy(ga[:, :, k], sa[k])  # MARK-odd-copy
            tg.copy(gb[:, :, k], sb[k])
        with tg.consumer():
            if GEMM:
                tg.gemm(acc, sa[k], sb[k])
            else:
                acc += tg.sum(tg.load(sa[k]).to(f32), 1) + tg.sum(tg.load(sb[k]).to(f32), 1)
    tg.copy(acc, c.tile((64, 64), (tg.block_id(0), tg.block_id(1))))


@pytest.mark.parametrize("options, why", [
    (dict(STAGES=1), "the tg.pipeline has stages=1"),
    (dict(GEMM=False), "it is not an operand of a wgmma gemm"),
    (dict(threads=64), "reading it does not run on wgmma: "),
], ids=["one-stage", "no-gemm", "64-threads"])
def test_stage_loads_tma_planning_passed_over_are_refused_with_the_reason(options, why):
    _refused(stated_odd, "MARK-odd-copy", "not a TMA box", why, **options)
