"""2-CTA clusters with TMA multicast for the persistent GEMM (examples/persistent_gemm.py
with CLUSTER=2; `tg.cluster`, `synth/roles.py` decide_multicast, `lower/hopper.py`).

The two blocks of a cluster take row tiles m = 2*mc and 2*mc+1 of the same column tile n:
b's box is the same for both, so each block's producer loads half of its rows into both
blocks' shared memory (`.multicast::cluster`), and a stage is free only once the
consumers of both blocks released it (remote arrives). Emulated against numpy with the
blocks of each cluster running together: ragged shapes, more and fewer tile pairs than
clusters, an odd number of row tiles (the second block's last tile lies past M: it still
takes part in the multicast, loads zeros and stores nothing), one-iteration and empty K
loops, every stage count, both role orders, bit-identical to CLUSTER=1. Injected bugs (a
missing remote arrive, no cluster barrier at exit, none after the inits) are reported,
not hung."""
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
from tegula.dtypes import f16
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.errors import TraceError
from tegula.kernels.common import poisoned, random_input
from tegula.lower.async_ir import ClusterBarrier, MBarrierArrive, MBarrierInit, Roles, TmaLoad
from tegula.lower.thread_ir import Barrier, walk

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "emulate"))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernels"))
from async_kernels import remove, role_body, run_with_deadline  # noqa: E402
from test_gemm import check_gemm  # noqa: E402


