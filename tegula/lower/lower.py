"""Lowering a synthesized kernel to thread IR.

Ops lower one by one (`lower.copy`, `lower.compute`, `lower.gemm`); this driver adds what
no single op can decide: the kernel signature, barriers between shared-memory writers and
readers, and loops — plain ones, and software-pipelined ones (`tg.pipeline` loops with
a load stage, `choices["pipeline"]`), which `lower/pipeline.py` lowers for cp.async and
TMA alike: the copies into multi-stage shared buffers run `stages - 1` iterations ahead
of the rest over a ring of stages.
"""
from __future__ import annotations

import dataclasses

from tegula.dtypes import i32
from tegula.ir.ops import (AtomicAdd, Bitcast, Copy, Elementwise, Fill, ForLoop, Gemm, IfThen,
                           Indices, LastArrival, Op, Rearrange, Reduce, Reshape, Scan,
                           TracedKernel, walk_ops)
from tegula.ir.scalar import LoopIndex, ScalarBinOp, ScalarConst
from tegula.ir.values import GlobalTile, SharedTile
from tegula.lower.addressing import condition_expr, scalar_expr
from tegula.lower.arg_reduce import lower_any_reduce
from tegula.lower.arrivals import lower_last_arrival, refuse_arrivals_in_roles
from tegula.lower.compute import (lower_atomic_add, lower_bitcast, lower_elementwise,
                                  lower_fill, lower_indices, lower_rearrange, lower_reshape)
from tegula.lower.context import LoweringContext
from tegula.lower.copy import lower_copy
from tegula.lower.fresh_accumulators import clear_fresh_accumulators
from tegula.lower.gemm import lower_gemm
from tegula.lower.hoist import hoist_loop_invariants
from tegula.lower.scalar_loads import bind_scalar_loads
from tegula.lower.scan import lower_scan
from tegula.lower.async_ir import SmemDesc
from tegula.lower.hopper import finish_async
from tegula.lower.pipeline import lower_pipeline
from tegula.lower.thread_ir import (Barrier, BinOp, CpAsyncWait, Expr, For, If, Reg,
                                    ScalarParam, Stmt, TensorParam, ThreadKernel, Value, Var,
                                    _bin)

_LOWER = {Copy: lower_copy, Gemm: lower_gemm, Fill: lower_fill, Elementwise: lower_elementwise,
          Reduce: lower_any_reduce, Rearrange: lower_rearrange, AtomicAdd: lower_atomic_add,
          Indices: lower_indices, Reshape: lower_reshape, Scan: lower_scan,
          Bitcast: lower_bitcast, LastArrival: lower_last_arrival}


class SharedSync:
    """Tracks shared buffers written/read since the last barrier, and whether cp.async
    copies are in flight, to place the fewest barriers that keep every access ordered.

    One instance follows one straight-line body (the kernel's, a loop's, a branch arm's);
    a nested loop or branch gets its own and hands what it leaves unordered back
    (`absorb`, `nested`). `head_read`/`head_written` are what the body touches before its first
    barrier: the accesses of the *next* iteration that the end of this one may race with
    when a loop body does not end in a barrier (`carried_conflict`)."""

    def __init__(self) -> None:
        self.written: set[int] = set()
        self.read: set[int] = set()
        self.async_pending = False
        self.head_read: set[int] = set()
        self.head_written: set[int] = set()
        self.head_open = True  # no barrier in this body yet
        # The same accesses with the stage each touched (`stage_key`; None: unknown), as
        # (alloc id, key, is_write): what lets a loop over a multi-stage buffer skip the
        # barrier ending its body where the next iteration touches another stage.
        self.tail_stages: set[tuple] = set()
        self.head_stages: set[tuple] = set()

    def before(self, op: Op) -> list:
        reads, writes = shared_accesses(op)
        return self.barrier() if self.conflicts(reads, writes) else []

    def conflicts(self, reads: set, writes: set) -> bool:
        """Would accesses (`reads`, `writes`) race with the ones since the last barrier?"""
        return bool((reads & self.written) or (writes & (self.read | self.written)))

    def after(self, op: Op) -> None:
        reads, writes = shared_accesses(op)
        cp_async = isinstance(op, Copy) and op.choices.get("instr") == "cp.async"
        self.note(reads, writes, cp_async, shared_stage_accesses(op))

    def note(self, reads: set, writes: set, cp_async: bool = False,
             staged: set | None = None) -> None:
        """Accesses to the buffers `reads`, `writes`; `staged` the same as (alloc id,
        stage key, is_write) where known (else every stage counts as touched)."""
        if staged is None:
            staged = {(a, None, False) for a in reads} | {(a, None, True) for a in writes}
        self.read |= reads
        self.written |= writes
        self.async_pending |= cp_async
        self.tail_stages |= staged
        if self.head_open:
            self.head_read |= reads
            self.head_written |= writes
            self.head_stages |= staged

    def barrier(self) -> list:
        stmts = [CpAsyncWait(0)] if self.async_pending else []
        self.written.clear()
        self.read.clear()
        self.tail_stages.clear()
        self.async_pending = False
        self.head_open = False
        return stmts + [Barrier()]

    def absorb(self, inner: "SharedSync") -> None:
        """After a nested loop or branch arm lowered with `inner`: what it left unordered
        is pending here too."""
        self.read |= inner.read
        self.written |= inner.written
        self.async_pending |= inner.async_pending
        self.tail_stages |= inner.tail_stages

    def nested(self, reads: set, writes: set) -> None:
        """A nested loop or branch may touch `reads`, `writes`: all of it belongs to this
        body's head while no barrier of ours came before (it may run zero times, so none
        of its own barriers is certain)."""
        if self.head_open:
            self.head_read |= reads
            self.head_written |= writes
            self.head_stages |= {(a, None, False) for a in reads} | \
                {(a, None, True) for a in writes}

    def carried_conflict(self, ignore: set = frozenset(), advance: tuple | None = None) -> bool:
        """Would the next iteration of a loop whose body this is race with this one's end
        (the accesses after its last barrier against those before its first), were no
        barrier to end the body? `ignore`: buffers ordered otherwise (a TMA ring's stages,
        by its mbarriers). `advance`: (the loop's index name, its constant step), where
        the accesses of a multi-stage buffer at stages `k + c` can be told apart from the
        next iteration's: only those that may meet the same stage count."""
        written, read = self.written - ignore, self.read - ignore
        head_read, head_written = self.head_read - ignore, self.head_written - ignore
        if self.async_pending:
            return True
        clash = (written & (head_read | head_written)) | (read & head_written)
        if not clash or advance is None or self.head_open:
            # With no barrier in the body, the iteration after next is unordered too.
            return bool(clash)
        return any(_may_meet(tail, head, advance)
                   for tail in self.tail_stages if tail[0] in clash
                   for head in self.head_stages if head[0] == tail[0]
                   and (tail[2] or head[2]))

    @property
    def dirty(self) -> bool:
        return bool(self.written or self.read or self.async_pending)


