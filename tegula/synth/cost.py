"""The analytical cost model: what a synthesized kernel issues, and how long it should take.

Two layers, both read off the *typed tile IR* (every op's `choices`, every tile's layout),
so synthesis and the autotuner can use them before lowering:

1. `instruction_uses(kernel, target)` (`synth/uses.py`, re-exported here): for every op,
   the instructions it issues per block and per execution (`InstrUse`), tagged with the
   runtime loops around it — `tegula explain`'s table.
2. `estimate(build, grid, shapes)`: a roofline over those counts (TileLang §4.2) with
   Hexcute §VI's issue cycles per instruction. Per block at full SM rates (the SM is
   shared with the other blocks resident with it, `blocks_per_sm`, from threads / shared
   memory / registers — registers from the thread IR's liveness, `synth/registers.py`,
   with a spill note only past the launch's per-thread limit):

   * tensor  = MMA instructions / the entry's `throughput` (instructions per clock per
     SM: for mma.sync the target's 4 sub-partitions, one tensor core each, over the
     entry's issue cycles; a wgmma's issue cycles are already the whole SM's);
   * shared  = shared-memory wavefronts of 128 B at `Target.shared_bytes_per_clk` (128:
     one wavefront per clock per SM);
   * issue   = all warp instructions / the sub-partitions' schedulers (one instruction
     per clock each);
   * special functions = exp2/log2/rsqrt/... warp instructions at 16 lanes per clock;
   * pipes   = the 2-norm of those four (`PIPE_OVERLAP_NORM`): the same warps feed
     every pipe, so two demands of similar size overlap imperfectly;
   * L2      = the block's global bytes at the SM's share of L2 -> SM bandwidth;
   * load latency = per loop iteration, one load latency over the loads in flight
     (Little's law, `pipeline_latency_cycles`; a TMA stage's latency includes its own
     bytes, the box completing as a whole), shared by the blocks resident at once, and
     weighed against the pipes by the same 2-norm (`_hidden`: a short wait is hidden, one
     the size of the work is not) — what deeper pipelines and more resident blocks buy;
   * barrier latency = block-wide barriers (cross-warp reductions, shared round-trip
     conversions) x `BARRIER_CYCLES`, a stall likewise shared by the resident blocks;
   * drained wgmma loop = in a loop that waits for all its wgmmas every iteration while
     the same warps load the next stages (cp.async into wgmma operands), the tensor work
     plus the stage's L2 bytes: they do not overlap (`drained_loop_cycles`), a serial
     chain the other resident blocks fill;
   * clusters: a multicast TMA box is read from L2 once for the cluster but lands whole in
     every SM (the SM's bytes do not drop), and each stage of its ring waits
     `CLUSTER_COUPLING_CYCLES` more (it is free only once every block released it);
   * loop-free load chain = where a block loads outside any loop (a row softmax or
     norm: load, reduce, store), its latency, the bytes it reads at its SM's DRAM share
     (stores are posted) and its work in series (`load_chain_cycles`), overlapped only by
     the blocks resident with it;
   * block launches = `BLOCK_LAUNCH_CYCLES` per block on its SM (tiny blocks are not free);
   * DRAM    = the grid's DRAM bytes at what a stream reaches of the GPU's DRAM bandwidth
     (`DRAM_STREAM_EFFICIENCY`), and every launch `LAUNCH_US` more (both fitted on torch's
     device copy, timed as the benchmark times kernels).

   The grid takes what its busiest SM takes: it runs ⌈blocks / SMs⌉ blocks (a partial
   last wave costs its blocks, not a whole wave), so its time is the largest of those
   blocks' pipes, L2 and latency terms and the DRAM time, plus one global-load latency
   per round of resident blocks (the pipeline fill, which nothing overlaps; once where the
   blocks' loads are a loop-free chain, which holds its latency). When the tensors' shapes are known, DRAM
   traffic for the grid is capped by their footprint (each byte read from DRAM once,
   re-reads hit L2) — the usual GEMM case, where per-block global bytes overstate DRAM
   traffic by the reuse factor. `block_cycles` is one block's time with `blocks_per_sm`
   of its kind on its SM, for `explain`.

Assumptions, said plainly: no dependency stalls beyond the fill and load latencies;
instruction-cache and launch overheads are not modelled; boundary tiles are counted as
full tiles; both branches of a `tg.if_` count; ALU work (elementwise, address arithmetic)
only counts toward issue slots, roughly. It ranks candidates and sanity-checks speeds; it
does not predict to the microsecond. Its rank correlation with measured times, per kernel
family, is recorded in docs/performance.md (`benchmarks/cost_model_check.py`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tegula.arch.catalogue import get_instruction
from tegula.arch.targets import Target
from tegula.ir.ops import TracedKernel
from tegula.lower.thread_ir import walk
from tegula.synth.registers import (RegisterEstimate, estimate_registers, over_limit,
                                    per_thread_limit)
from tegula.synth.uses import (REGISTER_OVERHEAD, SFU_LANES_PER_CLK,  # noqa: F401 (re-exports)
                               CountedUse, InstrUse, ProblemSize, instruction_uses,
                               loop_label, loop_weights, occupancy, op_uses, register_words,
                               register_words_from_tiles, trip_count, _sets_registers)


# --------------------------------------------------------------------------- the estimate

@dataclass(frozen=True)
class CostEstimate:
    """The model's numbers for one build (see the module docstring for the model).

    Per-block counts are per block for the whole kernel (runtime loops multiplied out
    where the problem size is known, else counted once: `unresolved_loops`). Cycle
    figures are SM clock cycles; `*_cycles` of resources are the block's demand at full
    SM rates, `block_cycles` the block's time on an SM it shares with
    `blocks_per_sm - 1` others. Grid figures are None without a grid."""

    target: str
    clock_ghz: float
    threads: int
    shared_bytes: int
    registers: int
    blocks_per_sm: int
    occupancy_limit: str
    global_bytes: float
    flops: float
    mma_instructions: float
    warp_instructions: float
    shared_wavefronts: float
    ideal_wavefronts: float
    tensor_cycles: float
    shared_cycles: float
    issue_cycles: float
    dram_cycles: float
    latency_cycles: float
    block_cycles: float
    bound: str
    grid: tuple | None = None
    blocks: int = 0
    waves: int = 0
    dram_bytes: float = 0.0
    grid_cycles: float | None = None
    unresolved_loops: tuple = ()
    notes: tuple = ()
    resources: tuple = ()        # ((name, cycles of the block on its shared SM), ...)
    #: A lower bound on the grid's cycles for any build of the same tiles whatever its
    #: load path or occupancy: its tensor work, L2 bytes and DRAM bytes alone.
    floor_cycles: float | None = None

    @property
    def block_seconds(self) -> float:
        return self.block_cycles / (self.clock_ghz * 1e9)

    @property
    def seconds(self) -> float | None:
        """Predicted time of the whole grid (None without a grid)."""
        return None if self.grid_cycles is None else self.grid_cycles / (self.clock_ghz * 1e9)

    @property
    def tflops(self) -> float | None:
        """Predicted tensor throughput of the grid (None without a grid or MMAs)."""
        if not self.seconds or not self.flops:
            return None
        return self.flops * self.blocks / self.seconds / 1e12

    def __str__(self) -> str:
        res = dict(self.resources)
        sfu = res.get("special-function (pipe)", 0.0) / max(1, self.blocks_per_sm)
        lines = [f"cost model ({self.target}, {self.clock_ghz} GHz): per block",
                 f"  global {self.global_bytes:,.0f} B, {self.mma_instructions:,.0f} MMA, "
                 f"{self.shared_wavefronts:,.0f} shared wavefronts (ideal "
                 f"{self.ideal_wavefronts:,.0f}), {self.warp_instructions:,.0f} warp instrs",
                 f"  cycles at full SM rates: tensor {self.tensor_cycles:,.0f}, shared "
                 f"{self.shared_cycles:,.0f}, issue {self.issue_cycles:,.0f}, special "
                 f"functions {sfu:,.0f} (together, with the loads' wait left to this block, "
                 f"imperfectly overlapped: "
                 f"{res.get('pipes', 0.0) / max(1, self.blocks_per_sm):,.0f}); DRAM share "
                 f"{self.dram_cycles:,.0f}; fill latency {self.latency_cycles:,.0f}",
                 f"  latency per block alone: loads {res.get('load latency', 0.0):,.0f}, "
                 f"barriers {res.get('barrier latency', 0.0):,.0f} cycles (shared by the "
                 f"blocks resident with it)",
                 f"  {self.blocks_per_sm} block(s)/SM (limited by {self.occupancy_limit}); "
                 f"block time {self.block_cycles:,.0f} cycles = "
                 f"{self.block_seconds * 1e6:.2f} us, {self.bound}-bound"]
        if self.grid_cycles is not None:
            rate = f", {self.tflops:.1f} TFLOP/s" if self.tflops else ""
            lines.append(f"  grid {self.grid}: {self.blocks} blocks in {self.waves} wave(s), "
                         f"DRAM {self.dram_bytes / 1e6:.2f} MB -> {self.seconds * 1e6:.2f} us"
                         f"{rate}")
        if self.unresolved_loops:
            lines.append("  runtime loops counted once (give tensor shapes for totals): " +
                         "; ".join(self.unresolved_loops))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _footprint(kernel: TracedKernel, shapes: dict) -> float | None:
    """Bytes of every global tensor the kernel touches (None if a shape is unknown)."""
    total = 0.0
    for arg in kernel.args:
        if arg.name not in shapes:
            return None
        total += float(np.prod(shapes[arg.name])) * arg.dtype.bits / 8  # u4: half a byte
    return total


def estimate(build, grid=None, shapes: dict | None = None,
             scalars: dict | None = None, registers: int | None = None) -> CostEstimate:
    """The cost model's estimate for `build` (a `tegula.build.Build`, or anything with
    `.traced`, `.target` and optionally `.thread_kernel`/`.synthesis`), launched on `grid`
    (int or tuple, optional) with tensor `shapes` and `scalars` by argument name.
    `registers`: the compiler's count per thread where the cubin was built (ptxas's
    report), used instead of the liveness estimate."""
    kernel, target = build.traced, build.target
    if grid is not None:
        grid = (grid,) if isinstance(grid, int) else tuple(int(g) for g in grid)
    uses = instruction_uses(kernel, target)
    size = ProblemSize(dict(shapes or {}), dict(scalars or {}), grid=grid,
                       sm_count=target.sm_count)
    weights, unresolved = loop_weights(uses, size, grid)
    thread_kernel = getattr(build, "thread_kernel", None)
    threads, live, compiled = kernel.threads, None, registers
    if thread_kernel is not None:
        # Registers from the thread IR's liveness; the block as launched (a warp-specialized
        # kernel adds its producer warpgroup).
        live, smem, threads = (estimate_registers(thread_kernel), thread_kernel.shared_bytes,
                               thread_kernel.threads)
        registers = live.registers
    else:
        smem = build.synthesis.shared_bytes
        registers = register_words_from_tiles(kernel) + REGISTER_OVERHEAD
    blocks_wanted = getattr(thread_kernel, "blocks_per_sm", None)
    notes = spill_notes(target, threads, registers, live, blocks_wanted)
    if compiled is not None:  # the compiler's own count (spills are its report's to say)
        registers, notes = compiled, []
    if blocks_wanted:
        # __launch_bounds__(threads, B): ptxas holds each thread to B blocks' share of the
        # register file (spilling past it, which the note above reports).
        registers = min(registers, per_thread_limit(target, threads, blocks_wanted))
    if thread_kernel is not None and _sets_registers(thread_kernel):
        # A role sets its register budget (setmaxnreg): the kernel is compiled for one block
        # per SM, every thread holding the block's share of the register file.
        from tegula.arch.tma import register_share
        registers = register_share(threads)
    bps, limit = occupancy(target, threads, smem, registers)
    if _footprint(kernel, size.shapes) is None:
        notes.append("without every tensor's shape, each block's global bytes count as DRAM "
                     "traffic (no L2 reuse): an upper bound on memory time")
    if bps == 0:
        notes.append(f"a block does not fit on an SM ({limit}); counted as 1 per SM")
        bps = 1
    if grid is not None and int(np.prod(grid)) <= target.sm_count * bps:
        # Every block is resident at once (one wave, e.g. a persistent kernel): the grid
        # lasts as long as its busiest block, not the average one, where loops depend on
        # the block (132 blocks sharing 512 tiles: some run 4 tiles, not 3.9).
        weights, _ = loop_weights(uses, size, grid, busiest=True)
    totals = _totals(uses, weights)
    totals["pipeline"] = pipeline_latency_cycles(uses, weights, target)
    totals["loop-free loads"] = sum(c.use.global_bytes for c in uses
                                    if not c.loops and c.use.role.startswith("G2"))
    totals["loop loads"] = sum(c.use.global_bytes for c in uses
                               if c.loops and c.use.role.startswith("G2"))
    if thread_kernel is not None:
        totals["drained"] = drained_loop_cycles(uses, weights, target,
                                                drained_wgmma_loops(thread_kernel))
    notes += _cluster_notes(uses, weights)
    return _combine(kernel, target, totals, bps, limit, registers, smem, grid, size,
                    tuple(unresolved), tuple(notes), threads)


#: A TMA box's completion on a loaded H100: the box lands as a whole (one mbarrier
#: completes it), so a stage's wait is a latency plus the stage's bytes at the rate one
#: SM's TMA traffic is served. Calibrated on the H100 measurements of 2026-11-24 (fitted:
#: the README GEMM's 2-stage 128x256x64 (48 KB a stage, ~3,100 cycles an iteration) and the
#: attention forward with V as (D, S) (8 and 16 KB a stage, ~1,100 and ~1,400 cycles); the
#: attention with V as (S, D) was held out). cp.async pipelines fit the catalogue's
#: unloaded global-load latency, their 16-byte requests completing independently.
TMA_LATENCY_CYCLES = 800
TMA_BYTES_PER_CLK = 20

#: What a pipelined cp.async or vector load from global memory waits on a loaded H100 (the
#: catalogue's 470 cycles are an idle GPU's). Fitted on the mma.sync GEMM at 2048^3 and
#: 4096^3 (H100, 2026-11-24): at 470 the model tied 2, 3 and 4 stages of a tile, where 2
#: stages of a BK = 32 tile measured up to 40% slower; 600 ranks them (Spearman 0.80 ->
#: 0.85, 0.82 -> 0.86), 800 about as well (0.82, 0.82), 1,000 worse. Held out: 2048 x 8192
#: x 1024 (0.75 -> 0.84) and the load-path family.
LOADED_LOAD_LATENCY_CYCLES = 600

#: What coupling the blocks of a cluster costs each stage of a multicast TMA ring: a stage
#: is refilled only after the consumers of every block of the cluster released it (remote
#: mbarrier arrives across SMs), so each block waits for its slowest peer and for the
#: arrive's trip between SMs. Multicast reads each box from L2 once for the cluster, but
#: every SM still receives all of it, and that is what bounds the SM: on the H100 clusters
#: of 2 never ran faster (ncu, session 6: L2 traffic 1.47 -> 1.20 GB, 4% slower). Fitted on
#: the persistent GEMM, clusters of 2 against 1 at 4096^3, 2048x8192x1024, 8192x2048x4096,
#: BN 128/256, 3/4 stages (H100, 2026-11-24, session 7 round 1): measured 2-12% slower;
#: the ratio's mean error is 0.035 (0.18 had multicast halved the bytes an SM is bound
#: by). At 4 stages the ring hides it: predicted ties (measured 2-5% slower), which
#: `tg.recommend` breaks toward clusters of 1 (the smaller key).
CLUSTER_COUPLING_CYCLES = 200


def pipeline_latency_cycles(uses: list[CountedUse], weights: dict, target: Target) -> float:
    """Cycles one block would wait on its loops' global loads if it were alone on its SM
    with all the bandwidth it wants: each iteration of a loop that loads from global memory
    waits one load latency (`LOADED_LOAD_LATENCY_CYCLES`), shared by the loads in flight
    (`S - 1` for a `tg.pipeline` of `S` stages, one when it is not pipelined). `_combine`
    divides this among the blocks resident on an SM (by Little's law an SM keeping `n`
    blocks' loads in flight sustains `n (S - 1) B / latency` bytes per clock) and weighs
    what is left against the block's work (`_hidden`): deeper pipelines shorten the wait,
    and so do more resident blocks, which the shared memory of deeper pipelines costs. A TMA stage's wait is
    `TMA_LATENCY_CYCLES` plus its bytes at `TMA_BYTES_PER_CLK` (the box completes as a
    whole). (Measured on an H100: the README GEMM at 128x256x64 runs ~2x slower at 2
    stages than at 4 on TMA; on cp.async, 2 stages cost nothing at 3 blocks per SM.)"""
    loaded = LOADED_LOAD_LATENCY_CYCLES
    per_loop: dict = {}          # loops -> (latency, TMA bytes per iteration)
    for counted in uses:
        u = counted.use
        if not counted.loops or not u.global_bytes or not u.role.startswith("G2"):
            continue
        latency, tma_bytes = per_loop.get(counted.loops, (loaded, 0.0))
        if u.pipe == "tma":
            # A multicast box lands whole in every block of the cluster; the stage it fills
            # is refilled only once every block's consumers released it (remote arrives).
            coupling = CLUSTER_COUPLING_CYCLES if u.multicast > 1 else 0
            latency = max(latency if latency != loaded else 0,
                          TMA_LATENCY_CYCLES + coupling)
            tma_bytes += u.global_bytes
        per_loop[counted.loops] = (latency, tma_bytes)
    return sum(weights[loops] * (latency + tma_bytes / TMA_BYTES_PER_CLK)
               / max(1, loops[-1].stages - 1)
               for loops, (latency, tma_bytes) in per_loop.items())


DRAINED_OVERLAP = 1.0


def drained_wgmma_loops(thread_kernel) -> set[str]:
    """Names of the runtime loops whose body waits for every wgmma group it issued
    (`wgmma.wait_group 0` in the body itself, not in an inner loop)."""
    from tegula.lower.async_ir import WgmmaWait
    from tegula.lower.thread_ir import For

    def direct(stmts):  # the body's statements, through branches and roles, not loops
        for st in stmts:
            yield st
            if not isinstance(st, For):
                for field in ("then", "otherwise"):
                    yield from direct(getattr(st, field, None) or [])
                for role in getattr(st, "roles", None) or []:
                    yield from direct(role.body)

    return {st.var.name for st in walk(thread_kernel.body)
            if isinstance(st, For) and not st.unroll
            and any(isinstance(x, WgmmaWait) and x.pending == 0 for x in direct(st.body))}


def drained_loop_cycles(uses: list[CountedUse], weights: dict, target: Target,
                        drained: set[str]) -> float:
    """A block's cycles in loops that drain their wgmmas every iteration while the same
    warps load the next stages (cp.async, not a TMA ring's producer): the tensor work and
    the stage's L2 bytes do not overlap, so each iteration takes their sum (module
    docstring). Measured (H100, 2026-11-24, README GEMM at 4096^3): cp.async builds, which
    wait `wgmma.wait_group 0` and a block barrier every k-step, ran 1.2-1.6x slower than
    the TMA build of the same tiles at 3-4 stages, where the model had tied them."""
    by_nest: dict = {}
    for counted in uses:
        if counted.loops and counted.loops[-1].var.name in drained:
            by_nest.setdefault(counted.loops, []).append(counted.use)
    total = 0.0
    for nest, used in by_nest.items():
        if any(u.pipe == "tma" for u in used) or not target.l2_bytes_per_clk:
            continue
        tensor = sum(u.warp_instructions * u.pipe_cycles for u in used if u.pipe == "tensor")
        l2 = sum(u.global_bytes for u in used) * target.sm_count / target.l2_bytes_per_clk
        total += weights[nest] * (max(tensor, l2) + DRAINED_OVERLAP * min(tensor, l2))
    return total


def _cluster_notes(uses: list[CountedUse], weights: dict) -> list[str]:
    """What launching in clusters changed in the estimate, where a TMA box is multicast."""
    multicast = [c for c in uses if c.use.multicast > 1]
    if not multicast:
        return []
    ctas = max(c.use.multicast for c in multicast)
    saved = sum(c.use.global_bytes * (c.use.multicast - 1) / c.use.multicast
                * weights[c.loops] for c in multicast)
    return [f"clusters of {ctas}: multicast TMA boxes take {saved:,.0f} B per block off L2 "
            f"reads (each box read once for the cluster; every SM still receives all of "
            f"it); each stage of their ring waits {CLUSTER_COUPLING_CYCLES} cycles more "
            f"(CLUSTER_COUPLING_CYCLES: it is free only once every block's consumers "
            f"released it)"]


def spill_notes(target: Target, threads: int, registers: int,
                live: RegisterEstimate | None, blocks_per_sm: int | None = None) -> list[str]:
    """Warnings where the register estimate exceeds what the launch allows a thread: the
    per-thread limit for `threads` and `blocks_per_sm` (`__launch_bounds__`), or a role's
    setmaxnreg budget."""
    if live is None:  # before lowering: the tile-level sum
        limit = per_thread_limit(target, threads, blocks_per_sm)
        reasons = [f"~{registers} registers per thread, over {limit}"] if registers > limit \
            else []
    else:
        reasons = over_limit(target, threads, live, blocks_per_sm)
    return [f"{r}: ptxas may spill (`tegula compile`, `tegula explain --compile` or "
            f"explain(compile=True) show the compiler's count)" for r in reasons]


def _totals(uses: list[CountedUse], weights: dict) -> dict:
    """Per-block sums of the quantities the model uses."""
    t = dict(global_bytes=0.0, flops=0.0, mma=0.0, instrs=0.0, waves=0.0, ideal=0.0,
             tensor=0.0, sfu=0.0, barriers=0.0)
    for counted in uses:
        u, w = counted.use, weights[counted.loops]
        t["global_bytes"] += u.global_bytes * w
        t["flops"] += u.flops * w
        t["instrs"] += u.warp_instructions * w
        t["waves"] += u.wavefronts * w
        t["ideal"] += u.ideal_wavefronts * w
        t["barriers"] += u.barriers * w
        if u.pipe == "tensor":
            t["mma"] += u.warp_instructions * w
            t["tensor"] += u.warp_instructions * u.pipe_cycles * w
        if u.pipe == "sfu":
            t["sfu"] += u.warp_instructions * u.pipe_cycles * w
    return t


#: How a block's demands on the SM's pipes combine: the `PIPE_OVERLAP_NORM`-norm of
#: (tensor, shared memory, issue, special functions) rather than their maximum. The same
#: warps feed every pipe, so demands of similar size do not overlap perfectly: two equal
#: demands take ~1.4x either alone, one that dominates takes its own time. Fitted on the
#: mma.sync GEMM at 2048^3 (measured, H100, 2026-11-24), where 256-thread blocks — whose
#: smaller warp tiles read as many shared-memory bytes as their MMAs take cycles — ran
#: 15-22% slower than 128-thread blocks of the same tile; checked on 4096^3 (held out).
#: Rankings are the same for any norm from 1.5 to 3.
PIPE_OVERLAP_NORM = 2

#: What one block-wide barrier of a reduction or conversion exchange costs its block, in
#: cycles of stall (the dependency chain up to it is exposed; other resident blocks may
#: fill it): fitted on the attention forward (H100, 2026-11-24, V as (D, S), 64 keys a
#: block) where two warpgroups share each row, ~1,600 cycles per key block for its two
#: cross-warp reductions; checked on 32 keys a block and on V as (S, D).
BARRIER_CYCLES = 500

#: Warps a scheduler needs to issue every cycle: one warp's next instruction usually waits
#: on its previous one (~4 cycles of ALU latency, ~2 independent instructions in flight),
#: so with fewer warps per sub-partition the issue slots stretch. Matters where work is
#: issue-bound and few warps compute: a warp-specialized attention forward has one
#: consumer warpgroup per SM, one warp per scheduler, and ran ~1.5x slower than the same
#: tiles unspecialized at two blocks per SM (H100, 2026-11-24, V as (S, D), 64-row
#: blocks: Spearman 0.84 -> 0.88, the model's pick from 1.52x to the best). On the
#: recorded V as (D, S) data it costs 0.90 -> 0.88 (3 or 4 would cost far more); the
#: 128-row half of V as (S, D), measured after this was set, is its check. Session 8
#: re-measured that kernel (V as (S, D), D = 64, 45 configurations, after the load wait
#: joined the pipes' norm): its one-consumer-warpgroup builds ran ~1.5x, not 2x, slower
#: than the 2-warpgroup ones; 1.5 takes its Spearman 0.82 -> 0.86 (fitted there) and V as
#: (D, S)'s 0.85 -> 0.88 (a check), the mma.sync GEMMs unchanged.
ISSUE_WARPS_PER_SCHEDULER = 1.5


#: What share of the DRAM's peak bandwidth a kernel streaming reads and writes reaches,
#: and a launch's fixed time as the families are timed (CUDA events around one launch,
#: L2 flushed before it): torch's device copy on the H100 (session 9,
#: `benchmarks/cost_model_check.py --copy-sizes`, 1-256 MB each way) takes 5.2 µs plus
#: its bytes at 3.03 TB/s (0.905 of 3.35), within 0.9 µs at every size — where the model
#: had taken the peak and no fixed time, it predicted 21 µs for the 27 µs of every good
#: 32 MB softmax.
DRAM_STREAM_EFFICIENCY = 0.905
LAUNCH_US = 5.2


#: What launching one block costs its SM, however small the block: the SMs take new
#: blocks at a bounded rate. Fitted on the H100 (session 9): softmax and RMSNorm of 65536
#: rows of 256, one row (512 B) a block on 32 or 64 threads — 65,536 blocks — ran 44.0-44.8
#: µs whatever the block did, where the bytes take 27 µs: (44.4 - 5.2) µs over 497 blocks
#: an SM.
BLOCK_LAUNCH_CYCLES = 144


def load_chain_cycles(t: dict, pipe_cycles: float, read_block: float) -> float:
    """A block's serial chain where it loads from global memory outside any loop (a row
    softmax or norm: load the rows, reduce, store): one loaded load latency
    (`LOADED_LOAD_LATENCY_CYCLES`), the bytes it reads at its SM's share of the DRAM
    bandwidth (`read_block` cycles: all the block's bytes where a loop streams some too;
    its stores are posted: the block retires once they
    issue, and their bytes count in the grid's DRAM time, not in the chain — counted
    here, one block per SM of 64 KB rows was predicted 1.5-1.75x the copy's time and
    measured 1.07-1.16x, H100, sessions 9-10), then its work (pipes and barrier stalls),
    one after another. `_combine` divides it
    among the blocks resident at once, whose chains overlap: with one block per SM
    nothing hides the latency and the work (H100, session 8: 8-row softmax blocks of
    4096, one per SM, ran 16% slower than the copy speed every multi-block one reached,
    where the model had predicted them all at copy speed). 0 for a kernel whose loads
    are all in loops (pipelined: `pipeline_latency_cycles`). (Counting one warp's
    dependent instructions instead of the block's pipes fits the row kernels' chains
    better — flat in the thread count, as measured — but took the attention forward's
    Spearman 0.94 → 0.72-0.85: its loop's work is throughput, not one warp's path.)"""
    if not t.get("loop-free loads"):
        return 0.0
    return (LOADED_LOAD_LATENCY_CYCLES + read_block + pipe_cycles
            + t["barriers"] * BARRIER_CYCLES)


def _hidden(work: float, wait: float) -> float:
    """A block's time for `work` cycles of its pipes and a load `wait` (its share of the
    wait, the rest filled by the blocks resident with it): the two overlap as two pipes do
    (`PIPE_OVERLAP_NORM`) — a wait much shorter than the work is hidden, one of the same
    size is not (the warps that wait do not issue). Where the maximum of the two had been
    taken, 2, 3 and 4 stages of an mma.sync GEMM tile tied, and so did occupancies of 1 to
    3 blocks per SM, which the GPU separates by up to 20% (H100, 2026-11-24: 128x128x64 at
    256 threads, 4 stages at 1 block per SM, ran 1.2x slower than 2 or 3 stages at 2)."""
    return (work ** PIPE_OVERLAP_NORM + wait ** PIPE_OVERLAP_NORM) ** (1 / PIPE_OVERLAP_NORM)


def _issue_stretch(kernel: TracedKernel, bps: int, target: Target) -> float:
    """How much longer the issue slots take when too few warps compute: the kernel's own
    warps (a warp-specialized kernel's producer warps only issue its copies) over the
    SM's schedulers."""
    warps = bps * max(1, kernel.threads // 32) / target.subpartitions
    return max(1.0, ISSUE_WARPS_PER_SCHEDULER / warps)


def _per_block(t: dict, target: Target, pipe_cycles: float, chain: float,
               sharing: int) -> dict:
    """A block's demands in cycles at full SM rates, its waits shared by the `sharing`
    blocks resident with it: "load latency" is the block's wait alone (see
    pipeline_latency_cycles), hidden behind the block's work only in part (`_hidden`); a
    block-wide barrier stalls the block's warps until the last one arrives, exposing the
    dependency chain before it; a drained wgmma loop and a loop-free load chain are one
    block's serial chains, which the other resident blocks fill."""
    per_block = {"pipes": pipe_cycles}
    if target.l2_bytes_per_clk:
        per_block["L2"] = t["global_bytes"] * target.sm_count / target.l2_bytes_per_clk
        per_block["load latency"] = t.get("pipeline", 0.0) / sharing
        per_block["pipes"] = _hidden(pipe_cycles, per_block["load latency"])
    per_block["barrier latency"] = t["barriers"] * BARRIER_CYCLES / sharing
    if t.get("drained"):
        per_block["drained wgmma loop"] = t["drained"] / sharing
    if chain:
        per_block["load chain"] = chain / sharing
    return per_block


def _combine(kernel: TracedKernel, target: Target, t: dict, bps: int, limit: str,
             registers: int, smem: int, grid, size: ProblemSize, unresolved: tuple,
             notes: tuple, threads: int) -> CostEstimate:
    """Per-block demands at full SM rates, then the grid: the busiest SM runs
    ⌈blocks / SMs⌉ blocks, `bps` at a time, and takes the longest of its pipes' work, its
    L2 bytes at its share of L2 bandwidth, and its loads' latency over the loads it keeps
    in flight; the GPU as a whole moves the DRAM bytes (module docstring)."""
    # bytes per SM clock, whole GPU, at what a read + write stream reaches
    dram_per_clk = target.dram_gbps * DRAM_STREAM_EFFICIENCY / target.clock_ghz
    blocks = int(np.prod(grid)) if grid is not None else 0
    dram_bytes = t["global_bytes"]
    footprint = _footprint(kernel, size.shapes)
    if blocks and footprint is not None and not unresolved:
        # Each byte comes from DRAM once; the blocks' re-reads of it hit L2.
        dram_bytes = min(dram_bytes, footprint / blocks)
    # A wavefront is one pass over every bank (32 x 4 B = 128 B).
    pipes = {"tensor": t["tensor"],
             "shared-memory": t["waves"] * (target.banks * target.bank_bytes)
             / target.shared_bytes_per_clk,
             "issue": t["instrs"] / target.subpartitions * _issue_stretch(kernel, bps, target),
             "special-function": t["sfu"]}
    pipe_cycles = sum(v ** PIPE_OVERLAP_NORM for v in pipes.values()) ** (1 / PIPE_OVERLAP_NORM)
    latency = get_instruction("ld.global.v4.b32").latency_cycles if t["global_bytes"] else 0.0
    dram_block = dram_bytes * target.sm_count / dram_per_clk  # every SM running such blocks
    # Where every load is outside loops (a row kernel) the chain waits for its reads only;
    # where a loop streams bytes too (a GEMV) the chain keeps all the block's bytes at its
    # share, as before (the loop's overlap is not modelled there): measured at W4A16
    # 1x4096x4096 (H100, session 13 round 2) the reads-only chain ranked the fragment GEMV
    # (13.0 us at best) over the rows kernel on plain bytes (12.5 us).
    reads = (min(t.get("loop-free loads", 0.0), dram_bytes) if not t.get("loop loads")
             else dram_bytes)
    chain = load_chain_cycles(t, pipe_cycles, reads * target.sm_count / dram_per_clk)
    per_block = _per_block(t, target, pipe_cycles, chain, bps)
    resources = {**{k: bps * v for k, v in per_block.items()}, "DRAM": bps * dram_block}
    bound = max(resources, key=lambda k: resources[k])
    block_cycles = resources[bound] + latency
    if bound == "pipes":
        parts = {**pipes, "load latency": per_block.get("load latency", 0.0)}
        bound = max(parts, key=lambda k: parts[k])
    fields = dict(target=target.name, clock_ghz=target.clock_ghz, threads=threads,
                  shared_bytes=smem, registers=registers, blocks_per_sm=bps,
                  occupancy_limit=limit, global_bytes=t["global_bytes"], flops=t["flops"],
                  mma_instructions=t["mma"], warp_instructions=t["instrs"],
                  shared_wavefronts=t["waves"], ideal_wavefronts=t["ideal"],
                  tensor_cycles=pipes["tensor"], shared_cycles=pipes["shared-memory"],
                  issue_cycles=pipes["issue"], dram_cycles=bps * dram_block,
                  latency_cycles=latency, block_cycles=block_cycles,
                  bound=bound, unresolved_loops=unresolved, notes=notes,
                  resources=tuple(resources.items()) + tuple(
                      (f"{k} (pipe)", bps * v) for k, v in pipes.items()))
    if grid is None:
        return CostEstimate(**fields)
    waves = -(-blocks // (target.sm_count * bps))
    on_sm = -(-blocks // target.sm_count)           # blocks the busiest SM runs
    resident = min(bps, on_sm)
    sm_cycles = {k: on_sm * v for k, v in
                 _per_block(t, target, pipe_cycles, chain, resident).items()}
    sm_cycles["DRAM"] = dram_block * blocks / target.sm_count
    sm_cycles["block launches"] = on_sm * BLOCK_LAUNCH_CYCLES
    grid_bound = max(sm_cycles, key=lambda k: sm_cycles[k])
    # Each round of resident blocks waits for its first loads (the fill) unoverlapped; a
    # loop-free chain holds its own load latency, and its blocks start as others retire:
    # one fill (per round, it had ranked many small blocks below few large ones).
    rounds = 1 if chain else -(-on_sm // resident)
    floor = max(on_sm * max(pipes["tensor"], per_block.get("L2", 0.0)), sm_cycles["DRAM"])
    launch = LAUNCH_US * 1e3 * target.clock_ghz
    return CostEstimate(**fields, grid=grid, blocks=blocks, waves=waves,
                        dram_bytes=dram_bytes * blocks,
                        grid_cycles=sm_cycles[grid_bound] + rounds * latency + launch,
                        floor_cycles=floor + latency + launch)
