"""Warp roles in the source: `with tg.producer(): …` and `with tg.consumer(): …`.

On sm_90a synthesis already splits a TMA + wgmma `tg.pipeline` into a producer warpgroup
that only issues the stage loads and a consumer role that computes (`synth/roles.py`).
These two blocks let the kernel say so itself, with a register budget per role:

    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        with tg.producer(regs=40):          # one extra warpgroup: waits for a free stage,
            tg.copy(ga[:, :, k], sa[k])     # issues its TMA boxes
            tg.copy(gb[:, :, k], sb[k])
        with tg.consumer(regs=232):         # the kernel's threads: wait for a full stage,
            tg.gemm(acc, sa[k], sb[k])      # compute, release it

A region is a `with` block directly in a `tg.pipeline` body: the producer first, holding
exactly the loop's copies from global memory into its multi-stage shared buffers, then the
consumer, holding everything else of the body. Code outside the pipeline (the prologue and
the epilogue) is the consumer's, as in the synthesized split. The ops stay in the loop's one
flat body; the loop records which region each belongs to (`ir.ops.RoleRegion` in
`ForLoop.regions`), and synthesis maps the regions onto the same `RolesPlan` it would have
chosen itself (`synth/roles.py` `plan_stated_roles`), so the same source with or without the
two `with` lines compiles to the same code where the budgets agree.

`regs=` is the role's registers per thread after `setmaxnreg` (a multiple of 8 from 24 to
256, the instruction's range); None leaves the budget to synthesis (producer 40, consumer
what that frees). Whether both fit the register file is checked in synthesis, which knows
the block's size.

Checked here, at the user's line: a region outside a `tg.pipeline` body (or nested in a
`tg.if_`, a `tg.range` or another region), two regions of one role, a consumer without a
producer (and the reverse), the consumer before the producer, an op of the body in neither
region, a producer op that is not a copy from global into a staged shared buffer, and a
shared buffer the consumer writes that the producer writes too. Checked in synthesis
(`synth/roles.py`): the target (sm_90a only), the copies being TMA boxes, the budgets
against the register file, and everything the synthesized split needs.
"""
from __future__ import annotations

from typing import Any

from tegula.errors import TraceError
from tegula.ir.ops import Copy, ForLoop, Gemm, IfThen, Op, RoleRegion, tiles_written, walk_ops
from tegula.ir.values import GlobalTile, SharedTile, describe
from tegula.lang.trace import TraceContext, current, fail, user_location

ROLES = ("producer", "consumer")
#: The consumer schedules a `tg.consumer` block may state (`synth/roles.py`).
CONSUMER_SCHEDULES = ("cooperative", "pingpong")
#: `setmaxnreg`'s range of registers per thread (PTX ISA: a multiple of 8 in 24..256).
MIN_REGISTERS, MAX_REGISTERS = 24, 256


class RoleBlock:
    """The context manager behind `tg.producer` / `tg.consumer`: the ops traced inside it
    go into the pipeline body as usual, and on exit the loop records them as the role's
    region."""

    def __init__(self, role: str, regs: Any, schedule: Any = None):
        self.role, self.label = role, f"tg.{role}"
        self.ctx: TraceContext = current(self.label)
        self.registers = _check_registers(self.label, regs)
        self.schedule = _check_schedule(self.label, schedule)
        self.loc = user_location()
        self.loop: ForLoop | None = None
        self.first = 0

    def __enter__(self) -> None:
        loop = _enclosing_pipeline(self.ctx, self.label)
        if loop.region(self.role) is not None:
            raise fail(self.label, f"the tg.pipeline at line {_line(loop)} already has a "
                                   f"{self.label} block (line {_line(loop.region(self.role))});"
                                   f" a pipeline has one producer and one consumer")
        if self.role == "producer" and loop.region("consumer") is not None:
            raise fail(self.label, f"the tg.producer block must come before the tg.consumer "
                                   f"block (line {_line(loop.region('consumer'))}) in the "
                                   f"pipeline body: the producer fills the stage the "
                                   f"consumer then reads")
        self.ctx.open_region = self
        self.loop, self.first = loop, len(loop.body)

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.ctx.open_region = None
        if exc_type is not None:
            return False
        ops = self.loop.body[self.first:]
        region = RoleRegion(self.role, ops, self.registers, self.loc, self.schedule)
        if self.role == "producer":
            _check_producer_ops(region)
        self.loop.regions.append(region)
        return False


def producer(regs: int | None = None) -> RoleBlock:
    """`with tg.producer(regs=40):` inside a `tg.pipeline` body: the block's copies (global
    memory into the pipeline's staged shared buffers) run on a producer warpgroup of their
    own (sm_90a, TMA), with `regs` registers per thread (None: synthesis chooses)."""
    return RoleBlock("producer", regs)


def consumer(regs: int | None = None, schedule: str | None = None) -> RoleBlock:
    """`with tg.consumer(regs=232):` after the `tg.producer` block of a `tg.pipeline` body:
    the rest of the body (and all of the kernel outside the pipeline) runs on the kernel's
    threads, waiting for each stage the producer fills and releasing it after use, with
    `regs` registers per thread (None: synthesis chooses). `schedule="pingpong"` gives the
    block two consumer warpgroups taking turns at the tensor cores (whole tiles of the
    enclosing tile loop, or, for a two-warpgroup tile with no tile loop, the gemms inside
    the loop), `"cooperative"` one consumer role; None: the `consumers=` build option, else
    synthesis's choice (`synth/roles.py`)."""
    return RoleBlock("consumer", regs, schedule)


