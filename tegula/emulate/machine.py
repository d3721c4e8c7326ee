"""The thread-IR interpreter: every block in turn, all threads of a block at once.

`run_thread_kernel(kernel, grid, tensors, scalars)` binds the tensors (numpy arrays; the
kernel's `{t}_shape{i}` / `{t}_stride{i}` variables come from their shapes and element
strides), then runs each block (x fastest): registers are numpy arrays [threads, size],
index expressions evaluate to Python ints when block-uniform and int64 arrays [threads]
otherwise, and the statement list is compiled once into closures (`compile_block`) so
per-statement overhead is a Python call plus a few numpy operations.

Control flow: `For` bounds must be block-uniform (checked); `If` with a per-thread
condition runs its branches under an active mask (statements only affect active threads);
a `Barrier` reached with some threads inactive is an error (deadlock/UB on the GPU).
Warp-collective statements (mma, ldmatrix, shuffles) need whole warps active.
Errors are `EmulationError`s naming the statement, tensor/buffer, block and loop iteration.

Asynchronous statements (`lower/async_ir.py`) compile in `async_ops.py` against the block's
`AsyncState` (created only for kernels that have them, so other kernels run as before);
`Roles` runs its roles as coroutines (`roles.py`), and the blocks of one thread-block cluster
(`ThreadKernel.cluster`) run together as coroutines too (`roles.run_cluster`).
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping

import numpy as np

from tegula.emulate.async_ops import ASYNC_COMPILERS
from tegula.emulate.arrivals import compile_last_arrival
from tegula.emulate.async_state import AsyncState, check_shared_layout
from tegula.emulate.describe import describe
from tegula.emulate.errors import EmulationError
from tegula.emulate.exprs import compile_expr, compile_value, tensor_key
from tegula.emulate.memory import GlobalTensor, SharedMemory
from tegula.emulate.ops import (Ctx, compile_atomic, compile_cp_async, compile_global,
                                compile_ldmatrix, compile_mma, compile_shared, compile_shuffle)
from tegula.emulate.state import BlockState, RegFile, uniform_int, write_regs
from tegula.emulate.roles import (Cluster, check_role_order, compile_roles, run_cluster,
                                  yield_point)
from tegula.emulate.stats import EmulationReport, OpStats
from tegula.emulate.values import round_to
from tegula.lower.thread_ir import (Assign, Barrier, BinOp, Comment, CpAsync, CpAsyncCommit,
                                    CpAsyncWait, For, GlobalAtomicAdd, GlobalLoad, GlobalStore,
                                    If, LdMatrix, Mma, ScalarParam, SharedLoad, SharedStore,
                                    Shuffle, Stmt, TensorParam, ThreadKernel, all_of, walk)
from tegula.lower.arrivals import LastArrivalStmt
from tegula.lower.async_ir import (ASYNC_STATEMENTS, Elect, Roles, TensorMapParam, Wgmma,
                                   contains_elect)

Run = Callable[[BlockState], None]


class Compiler:
    """Turns a statement list into closures, with one `OpStats` per statement.
    `scheduling_points`: every asynchronous statement is a scheduling point of a random
    interleaving (`roles.yield_point`, before and after it)."""

    def __init__(self, kernel: ThreadKernel, scheduling_points: bool = False):
        self.kernel = kernel
        self.scheduling_points = scheduling_points
        self.regfile = RegFile(kernel.registers)
        tensor_dtypes = {p.name: p.dtype for p in kernel.params if isinstance(p, TensorParam)}
        self.ctx = Ctx(self.regfile, tensor_dtypes, {b.name: b for b in kernel.shared})
        self.ctx.tensor_maps = {p.name: p for p in kernel.params if isinstance(p, TensorMapParam)}
        self.stmt_stats: list[tuple[str, str, OpStats]] = []  # (kind, description, stats)
        # Kernels without asynchronous statements run exactly as before (no AsyncState).
        stmts = list(walk(kernel.body))
        self.is_async = bool(kernel.mbarriers) or any(isinstance(s, ASYNC_STATEMENTS)
                                                      for s in stmts)
        if self.is_async:
            check_shared_layout(kernel)
        self.regfile.wgmma_arrays = frozenset(
            r.array.name for s in stmts if isinstance(s, Wgmma)
            for r in s.d + (s.a if isinstance(s.a, list) else []))

    def block(self, stmts: list[Stmt]) -> Run:
        fns = [self.stmt(s) for s in stmts]
        fns = [f for f in fns if f is not None]
        if len(fns) == 1:
            return fns[0]

        def run(state: BlockState) -> None:
            for f in fns:
                f(state)
        return run

    def stmt(self, s: Stmt) -> Run | None:
        kind = type(s).__name__
        what = describe(s)
        st = OpStats()
        self.stmt_stats.append((kind, what, st))
        handler = getattr(self, f"_{kind}", None)
        if handler is not None:
            return handler(s, st, what)
        if isinstance(s, (GlobalLoad, GlobalStore)):
            return compile_global(s, self.ctx, st, what)
        if isinstance(s, (SharedLoad, SharedStore)):
            return compile_shared(s, self.ctx, st, what)
        if type(s) in ASYNC_COMPILERS:
            run = ASYNC_COMPILERS[type(s)](s, self.ctx, st, what)
            return _between_yields(run) if self.scheduling_points else run
        if isinstance(s, Roles):
            return compile_roles(s, self.block, st, what)
        compilers = {GlobalAtomicAdd: compile_atomic, CpAsync: compile_cp_async,
                     LdMatrix: compile_ldmatrix, Mma: compile_mma, Shuffle: compile_shuffle,
                     LastArrivalStmt: compile_last_arrival}  # tg.last_arrival
        for cls, fn in compilers.items():
            if isinstance(s, cls):
                return fn(s, self.ctx, st, what)
        raise EmulationError(f"the emulator does not know the statement {what}")

    # ------------------------------------------------------------------ simple statements

    def _Comment(self, s: Comment, st: OpStats, what: str) -> Run:
        text = s.text

        def run(state: BlockState) -> None:
            state.comment = text
        return run

    def _Assign(self, s: Assign, st: OpStats, what: str) -> Run:
        locate = self.regfile.locator(s.dst, 1, what)
        value = compile_value(s.value, lambda reg, n: self.regfile.locator(reg, n, what))
        dt = s.dst.array.dtype

        def run(state: BlockState) -> None:
            v = round_to(value(state), dt)
            arr, col = locate(state)
            write_regs(state, arr, col, 1, v)
            st.count += state.active_warps()
        return run

    def _Barrier(self, s: Barrier, st: OpStats, what: str) -> Run:
        def run(state: BlockState) -> None:
            if state.task is not None:
                raise EmulationError(f"{what}: __syncthreads inside {state.task.label()}: "
                                     "roles meet only at mbarriers and named barriers")
            if not state.full:
                off = int(np.count_nonzero(~state.mask))
                raise EmulationError(f"{what}: barrier under divergent control flow "
                                     f"({off} of {state.threads} threads do not reach it)")
            state.smem.barrier()
            if state.asyncs is not None:
                state.asyncs.share_observations(state.tid)
            st.count += state.warps
        return run

    def _CpAsyncCommit(self, s: CpAsyncCommit, st: OpStats, what: str) -> Run:
        def run(state: BlockState) -> None:
            state.smem.commit(state.mask)
            st.count += state.active_warps()
        return run

    def _CpAsyncWait(self, s: CpAsyncWait, st: OpStats, what: str) -> Run:
        pending = s.pending

        def run(state: BlockState) -> None:
            state.smem.wait(state.mask, pending)
            st.count += state.active_warps()
        return run

    # ------------------------------------------------------------------ control flow

    def _Let(self, s, st: OpStats, what: str) -> Run:
        """Bind a per-thread integer (an array over the block's threads) to a name."""
        value, name = compile_expr(s.value), s.var.name
        check = _whole_warps_elect(s.value, what)

        def run(state: BlockState) -> None:
            check(state)
            state.env[name] = value(state.env)
        return run

    def _For(self, s: For, st: OpStats, what: str) -> Run:
        start, stop = compile_expr(s.start), compile_expr(s.stop)
        step, var = s.step, s.var.name
        if step <= 0:
            raise EmulationError(f"{what}: loop step must be positive")
        body = self.block(s.body)

        def run(state: BlockState) -> None:
            lo = uniform_int(start(state.env), state, f"{what}: start")
            hi = uniform_int(stop(state.env), state, f"{what}: stop")
            env = state.env
            saved = env.get(var)
            frame = [var, lo]
            state.loops.append(frame)
            for i in range(lo, hi, step):
                env[var] = i
                frame[1] = i
                body(state)
            state.loops.pop()
            if saved is None:
                env.pop(var, None)
            else:
                env[var] = saved
        return run

    def _If(self, s: If, st: OpStats, what: str) -> Run:
        cond = compile_expr(s.cond)
        then = self.block(s.then)
        other = self.block(s.otherwise) if s.otherwise else None
        check = _whole_warps_elect(s.cond, what)

        def run(state: BlockState) -> None:
            check(state)
            c = cond(state.env)
            if not isinstance(c, np.ndarray):
                if c:
                    then(state)
                elif other is not None:
                    other(state)
                return
            c = np.broadcast_to(c.astype(bool), (state.threads,))
            mask, full = state.mask, state.full
            for branch, sel in ((then, c), (other, ~c)):
                if branch is None:
                    continue
                m = mask & sel
                if not m.any():
                    continue
                state.mask, state.full = m, bool(m.all())
                try:
                    branch(state)
                finally:
                    state.mask, state.full = mask, full
        return run


def _whole_warps_elect(cond, what: str) -> Run:
    """A check (state -> None) for a condition holding an `Elect`: elect.sync with the full
    member mask needs every lane of a warp to take part, so each warp that reaches the
    election (its active lanes where the conjuncts before it hold; C's `&&` stops before
    it elsewhere) must have all 32 lanes there. The election itself is lane 0
    (`compile_expr`), which is what it gives when that holds."""
    if not contains_elect(cond):
        return lambda state: None
    terms = _conjuncts(cond)
    at = next(i for i, t in enumerate(terms) if contains_elect(t))
    if not isinstance(terms[at], Elect):
        raise EmulationError(f"{what}: an Elect may only be a conjunct of a condition "
                             f"(`all_of([..., Elect()])`), not inside {terms[at]!r}")
    before = all_of(terms[:at])
    before_fn = compile_expr(before) if before is not None else None

    def check(state: BlockState) -> None:
        take = state.mask.copy()
        if before_fn is not None:
            take &= np.broadcast_to(np.asarray(before_fn(state.env), dtype=bool), take.shape)
        lanes = np.zeros(state.warps * 32, dtype=bool)
        lanes[:state.threads] = take
        lanes = lanes.reshape(-1, 32)
        partial = np.flatnonzero(lanes.any(1) & ~lanes.all(1))
        if partial.size:
            w = int(partial[0])
            missing = np.flatnonzero(~lanes[w])
            raise EmulationError(
                f"{what}: elect.sync in warp {w} with lanes {', '.join(map(str, missing[:8]))}"
                f"{' ...' if missing.size > 8 else ''} not taking part (inactive, or the "
                f"condition before the election is false there); the full-mask election "
                f"needs all 32 lanes of the warp")
    return check


def _conjuncts(e) -> list:
    if isinstance(e, BinOp) and e.op == "and":
        return _conjuncts(e.lhs) + _conjuncts(e.rhs)
    return [e]


def _between_yields(run: Run) -> Run:
    """`run` as a scheduling point of a random interleaving: other coroutines may go on
    just before it (a wait, an issue) and just after it (an arrive, a release)."""
    def scheduled(state: BlockState) -> None:
        yield_point(state)
        run(state)
        yield_point(state)
    return scheduled


def _bind(kernel: ThreadKernel, tensors: Mapping[str, np.ndarray],
          scalars: Mapping[str, object]) -> tuple[dict, dict[str, GlobalTensor]]:
    """The base environment (extents, strides, scalars) and the bound tensors."""
    env: dict = {}
    bound: dict[str, GlobalTensor] = {}
    names = set()
    for p in kernel.params:
        names.add(p.name)
        if isinstance(p, TensorParam):
            if p.name not in tensors:
                raise EmulationError(f"kernel {kernel.name}: tensor {p.name!r} not given")
            t = GlobalTensor(p.name, p.dtype, tensors[p.name])
            if t.array.ndim != p.rank:
                raise EmulationError(f"tensor {p.name!r} has rank {t.array.ndim}, the kernel "
                                     f"expects {p.rank}")
            for i, (ext, stride) in enumerate(zip(t.shape, t.strides)):
                env[f"{p.name}_shape{i}"] = int(ext)
                env[f"{p.name}_stride{i}"] = int(stride)
            bound[p.name] = t
            env[tensor_key(p.name)] = t  # for scalar loads (`offsets[e]`)
        elif isinstance(p, ScalarParam):
            if p.name not in scalars:
                raise EmulationError(f"kernel {kernel.name}: scalar {p.name!r} not given")
            v = scalars[p.name]
            env[p.name] = int(v) if p.dtype.is_int else v
    extra = (set(tensors) | set(scalars)) - names
    if extra:
        raise EmulationError(f"kernel {kernel.name} has no parameter(s) {sorted(extra)}")
    return env, bound


def _grid3(kernel: ThreadKernel, grid: tuple) -> tuple[int, int, int]:
    """The grid's three block counts, checked (whole clusters)."""
    if not 1 <= len(grid) <= 3 or any(g < 0 for g in grid):
        raise EmulationError(f"grid must be 1 to 3 non-negative block counts, got {grid}")
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    if any(g % c for g, c in zip((gx, gy, gz), kernel.cluster)):
        raise EmulationError(f"kernel {kernel.name}: grid {(gx, gy, gz)} is not a multiple of "
                             f"its cluster dimensions {tuple(kernel.cluster)} (a launch with "
                             "clusters needs whole clusters)")
    return gx, gy, gz


def _add_stats(report: EmulationReport, comp: Compiler) -> None:
    """Each executed statement's counts into the report, by statement and by kind."""
    for i, (kind, what, st) in enumerate(comp.stmt_stats):
        if st.count:
            report.by_stmt[i] = (what, st)
            report.by_kind.setdefault(kind, OpStats()).add(st.count, st.bytes, st.wavefronts,
                                                           st.ideal_wavefronts)


def _race_records(kernel: ThreadKernel, bound: dict, same_memory) -> None:
    """Make the race record of every tensor the kernel writes before the launch runs (so
    reads before the first store are recorded too), one per memory for `same_memory`."""
    from tegula.emulate.global_races import tracker
    for p in kernel.params:
        if isinstance(p, TensorParam) and p.writes:  # (codegen's const-ness reads it too)
            tracker(bound[p.name])
    for name, other in (same_memory or {}).items():
        if bound[name].races is None and bound[other].races is None:
            continue
        bound[name].races = bound[other].races = tracker(bound[other]) \
            if bound[other].races is not None else tracker(bound[name])


def run_thread_kernel(kernel: ThreadKernel, grid: tuple[int, ...] | int,
                      tensors: Mapping[str, np.ndarray],
                      scalars: Mapping[str, object] | None = None,
                      *, check_races: bool = True,
                      track_writes: Iterable[str] = (),
                      num_sms: int = 132, role_order: str = "listed",
                      same_memory: Mapping[str, str] | None = None) -> EmulationReport:
    """Execute `kernel` on the CPU over `grid` (1-3 block counts); tensors are updated in
    place. Returns the statistics; raises `EmulationError` on a bug in the thread IR.
    For the tensors named in `track_writes`, `report.written[name]` is a boolean mask over
    their element offsets of those any block stored to (for `tegula.emulate.coverage`).
    `num_sms` is what `tg.num_sms()` reads (the SM count of the emulated device).
    `role_order` ("listed" or "reversed") is the order in which the roles of a `Roles`
    statement first get to run: each runs until it blocks, so the two orders are two
    different interleavings (a correct kernel is right under both). "random:SEED" draws
    the interleaving at every asynchronous statement from a stream seeded by SEED (and the
    block): one more interleaving per seed (`roles.yield_point`).
    `same_memory`: tensor -> the tensor whose identical array it is (an in-place kernel,
    `tegula.runtime.aliasing`); the two share one race record (`global_races`)."""
    check_role_order(role_order)
    t0 = time.perf_counter()
    grid = (grid,) if isinstance(grid, int) else tuple(int(g) for g in grid)
    gx, gy, gz = _grid3(kernel, grid)
    base_env, bound = _bind(kernel, tensors, scalars or {})
    if check_races:
        _race_records(kernel, bound, same_memory)
    base_env.update(tg_grid_x=gx, tg_grid_y=gy, tg_grid_z=gz, tg_num_sms=int(num_sms))
    for name in track_writes:
        bound[name].track_writes()
    comp = Compiler(kernel, scheduling_points=role_order.startswith("random:"))
    body = comp.block(kernel.body)
    report = EmulationReport(kernel=kernel.name, grid=tuple(grid), threads=kernel.threads,
                             shared_bytes=kernel.shared_bytes)
    def new_block(bx: int, by: int, bz: int) -> BlockState:
        env = dict(base_env)
        env.update(tid=np.arange(kernel.threads, dtype=np.int64), bid_x=bx, bid_y=by, bid_z=bz)
        smem = SharedMemory(kernel.shared_bytes, kernel.shared, kernel.threads, check_races)
        state = BlockState(kernel.threads, env, comp.regfile.allocate(kernel.threads), smem,
                           bound, (bx, by, bz))
        if comp.is_async:
            state.asyncs = smem.async_ = AsyncState(
                kernel.mbarriers, kernel.threads, kernel.shared_bytes, check_races,
                {a.name: a.size for a in comp.regfile.arrays.values()}, role_order)
        return state

    def run_block(state: BlockState) -> None:
        try:
            body(state)
            unfinished = state.asyncs and state.asyncs.unfinished()
            if unfinished:
                raise EmulationError(f"the block ends with asynchronous work "
                                     f"outstanding: {unfinished}")
            if state.asyncs is not None:
                state.asyncs.retire_global_writes()
        except EmulationError as e:
            raise EmulationError(f"{e.message}\n  at {state.where()}") from None
        report.blocks += 1

    cx, cy, cz = kernel.cluster
    for bz in range(0, gz, cz):
        for by in range(0, gy, cy):
            for bx in range(0, gx, cx):
                blocks = [new_block(bx + x, by + y, bz + z)
                          for z in range(cz) for y in range(cy) for x in range(cx)]
                if len(blocks) == 1:
                    run_block(blocks[0])
                    continue
                # A cluster's blocks run together (they meet at remote mbarriers, multicast
                # copies and the cluster barrier), ranked x fastest like %cluster_ctarank.
                cluster = Cluster((cx, cy, cz), blocks)
                for rank, state in enumerate(blocks):
                    state.cluster, state.rank = cluster, rank
                run_cluster(cluster, run_block, role_order)
    _add_stats(report, comp)
    report.written = {name: bound[name].written for name in track_writes}
    report.seconds = time.perf_counter() - t0
    return report


__all__ = ["run_thread_kernel", "Compiler"]