def shared_accesses(op: Op) -> tuple[set, set]:
    """(alloc ids read, alloc ids written) by one op, loop bodies not included."""
    reads, writes = set(), set()
    if isinstance(op, Copy):
        if isinstance(op.src, SharedTile):
            reads.add(op.src.alloc.id)
        if isinstance(op.dst, SharedTile):
            writes.add(op.dst.alloc.id)
    elif isinstance(op, Gemm):
        reads |= {t.alloc.id for t in (op.a, op.b) if isinstance(t, SharedTile)}
    return reads, writes


def shared_stage_accesses(op: Op) -> set:
    """(alloc id, `stage_key`, is_write) of each shared access of one op."""
    accesses = set()
    if isinstance(op, Copy):
        for tile, write in ((op.src, False), (op.dst, True)):
            if isinstance(tile, SharedTile):
                accesses.add((tile.alloc.id, stage_key(tile), write))
    elif isinstance(op, Gemm):
        accesses |= {(t.alloc.id, stage_key(t), False) for t in (op.a, op.b)
                     if isinstance(t, SharedTile)}
    return accesses


def stage_key(tile: SharedTile) -> tuple | None:
    """The stage a shared tile touches as (stages, loop index name or None, constant):
    stage `(index + constant) % stages`, or `constant % stages` without an index; None
    where it is another expression (or the buffer has one stage: one key for all)."""
    stages, stage = tile.alloc.stages, tile.stage
    if stages == 1:
        return None
    if isinstance(stage, ScalarConst):
        stage = stage.value
    if isinstance(stage, int):
        return (stages, None, stage)
    if isinstance(stage, LoopIndex):
        return (stages, stage.name, 0)
    if isinstance(stage, ScalarBinOp) and stage.op in ("+", "-") and \
            isinstance(stage.lhs, LoopIndex) and isinstance(stage.rhs, (int, ScalarConst)):
        c = stage.rhs.value if isinstance(stage.rhs, ScalarConst) else stage.rhs
        return (stages, stage.lhs.name, c if stage.op == "+" else -c)
    return None


def _may_meet(tail: tuple, head: tuple, advance: tuple) -> bool:
    """May access `tail` (this iteration, after its last barrier) and access `head` (the
    next iteration's, before its first) touch the same stage of their buffer? The next
    iteration's index is this one's plus the step."""
    a, b = tail[1], head[1]
    if a is None or b is None or a[0] != b[0]:
        return True
    stages, index, step = a[0], advance[0], advance[1]
    if a[1] is None and b[1] is None:
        return (a[2] - b[2]) % stages == 0
    if a[1] == b[1] == index:
        return (b[2] + step - a[2]) % stages == 0
    return True


def shared_accesses_within(ops: list[Op]) -> tuple[set, set]:
    """(alloc ids read, alloc ids written) by `ops`, loop and branch bodies included."""
    reads, writes = set(), set()
    for op in walk_ops(ops):
        r, w = shared_accesses(op)
        reads |= r
        writes |= w
    return reads, writes