def _example():
    spec = importlib.util.spec_from_file_location("persistent_gemm_cluster_example",
                                                  ROOT / "examples" / "persistent_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PERSISTENT = _example()
KERNEL = PERSISTENT.persistent_gemm
#: The cooperative schedule (one consumer role), whose structure these tests check: at
#: one warpgroup's tile synthesis would take ping-pong by default, whose clustered form
#: tests/lower/test_hopper_pingpong.py emulates.
SMALL = dict(BM=64, BN=64, BK=32, GROUP=2, consumers="cooperative")


def emulate(m, n, k, sms, cluster=2, seed=0, role_order="listed", **config):
    """(a, b, c, report) of the persistent kernel with CLUSTER=`cluster` on the grid
    `persistent_grid` gives for `sms` SMs."""
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    config = {**SMALL, "STAGES": 3, **config}
    grid = PERSISTENT.persistent_grid(m, n, sms, config["BM"], config["BN"], cluster)
    report = run_with_deadline(lambda: tg.emulate(
        KERNEL, grid, a, b, c, target="sm_90a", role_order=role_order, num_sms=sms,
        CLUSTER=cluster, **config))
    return a, b, c, report


def bits(x):
    return x.view(np.uint16)


# ------------------------------------------------------------------ right in the emulator

#: (M, N, K, SMs). Row tiles of 64: 2 (one pair), 3 (odd: the second block's last tile is
#: past M), 5, 4; pairs of tiles against clusters: more pairs than clusters (4 SMs = 2
#: clusters walking 3..6 pairs), fewer (idle clusters), one cluster doing every pair.
SHAPES = [(100, 130, 72, 4), (150, 70, 200, 4), (300, 200, 40, 2), (250, 129, 96, 12),
          (97, 64, 64, 16)]


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cluster_multicast_is_right_and_equals_one_block_per_tile(shape, role_order):
    m, n, k, sms = shape
    a, b, c, report = emulate(m, n, k, sms, seed=m + k, role_order=role_order)
    assert report.grid[0] % 2 == 0 and report.kind("TmaLoad").count > 0
    check_gemm(c, a, b, f16)
    # The same k16 steps in the same order as without a cluster: the very same bits.
    _, _, alone, _ = emulate(m, n, k, sms, cluster=1, seed=m + k)
    assert np.array_equal(bits(c), bits(alone))


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
@pytest.mark.parametrize("k", [32, 72, 160], ids=["1-k-tile", "3-k-tiles", "5-k-tiles"])
def test_every_stage_count_with_k_loops_shorter_and_longer_than_the_ring(stages, k):
    a, b, c, _ = emulate(150, 130, k, 4, seed=stages * k, STAGES=stages)
    check_gemm(c, a, b, f16)


def test_two_consumer_warpgroups_and_the_benchmark_tiles():
    """threads=256, 128x128x64 tiles (the bench's 128x256 is the same code, slower here)."""
    config = dict(BM=128, BN=128, BK=64, STAGES=4, threads=256)
    a, b, c, report = emulate(300, 260, 136, 4, seed=5, **config)
    assert report.threads == 256 + 128
    check_gemm(c, a, b, f16)


def test_empty_k_loop_does_not_deadlock_and_writes_zeros():
    """K = 0: no box, no release; both blocks still meet at the cluster barriers and store
    their zero accumulators. (Arrays of K = 0 prove no TMA facts: run the build's IR.)"""
    tk = build(KERNEL, dict(SMALL, STAGES=3, CLUSTER=2), None, "sm_90a").thread_kernel
    assert tk.cluster == (2, 1, 1)
    a, b = np.zeros((130, 0), np.float16), np.zeros((70, 0), np.float16)
    c = poisoned((130, 70), f16)
    run_with_deadline(lambda: run_thread_kernel(tk, (4,), {"a": a, "b": b, "c": c},
                                                num_sms=4))
    assert np.array_equal(c, np.zeros((130, 70), np.float16))


def test_the_one_role_pipeline_takes_the_cluster_without_multicast():
    """warp_specialize=False: the one-role ring is not multicast (explain says why); the
    clustered launch is still right."""
    a, b, c, report = emulate(150, 130, 72, 4, warp_specialize=False)
    check_gemm(c, a, b, f16)
    tk = thread_kernel(warp_specialize=False)
    assert tk.cluster == (2, 1, 1) and not any(isinstance(s, Roles) for s in tk.body)
    assert all(s.multicast == 0 for s in walk(tk.body) if isinstance(s, TmaLoad))


# ------------------------------------------------------------------ structure


def thread_kernel(**config):
    return build(KERNEL, {**SMALL, "STAGES": 3, "CLUSTER": 2, **config}, None,
                 "sm_90a").thread_kernel


def test_structure_multicast_b_remote_releases_and_cluster_barriers():
    tk = thread_kernel()
    assert tk.cluster == (2, 1, 1)
    loads = [s for s in walk(role_body(tk, "producer")) if isinstance(s, TmaLoad)]
    by_tensor = {tk_param.tensor: tk_param for tk_param in tk.params
                 if type(tk_param).__name__ == "TensorMapParam"}
    # a: its own box (coordinates read the rank); b: half its 64 rows, to both blocks.
    assert sorted(s.multicast for s in loads) == [0, 3]
    assert by_tensor["b"].box == (32, 32) and by_tensor["a"].box == (32, 64)
    # Both blocks' consumers release every stage: 4 warps x 2 blocks per empty barrier.
    inits = [s for s in walk(tk.body) if isinstance(s, MBarrierInit)]
    assert sorted({s.count for s in inits if s.barrier.startswith("empty")}) == [8]
    remote = [s for s in walk(role_body(tk, "consumer"))
              if isinstance(s, MBarrierArrive) and s.barrier.startswith("empty")]
    assert remote and all(s.cta is not None for s in remote)
    assert sorted({s.cta.value for s in remote}) == [0, 1]
    # The cluster meets after the inits and once more after the roles, before exit.
    assert isinstance(tk.body[-1], ClusterBarrier)
    assert sum(isinstance(s, ClusterBarrier) for s in walk(tk.body)) == 2


def test_cluster_1_is_the_unclustered_kernel():
    tk = thread_kernel(CLUSTER=1)
    assert tk.cluster == (1, 1, 1)
    assert not any(isinstance(s, ClusterBarrier) for s in walk(tk.body))
    assert all(s.multicast == 0 for s in walk(tk.body) if isinstance(s, TmaLoad))


def test_explain_shows_the_cluster_and_what_is_multicast():
    text = tg.explain(KERNEL, target="sm_90a", BM=128, BN=256, BK=64, STAGES=4, threads=256,
                      CLUSTER=2)
    assert ("cluster 2x1: b's box is the same in every block, so each loads 128 of its 256 "
            "rows into all 2; a's box differs between the blocks") in text
    assert "a stage is free once the consumers of every block released it" in text


@tg.kernel(threads=128)
def rank_strided(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16]):
    """A persistent loop over single tiles with a cluster: the blocks of a cluster walk
    different tiles (and maybe different counts of them), so nothing may be multicast."""
    tg.cluster(2)
    tiles_n = tg.cdiv(b.shape[0], 64)
    sa, sb = tg.shared((64, 32), f16, stages=3), tg.shared((64, 32), f16, stages=3)
    for t in tg.range(tg.block_id(0), tg.cdiv(a.shape[0], 64) * tiles_n, tg.num_programs(0)):
        m, n = t // tiles_n, t % tiles_n
        ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
        acc = tg.zeros((64, 64), tg.f32)
        for k in tg.pipeline(ga.shape[2], stages=3):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), c.tile((64, 64), (m, n)))


