"""Software pipelining, the transformation: one ring, one schedule, two protocols.

Synthesis split a `tg.pipeline` loop into a load stage and a compute stage
(`synth/pipeline.py` `PipelinePlan`); this module lowers every such loop, cp.async or
TMA, through the same three pieces:

**The ring** (`Ring`): iteration `it` of the loop uses slot `slot(it)` of the S stage
buffers, and it is that slot's `n`-th use, `n = count(it) // S`, so a barrier completing
one phase per use is waited on with phase parity `parity(it) = n % 2`. A top-level loop
counts from its start (`count = it - start`, slot `it % S`: the stage every access of a
multi-stage buffer computes, `addressing.shared_offset`); a TMA ring inside other
run-time loops (`copies.RingPlan`, a persistent kernel's tile loop) continues its count
across their iterations.

**The schedule** (`run_ahead`), in one role (every thread computes):

    prologue:  issue(start + j) for j < S - 1          (each only if the iteration exists)
    loop k:    acquire(k)   slot(k) is full: its loads landed and are visible
               release(k-1) nothing reads slot(k-1) = slot(k+S-1) any more
               refill       issue(k + S - 1) into it
               compute(k)   the rest of the body
    after:     the drain (nothing in flight, shared memory ordered)

in an order the protocol and the body allow (`steps`): the refill always follows the
release it depends on, and the compute stage the acquire.

**The protocol** says how "full" and "released" are signalled:

- `CpAsyncGroups`: `issue` is the load stage's cp.async copies, predicated on the
  iteration existing, and one unconditional commit (every iteration owns one group);
  `acquire` is `cp.async.wait_group S-2` (this thread's group of iteration k landed: at
  most S-2 younger groups pending) and a block barrier (every thread's landed), which
  is also the release of slot(k-1): every thread finished iteration k-1. Order: acquire,
  refill, compute.
- `MBarrierRing` (TMA): a `full[S]` mbarrier array; `issue` is the issuing thread's
  expect-tx of the stage's bytes and its boxes; `acquire` waits on `full[slot(k)]` with
  `parity(k)`; the release is a block barrier. A body that is one wgmma gemm keeps its
  group in flight (acquire, compute with `wait_group 1` — iteration k-1's wgmmas, the
  readers of slot(k-1), retired — release, refill); any other body waits for its own
  wgmmas by the body's end (its waits deferred within it, `lower/wgmma_waits.py`), so
  release and refill come first (release, refill, acquire, compute) — unless its last
  wgmma groups are carried into the next iteration (`carry_wgmma_groups`), which
  retires them by its own end: then acquire, compute, release, refill, as for a lone
  gemm.
  Warp-specialized (`lower/hopper.py` `lower_specialized_pipeline`), the same ring and
  `full` barriers serve a producer warpgroup, which issues iteration k once
  `empty[slot(k)]` completed the release of its previous use (`producer_wait`), and
  the consumer releases by arriving on `empty` instead of a block barrier.
"""
from __future__ import annotations

import dataclasses

from tegula.errors import SynthesisError
from tegula.ir.ops import ForLoop
from tegula.lower.addressing import scalar_expr
from tegula.lower.async_ir import FenceBarrierInit, MBarrierInit, MBarrierWait, WgmmaWait
from tegula.lower.thread_ir import (TID, Barrier, BinOp, Comment, Const, CpAsyncCommit,
                                    CpAsyncWait, Expr, For, If, Let, LoadScalar, Reg, RegArray,
                                    Select, Stmt, Var, _bin, all_of, walk)


