"""Block-wide barriers in the cost model: a reduction whose rows span several warps
exchanges partials through shared memory with three barriers (lower/compute.py), which the
model used to leave out ("small") — on the H100 it cost an attention forward whose two
warpgroups share each row ~2x. A warp-local reduction has none. A barrier stalls its block
(a latency the other resident blocks may fill)."""
from __future__ import annotations

import pytest

import tegula as tg
from tegula import f32
from tegula.build import build
from tegula.ir.ops import Reduce
from tegula.synth.cost import BARRIER_CYCLES, estimate, instruction_uses


def _row_sum(bm: int, bn: int, threads: int):
    @tg.kernel(threads=threads)
    def row_sum(x: tg.Tensor[f32], y: tg.Tensor[f32, 1]):
        m = tg.block_id(0)
        t = tg.load(x.tile((bm, bn), (m, 0)))
        tg.copy(tg.sum(t, axis=1)[:, 0], y.tile((bm,), (m,)))
    return row_sum


def _reduce_barriers(built) -> int:
    return sum(c.use.barriers for c in instruction_uses(built.traced, built.target)
               if isinstance(c.op, Reduce))


def test_a_row_over_several_warps_pays_three_barriers():
    wide = build(_row_sum(1, 1024, 256), {}, None, "sm_90a")     # one row, 8 warps
    assert _reduce_barriers(wide) == 3
    local = build(_row_sum(8, 128, 256), {}, None, "sm_90a")     # a row per warp
    assert _reduce_barriers(local) == 0


def test_barriers_stall_the_block_unless_other_blocks_fill_them():
    shapes = {"x": (1000, 1024), "y": (1000,)}
    wide = estimate(build(_row_sum(1, 1024, 256), {}, None, "sm_90a"), (1000,), shapes)
    assert dict(wide.resources)["barrier latency"] == 3 * BARRIER_CYCLES
    on_sm = -(-1000 // 132)
    resident = min(wide.blocks_per_sm, on_sm)
    cycles = wide.seconds * wide.clock_ghz * 1e9
    assert cycles >= on_sm * 3 * BARRIER_CYCLES / resident


def test_few_warps_stretch_the_issue_slots():
    """A scheduler with one warp waits on that warp's dependent instructions: issue time
    stretches below ISSUE_WARPS_PER_SCHEDULER (1.5) warps per scheduler."""
    from tegula.arch.targets import get_target
    from tegula.synth.cost import ISSUE_WARPS_PER_SCHEDULER, _issue_stretch
    kernel = build(_row_sum(8, 128, 128), {}, None, "sm_90a").traced      # 4 warps
    target = get_target("sm_90a")
    assert ISSUE_WARPS_PER_SCHEDULER == 1.5
    assert _issue_stretch(kernel, 1, target) == 1.5      # one warp per scheduler
    assert _issue_stretch(kernel, 2, target) == 1.0      # two: every slot can issue
    assert _issue_stretch(kernel, 4, target) == 1.0
    one = estimate(build(_row_sum(8, 128, 128), {}, None, "sm_90a"), (1,),
                   {"x": (8, 128), "y": (8,)})
    instrs_per_scheduler = one.warp_instructions / target.subpartitions
    assert one.issue_cycles == instrs_per_scheduler * _issue_stretch(kernel, one.blocks_per_sm,
                                                                     target)


def _reduce_shared_loads(built) -> int:
    return sum(c.use.warp_instructions for c in instruction_uses(built.traced, built.target)
               if isinstance(c.op, Reduce) and c.use.instr.startswith("ld.shared"))


def _lowered_shared_loads(built) -> int:
    """Warp-level shared loads the thread IR issues (every warp runs the same program)."""
    from tegula.lower.thread_ir import walk
    per_thread = sum(1 for st in walk(built.thread_kernel.body)
                     if type(st).__name__ == "SharedLoad")
    return per_thread * built.thread_kernel.threads // 32


@pytest.mark.parametrize("bm,bn,threads,loads", [
    (1, 1024, 256, 8 * 7),     # one row over 8 warps: each combines the other 7
    (1, 1024, 1024, 32 * 7),   # 256 threads hold the row's vectors, 3 copies replicate it
    (1, 4096, 1024, 32 * 31),  # one row over all 32 warps
    (4, 64, 256, 0)])          # rows within warps (the other threads hold copies)
def test_the_model_counts_the_exchange_lowering_issues(bm, bn, threads, loads):
    """Lowering's exchange (lower/compute.py `_reduce_across_warps`) loads, in each thread,
    the partials of every other warp of its group: W (W - 1) warp loads for a row over W
    warps (one per warp had been counted). The model's count is the thread IR's."""
    built = build(_row_sum(bm, bn, threads), {}, None, "sm_90a")
    assert _reduce_shared_loads(built) == _lowered_shared_loads(built) == loads
    assert _reduce_barriers(built) == (3 if loads else 0)