def check_pipeline_regions(loop: ForLoop, label: str) -> None:
    """When a loop body closes: a loop with role blocks is a `tg.pipeline` with both, and
    every op of its body is in one of them, no buffer written by both (module docstring)."""
    if not loop.regions:
        return
    made = loop.regions[0]
    missing = [role for role in ROLES if loop.region(role) is None]
    if missing:
        raise TraceError(f"tg.{made.role}: the tg.pipeline at line {_line(loop)} has a "
                         f"tg.{made.role} block but no tg.{missing[0]} block; warp roles come "
                         f"in pairs (a producer filling the stages, a consumer reading "
                         f"them). Write both, or neither and let synthesis split the "
                         f"pipeline itself", made.loc)
    for op in loop.body:
        if not any(r.holds(op) for r in loop.regions):
            raise TraceError(f"{label}: {_what(op)} is in the pipeline body but in neither "
                             f"its tg.producer nor its tg.consumer block; with warp roles every "
                             f"op of the body belongs to one (move it into the tg.consumer "
                             f"block)", op.loc, made.loc)
    _check_shared_writes(loop)


def _check_shared_writes(loop: ForLoop) -> None:
    """The producer's stage buffers are written only by the producer: a consumer write
    would race with the producer's boxes, which land whenever the stage is free."""
    producer, consumer = loop.region("producer"), loop.region("consumer")
    for op in consumer.ops:
        if _is_stage_load(op):
            raise TraceError(
                f"tg.consumer: {_what(op)} is a stage load (global memory into the staged "
                f"buffer {describe(op.dst)}), which the pipeline runs ahead of its index: "
                f"with warp roles the producer issues every one of them. Move it into the "
                f"tg.producer block (line {_line(producer)})", op.loc, producer.loc)
    filled = {op.dst.alloc.id: op for op in producer.ops}
    for op in walk_ops(consumer.ops):
        for tile in tiles_written(op):
            if isinstance(tile, SharedTile) and tile.alloc.id in filled:
                raise TraceError(
                    f"tg.consumer: {_what(op)} writes {describe(tile)}, a stage buffer the "
                    f"tg.producer block fills (line {_line(filled[tile.alloc.id])}); shared "
                    f"tiles written by both roles race (the producer's boxes land whenever "
                    f"the consumer releases a stage). Write a buffer of the consumer's own",
                    op.loc, filled[tile.alloc.id].loc)


def _check_producer_ops(region: RoleRegion) -> None:
    """The producer warpgroup holds no tiles: it may only issue the pipeline's copies from
    global memory into multi-stage shared buffers (its TMA boxes)."""
    if not region.ops:
        raise TraceError("tg.producer: the block is empty; it holds the pipeline's copies from "
                         "global memory into its staged shared buffers", region.loc)
    for op in region.ops:
        if not _is_stage_load(op):
            raise TraceError(
                f"tg.producer: {_what(op)} cannot run in the producer, a warpgroup that holds "
                f"no tiles and only issues the stage loads: it may hold only copies from global "
                f"memory into the pipeline's multi-stage shared buffers (tg.shared(..., "
                f"stages=S)[k]). Move it into the tg.consumer block", op.loc, region.loc)


def _is_stage_load(op: Op) -> bool:
    """A copy from global memory into a multi-stage shared buffer: what a pipeline runs
    ahead of its index (synthesis makes them the producer's TMA boxes)."""
    return (isinstance(op, Copy) and isinstance(op.src, GlobalTile)
            and isinstance(op.dst, SharedTile) and op.dst.alloc.stages > 1)


def _enclosing_pipeline(ctx: TraceContext, label: str) -> ForLoop:
    """The `tg.pipeline` whose body is being traced right here, else a TraceError."""
    if ctx.open_region is not None:
        raise fail(label, f"role blocks do not nest (this one is inside the "
                          f"tg.{ctx.open_region.role} block at line {ctx.open_region.loc.lineno})")
    owner = ctx.enclosing_op()
    if not isinstance(owner, ForLoop) or ctx.scope.op != "tg.pipeline":
        where = "outside any loop" if owner is None else f"directly inside {ctx.scope.where}"
        raise fail(label, f"a role block goes directly in the body of a tg.pipeline loop (the "
                          f"roles meet at its stages), but this one is {where}")
    return owner


def _check_registers(label: str, regs: Any) -> int | None:
    if regs is None:
        return None
    if isinstance(regs, bool) or not isinstance(regs, int) or regs % 8 or \
            not MIN_REGISTERS <= regs <= MAX_REGISTERS:
        raise fail(label, f"regs={regs!r}: a role's register budget is setmaxnreg's, a "
                          f"multiple of 8 from {MIN_REGISTERS} to {MAX_REGISTERS} registers per "
                          f"thread (or None: synthesis chooses)")
    return regs


def _check_schedule(label: str, schedule: Any) -> str | None:
    if schedule is None:
        return None
    if label != "tg.consumer":
        raise fail(label, f"schedule={schedule!r}: only the tg.consumer block has a schedule "
                          f"(the producer is one warpgroup issuing the stage loads)")
    if schedule not in CONSUMER_SCHEDULES:
        raise fail(label, f"schedule={schedule!r}: a consumer schedule is one of "
                          f"{', '.join(map(repr, CONSUMER_SCHEDULES))} (or None: the "
                          f"consumers= build option, else synthesis chooses)")
    return schedule


def _what(op: Op) -> str:
    """How messages name an op: its language function and line."""
    name = {Copy: "tg.copy", Gemm: "tg.gemm", ForLoop: "a run-time loop",
            IfThen: "a tg.if_ block"}.get(type(op), f"an op ({type(op).__name__})")
    return f"{name} at line {_line(op)}"


def _line(thing) -> str:
    loc = getattr(thing, "loc", None)
    return str(loc.lineno) if loc is not None else "?"


__all__ = ["producer", "consumer", "check_pipeline_regions", "RoleBlock", "ROLES"]
