"""The cost model on row kernels (softmax, RMSNorm: load the rows outside any loop, reduce,
store): a block's load chain counts the bytes it reads, not its stores (posted: the block
retires once they issue; the grid's DRAM time still counts them), and such a grid waits
for one fill, not one per round of resident blocks (its chain holds the load latency)."""
from __future__ import annotations

import pytest

from tegula.build import build
from tegula.dtypes import f16
from tegula.kernels.softmax import softmax_kernel
from tegula.synth.cost import (BARRIER_CYCLES, DRAM_STREAM_EFFICIENCY, LAUNCH_US,
                               LOADED_LOAD_LATENCY_CYCLES, estimate)

M, N = 2048, 8192
SHAPES = dict(x=(M, N), y=(M, N))


def softmax_estimate(bm: int, threads: int):
    built = build(softmax_kernel(f16), dict(BM=bm, BN=N, threads=threads), None, "sm_90a")
    return built, estimate(built, (M // bm,), SHAPES)


def test_the_load_chain_counts_reads_not_stores():
    """Four rows of 8,192 a block, one block per SM: the chain is the load latency, the
    block's 64 KB of reads at its SM's DRAM share, its work and its barriers; its 64 KB of
    stores are in the grid's DRAM time only (counted in the chain, it was predicted 1.6x
    the copy's time, measured 1.17x on an H100)."""
    built, est = softmax_estimate(4, 512)
    target = built.target
    res = dict(est.resources)
    assert est.blocks_per_sm == 1
    per_clk = target.dram_gbps * DRAM_STREAM_EFFICIENCY / target.clock_ghz
    reads = 4 * N * 2 * target.sm_count / per_clk
    barriers = res["barrier latency"]          # one block: its barriers, unshared
    assert barriers == 6 * BARRIER_CYCLES
    assert res["load chain"] == pytest.approx(LOADED_LOAD_LATENCY_CYCLES + reads
                                              + res["pipes"] + barriers)
    assert res["DRAM"] == pytest.approx(2 * reads, rel=1e-3)   # reads and writes


def test_a_row_grid_waits_for_one_fill():
    """Sixteen one-row blocks an SM, several at a time, bound by DRAM: the grid's time is
    its busiest SM's DRAM time plus one load latency and the launch, not one latency per
    round of resident blocks."""
    built, est = softmax_estimate(1, 256)
    assert est.bound == "DRAM" and 1 < est.blocks_per_sm < 16
    launch = LAUNCH_US * 1e3 * built.target.clock_ghz
    sm_dram = est.dram_cycles / est.blocks_per_sm * M / built.target.sm_count
    assert est.grid_cycles == pytest.approx(sm_dram + est.latency_cycles + launch)
