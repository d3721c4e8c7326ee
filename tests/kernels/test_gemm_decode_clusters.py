"""The library's one-block-per-tile GEMM (`kernels.gemm.gemm_kernel`) in thread-block
clusters (CLUSTER_M x CLUSTER_N, sm_90a): the decode tiles — few rows, narrow N tiles —
where the blocks of a cluster along N share their a tile (TMA multicast) and along M
their b tile. Emulated against numpy at shapes whose tile counts are no multiple of the
cluster (the grid is rounded up: `tile_grid`; the extra blocks load zeros and store
nothing), every element checked, outputs poisoned first; random role interleavings."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import bf16, f16
from tegula.kernels.common import poisoned, random_input
from tegula.kernels.gemm import gemm_emulated, gemm_kernel, tile_grid

sys.path.insert(0, os.path.dirname(__file__))
from test_gemm import check_gemm  # noqa: E402


def test_tile_grid_rounds_each_axis_up_to_whole_clusters():
    assert tile_grid(64, 4096, 64, 32, 1, 4) == (1, 128)
    assert tile_grid(50, 200, 64, 32, 1, 4) == (1, 8)      # 7 column tiles -> 8
    assert tile_grid(130, 200, 64, 64, 2, 2) == (4, 4)     # 3 row tiles -> 4, 4 -> 4
    assert tile_grid(130, 200, 64, 64) == (3, 4)


@pytest.mark.parametrize("m, n, k, tiles", [
    (50, 200, 136, dict(BM=64, BN=32, BK=64, STAGES=4, CLUSTER_N=4)),   # 7 of 8 tiles
    (16, 96, 520, dict(BM=64, BN=32, BK=64, STAGES=3, CLUSTER_N=2)),    # M=16, long K
    (130, 70, 72, dict(BM=64, BN=32, BK=32, STAGES=2, CLUSTER_M=2, CLUSTER_N=2)),
    (9, 33, 8, dict(BM=64, BN=32, BK=64, STAGES=2, CLUSTER_N=4)),        # one partial k
])
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_clustered_gemm_matches_numpy(dtype, m, n, k, tiles):
    rng = np.random.default_rng(m * 31 + n + k)
    a, b = random_input(rng, (m, k), dtype), random_input(rng, (n, k), dtype)
    c = gemm_emulated(a, b, dtype, **tiles)
    check_gemm(c, a, b, dtype)


def test_clustered_gemm_under_random_role_orders():
    rng = np.random.default_rng(7)
    m, n, k = 40, 150, 200
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    tiles = dict(BM=64, BN=32, BK=64, STAGES=3, CLUSTER_N=4)
    for seed in range(3):
        c = poisoned((m, n), f16)
        tg.emulate(gemm_kernel(f16), tile_grid(m, n, 64, 32, 1, 4), a, b, c,
                   role_order=f"random:{seed}", **tiles)
        check_gemm(c, a, b, f16)


def test_the_a_box_is_multicast_along_n_and_b_along_m():
    """explain's note names the multicast; a cluster of 1 has none."""
    text = tg.explain(gemm_kernel(f16), BM=64, BN=32, BK=64, STAGES=4, CLUSTER_N=4)
    assert "multicast" in text and "clusters of 4" in text
    plain = tg.explain(gemm_kernel(f16), BM=64, BN=32, BK=64, STAGES=4)
    assert "multicast" not in plain
    built = build(gemm_kernel(f16), dict(BM=64, BN=32, BK=64, STAGES=4, CLUSTER_N=4),
                  None, "sm_90a")
    assert "multicast::cluster" in built.cuda_source()
