"""Whether a producer warpgroup pays for a TMA pipeline: the cost model's side of the
warp-roles decision (`synth/roles.py` asks it where the kernel leaves `warp_specialize`
open).

A TMA + wgmma pipeline runs in one role (every warp waits on the stage's mbarrier and
computes; thread 0 refills a stage after a block barrier) or warp-specialized (a producer
warpgroup issues the boxes; the consumers never meet at a block barrier). What each form
costs, per iteration of the pipeline, on the SM (cycles at full SM rates, the counts of
`synth/uses.py` and the constants of `synth/cost.py`):

* **work.** The body's tensor, issue and special-function cycles. Where the body is more
  than its copies and one gemm, every gemm waits for its own wgmmas before the register
  work that reads them (`lower/hopper.py`), so one block's tensor and register work run
  one after the other: its chain is their *sum*, and only other resident blocks fill the
  gaps. A lone gemm keeps a wgmma group in flight: its chain is the pipes' 2-norm.
* **one role** runs as many blocks per SM as threads, shared memory and registers allow
  (`r`); each iteration waits a load latency over the `S - 1` stages in flight and one
  block barrier (`BARRIER_CYCLES`), shared by the `r` blocks' chains.
* **warp-specialized** runs one block per SM (the roles' `setmaxnreg` budgets are the
  block's share of the register file), and with few consumer warps a scheduler issues at
  part rate (`ISSUE_WARPS_PER_SCHEDULER`); no block barrier, and `S - 1` stages in flight
  too (a stage is released once the next iteration's wgmmas were issued).

The SM's time per block-iteration is the larger of its pipes' 2-norm and the chain over
the resident blocks; the producer pays where that is shorter specialized: where one role
could not run a second block anyway (a deep ring filling shared memory, a persistent
kernel, a tile of two warpgroups' registers), not where one role runs two and the body's
dependent gemms leave the tensor cores idle during the register work.

Measured (H100, session 11 round 1, `benchmarks/roles_check.py`, specialized / one-role
time; the model's ratio in brackets): attention backward dK/dV and dQ at D = 128, 64x64
on 128 threads 1.32 [1.81] and 1.17 [1.78], dK/dV at D = 64 1.73 [1.75]; on 256 threads
(one block per SM either way) 0.96 [0.90] and 0.89 [0.88]; the forward at D = 128, 64x64
on 128 threads 1.36 [2.07] — all decided right — but 128x64 on 256 threads 1.10 [0.93],
decided wrong (ptxas: 168 registers, one block per SM in both forms; the barrier the
model charges one role is not what separates them). One-gemm bodies, all right in
direction: the README GEMM 128x128x32 / 128x128x64 in 3 stages (two blocks per SM in one
role) 1.57 [1.26] / 1.15 [1.45], 4 stages (one block) 0.64 [0.66]; blockwise FP8 64x128
1.11 [1.39]. Since session 12 the model decides bodies of one gemm too (before, they kept
the producer): the README GEMM's default tile runs in one role, two blocks per SM; tests
and fuzz programs that exercise the specialized lowering ask for it (`warp_specialize=True`).
Session 12 round 1: right on all 8 one-gemm bodies at full grids (README GEMM 128x128x32 S3
1.62 [1.26]), wrong on all 6 small-grid library candidates (split-K and FP8 at 64-128 rows,
at most one block an SM: 0.86-1.00 [1.05-1.39]) — one role's second block per SM needs a
grid that has it.

**The launch grid**, where the build knows it (the `grid_blocks` build option, which every
launch and `tg.emulate` pass from their grid since session 14): the busiest SM runs
`s = ⌈blocks / SMs⌉` blocks, so one role holds `min(r, s)` of them at once, and the
specialized form runs them one after another; the two are compared per block of the
busiest SM. (Pricing a last partial round at its own occupancy was tried: at 384 blocks,
three an SM, it chose the producer, which measured 1.75x slower, H100 session 13 round 2:
blocks start as others retire, not in rounds.) At `s = 1`
(split-K and FP8 candidates at 64-128 rows: 32-128 blocks on 132 SMs) one role has no
second block to fill its stalls and pays a block barrier each iteration that the producer
does not: the producer is kept. Without a grid (or with `s` at least the SM's block
limit) one role is priced at its occupancy, the steady state of a full grid. Session 13
round 1 (H100, `benchmarks/roles_check.py --one-gemm`, each case at its grid): 12 of the
14 one-gemm bodies right (session 12: 8); per-tensor FP8 64x64 at 64 rows measured level
(1.02) where the model prefers the producer, and split-K /4 at 64 rows ran its specialized
kernel 3.2x slower than in session 12 (a kernel matter, re-timed in round 2).
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.arch.targets import Target
from tegula.ir.ops import Copy, ForLoop, Gemm, TracedKernel, walk_ops
from tegula.ir.scalar import GridSize, ScalarBinOp, SMCount


@dataclass(frozen=True)
class RolesCost:
    """The model's cycles per block-iteration of one pipeline on its SM, in one role and
    warp-specialized, and what set them (for explain and the decision's reason)."""

    one_role: float
    specialized: float
    one_role_blocks: int
    one_role_limit: str
    serial: bool
    gemms: int
    tensor: float
    register_work: float
    load_wait: float
    #: Blocks the busiest SM runs over the launch (None: the grid is not known, priced as
    #: a full grid's steady state).
    sm_blocks: int | None = None

    @property
    def producer_pays(self) -> bool:
        """Ties keep the producer (the form the pipeline had before the model chose)."""
        return self.specialized <= self.one_role

    def describe(self) -> str:
        grid = ("" if self.sm_blocks is None else
                f"; the launch grid gives the busiest SM {self.sm_blocks} block(s)")
        body = ("its gemms wait for their wgmmas before the register work that reads them "
                "(tensor and register work one after the other in a block)" if self.serial
                else "a lone gemm keeps its wgmmas in flight")
        return (f"cost model per iteration: one role {self.one_role:,.0f} cycles at "
                f"{self.one_role_blocks} block(s) per SM (limited by {self.one_role_limit}), "
                f"warp-specialized {self.specialized:,.0f} at 1 block per SM; tensor "
                f"{self.tensor:,.0f}, register work {self.register_work:,.0f}, a stage's "
                f"load {self.load_wait:,.0f} cycles; {body}{grid}")


def roles_cost(kernel: TracedKernel, loop: ForLoop, target: Target,
               grid_blocks: int | None = None) -> RolesCost:
    """The two forms' cycles for the TMA pipeline `loop` of `kernel`, launched on
    `grid_blocks` blocks where that is known (module docstring)."""
    from tegula.synth import cost
    from tegula.synth.uses import (REGISTER_OVERHEAD, occupancy, op_uses,
                                   register_words_from_tiles)
    tensor = issue = sfu = barriers = tma_bytes = 0.0
    for op in walk_ops(loop.body):
        for u in op_uses(op, kernel, target):
            issue += u.warp_instructions / target.subpartitions
            barriers += u.barriers
            if u.pipe == "tensor":
                tensor += u.warp_instructions * u.pipe_cycles
            elif u.pipe == "sfu":
                sfu += u.warp_instructions * u.pipe_cycles
            elif u.pipe == "tma":
                tma_bytes += u.global_bytes
    rest = [o for o in loop.body if not (isinstance(o, Copy) and o.choices.get("instr") == "tma")]
    gemms = sum(isinstance(o, Gemm) for o in walk_ops(loop.body))
    serial = not (len(rest) == 1 and isinstance(rest[0], Gemm))
    load = cost.TMA_LATENCY_CYCLES + tma_bytes / cost.TMA_BYTES_PER_CLK
    stages = max(2, loop.stages)
    warps = max(1, kernel.threads // 32)

    def per_iteration(blocks: int, in_flight: int, barrier: float) -> float:
        stretch = max(1.0, cost.ISSUE_WARPS_PER_SCHEDULER * target.subpartitions
                      / (blocks * warps))
        pipes = [tensor, issue * stretch, sfu]
        norm = sum(p ** cost.PIPE_OVERLAP_NORM for p in pipes) ** (1 / cost.PIPE_OVERLAP_NORM)
        chain = (sum(pipes) if serial else norm) + barriers * cost.BARRIER_CYCLES
        chain = cost._hidden(chain, load / in_flight) + barrier
        return max(norm, chain / blocks)

    registers = min(register_words_from_tiles(kernel) + REGISTER_OVERHEAD,
                    target.regs_per_thread_max)
    smem = sum(int(a.dtype.bits) * a.stages * _elements(a.shape) // 8
               for a in kernel.shared_allocs)
    blocks, limit = occupancy(target, kernel.threads, smem, registers)
    if _persistent(kernel, loop):
        blocks, limit = 1, "the grid (a persistent tile loop: one block per SM)"
    blocks = max(1, blocks)
    sm_blocks = grid_sm_blocks(grid_blocks, target)
    if sm_blocks is not None and sm_blocks < blocks:
        blocks, limit = sm_blocks, (f"the launch grid ({grid_blocks} blocks on "
                                    f"{target.sm_count} SMs)")
    # Both forms keep S - 1 stages in flight: a stage is refilled once the wgmmas of the
    # iteration after it were issued and its own retired (wait_group 1), whether thread 0
    # refills it after the block barrier or the producer after the consumers' release.
    return RolesCost(one_role=per_iteration(blocks, stages - 1, cost.BARRIER_CYCLES),
                     specialized=per_iteration(1, stages - 1, 0.0),
                     one_role_blocks=blocks, one_role_limit=limit, serial=serial, gemms=gemms,
                     tensor=tensor, register_work=issue + sfu, load_wait=load,
                     sm_blocks=sm_blocks)


def grid_sm_blocks(grid_blocks: int | None, target: Target) -> int | None:
    """The blocks the busiest SM runs over a launch of `grid_blocks` blocks: ⌈blocks /
    SMs⌉; None where the grid is unknown or gives every SM at least as many blocks as it
    can hold at once (a full grid: its steady state is what the model prices)."""
    if grid_blocks is None:
        return None
    on_sm = -(-int(grid_blocks) // target.sm_count)
    return on_sm if on_sm < target.max_blocks_per_sm else None


def why_no_producer(kernel: TracedKernel, loop: ForLoop, target: Target | None,
                    grid_blocks: int | None = None) -> str:
    """Why the cost model keeps the TMA pipeline `loop` in one role ("" where the producer
    warpgroup pays, or without a target to price it), launched on `grid_blocks` blocks
    where the build knows it."""
    if target is None:
        return ""
    if _elements(kernel.cluster) > 1:
        # Launched in clusters: only a producer warpgroup's ring multicasts its boxes
        # (`synth/roles.py`), which is what the cluster was asked for; not priced.
        return ""
    priced = roles_cost(kernel, loop, target, grid_blocks)
    if priced.producer_pays:
        return ""
    return (f"a producer warpgroup does not pay here: {priced.describe()} "
            f"(warp_specialize=True forces it)")


def _elements(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _persistent(kernel: TracedKernel, loop: ForLoop) -> bool:
    """Whether a loop around `loop` walks tiles by the grid's size (`tg.num_programs`,
    `tg.num_sms`): a persistent kernel, whose grid holds one block per SM whatever its
    occupancy would allow."""
    from tegula.synth.copies import enclosing_ops
    return any(isinstance(op, ForLoop) and (_reads_grid(op.start) or _reads_grid(op.stop))
               for op in enclosing_ops(kernel.body, loop) or [])


def _reads_grid(x) -> bool:
    if isinstance(x, (GridSize, SMCount)):
        return True
    if isinstance(x, ScalarBinOp):
        return _reads_grid(x.lhs) or _reads_grid(x.rhs)
    return False
