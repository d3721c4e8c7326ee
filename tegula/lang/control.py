"""Run-time control flow: `tg.range`, `tg.pipeline`, `tg.if_` / `tg.else_`.

Python control flow in a kernel body runs at trace time (it unrolls and specializes). These
are the run-time forms: a loop yields its symbolic index exactly once, and the ops traced
while the body runs become the recorded `ForLoop`'s body; `with tg.if_(k < n):` records an
`IfThen` around the ops of its block. Each block snapshots the locals of the user's frame
when it opens and, when it closes, carries the register tiles rebound inside it
(tegula.lang.carry).
"""
from __future__ import annotations

from typing import Any, Iterator

from tegula.errors import TraceError
from tegula.ir.ops import ForLoop, IfThen
from tegula.ir.scalar import (Condition, GridSize, LoopIndex, Scalar, SMCount, SteppedIndex,
                              as_scalar, compare, known_non_negative)
from tegula.lang.carry import BlockEntry, carry_out
from tegula.lang.roles import check_pipeline_regions
from tegula.lang.tensors import TileHandle, index_value
from tegula.lang.trace import Scope, TraceContext, current, fail, user_location


class RuntimeLoop:
    """The iterable `tg.range` / `tg.pipeline` return; iterating it records a ForLoop."""

    def __init__(self, label: str, start: Any, stop: Any, step: Any, stages: Any):
        self.label = label
        self.start = index_value(start, label, "the loop start")
        self.stop = index_value(stop, label, "the loop stop")
        if isinstance(step, Scalar) and label != "tg.range":
            raise fail(label, f"the step must be a Python int known at trace time, got {step} "
                              f"(a run-time step is for tg.range)")
        if not isinstance(step, Scalar) and (isinstance(step, bool) or
                                             not isinstance(step, int)):
            raise fail(label, f"the step must be an int or a kernel scalar, got {step!r}")
        if not isinstance(step, Scalar) and step == 0:
            raise fail(label, "the step must not be zero")
        if not isinstance(step, Scalar) and step < 0 and label != "tg.range":
            raise fail(label, f"the step must be positive, got {step} (a pipeline runs its "
                              f"copies ahead of increasing indices; a descending loop is "
                              f"tg.range)")
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
            raise fail(label, f"stages must be a positive integer, got {stages!r}")
        self.step, self.stages = step, stages
        self.loc = user_location()

    def __iter__(self) -> Iterator[Scalar]:
        ctx = current(self.label)
        # A trip counter (run-time step) starts at 0; a constant-step loop counts up from
        # its start: its index is never negative when that start is not.
        counts_up = isinstance(self.step, Scalar) or (self.step > 0 and
                                                      known_non_negative(self.start))
        var = LoopIndex(ctx.fresh_name("i"), non_negative=counts_up)
        if isinstance(self.step, Scalar) or self.step < 0:
            # A run-time or negative step: count iterations j = 0 … trips-1 and give the
            # body start + j * step, so every loop below the language counts up by a
            # positive constant (lowering, pipelining, the emulator and the `<` of the
            # emitted C loop rely on it; a descending loop once printed `i < stop` with a
            # negative increment and never ran).
            start, stop, step = 0, _trip_count(self.start, self.stop, self.step), 1
            index = SteppedIndex("+", as_scalar(self.start), var * self.step)
        else:
            start, stop, step, index = self.start, self.stop, self.step, var
        loop = ForLoop(var=var, start=start, stop=stop, step=step, body=[],
                       stages=self.stages, loc=self.loc)
        ctx.emit(loop)
        entry = BlockEntry.capture(ctx)  # the locals of the frame running the `for`
        scope = ctx.open_block(loop.body, self.label, self.loc)
        ctx.loop_scopes[id(var)] = scope
        return _trace_body_once(ctx, loop, index, self.label, entry, scope)


