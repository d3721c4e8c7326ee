"""Warp specialization of a TMA + wgmma pipeline: whether to split the block into roles.

On sm_90a a `tg.pipeline` whose run-ahead copies are TMA boxes and whose gemm runs on
wgmma (`synth/copies.py`, `synth/gemm.py`) can run in one role — every thread waits on the
stage's mbarrier and computes, thread 0 also issues the refills after a block barrier — or
warp-specialized (issue 9 §3): a **producer** warpgroup that does nothing but wait for a
stage to be released and issue its TMA boxes, and a **consumer** role that does everything
else of the kernel. Every layout synthesis decided spans the user's `threads`, so the
producer is one *extra* warpgroup (128 threads, `tid >= threads`) that holds no tile at
all: nothing synthesized changes, and the block grows to `threads + 128`.

The producer needs few registers, so it lowers its budget with `setmaxnreg.dec`
(`PRODUCER_REGISTERS`) and the consumer raises its own with `.inc` by what that frees:
`setmaxnreg` moves registers within the block's allocation, which is `register_share`
per thread for one block per SM (`arch.tma.register_share`), so the consumer may take
`(total * share - 128 * PRODUCER_REGISTERS) / threads`, rounded down to a multiple of 8
and capped at `MAX_CONSUMER_REGISTERS`. Where that is not more than the share the
consumer keeps the share (no `setmaxnreg` for it).

`decide_warp_roles` records the decision on the loop: `choices["roles"]` (a `RolesPlan`)
when specialized, otherwise `choices["roles_skipped"]`, the reason `tegula explain`
prints. The kernel option `warp_specialize` (None: where the rule applies and the cost
model prices the producer warpgroup below one role, `synth/cost_roles.py`, for the launch
grid where the `grid_blocks` build option gives it; True: required,
a `SynthesisError` with the reason where it cannot; False: never) chooses. A consumer
schedule asked for (`consumers=`, `tg.consumer(schedule=)`), stated roles or a launch in
clusters skip the price: they need the producer (only its ring multicasts).

**Cluster multicast** (a kernel launched in clusters, `tg.cluster(x, y)`): a TMA copy of a
specialized pipeline whose box is provably the same in every block of the cluster
(`copies.cluster_uniform` of its coordinates, and the pipeline and its enclosing loops
run the same iterations in every block) is multicast (`MulticastPlan` in the copy's
`choices["multicast"]`): each block's producer loads one of `ctas` row slices of the box
into *every* block of the cluster, so each block receives the whole box while global
memory and L2 serve it once. A block's stage is then written by its peers too, so it is
free only when the consumers of every block of the cluster released it: they arrive on
the empty barrier of each block (`lower/hopper.py`). Only a body of TMA copies and one
wgmma gemm is multicast (its release is the warp-level one that the remote arrives
extend); `choices["multicast_skipped"]` on the loop says why not otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.arch.tma import register_share
from tegula.arch.wgmma import WARPGROUP
from tegula.errors import SynthesisError
from tegula.ir.ops import Copy, ForLoop, Gemm, IfThen, Rearrange, Reduce, Scan, TracedKernel, \
    tiles_read, tiles_written, walk_ops, wgmma_stage_reads_only
from tegula.ir.values import GlobalTile, SharedTile, describe
from tegula.synth.copies import cluster_uniform, enclosing_ops
from tegula.synth.tile_map import global_dependence
from tegula.synth.cost_roles import roles_cost, why_no_producer

#: The producer warpgroup's register budget: a loop of mbarrier waits and TMA issues needs
#: few (CUTLASS's warp-specialized GEMMs give their producer 40 as well).
PRODUCER_REGISTERS = 40
#: The largest consumer budget asked for: a thread addresses at most 255 registers, and
#: `setmaxnreg` takes multiples of 8 (CUTLASS's consumers ask for at most 240 too).
MAX_CONSUMER_REGISTERS = 240
#: The block-size limit the producer warpgroup must fit under.
MAX_BLOCK_THREADS = 1024
#: The consumer schedules of a warp-specialized pipeline (the `consumers=` build option;
#: None lets synthesis choose, `choose_consumers`).
CONSUMER_SCHEDULES = (None, "cooperative", "pingpong")
#: Consumer warpgroups taking turns in the ping-pong schedule.
PINGPONG_GROUPS = 2


@dataclass(frozen=True)
class RolesPlan:
    """A warp-specialized pipeline: the consumer role is threads `0 … consumer_threads-1`
    (every tile's layout spans them), the producer the warpgroup after them. Register
    budgets per thread (`None`: the role keeps what ptxas allocated)."""

    consumer_threads: int
    producer_registers: int
    consumer_registers: int | None
    producer_threads: int = WARPGROUP
    ring: object = None  # synth.copies.RingPlan when the pipeline sits in other loops
    cluster: tuple = (1, 1, 1)  # the kernel's cluster (blocks along x, y, z)
    cluster_note: str = ""      # which boxes are multicast, or why none is
    #: Consumer copies of the user's threads: 1 ("cooperative": they compute every tile
    #: together), or PINGPONG_GROUPS ("pingpong": each copy, one warpgroup, computes whole
    #: tiles of the enclosing tile loop in turn, module docstring).
    consumer_groups: int = 1
    consumers_note: str = ""  # why this consumer schedule (explain)
    #: Where the source stated the roles (`tg.producer` / `tg.consumer` blocks), "" where
    #: synthesis introduced them (explain).
    stated: str = ""
    #: ((role, line), …): the lines of the stated blocks, which name the roles in reports
    stated_lines: tuple = ()
    #: Cooperative consumers of two warpgroups that take turns at the tensor cores inside
    #: the pipeline loop (consumers='pingpong' on a two-warpgroup tile with no tile loop:
    #: FlashAttention-3's schedule, `lower/warp_roles.py` `take_turns_in_loop`).
    turns: bool = False
    kind = "warp_roles"  # what lowering dispatches on (lowering does not import synthesis)

    @property
    def block_threads(self) -> int:
        return self.consumer_threads * self.consumer_groups + self.producer_threads

    @property
    def pingpong(self) -> bool:
        return self.consumer_groups > 1

    def describe(self) -> str:
        c, total = self.consumer_threads * self.consumer_groups, self.block_threads
        consumer_budget = (_setmaxnreg(self.consumer_registers, total)
                           if self.consumer_registers is not None
                           else f"keeps {register_share(total)} registers")
        return (f"warp-specialized, {total} threads per block: producer warpgroup (threads "
                f"{c}..{total - 1}, {_setmaxnreg(self.producer_registers, total)}; thread "
                f"{c} waits on the stage's empty mbarrier, expects its bytes on the full one and "
                f"issues the TMA boxes), {self._consumers(consumer_budget)}"
                f"{self._walk()}{self._cluster()}"
                f"{'; ' + self.stated if self.stated else ''}")

    def _consumers(self, budget: str) -> str:
        c = self.consumer_threads
        if self.turns:
            return (f"consumers: pingpong{self._why()} — one consumer role (threads 0..{c - 1}, "
                    f"{budget}) whose two warpgroups take turns at the tensor cores in the "
                    f"loop (bar.sync on its own turn barrier before its gemms, bar.arrive on "
                    f"the other's after them), so one warpgroup's register work runs while "
                    f"the other's wgmmas do")
        if not self.pingpong:
            return (f"consumer (threads 0..{c - 1}, {budget}; waits on the full mbarrier, "
                    f"wgmma, releases the stage on the empty one, and runs the rest of the "
                    f"kernel); consumers: cooperative{self._why()}")
        groups = ", ".join(f"{g * c}..{(g + 1) * c - 1}" for g in range(self.consumer_groups))
        return (f"consumers: pingpong{self._why()} — {self.consumer_groups} consumer "
                f"warpgroups (threads {groups}, {budget} each), each computing whole tiles of "
                f"the tile loop in turn (warpgroup g takes its iterations g, g + "
                f"{self.consumer_groups}, …, with its own accumulator), their main loops "
                f"taking turns through a named barrier each (bar.sync on its own before the "
                f"K loop, bar.arrive on the next one's after it), so one warpgroup's epilogue "
                f"runs "
                f"while the other's wgmmas do; the producer fills the ring in the order they "
                f"take turns")

    def _why(self) -> str:
        return f" ({self.consumers_note})" if self.consumers_note else ""

    def _cluster(self) -> str:
        if self.cluster == (1, 1, 1):
            return ""
        x, y, _ = self.cluster
        return f"; cluster {x}x{y}: {self.cluster_note}"

    def _walk(self) -> str:
        if self.ring is None:
            return ""
        who = "the producer and each consumer warpgroup" if self.pingpong else "both roles"
        return (f"; {who} walk the enclosing loops and their scalar code (the producer "
                f"only issues), and {self.ring.describe()}, so the producer loads the next "
                f"run's first stages while the consumer finishes the current one")


def _setmaxnreg(registers: int, block_threads: int) -> str:
    """`setmaxnreg.inc 232 registers`: a role's budget as codegen sets it (`.inc` above the
    block's even share of the register file, `.dec` otherwise)."""
    way = "inc" if registers > register_share(block_threads) else "dec"
    return f"setmaxnreg.{way} {registers} registers"


def register_budgets(consumer_threads: int) -> tuple[int, int | None]:
    """(producer, consumer) registers per thread for a block of `consumer_threads` (every
    consumer warpgroup) plus the producer warpgroup (module docstring); the consumer's is
    None where it cannot grow."""
    total = consumer_threads + WARPGROUP
    share = register_share(total)
    freed = total * share - WARPGROUP * PRODUCER_REGISTERS
    consumer = min(MAX_CONSUMER_REGISTERS, freed // consumer_threads // 8 * 8)
    return PRODUCER_REGISTERS, (consumer if consumer > share else None)


def check_cluster(kernel: TracedKernel, target) -> None:
    """A kernel declaring a thread-block cluster (`tg.cluster`) needs sm_90: refused at
    its `tg.cluster` line for an older target, rather than failing at launch."""
    if tuple(kernel.cluster) != (1, 1, 1) and target.cc < 90:
        x, y, _ = kernel.cluster
        raise SynthesisError(f"tg.cluster({x}, {y}): thread-block clusters need sm_90 or "
                             f"newer; the target is {target.name}",
                             loc=getattr(kernel.cluster, "loc", None) or kernel.loc)


def decide_warp_roles(kernel: TracedKernel, option: bool | None,
                      consumers: str | None = None, target=None,
                      grid_blocks: int | None = None) -> int:
    """Record on each TMA pipeline loop whether it is warp-specialized, and with which
    consumer schedule (`consumers`, the build option: module docstring); the cost model
    prices the producer for a launch of `grid_blocks` blocks where the build knows it
    (the `grid_blocks` build option, `synth/cost_roles.py`). Returns the most blocks per SM
    one role holds in a pipeline the cost model kept in one role (0 if none): the grid
    changes a decision only where it gives an SM fewer (`build`). A pipeline whose
    source states its roles (`tg.producer` / `tg.consumer`, `lang/roles.py`) must be
    specialized, with the budgets it asks for (`check_stated_roles`, `stated_budgets`)."""
    check_stated_roles(kernel, option, target)
    loops = [op for op in walk_ops(kernel.body) if isinstance(op, ForLoop) and _is_tma(op)]
    if option and not loops:
        _refuse_without_tma(kernel)
    if consumers == "pingpong" and not loops:
        raise SynthesisError("consumers='pingpong': the kernel has no tg.pipeline whose "
                             "copies run on TMA into wgmma operands (sm_90a only)",
                             loc=kernel.loc)
    grid_limit = 0
    for loop in loops:
        stated = loop.region("producer")
        problem = _why_not(kernel, loop, loops, True if stated else option)
        if not problem and option is None and consumers is None and not stated:
            # the cost model's choice; a grid only holds one role to fewer blocks (never
            # the producer's one), so it can turn one role into the producer, not back
            problem = why_no_producer(kernel, loop, target, grid_blocks)
            if problem:
                grid_limit = max(grid_limit, roles_cost(kernel, loop, target,
                                                        grid_blocks).one_role_blocks)
        if problem and (option or consumers == "pingpong" or stated):
            what = ("tg.producer / tg.consumer" if stated else
                    "warp_specialize=True" if option else "consumers='pingpong'")
            raise SynthesisError(f"{what}: the pipeline cannot be warp-specialized: "
                                 f"{problem}", loc=stated.loc if stated else loop.loc,
                                 other_loc=loop.loc if stated else None)
        if problem:
            loop.choices["roles_skipped"] = problem
            continue
        schedule, what = stated_schedule(loop, consumers)
        turns = schedule == "pingpong" and takes_turns_in_loop(kernel, loop)
        groups, note = ((1, f"{what}: turns inside the loop") if turns
                        else choose_consumers(kernel, loop, schedule, what))
        producer, consumer = stated_budgets(kernel, loop, groups)
        loop.choices["roles"] = RolesPlan(kernel.threads, producer, consumer,
                                          ring=loop.choices.get("ring"),
                                          cluster=tuple(kernel.cluster),
                                          cluster_note=decide_multicast(kernel, loop),
                                          consumer_groups=groups, consumers_note=note,
                                          stated=_stated_note(loop),
                                          stated_lines=tuple((r.role, r.loc.lineno)
                                                             for r in loop.regions if r.loc),
                                          turns=turns)
    return grid_limit


def stated_schedule(loop: ForLoop, consumers: str | None) -> tuple[str | None, str]:
    """(the consumer schedule of the specialized pipeline `loop`, how explain and errors
    name where it came from): a `tg.consumer(schedule=)` block's, else the `consumers=`
    build option. A block and an option that disagree are a `SynthesisError` at the
    block's line (neither silently wins)."""
    block = loop.region("consumer")
    stated = block.schedule if block is not None else None
    if stated is None:
        return consumers, f"consumers={consumers!r}"
    if consumers is not None and consumers != stated:
        raise SynthesisError(f"tg.consumer(schedule={stated!r}) and the build option "
                             f"consumers={consumers!r} disagree; drop one of them",
                             loc=block.loc, other_loc=loop.loc)
    where = f" at line {block.loc.lineno}" if block.loc is not None else ""
    return stated, f"tg.consumer(schedule={stated!r}){where}"


def takes_turns_in_loop(kernel: TracedKernel, loop: ForLoop) -> bool:
    """Whether ping-pong means turns inside the pipeline loop: the kernel's tiles span two
    warpgroups (each its own rows of every gemm), the loop is not in a tile loop the
    warpgroups could split instead, and its body has two gemms or more (a turn is one
    warpgroup's run of gemms; the other's register work between them overlaps it)."""
    gemms = sum(isinstance(op, Gemm) for op in loop.body)
    return (kernel.threads == 2 * WARPGROUP and loop.choices.get("ring") is None
            and gemms >= 2)


def check_stated_roles(kernel: TracedKernel, option: bool | None, target) -> None:
    """A pipeline whose source states warp roles can have them: the target is sm_90a,
    `warp_specialize` is not False, and its producer block's copies are TMA boxes (the
    producer warpgroup issues nothing else). A `SynthesisError` at the block's line."""
    for loop in walk_ops(kernel.body):
        region = loop.region("producer") if isinstance(loop, ForLoop) else None
        if region is None:
            continue
        if target is not None and not (target.cc >= 90 and target.arch_suffix == "a"):
            raise SynthesisError(
                f"tg.producer / tg.consumer: warp roles need sm_90a (a producer warpgroup "
                f"issuing TMA boxes into an mbarrier ring, setmaxnreg budgets, wgmma); the "
                f"target is {target.name}. Build for sm_90a, or drop the two blocks (a plain "
                f"tg.pipeline runs on every target, specialized by synthesis where it can)",
                loc=region.loc)
        if option is False:
            raise SynthesisError(
                "warp_specialize=False, but this tg.pipeline states its warp roles "
                "(tg.producer / tg.consumer); drop the option or the two blocks",
                loc=region.loc)
        for op in region.ops:
            if op.choices.get("instr") != "tma":
                why = op.choices.get("tma_skipped") or _why_no_box(loop, op)
                raise SynthesisError(
                    f"tg.producer: the copy into {describe(op.dst)} is not a TMA box ({why}); "
                    f"the producer warpgroup only issues TMA boxes into wgmma operand "
                    f"buffers", loc=op.loc, other_loc=region.loc)


def _why_no_box(loop: ForLoop, copy: Copy) -> str:
    """Why TMA planning left a stage load alone without a reason of its own: it plans only
    the loads of a pipelined loop into wgmma operand buffers."""
    if loop.stages < 2:
        return "the tg.pipeline has stages=1, so no load runs ahead of its use"
    for op in walk_ops(loop.body):
        if isinstance(op, Gemm) and any(isinstance(t, SharedTile) and t.alloc is copy.dst.alloc
                                        for t in (op.a, op.b)):
            skipped = getattr(op.choices.get("plan"), "wgmma_skipped", "")
            if skipped:
                return (f"the gemm at line {op.loc.lineno if op.loc else '?'} reading it does "
                        f"not run on wgmma: {skipped}")
    return "it is not an operand of a wgmma gemm"


def stated_budgets(kernel: TracedKernel, loop: ForLoop, groups: int) -> tuple[int, int | None]:
    """(producer, consumer) registers per thread of the specialized pipeline `loop`: what
    its `tg.producer(regs=)` / `tg.consumer(regs=)` ask for, else `register_budgets`'s;
    a `SynthesisError` where the two do not fit the block's share of the register file
    (`setmaxnreg` only moves registers within it)."""
    producer, consumer = register_budgets(kernel.threads * groups)
    regions = {r.role: r for r in loop.regions}
    if not any(r.registers for r in regions.values()):
        return producer, consumer
    producer = regions["producer"].registers or producer
    consumer = regions["consumer"].registers or consumer
    threads = kernel.threads * groups
    total = threads + WARPGROUP
    share = register_share(total)
    asked = WARPGROUP * producer + threads * (consumer or share)
    if asked > total * share:
        region = regions["consumer"] if regions["consumer"].registers else regions["producer"]
        raise SynthesisError(
            f"tg.{region.role}(regs={region.registers}): the roles ask for {WARPGROUP} x "
            f"{producer} (producer) + {threads} x {consumer or share} (consumer) = {asked} "
            f"registers, over the {total} x {share} = {total * share} a block of {total} "
            f"threads holds (one block per SM; setmaxnreg only moves registers between its "
            f"warps). Lower a budget", loc=region.loc)
    return producer, consumer


def _stated_note(loop: ForLoop) -> str:
    """What explain says about roles the source stated ("" where synthesis chose them)."""
    if not loop.regions:
        return ""
    parts = []
    for r in loop.regions:
        args = ([f"regs={r.registers}"] if r.registers else []) + \
            ([f"schedule={r.schedule!r}"] if r.schedule else [])
        parts.append(f"tg.{r.role}" + (f"({', '.join(args)})" if args else "")
                     + (f" at line {r.loc.lineno}" if r.loc else ""))
    return "roles stated in the source: " + ", ".join(parts)


def choose_consumers(kernel: TracedKernel, loop: ForLoop, consumers: str | None,
                     asked: str | None = None) -> tuple[int, str]:
    """(consumer groups, why) for the specialized pipeline `loop` under the build option
    `consumers`: "pingpong" requires the ping-pong schedule (a `SynthesisError` saying why
    it cannot run), "cooperative" keeps one consumer role; None takes ping-pong where it
    applies and is measured faster (`_pingpong_pays`). `asked` names where the schedule
    was asked for (a `tg.consumer(schedule=)` block, whose line errors point at)."""
    problem = why_not_pingpong(kernel, loop)
    asked = asked or f"consumers={consumers!r}"
    if consumers == "pingpong":
        if problem:
            block = loop.region("consumer")
            stated = block is not None and block.schedule is not None
            raise SynthesisError(f"{asked}: {problem}", loc=block.loc if stated else loop.loc,
                                 other_loc=loop.loc if stated else None)
        return PINGPONG_GROUPS, asked
    if consumers == "cooperative":
        return 1, asked
    if problem:
        return 1, f"not pingpong: {problem}"
    pays = _pingpong_pays(kernel, loop)
    if not pays:
        return 1, ("pingpong applies but is not the default in clusters (not measured yet; "
                   "consumers='pingpong' forces it)")
    return PINGPONG_GROUPS, pays


def _pingpong_pays(kernel: TracedKernel, loop: ForLoop) -> str:
    """Why the default takes ping-pong for this pipeline ("" where it does not). Where it
    applies, the user's tile is one warpgroup's, whose only alternative is one consumer
    warpgroup idling the tensor cores through each tile's epilogue: on an H100 (session 7,
    4096³, 128x128x64 tiles) ping-pong ran at 397–405 TFLOP/s against 390 for the one
    warpgroup and 379 for two cooperative ones. (Larger tiles are cooperative: 128x256 on
    two warpgroups ran at 632, a tile one warpgroup cannot hold.) In clusters it is not
    measured yet: there the default stays cooperative."""
    if tuple(kernel.cluster) != (1, 1, 1):
        return ""
    return "the default for a tile of one warpgroup in a tile loop"


def why_not_pingpong(kernel: TracedKernel, loop: ForLoop) -> str:
    """Why the specialized pipeline `loop` cannot run the ping-pong schedule ("" if it
    can). Each consumer warpgroup runs the kernel's consumer code for its own tiles, so
    the user's threads must be one warpgroup, the tiles an enclosing loop the
    warpgroups can split (one run-time loop around the pipeline, stepping forward, its
    iterations independent but for the ring), and nothing but the ring in shared memory
    (the warpgroups would share it), nor an exchange lowering makes through shared
    scratch (`_shared_scratch`). Clusters compose: every block of a cluster walks the
    same tiles (multicast proved it), so warpgroup g of each takes the same ones."""
    if kernel.threads != WARPGROUP:
        return (f"the kernel's tiles span {kernel.threads} threads; each ping-pong consumer "
                f"is one warpgroup (launch with threads={WARPGROUP})")
    ring = loop.choices.get("ring")
    if ring is None:
        return ("the pipeline is not inside a tile loop (the consumer warpgroups take turns "
                "over the enclosing loop's iterations)")
    around = enclosing_ops(kernel.body, loop) or []
    if len(around) != 1 or not isinstance(around[0], ForLoop) or around[0].step <= 0:
        return ("the pipeline must sit directly in one run-time tile loop with a positive "
                "step (its iterations are what the consumer warpgroups split)")
    stages = {o.dst.alloc.id for o in loop.body
              if isinstance(o, Copy) and o.choices.get("instr") == "tma"}
    rest = [o for o in loop.body
            if not (isinstance(o, Copy) and o.choices.get("instr") == "tma")]
    if not (len(rest) == 1 and isinstance(rest[0], Gemm)):
        # Lowering runs ping-pong turns around a lone gemm's loop only (session 10: a
        # body with more, the blockwise FP8 GEMM's, read unwritten stages in the emulator).
        return ("the pipeline's body is more than its TMA copies and one gemm (ping-pong "
                "turns are lowered for a lone gemm)")
    for op in walk_ops(kernel.body):
        for tile in tiles_read(op) + tiles_written(op):
            if isinstance(tile, SharedTile) and tile.alloc.id not in stages:
                return (f"{describe(tile)} (line {op.loc.lineno if op.loc else '?'}) is in "
                        f"shared memory, which both consumer warpgroups would use at once")
        scratch = _shared_scratch(op, kernel.threads)
        if scratch:
            return (f"{scratch} (line {op.loc.lineno if op.loc else '?'}) goes through a "
                    f"shared-memory scratch buffer, which both consumer warpgroups would use "
                    f"at once")
    return _tile_loop_dependence(kernel, around[0])


def _shared_scratch(op, threads: int) -> str:
    """What of `op` lowering exchanges through shared scratch ("" if nothing): a reduction
    whose threads span warps (`lower/compute.py`, `lower/arg_reduce.py`), a layout
    conversion the planner sends through shared memory, any scan (conservatively: one
    across warps does)."""
    from tegula.lower.compute import reduction_thread_bits
    if isinstance(op, Reduce) and op.x.layout is not None and op.out.layout is not None:
        if any(b >= 5 for b in reduction_thread_bits(op.x.layout, op.out.layout, threads)):
            return f"the {op.kind} of {describe(op.x)} across warps"
    elif isinstance(op, Rearrange):
        choice = op.choices.get("conversion")
        if choice is None or choice.kind == "shared":
            return f"the layout conversion of {describe(op.x)}"
    elif isinstance(op, Scan):
        return "the scan"
    return ""


def _tile_loop_dependence(kernel: TracedKernel, tile_loop: ForLoop) -> str:
    """Why the iterations of `tile_loop` may depend on each other ("" where none is
    seen): ping-pong gives each consumer warpgroup every other iteration, with registers of
    its own and no order between the two, so a register tile carried from one iteration to
    the next (`acc` accumulated over the loop rather than made in it: each warpgroup would
    hold half the sum) or a global tile every iteration stores to (the last store could be
    any warpgroup's) would be a silent wrong result, as would two iterations storing one
    global element, or one reading what another stored: `tile_map.global_dependence`
    proves they do not (or says why it cannot)."""
    inside = list(walk_ops(tile_loop.body))
    written = {id(t) for op in inside for t in tiles_written(op)
               if not isinstance(t, (SharedTile, GlobalTile))}
    for op in walk_ops(kernel.body):
        if any(op is o for o in inside):
            continue
        for tile in tiles_read(op) + tiles_written(op):
            if id(tile) in written:
                return (f"{describe(tile)} is written in the tile loop (line "
                        f"{tile_loop.loc.lineno if tile_loop.loc else '?'}) and used outside "
                        f"it (line {op.loc.lineno if op.loc else '?'}), so its iterations "
                        f"are not independent: each consumer warpgroup would hold its own")
    return global_dependence(tile_loop, kernel.cluster)


@dataclass(frozen=True)
class MulticastPlan:
    """A TMA copy multicast across the cluster: the box's `rows` (its outermost map dim)
    split into `ctas` slices of `slice_rows`; the block of rank r loads slice r into every
    block of the cluster (CTA mask `mask`), at the slice's place in the stage."""

    ctas: int
    rows: int
    slice_rows: int

    @property
    def mask(self) -> int:
        return (1 << self.ctas) - 1

    def describe(self, name: str) -> str:
        return (f"{name}'s box is the same in every block, so each loads {self.slice_rows} of "
                f"its {self.rows} rows into all {self.ctas}")


def decide_multicast(kernel: TracedKernel, loop: ForLoop) -> str:
    """Multicast the TMA copies of the specialized pipeline `loop` that every block of the
    kernel's cluster loads alike (module docstring); record `choices["multicast"]` on each
    and return what explain says about the cluster."""
    ctas = kernel.cluster[0] * kernel.cluster[1] * kernel.cluster[2]
    if ctas == 1:
        return ""
    copies = [o for o in loop.body if isinstance(o, Copy) and o.choices.get("instr") == "tma"]
    problem = _why_no_multicast(kernel, loop, copies)
    if problem:
        loop.choices["multicast_skipped"] = problem
        return f"no box is multicast: {problem}"
    loops = {op.var.name: op for op in walk_ops(kernel.body) if isinstance(op, ForLoop)}
    notes, why = [], []
    for op in copies:
        name, plan = op.src.arg.name, op.choices["tma"]
        origin = op.src.origin
        if not all(cluster_uniform(origin[d], kernel.cluster, loops) for d in plan.dims):
            why.append(f"{name}'s box differs between the blocks (its coordinates read the "
                       f"block's rank in the cluster)")
            continue
        rows, swizzle_atom = plan.box[-1], 8
        inner = [b for b in plan.box[1:-1] if b != 1]
        slice_rows = rows // ctas
        if inner or rows % ctas or slice_rows % swizzle_atom:
            why.append(f"{name}'s box {plan.box} does not split into {ctas} slices of whole "
                       f"8-row swizzle atoms along its outermost dim")
            continue
        op.choices["multicast"] = MulticastPlan(ctas, rows, slice_rows)
        notes.append(op.choices["multicast"].describe(name))
    if not notes:
        loop.choices["multicast_skipped"] = "; ".join(why)
        return "no box is multicast: " + "; ".join(why)
    return ("; ".join(notes + why) + "; a stage is free once the consumers of every block "
            "released it (they arrive on the empty mbarrier of each block of the cluster)")


def _why_no_multicast(kernel: TracedKernel, loop: ForLoop, copies: list) -> str:
    """Why the copies of `loop` cannot be multicast at all ("" if they may be)."""
    rest = [o for o in loop.body if not any(o is c for c in copies)]
    if not wgmma_stage_reads_only(rest, {c.dst.alloc.id for c in copies}):
        return ("something other than a wgmma gemm reads the pipeline's staged tiles (a "
                "stage is released to the cluster by each warp once its wgmmas retired)")
    loops = {op.var.name: op for op in walk_ops(kernel.body) if isinstance(op, ForLoop)}
    for op in (enclosing_ops(kernel.body, loop) or []) + [loop]:
        if isinstance(op, ForLoop) and not all(cluster_uniform(b, kernel.cluster, loops)
                                               for b in (op.start, op.stop)):
            return (f"the loop at line {op.loc.lineno if op.loc else '?'} may run different "
                    f"iterations in the blocks of a cluster (its bounds read the block's rank; "
                    f"walk the tiles by cluster, tg.block_id(0) // {kernel.cluster[0]})")
    return ""


def _refuse_without_tma(kernel: TracedKernel) -> None:
    """`warp_specialize=True` for a kernel with no TMA pipeline (no producer to split off):
    a `SynthesisError` saying why, at the kernel's first pipeline or its definition."""
    pipelines = [op for op in walk_ops(kernel.body) if isinstance(op, ForLoop) and op.stages > 1]
    reasons = [o.choices["tma_skipped"] for p in pipelines for o in p.body
               if isinstance(o, Copy) and o.choices.get("tma_skipped")]
    why = (f"its copies are not TMA boxes ({reasons[0]})" if reasons else
           "the kernel has no tg.pipeline whose copies run on TMA into wgmma operands "
           "(sm_90a only)")
    raise SynthesisError(f"warp_specialize=True: the kernel cannot be warp-specialized: {why}",
                         loc=pipelines[0].loc if pipelines else kernel.loc)


def _is_tma(loop: ForLoop) -> bool:
    return any(isinstance(o, Copy) and o.choices.get("instr") == "tma" for o in loop.body)


def _why_not(kernel: TracedKernel, loop: ForLoop, tma_loops: list, option: bool | None) -> str:
    """Why `loop` is not warp-specialized ("" if it is)."""
    if option is False:
        return "warp_specialize=False"
    if kernel.threads + WARPGROUP > MAX_BLOCK_THREADS:
        return (f"the producer warpgroup would make the block {kernel.threads + WARPGROUP} "
                f"threads, over {MAX_BLOCK_THREADS}")
    if len(tma_loops) > 1:
        # One producer runs ahead of the consumer; a second pipeline's boxes could land
        # while the consumer still reads the first's stages (one role orders them with a
        # block barrier).
        return f"the kernel has {len(tma_loops)} TMA pipelines (one producer role serves one)"
    around = enclosing_ops(kernel.body, loop) or []
    if any(isinstance(op, IfThen) for op in around):
        return ("the pipeline is inside a tg.if_ (the producer runs outside every branch of "
                "the consumer)")
    if not any(isinstance(op, Gemm) for op in walk_ops(loop.body)):
        return "the pipeline issues no wgmma"
    buffers = {o.dst.alloc.id for o in loop.body
               if isinstance(o, Copy) and o.choices.get("instr") == "tma"}
    for op in _ops_outside(kernel.body, loop):
        for tile in tiles_read(op) + tiles_written(op):
            if isinstance(tile, SharedTile) and tile.alloc.id in buffers:
                return (f"{describe(tile)} is also used outside the pipeline (line "
                        f"{op.loc.lineno if op.loc else '?'}), where the producer's boxes "
                        f"would race with it")
    return ""


def _ops_outside(ops: list, loop: ForLoop):
    """Every op of `ops` (bodies included) that is not `loop` or inside it."""
    for op in ops:
        if op is loop:
            continue
        yield op
        if isinstance(op, ForLoop):
            yield from _ops_outside(op.body, loop)
        elif isinstance(op, IfThen):
            yield from _ops_outside(op.then, loop)
            yield from _ops_outside(op.otherwise, loop)
