"""A wgmma pipeline on cp.async drains its wgmmas every k-step (`wgmma.wait_group 0` and a
block barrier before the stage is refilled by the same warps), so its tensor work and its
stage's L2 bytes do not overlap. The model had tied such builds with their TMA twins
(L2-bound both); on the H100 (2026-11-24, 4096^3) the cp.async builds ran 1.2-1.6x slower
at 3-4 stages, and `tg.recommend`'s pick over both load paths was a cp.async build 1.37x
off the best."""
from __future__ import annotations

import os
import sys

import pytest

from tegula.build import build
from tegula.recommend import _facts
from tegula.synth.cost import drained_wgmma_loops, estimate

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from gemm import gemm  # noqa: E402  (the README GEMM)

SHAPES = {k: (4096, 4096) for k in "abc"}
TILES = dict(BM=128, BN=256, BK=64, STAGES=4, threads=256)
GRID = (32, 16)


def _build(target="sm_90a", **options):
    return build(gemm, dict(TILES, **options), _facts(gemm, SHAPES), target)


def test_cp_async_wgmma_pipeline_is_slower_than_its_tma_twin():
    tma, cp = _build(load_path="tma"), _build(load_path="cp.async")
    assert drained_wgmma_loops(tma.thread_kernel) == set()    # the ring keeps one in flight
    assert drained_wgmma_loops(cp.thread_kernel) == {"i0"}
    fast, slow = estimate(tma, GRID, SHAPES), estimate(cp, GRID, SHAPES)
    assert "drained wgmma loop" not in dict(fast.resources)
    assert slow.bound == "drained wgmma loop"
    assert slow.seconds > 1.2 * fast.seconds
    # Per k-step: the tensor work plus the stage's bytes at the SM's share of L2.
    k_steps = 4096 // 64
    tensor = slow.tensor_cycles / k_steps
    stage = (128 + 256) * 64 * 2 * cp.target.sm_count / cp.target.l2_bytes_per_clk
    assert dict(slow.resources)["drained wgmma loop"] == pytest.approx(
        k_steps * (tensor + stage))


def test_mma_sync_pipelines_are_not_drained_loops():
    built = build(gemm, dict(BM=128, BN=128, BK=32, STAGES=3), _facts(gemm, SHAPES), "sm_80")
    assert drained_wgmma_loops(built.thread_kernel) == set()
    assert "drained wgmma loop" not in dict(estimate(built, (32, 32), SHAPES).resources)