def test_blocks_walking_different_tiles_are_not_multicast_and_stay_right():
    result = build(rank_strided, {}, None, "sm_90a")
    assert all(s.multicast == 0 for s in walk(result.thread_kernel.body)
               if isinstance(s, TmaLoad))
    text = tg.explain(rank_strided, target="sm_90a")
    assert "no box is multicast: the loop at line" in text
    rng = np.random.default_rng(2)
    a, b = random_input(rng, (200, 72), f16), random_input(rng, (130, 72), f16)
    c = poisoned((200, 130), f16)
    run_with_deadline(lambda: tg.emulate(rank_strided, (4,), a, b, c, target="sm_90a"))
    check_gemm(c, a, b, f16)


@tg.kernel(threads=128)
def pairs_along_n(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                  STAGES: tg.constexpr = 3):
    """The other cluster shape over the tile grid (1x2): the two blocks of a cluster take
    column tiles 2*nc and 2*nc+1 of one row tile, so a's box is the one they share."""
    tg.cluster(2)
    tiles_m = tg.cdiv(a.shape[0], 64)
    pairs_n = tg.cdiv(tg.cdiv(b.shape[0], 64), 2)
    sa, sb = tg.shared((64, 32), f16, stages=STAGES), tg.shared((64, 32), f16, stages=STAGES)
    for t in tg.range(tg.block_id(0) // 2, tiles_m * pairs_n, tg.num_programs(0) // 2):
        m, n = t % tiles_m, (t // tiles_m) * 2 + tg.block_id(0) % 2
        ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
        acc = tg.zeros((64, 64), tg.f32)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), c.tile((64, 64), (m, n)))


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
@pytest.mark.parametrize("shape", [(130, 150, 104, 4), (64, 70, 40, 2), (200, 300, 72, 6)],
                         ids=lambda s: "x".join(map(str, s)))
def test_pairs_sharing_a_row_tile_multicast_a(shape, role_order):
    """Odd column-tile counts (150 and 300 columns: 3 and 5 tiles, so the last pair's
    second block has no tile: it loads zeros and stores nothing; 70: 2 tiles, the second
    partial)."""
    m, n, k, grid = shape
    tk = build(pairs_along_n, {}, None, "sm_90a").thread_kernel
    loads = {s.tensor_map: s.multicast for s in walk(role_body(tk, "producer"))
             if isinstance(s, TmaLoad)}
    assert sorted(loads.values()) == [0, 3]
    shared = next(name for name, mask in loads.items() if mask)
    assert shared.startswith("a")
    rng = np.random.default_rng(m + n)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    run_with_deadline(lambda: tg.emulate(pairs_along_n, (grid,), a, b, c, target="sm_90a",
                                         role_order=role_order))
    check_gemm(c, a, b, f16)