class KernelLowering:
    def __init__(self, kernel: TracedKernel, ctx: LoweringContext):
        self.kernel = kernel
        self.ctx = ctx

    def ops(self, ops: list[Op], sync: SharedSync) -> list:
        stmts: list = []
        for op in ops:
            if isinstance(op, ForLoop):
                stmts += self.loop(op, sync)
            elif isinstance(op, IfThen):
                stmts += self.branch(op, sync)
            else:
                stmts += sync.before(op)
                stmts += _LOWER[type(op)](self.ctx, op)
                sync.after(op)
        return stmts

    def branch(self, op: IfThen, sync: SharedSync) -> list:
        # A barrier before the branch only where what it may touch races with what came
        # before (a branch of register work, e.g. masking only the boundary blocks, needs
        # none). Each arm starts clean; what an arm leaves unordered stays pending after
        # the branch, so the code after it places the barriers it needs.
        reads, writes = shared_accesses_within(op.then + op.otherwise)
        pre = sync.barrier() if sync.conflicts(reads, writes) else []
        sync.nested(reads, writes)
        arms = []
        for ops in (op.then, op.otherwise):
            inner = SharedSync()
            arms.append(self.ops(ops, inner))
            sync.absorb(inner)
        return pre + [If(condition_expr(op.cond), *arms)]

    def loop(self, op: ForLoop, sync: SharedSync) -> list:
        reads, writes = shared_accesses_within(op.body)
        if op.choices.get("pipeline") is not None:
            # A pipelined loop (`lower/pipeline.py`) orders its own iterations (a barrier
            # at the top of each, or mbarriers) and leaves shared memory ordered after it.
            pre = sync.barrier() if sync.dirty else []
            sync.nested(reads, writes)
            return pre + lower_pipeline(self, op)
        # A plain loop: a barrier before it where its accesses race with what came before;
        # one ending its body where the next iteration's first accesses race with this
        # one's last (a buffer read at the end and written at the start); what the body
        # leaves unordered stays pending after the loop.
        pre = sync.barrier() if sync.conflicts(reads, writes) else []
        sync.nested(reads, writes)
        inner = SharedSync()
        body = self.ops(op.body, inner)
        advance = (op.var.name, op.step) if isinstance(op.step, int) else None
        if inner.carried_conflict(advance=advance):
            body += inner.barrier()
        sync.absorb(inner)
        return pre + [For(Var(op.var.name), scalar_expr(op.start), scalar_expr(op.stop),
                          op.step, body)]


def substitute(node, mapping: dict):
    """A copy of thread IR with variables replaced by expressions (`mapping`: name -> Expr);
    index expressions are rebuilt through their operators so constants fold again."""
    if isinstance(node, list):
        return [substitute(s, mapping) for s in node]
    if isinstance(node, tuple):  # e.g. a LoadScalar's coordinates
        return tuple(substitute(s, mapping) for s in node)
    if isinstance(node, Var):
        return mapping.get(node.name, node)
    if isinstance(node, BinOp):
        return _bin(node.op, substitute(node.lhs, mapping), substitute(node.rhs, mapping))
    if isinstance(node, (Stmt, Expr, Value, Reg, SmemDesc)):  # SmemDesc: a wgmma operand
        return dataclasses.replace(node, **{f.name: substitute(getattr(node, f.name), mapping)
                                            for f in dataclasses.fields(node) if f.init})
    return node


def _tensor_written(kernel: TracedKernel, name: str) -> bool:
    from tegula.ir.ops import tiles_written, walk_ops
    return any(isinstance(t, GlobalTile) and t.arg.name == name
               for op in walk_ops(kernel.body) for t in tiles_written(op))


def lower(result) -> ThreadKernel:
    """Thread IR for a `SynthesisResult` (a kernel whose layouts are all decided)."""
    kernel = result.kernel
    ctx = LoweringContext(kernel.threads, result.facts, result.shared_offsets, result.shared_bytes)
    sync = SharedSync()
    body = KernelLowering(kernel, ctx).ops(kernel.body, sync)
    params = [TensorParam(a.name, a.dtype, a.rank, _tensor_written(kernel, a.name),
                          result.facts[a.name].index_bits)
              for a in kernel.args]
    params += [ScalarParam(name, i32) for name in kernel.scalar_args]
    wide = {f"{p.name}_stride{d}" for p in params
            if isinstance(p, TensorParam) and p.index_bits > 32 for d in range(p.rank)}
    params, body = finish_async(kernel, ctx, params, body)
    refuse_arrivals_in_roles(body)
    body = clear_fresh_accumulators(body)
    body = hoist_loop_invariants(ctx.coords.prologue + body, wide)
    body = bind_scalar_loads(body, {p.name for p in params
                                    if isinstance(p, TensorParam) and not p.writes})
    # A warp-specialized pipeline adds its producer warpgroup after the user's threads.
    threads = ctx.warp_roles.block_threads if ctx.warp_roles is not None else kernel.threads
    return ThreadKernel(kernel.name, threads, params, ctx.registers, ctx.shared, body,
                        mbarriers=ctx.mbarriers, cluster=tuple(kernel.cluster))

