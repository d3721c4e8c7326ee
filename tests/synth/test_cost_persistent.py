"""The cost model on the persistent GEMM: its tile loop steps by the grid
(`tg.num_programs`), so the model must know the launch's grid to count the tiles a block
runs (it counted one tile a block, predicting a 4096^3 GEMM 2.5x faster than the tensor
cores allow); and in clusters, a multicast box is read from L2 once for the cluster (every
SM still receives it) while each stage waits on every block of the cluster
(`CLUSTER_COUPLING_CYCLES`)."""
from __future__ import annotations

import pytest

from tegula.build import build
from tegula.dtypes import f16
from tegula.kernels.gemm import persistent_gemm_kernel, persistent_grid
from tegula.recommend import _facts
from tegula.synth import cost
from tegula.synth.cost import estimate

M, N, K = 1000, 1500, 264         # ragged in every dimension: 8 x 6 tiles of 128 x 256
TILES = dict(BM=128, BN=256, BK=64, STAGES=4, threads=256)
SHAPES = dict(a=(M, K), b=(N, K), c=(M, N))


def _estimate(cluster: int, sms: int = 132):
    kernel = persistent_gemm_kernel(f16)
    built = build(kernel, dict(TILES, CLUSTER=cluster), _facts(kernel, SHAPES), "sm_90a")
    grid = persistent_grid(M, N, sms, TILES["BM"], TILES["BN"], cluster)
    return estimate(built, grid, SHAPES)


@pytest.mark.parametrize("sms", [132, 20, 7])
def test_the_busiest_block_runs_its_share_of_every_tile(sms):
    """48 tiles over min(48, sms) blocks, all resident at once: the grid lasts as long as
    the block with the most tiles (20 blocks: 3 tiles, not the average 2.4)."""
    est = _estimate(1, sms)
    assert not est.unresolved_loops
    tiles = -(-M // 128) * -(-N // 256)          # boundary tiles count as full tiles
    k_steps = -(-K // 64)
    assert est.blocks == min(tiles, sms)
    busiest = -(-tiles // est.blocks)
    assert est.flops == pytest.approx(2 * 128 * 256 * 64 * k_steps * busiest)


def test_cluster_multicast_still_lands_every_byte_in_each_sm():
    """Multicast reads b's box from L2 once for the pair, but each SM receives all of it:
    the bytes the model's L2 -> SM term counts stay those of a block alone (on the H100,
    clusters of 2 never ran faster)."""
    alone, pair = _estimate(1), _estimate(2)
    assert not pair.unresolved_loops
    assert alone.blocks == pair.blocks == 48      # 8 x 6 tiles, one a block
    assert pair.global_bytes == alone.global_bytes
    assert dict(pair.resources)["L2"] == dict(alone.resources)["L2"]


def test_cluster_coupling_is_paid_per_stage(monkeypatch):
    """The coupling cost enters the multicast ring's per-stage latency and nothing else:
    a cluster with no coupling cost waits less than one with it."""
    coupled = dict(_estimate(2).resources)["load latency"]
    monkeypatch.setattr(cost, "CLUSTER_COUPLING_CYCLES", 0)
    free = dict(_estimate(2).resources)["load latency"]
    alone = dict(_estimate(1).resources)["load latency"]
    assert coupled > free
    # Without coupling, a multicast stage waits as long as a stage of its own box.
    assert free == pytest.approx(alone)


def test_explain_says_what_the_cluster_changed():
    pair_notes = " ".join(_estimate(2).notes)
    k_steps = -(-K // 64)
    saved = 256 * 64 * 2 * k_steps / 2             # one tile a block (48 blocks)
    assert f"clusters of 2: multicast TMA boxes take {saved:,.0f} B per block off L2 reads" \
        in pair_notes
    assert f"waits {cost.CLUSTER_COUPLING_CYCLES} cycles more" in pair_notes
    assert not any("clusters of" in n for n in _estimate(1).notes)