def _trip_count(start: Scalar | int, stop: Scalar | int, step: Scalar | int) -> Scalar | int:
    """Iterations of `range(start, stop, step)` for a run-time (or negative constant) step,
    as Python counts them: ceil((stop - start) / step) when positive, else 0 — for either
    sign of the step — and 0 for a zero step (which Python refuses; at run time there is
    no one to tell)."""
    from tegula.lang.scalars import scalar_extremum
    if not isinstance(step, Scalar):  # a constant step (negative: tg.range checked it)
        if isinstance(start, int) and isinstance(stop, int):
            return len(range(start, stop, step))
        return scalar_extremum("max", 0, 0 - (start - stop) // step)
    trips = scalar_extremum("max", 0, 0 - (start - stop) // step)  # ceil by floor division
    if isinstance(step, (GridSize, SMCount)):  # at least 1 whenever the kernel runs
        return trips
    nonzero = scalar_extremum("min", 1, scalar_extremum("max", step, 0 - step))  # 0 or 1
    return trips * nonzero


def _trace_body_once(ctx: TraceContext, loop: ForLoop, index: Scalar, label: str,
                     entry: BlockEntry, scope: Scope) -> Iterator[Scalar]:
    """Yield the loop index once; the user's body runs between the yield and the resume.
    Names the body rebound are then carried to the next iteration (tegula.lang.carry)."""
    resumed = False
    try:
        yield index
        resumed = True
    finally:
        if not resumed and ctx.innermost_block is loop.body:
            # Closed without finishing: the body did `break`/`return` (or raised, in which
            # case the driver reports that exception instead of this one).
            entry.frame = None
            ctx.close_block(loop.body)
            ctx.deferred_error = ctx.deferred_error or TraceError(
                f"{label}: `break` or `return` inside a run-time loop is not supported (the "
                f"body is traced once; use tg.if_ to guard work instead)", loop.loc)
    check_pipeline_regions(loop, label)  # its tg.producer / tg.consumer blocks, if any
    retarget = carry_out(ctx, entry, scope, loop, loop.body)
    ctx.close_block(loop.body)
    retarget()


def runtime_range(start: Any, stop: Any = None, step: Any = 1) -> RuntimeLoop:
    """A run-time loop `for k in tg.range(n)` / `tg.range(start, stop, step)`: the body is
    traced once with a symbolic index. Exported as `tg.range`; Python's `range` unrolls.
    Start, stop and step may be kernel scalars (a persistent loop: `tg.range(
    tg.block_id(0), tiles, tg.num_programs(0))`); a run-time step of 0 runs no iteration."""
    if stop is None:
        start, stop = 0, start
    return RuntimeLoop("tg.range", start, stop, step, 1)


def pipeline(start: Any, stop: Any = None, step: int = 1, *, stages: int = 2) -> RuntimeLoop:
    """A software-pipelined run-time loop: copies into multi-stage shared buffers are
    issued `stages - 1` iterations ahead (`for k in tg.pipeline(n, stages=3)`). On sm_90a
    its body may state warp roles: a `with tg.producer():` block of those copies, then a
    `with tg.consumer():` block of the rest (tegula.lang.roles)."""
    if stop is None:
        start, stop = 0, start
    return RuntimeLoop("tg.pipeline", start, stop, step, stages)


class _Branch:
    """The context manager behind `tg.if_` / `tg.else_`: traces its block into `ops` (the
    `then` or `otherwise` list of `op`); names it rebinds are carried out of it."""

    def __init__(self, ctx: TraceContext, op: IfThen, ops: list, label: str):
        self.ctx, self.op, self.ops, self.label = ctx, op, ops, label
        self.loc = op.loc if label == "tg.if_" else user_location()
        self.entry: BlockEntry | None = None
        self.scope: Scope | None = None

    def __enter__(self) -> None:
        self.entry = BlockEntry.capture(self.ctx)
        self.scope = self.ctx.open_block(self.ops, self.label, self.loc)
        if self.label == "tg.if_":
            self.ctx.branch_scopes[id(self.op)] = self.scope

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            then_scope = self.ctx.branch_scopes.get(id(self.op)) \
                if self.label == "tg.else_" else None
            retarget = carry_out(self.ctx, self.entry, self.scope, self.op, self.ops,
                                 then_scope)
            self.ctx.close_block(self.ops)
            retarget()
        elif self.ctx.innermost_block is self.ops:
            self.entry.frame = None
            self.ctx.close_block(self.ops)
        return False


def if_(cond: Any) -> _Branch:
    """`with tg.if_(k < n): …` runs the block only when the block-uniform condition holds."""
    label = "tg.if_"
    ctx = current(label)
    if isinstance(cond, bool):
        raise fail(label, f"the condition is {cond} at trace time; use a Python `if` instead")
    if isinstance(cond, TileHandle):
        raise fail(label, "the condition is a tile (one value per element); use tg.where to "
                          "choose per element, or reduce it first")
    if isinstance(cond, Scalar):
        raise fail(label, f"the condition must be a comparison such as {cond} > 0, got {cond}")
    if not isinstance(cond, Condition):
        raise fail(label, f"the condition must compare kernel scalars (e.g. k < n), got "
                          f"{cond!r}")
    op = ctx.emit(IfThen(cond=cond, then=[]))
    return _Branch(ctx, op, op.then, label)


def else_() -> _Branch:
    """`with tg.else_(): …` right after a `with tg.if_(…):` block: its other branch."""
    label = "tg.else_"
    ctx = current(label)
    block = ctx.innermost_block
    last = block[-1] if block else None
    if not isinstance(last, IfThen) or last.otherwise:
        raise fail(label, "tg.else_ must directly follow a `with tg.if_(...):` block")
    return _Branch(ctx, last, last.otherwise, label)


def _equality(op: str, a: Any, b: Any):
    if isinstance(a, TileHandle) or isinstance(b, TileHandle):
        from tegula.lang.elementwise import binary
        return binary("eq" if op == "==" else "ne", a, b)
    label = "tg.eq" if op == "==" else "tg.ne"
    return compare(op, index_value(a, label, "operand"), index_value(b, label, "operand"))


def eq(a: Any, b: Any):
    """`a == b`: a Condition for kernel scalars (Scalar `==` is identity, on purpose), an
    element-wise bool tile for register tiles."""
    return _equality("==", a, b)


def ne(a: Any, b: Any):
    """`a != b`: a Condition for kernel scalars, an element-wise bool tile for tiles."""
    return _equality("!=", a, b)


__all__ = ["RuntimeLoop", "runtime_range", "pipeline", "if_", "else_", "eq", "ne"]