class Ring:
    """Where iteration `it` of a pipeline sits in its ring of `S` stages (module docstring).

    A top-level pipeline runs once, so its use count is `it - start`: stage `it % S`,
    parity `((it - start) // S) % 2`. A pipeline inside other run-time loops (synthesis
    put a `RingPlan` on it) keeps one ring across their iterations: its count is
    `base + (it - start)`, `base = J * trips` for the J-th run (the flattened index of the
    enclosing iterations) and the pipeline's trip count `trips` (the same in every run:
    synthesis checked), stage `count % S`, parity `(count // S) % 2`. `gemm_slot` is the
    stage the gemm's descriptors must read where it differs from their own `it % S`
    (nested), else None."""

    def __init__(self, op: ForLoop):
        self.stages = op.stages
        self.var = Var(op.var.name)
        self.start, self.stop = scalar_expr(op.start), scalar_expr(op.stop)
        plan = op.choices.get("ring")
        self.nested = getattr(plan, "kind", "") == "nested_ring"
        self.base = _runs_before(plan.enclosing, self.start, self.stop) if self.nested \
            else Const(0)

    def count(self, it: Expr) -> Expr:
        return self.base + (it - self.start)

    def slot(self, it: Expr) -> Expr:
        return self.count(it) % self.stages if self.nested else it % self.stages

    def parity(self, it: Expr) -> Expr:
        return (self.count(it) // self.stages) % 2

    def gemm_slot(self, it: Expr) -> Expr | None:
        return self.slot(it) if self.nested else None

    def exists(self, it: Expr) -> Expr:
        """True where iteration `it` is one of the loop's (it is never below `start`)."""
        return it.lt(self.stop)


def _runs_before(enclosing: tuple, start: Expr, stop: Expr) -> Expr:
    """The ring uses before the current run of a nested pipeline with bounds `start …
    stop`: (flattened index of the enclosing loops' iterations) * (its trip count).
    Indices and counts are non-negative, so C's `/` is floor division here."""
    runs: Expr | None = None
    for loop in enclosing:
        index = (Var(loop.var.name) - scalar_expr(loop.start)) // loop.step
        runs = index if runs is None else runs * trip_count(loop) + index
    return runs * _bin("max", stop - start, Const(0))


def trip_count(loop: ForLoop) -> Expr:
    """Iterations of a run-time loop with constant step (0 when it does not run)."""
    start, stop, step = scalar_expr(loop.start), scalar_expr(loop.stop), loop.step
    span = stop - start if step > 0 else start - stop
    return _bin("max", (span + (abs(step) - 1)) // abs(step), Const(0))


# --------------------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------------------


def run_ahead(ring: Ring, protocol, steps: tuple[str, ...], compute) -> list[Stmt]:
    """The pipelined loop in one role (module docstring): the prologue issues the first
    S-1 iterations, iteration k runs `steps` — "acquire", "release", "refill", "compute",
    in the order given — and the drain follows. `compute()` lowers the compute stage
    after the load stage was issued (names are handed out in that order) and returns
    (its statements, the drain)."""
    k, ahead = ring.var, ring.stages - 1
    prologue = [protocol.prologue_comment()]
    for j in range(ahead):
        prologue += protocol.issue(ring.start + j)
    early, refill = [], protocol.issue(k + ahead)
    if hasattr(protocol, "table_loads_first"):   # cp.async: a page table's entries
        early, refill = protocol.table_loads_first(refill, k + ahead)
    parts = {"refill": refill, "acquire": protocol.acquire(k),
             "release": protocol.release(k - 1)}
    parts["compute"], drain = compute()
    steps = steps() if callable(steps) else steps   # a body may decide its order
    _check_order(steps)
    body = early + [s for step in steps for s in parts[step]]
    return prologue + [For(k, ring.start, ring.stop, 1, body)] + drain


def _check_order(steps: tuple[str, ...]) -> None:
    """The two dependences of the schedule: a slot is refilled only after its release, and
    computed on only after its acquire (a protocol whose acquire is its release lists
    both, the release's statements empty)."""
    order = {step: i for i, step in enumerate(steps)}
    if len(steps) != 4 or set(order) != {"acquire", "release", "refill", "compute"} \
            or order["refill"] < order["release"] or order["compute"] < order["acquire"]:
        raise AssertionError(f"pipeline schedule {steps}: every step once, the refill "
                             f"after the release, the compute after the acquire")


# --------------------------------------------------------------------------------------
# The protocols
# --------------------------------------------------------------------------------------


class CpAsyncGroups:
    """cp.async commit groups, one per iteration (module docstring)."""

    #: The block barrier of the acquire is the release: no statements of its own.
    steps = ("acquire", "release", "refill", "compute")

    def __init__(self, lowering, op: ForLoop, producers: tuple, ring: Ring):
        from tegula.lower.copy import lower_copy
        from tegula.lower.lower import _tensor_written
        self.ring, self.stages, self.ctx = ring, op.stages, lowering.ctx
        self.copies = [s for p in producers for s in lower_copy(lowering.ctx, p)
                       if not isinstance(s, CpAsyncCommit)]
        self.read_only = {a.name for a in lowering.kernel.args
                          if not _tensor_written(lowering.kernel, a.name)}

    def prologue_comment(self) -> Stmt:
        return Comment(f"pipeline prologue: {self.stages - 1} stages in flight")

    def issue(self, it: Expr) -> list[Stmt]:
        # Only iterations that exist are fetched: a copy's address may come from a scalar
        # load (a page table) that is out of bounds past the loop's end. The commit is
        # unconditional so that every iteration owns one cp.async group.
        from tegula.lower.lower import substitute
        fetch, exists = substitute(self.copies, {self.ring.var.name: it}), self.ring.exists(it)
        if isinstance(exists, Const):
            fetch = fetch if exists.value else []
        else:
            fetch = [If(exists, fetch, [])]
        return fetch + [CpAsyncCommit()]

    def table_loads_first(self, refill: list[Stmt], it: Expr) -> tuple[list[Stmt], list[Stmt]]:
        """(Lets, the refill reading them): the scalar loads of read-only tensors that the
        refill's addresses read at an index moving with the loop (a paged cache's
        block-table entry) read at the top of the
        iteration, before the acquire's wait and barrier, so that their global-memory
        round trip overlaps the wait instead of sitting between it and the cp.async issue.
        Each is guarded like the refill (`Select(iteration exists, load, 0)`: a table is
        read only for iterations that exist); its value is the same, the tensor being
        read-only."""
        from tegula.lower.hoist import variables
        from tegula.lower.scalar_loads import _LoadBinder
        binder = _LoadBinder(self.read_only)   # (loads the loop does not move stay there)
        loads = [x for x in dict.fromkeys(x for st in walk(refill)
                                          for x in binder._surely_read(st))
                 if self.ring.var.name in variables(x)]
        if not loads:
            return [], refill
        exists, bound, lets = self.ring.exists(it), {}, []
        for load in loads:
            var = Var(self.ctx.unique("tg_pre"))
            lets.append(Let(var, Select(exists, _rebind(load, bound), Const(0)),
                            wide=load.dtype.bits > 32))
            bound[load] = var
        per_thread = {TID.name, "tg_warp_tid"} | {s.var.name for s in self.ctx.coords.prologue}
        moving = {self.ring.var.name} | {v.name for v in bound.values()}
        return lets, [_iteration_terms(s, moving, per_thread, self.ctx.unique) if isinstance(s, If)
                      else s for s in _rebind(refill, bound)]

    def acquire(self, k: Expr) -> list[Stmt]:
        return [CpAsyncWait(self.stages - 2), Barrier()]

    def release(self, previous: Expr) -> list[Stmt]:
        return []

    def drain(self) -> list[Stmt]:
        return [CpAsyncWait(0), Barrier()]


def _iteration_terms(branch: If, moving: set, per_thread: set, unique) -> If:
    """`branch` (a refill's `If(iteration exists, copies)`) with each index expression its
    copies compute more than once, reading a `moving` variable (the loop's, a prefetched
    table entry) and no `per_thread` one, bound once at the top of its body: a paged
    copy's sixteen vectors each recomputed the page row (a signed `%`) in both their
    predicate and their address, in the branches of the predicate's `&&`, where the CUDA
    compiler does not share it."""
    from collections import Counter

    from tegula.lower.hoist import MEMORY, variables
    counts: Counter = Counter()

    def count(node) -> None:
        if isinstance(node, (BinOp, Select)):
            names = variables(node)
            if names & moving and not names & per_thread and MEMORY not in names:
                counts[node] += 1
        if isinstance(node, (list, tuple)):
            for x in node:
                count(x)
        elif dataclasses.is_dataclass(node) and not isinstance(node, (type, Reg, RegArray)):
            for f in dataclasses.fields(node):
                count(getattr(node, f.name))

    count(branch.then)
    shared = {e for e, n in counts.items() if n > 1}
    lets, names = [], {}

    def bind(node):
        if isinstance(node, (list, tuple)):
            return type(node)(bind(x) for x in node)
        if not dataclasses.is_dataclass(node) or isinstance(node, (type, Reg, RegArray)):
            return node
        new = dataclasses.replace(node, **{f.name: bind(getattr(node, f.name))
                                           for f in dataclasses.fields(node) if f.init})
        if node in shared if isinstance(node, (BinOp, Select)) else False:
            if node not in names:
                names[node] = Var(unique("tg_it"))
                lets.append(Let(names[node], new,
                                wide=any("_stride" in v for v in variables(node))))
            return names[node]
        return new

    then = bind(branch.then)
    return dataclasses.replace(branch, then=lets + then) if lets else branch


def _rebind(node, bound: dict):
    """`node` (statements included) with each load in `bound` read from its variable."""
    if isinstance(node, LoadScalar) and node in bound:
        return bound[node]
    if isinstance(node, list):
        return [_rebind(x, bound) for x in node]
    if isinstance(node, tuple):
        return tuple(_rebind(x, bound) for x in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, (type, Reg, RegArray)):
        return dataclasses.replace(node, **{f.name: _rebind(getattr(node, f.name), bound)
                                            for f in dataclasses.fields(node) if f.init})
    return node  # (registers keep their identity: the emitter compares arrays by it)


class MBarrierRing:
    """TMA boxes completing `full` mbarriers, waited on by phase parity (module
    docstring); thread 0 initializes the barriers at kernel start and issues."""

    def __init__(self, lowering, op: ForLoop, producers: tuple, ring: Ring,
                 cluster: tuple = (1, 1, 1)):
        self.ctx, self.ring, self.producers = lowering.ctx, ring, list(producers)
        self.cluster = cluster  # multicast boxes address the block's rank in it
        self.full = self.ctx.mbarrier_array("full", op.stages)
        # Thread 0 issues. (`tid < 32 && Elect()` was measured worse: ptxas cannot prove
        # `tid < 32` warp-uniform, so it wraps the full-mask election in a collective
        # loop, +40 SASS instructions on the 128x256 one-role GEMM, while it already
        # turns thread 0's TMA issue into its own ELECT loop. The warp-specialized
        # producer and the stage releases elect: fewer instructions there.)
        self.issuer = TID.eq(0)

    def init_full(self) -> list[Stmt]:
        """Thread 0's inits of the full barriers (one arrival: the issuer's expect-tx)."""
        return [MBarrierInit(self.full.name, Const(s), 1) for s in range(self.ring.stages)]

    def prologue_comment(self) -> Stmt:
        stages = self.ring.stages
        return Comment(f"pipeline prologue: TMA for {stages - 1} stages, mbarrier ring "
                       f"{self.full.name}[{stages}]")

    def boxes(self, it: Expr) -> list[Stmt]:
        """The issuing thread's expect-tx and boxes of iteration `it` (`hopper.tma_issue`)."""
        from tegula.lower.hopper import tma_issue
        return tma_issue(self.ctx, self.producers, self.full.name, self.ring.slot(it), it,
                         self.ring.var.name, self.cluster)

    def issue(self, it: Expr) -> list[Stmt]:
        return [If(all_of([self.issuer, self.ring.exists(it)]), self.boxes(it))]

    def acquire(self, k: Expr) -> list[Stmt]:
        return [MBarrierWait(self.full.name, self.ring.slot(k), self.ring.parity(k))]

    def release(self, previous: Expr) -> list[Stmt]:
        return [Barrier()]

    def producer_wait(self, empty: str, it: Expr) -> Stmt:
        """Warp-specialized: the producer waits until the previous use of slot(it) was
        released (`empty[slot]`'s phase before this use: parity `parity(it) ^ 1`, which a
        fresh barrier passes, so the first S iterations go at once)."""
        return MBarrierWait(empty, self.ring.slot(it), self.ring.parity(it) ^ 1)


# --------------------------------------------------------------------------------------
# Lowering a pipelined loop
# --------------------------------------------------------------------------------------


def lower_pipeline(lowering, op: ForLoop) -> list[Stmt]:
    """A `tg.pipeline` loop with a load stage (`choices["pipeline"]`)."""
    plan = op.choices["pipeline"]
    producers = list(plan.producers)
    rest = [o for o in op.body if not any(o is p for p in producers)]
    ring = Ring(op)
    if plan.protocol == "cp.async":
        protocol = CpAsyncGroups(lowering, op, plan.producers, ring)
        return run_ahead(ring, protocol, protocol.steps,
                         lambda: (_lower_body(lowering, rest)[0], protocol.drain()))
    roles = op.choices.get("roles")
    if getattr(roles, "kind", "") == "warp_roles":
        from tegula.lower.hopper import lower_specialized_pipeline
        return lower_specialized_pipeline(lowering, op, producers, roles)
    return _lower_tma_one_role(lowering, op, ring, producers, rest)


def _lower_tma_one_role(lowering, op: ForLoop, ring: Ring, producers: list,
                        rest: list) -> list[Stmt]:
    from tegula.lower.hopper import lower_wgmma_gemm, one_gemm_in_flight
    ctx = lowering.ctx
    protocol = MBarrierRing(lowering, op, producers, ring)
    ctx.setup += [If(TID.eq(0), protocol.init_full() + [FenceBarrierInit()]), Barrier()]
    if one_gemm_in_flight(rest):
        # wait_group 1 after this iteration's wgmmas retires iteration k-1's, which read
        # stage slot(k-1), the one refilled next; iteration k's keep running across the
        # barrier and the next wait. Only this gemm touches its accumulator in the loop,
        # and wait_group 0 after the loop completes it before anything reads it (and, in
        # a nested ring, before the next run's prologue refills its stages).
        def gemm():
            return (lower_wgmma_gemm(ctx, rest[0], pending=1, slot=ring.gemm_slot(ring.var)),
                    [WgmmaWait(0), Barrier()])
        return run_ahead(ring, protocol, ("acquire", "compute", "release", "refill"), gemm)
    nested_stage_slots(ctx, ring, op, rest, producers)
    order = ["release", "refill", "acquire", "compute"]

    def body():
        # The body's gemms wait for their wgmmas where their registers are first needed,
        # not right after them (`wgmma_waits.defer_wgmma_waits`). Where its last groups
        # need not be retired by its end (the attention forward's p @ v), they stay in
        # flight across the release barrier and the refill into the next iteration
        # (`carry_wgmma_groups`), which retires them where it first needs them and at
        # the latest before its own end: the release of stage slot(k-1) at the end of
        # iteration k then follows the retirement of its readers, iteration k-1's
        # wgmmas, in every thread (the barrier), as for a lone gemm. Otherwise every
        # group is retired by the body's end, before the next iteration's release.
        # Gemms with register A operands keep their waits (ptxas's C7513: the W4A16
        # fragment kernel's one-role loop had every wgmma serialized with them deferred).
        from tegula.lower.wgmma_waits import (carry_wgmma_groups, defer_wgmma_waits,
                                              split_reused_products)
        stmts, inner = _lower_body(lowering, rest)
        carried = carry_wgmma_groups(stmts, register_a=False) if ring.stages > 1 else None
        if carried is not None:
            order[:] = ["acquire", "compute", "release", "refill"]
            return carried[0], [WgmmaWait(0)] + (inner.barrier() if inner.dirty
                                                  else [Barrier()])
        stage_wait, = protocol.acquire(ring.var)
        stmts = split_reused_products(defer_wgmma_waits(stmts, register_a=False),
                                      stage_wait)
        return stmts, (inner.barrier() if inner.dirty else [])
    return run_ahead(ring, protocol, lambda: tuple(order), body)


def _lower_body(lowering, ops: list) -> tuple[list[Stmt], object]:
    """The compute stage's statements, and the barrier tracker they leave (`SharedSync`)."""
    from tegula.lower.lower import SharedSync
    inner = SharedSync()
    return lowering.ops(ops, inner), inner


def nested_stage_slots(ctx, ring: Ring, op: ForLoop, rest: list, producers: list) -> None:
    """A nested ring's stage is `ring.slot(k)`, not the `k % S` of the ordinary shared
    addressing: the wgmma descriptors of a body with more than one gemm (the blockwise
    FP8 GEMM's promotion) read it from `ctx.ring_slots`. Synthesis keeps nested rings to
    bodies whose only reads of the stages are wgmma operands; anything else would read
    the wrong stage, so it is refused here too."""
    if not ring.nested:
        return
    from tegula.ir.ops import wgmma_stage_reads_only
    staged = {p.dst.alloc.id for p in producers}
    if not wgmma_stage_reads_only(rest, staged):
        raise SynthesisError("tg.pipeline: a TMA ring across enclosing loops serves only a "
                             "body whose reads of the staged tiles are wgmma operands",
                             loc=op.loc)
    ctx.ring_slots.update({alloc: ring.slot(ring.var) for alloc in staged})