def test_a_cluster_on_a_target_without_clusters_is_refused_at_its_line():
    from tegula.errors import SynthesisError
    with pytest.raises(SynthesisError, match=r"tg.cluster\(2, 1\): thread-block clusters need "
                                             r"sm_90 or newer; the target is sm_80") as info:
        build(KERNEL, {**SMALL, "CLUSTER": 2}, None, "sm_80")
    assert "tg.cluster(CLUSTER)" in str(info.value)          # the line that declared it
    build(KERNEL, {**SMALL, "CLUSTER": 1}, None, "sm_80")    # no cluster: the Ampere path


def test_cluster_declarations_are_checked():
    @tg.kernel(threads=128)
    def too_big(a: tg.Tensor[f16]):
        tg.cluster(4, 4)

    with pytest.raises(TraceError, match="over the portable 8"):
        build(too_big, {}, None, "sm_90a")

    @tg.kernel(threads=128)
    def not_an_int(a: tg.Tensor[f16]):
        tg.cluster(2.0)

    with pytest.raises(TraceError, match="positive Python ints"):
        build(not_an_int, {}, None, "sm_90a")


# ------------------------------------------------------------------ injected bugs


def inputs(m=150, n=130, k=72, seed=1):
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    return {"a": a, "b": b, "c": poisoned((m, n), f16)}


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_a_missing_remote_release_is_a_deadlock_report_naming_each_block_and_role(role_order):
    """The consumer no longer releases the peer's stages: the peer's producer waits on its
    empty barrier forever; every block ends blocked, and the report says where."""
    tk = copy.deepcopy(thread_kernel())
    consumer = role_body(tk, "consumer")
    assert remove(consumer, lambda s: isinstance(s, MBarrierArrive) and s.cta is not None
                  and s.cta.value == 1) == 2
    with pytest.raises(EmulationError, match="every block of the cluster is blocked") as info:
        run_with_deadline(lambda: run_thread_kernel(tk, (4,), inputs(), num_sms=4,
                                                    role_order=role_order))
    text = str(info.value)
    assert "block (0, 0, 0)" in text and "block (1, 0, 0)" in text
    assert "producer of the tg.pipeline" in text and "empty" in text


def test_exit_without_the_cluster_barrier_is_reported():
    """With no cluster barrier before exit, a block can finish while its peer still
    releases stages into its shared memory (undefined on the GPU)."""
    tk = copy.deepcopy(thread_kernel())
    assert isinstance(tk.body[-1], ClusterBarrier)
    tk.body.pop()
    with pytest.raises(EmulationError, match="has already exited"):
        run_with_deadline(lambda: run_thread_kernel(tk, (2,), inputs(m=64, n=64, k=96),
                                                    num_sms=2))


def test_remote_use_before_the_cluster_barrier_is_reported():
    """The setup's cluster barrier made a block barrier: a peer's remote arrive or
    multicast box may reach a barrier whose init it cannot see yet."""
    tk = copy.deepcopy(thread_kernel())
    first = next(i for i, s in enumerate(tk.body) if isinstance(s, ClusterBarrier))
    tk.body[first] = Barrier()
    with pytest.raises(EmulationError, match="not visible to the peer"):
        run_with_deadline(lambda: run_thread_kernel(tk, (2,), inputs(m=64, n=64, k=96),
                                                    num_sms=2))


def test_a_multicast_mask_past_the_cluster_is_reported():
    tk = copy.deepcopy(thread_kernel())
    for s in walk(role_body(tk, "producer")):
        if isinstance(s, TmaLoad) and s.multicast:
            s.multicast = 0b111
    with pytest.raises(EmulationError, match="CTA rank 2 outside the cluster"):
        run_with_deadline(lambda: run_thread_kernel(tk, (2,), inputs(m=64, n=64, k=96),
                                                    num_sms=2))


def test_the_cuda_source_multicasts_and_arrives_remotely():
    source = build(KERNEL, {**SMALL, "STAGES": 3, "CLUSTER": 2}, None,
                   "sm_90a").cuda_source()
    assert ".multicast::cluster" in source
    assert "mapa.shared::cluster.u32" in source
    assert source.count("barrier.cluster.arrive.release.aligned") == 2
    assert any(isinstance(s, Roles) for s in thread_kernel().body)
