"""Software pipelining, the decision: which ops of a `tg.pipeline` loop run ahead, over
which ring, signalled how.

A `tg.pipeline(n, stages=S)` body is split into two stages. The **load stage** is the
body's copies from global memory into multi-stage shared buffers whose transfers are
asynchronous (cp.async vectors or TMA boxes); it runs `S - 1` iterations ahead of the
**compute stage**, everything else. Iteration k's loads fill one *slot* of a ring of S
stage buffers; the compute stage waits until the slot is *full*, reads it, and *releases*
it so the load stage can refill it with iteration k + S. The ring's position of an
iteration — slot and phase parity, from a use count — and the schedule (prologue,
steady state, drain) are one transformation, `lower/pipeline.py`; what differs between
the two kinds of copies is only how "full" and "released" are signalled, the *protocol*:

- `"cp.async"`: one commit group per iteration; a slot is full once
  `cp.async.wait_group S-2` retired its group in every thread and a block barrier made
  the threads' copies visible to each other; the same barrier is the release (every
  thread finished the iteration that read the slot being refilled).
- `"mbarrier"` (sm_90a, TMA): a `full` mbarrier per slot that the loads arm with their
  byte count and complete; the compute stage waits on its phase parity. The release is a
  block barrier in one role, or, warp-specialized (`choices["roles"]`, `synth/roles.py`),
  arrivals on an `empty` mbarrier per slot that the producer warpgroup waits on.

The decision lands on the loop as `choices["pipeline"]` (a `PipelinePlan`), or as
`choices["pipeline_skipped"]` saying why the loop runs without a load stage (its copies
are synchronous: the loop is correct, each iteration loads its own stage, but nothing
overlaps). Lowering reads the plan and nothing else to find the load stage.
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.errors import SynthesisError
from tegula.ir.ops import Copy, ForLoop, TracedKernel, walk_ops
from tegula.ir.values import GlobalTile, SharedTile, describe

#: The protocols, by the copy instruction synthesis chose for the load stage.
PROTOCOLS = {"cp.async": "cp.async", "tma": "mbarrier"}


@dataclass(frozen=True, eq=False)
class PipelinePlan:
    """The software pipeline of one `tg.pipeline` loop (module docstring)."""

    stages: int
    #: The load stage: the body's copies that run `lookahead` iterations ahead.
    producers: tuple
    #: "cp.async" or "mbarrier": how a slot's landing and release are signalled.
    protocol: str
    #: A TMA ring that runs on across enclosing loops (`copies.RingPlan`), else None.
    ring: object = None
    kind = "pipeline"  # what lowering dispatches on (lowering does not import synthesis)

    @property
    def lookahead(self) -> int:
        return self.stages - 1

    def describe(self) -> str:
        loads = ", ".join(describe(op.dst) for op in self.producers)
        how = ("cp.async groups, one per iteration (wait_group + block barrier)"
               if self.protocol == "cp.async" else
               "TMA boxes completing full mbarriers, waited on by phase parity")
        ring = "; " + self.ring.describe() if self.ring is not None else ""
        return (f"{loads} loaded {self.lookahead} iteration{'s' if self.lookahead > 1 else ''}"
                f" ahead into a ring of {self.stages} stages: {how}{ring}")


def plan_pipelines(kernel: TracedKernel) -> None:
    """Put a `PipelinePlan` (or the reason there is none) on every `tg.pipeline` loop of
    `kernel`, once synthesis decided each copy's instruction (TMA, cp.async, or a
    synchronous ld+st) and a TMA ring's `RingPlan`."""
    for loop in walk_ops(kernel.body):
        if not isinstance(loop, ForLoop) or loop.stages < 2:
            continue
        loop.choices.pop("pipeline", None)
        loop.choices.pop("pipeline_skipped", None)
        plan, why_not = plan_pipeline(loop)
        if plan is not None:
            loop.choices["pipeline"] = plan
        else:
            loop.choices["pipeline_skipped"] = why_not


def plan_pipeline(loop: ForLoop) -> tuple[PipelinePlan | None, str]:
    """(the loop's plan, "") or (None, why its body has no load stage)."""
    staged = staged_loads(loop)
    if not staged:
        return None, ("no copy from global memory into a multi-stage shared buffer in the "
                      "loop body: nothing to load ahead")
    # One protocol per loop: synthesis makes a loop's staged loads TMA boxes all or none
    # (`synthesize._plan_tma_copies`), so TMA wins where present and cp.async copies of
    # the same loop cannot exist beside them.
    for instr in ("tma", "cp.async"):
        producers = tuple(op for op in staged if op.choices.get("instr") == instr)
        if producers and loop.step != 1:
            # Iteration k loads iteration k + S - 1's stage, and stage buffers are indexed
            # by the loop index modulo S: both count iterations in steps of one.
            raise SynthesisError(f"tg.pipeline with step {loop.step}: a pipelined loop "
                                 f"loads {loop.stages - 1} iteration(s) ahead and indexes "
                                 f"its stages by its index modulo {loop.stages}, so it steps "
                                 f"by 1 (loop over the step count and scale the index "
                                 f"instead)", loc=loop.loc)
        if producers:
            return PipelinePlan(loop.stages, producers, PROTOCOLS[instr],
                                loop.choices.get("ring")), ""
    first = staged[0]
    return None, (f"the copy into {describe(first.dst)} is {first.choices.get('instr')} "
                  f"(a synchronous load: cp.async moves vectors of 4, 8 or 16 bytes, which "
                  f"this copy's layouts do not give), so each iteration loads its own stage "
                  f"and nothing runs ahead")


def staged_loads(loop: ForLoop) -> list[Copy]:
    """The body's copies from global memory into multi-stage shared buffers."""
    return [op for op in loop.body if isinstance(op, Copy) and isinstance(op.src, GlobalTile)
            and isinstance(op.dst, SharedTile) and op.dst.alloc.stages > 1]
