"""What pipeline stages buy and what they cost: a deeper pipeline shortens each k-step's
load wait, and its shared memory can cost resident blocks, which hide each other's waits.

Measured on an H100 (2026-11-24), the mma.sync README GEMM (built for sm_90) at 4096^3:
  128x128x32, 128 threads, 2 blocks per SM: 2 / 3 / 4 stages 425 / 353 / 343 us
  128x128x64, 256 threads: 2 / 3 stages at 2 blocks per SM 393 / 400 us, 4 stages (128 KB
    of shared memory) at 1 block per SM 494 us (ptxas: 128 registers; the estimate says
    136, 1 block per SM at any stage count: the model misses this one)
and the wgmma GEMM on cp.async (a loop that drains its wgmmas each k-step) at 4096^3,
128x128x64, 256 threads: 3 stages at 2 blocks per SM 280 us, 4 stages at 1 334 us.
The model had predicted the same time for every stage count of each tile (the load wait
and the block's work were combined by their maximum, and the register estimate put
128x128x64 at 1 block per SM whatever its stages).
"""
from __future__ import annotations

import os
import sys

from tegula.build import build
from tegula.synth import cost
from tegula.recommend import _facts
from tegula.synth.cost import estimate
from tegula.synth.registers import estimate_registers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from gemm import gemm  # noqa: E402  (the README GEMM)

SHAPES = {k: (4096, 4096) for k in "abc"}


def _estimate(target="sm_90", **tiles):
    built = build(gemm, tiles, _facts(gemm, SHAPES), target)
    return estimate(built, (4096 // tiles["BM"], 4096 // tiles["BN"]), SHAPES)


def test_two_stages_of_a_short_k_step_wait_for_their_loads():
    two, three, four = (_estimate(BM=128, BN=128, BK=32, STAGES=s, threads=128)
                        for s in (2, 3, 4))
    assert two.blocks_per_sm == three.blocks_per_sm == four.blocks_per_sm == 2
    assert two.seconds > 1.05 * three.seconds         # measured 1.20x
    assert three.seconds >= four.seconds


def test_fewer_resident_blocks_hide_less_of_the_wait(monkeypatch):
    # The same build at 2 and at 1 block per SM: the block's load wait is shared by fewer
    # blocks, and hidden less (with the maximum of wait and work, both predicted the same).
    at = {}
    for blocks in (1, 2):
        monkeypatch.setattr(cost, "occupancy", lambda *_, b=blocks: (b, "shared memory"))
        at[blocks] = _estimate(BM=128, BN=128, BK=32, STAGES=2, threads=256)
    assert at[1].seconds > 1.1 * at[2].seconds
    assert cost._hidden(1000.0, 10.0) < 1001.0                  # a short wait is hidden
    assert cost._hidden(1000.0, 1000.0) > 1400.0                # an equal one is not


def test_a_drained_wgmma_loop_is_shared_by_resident_blocks():
    three, four = (_estimate("sm_90a", BM=128, BN=128, BK=64, STAGES=s, threads=256,
                             load_path="cp.async") for s in (3, 4))
    assert (three.blocks_per_sm, four.blocks_per_sm) == (2, 1)
    assert four.seconds > 1.1 * three.seconds                   # measured 1.19x


def test_operand_fragments_live_one_k_step_ahead():
    # ptxas 13 (sm_90): 242 registers at BK = 64, 234 at BK = 32; taking the whole
    # BK = 64 fragment arrays as live said 280 (over 255: the build was dropped as a spill).
    registers = {bk: estimate_registers(build(gemm, dict(BM=128, BN=128, BK=bk, STAGES=2),
                                              _facts(gemm, SHAPES), "sm_90").thread_kernel)
                 for bk in (32, 64)}
    assert registers[64].live_words == registers[32].live_words == 192   # 128 acc + 2 k-steps
    assert registers[64].registers <= 255
