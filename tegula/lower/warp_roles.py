"""Splitting a warp-specialized kernel body into its roles (`async_ir.Roles`), and the
ping-pong consumer schedule.

Lowering a warp-specialized TMA pipeline (`lower/hopper.py`
`lower_specialized_pipeline`) leaves the producer's loop on the context (`WarpRoles`) and
the consumer's statements in the kernel body; once the body is complete, `split_roles`
makes the roles: the consumer runs the body (its block barriers become named barriers
over its threads), the producer the TMA loop.

**Ping-pong** (synthesis put a `RolesPlan` with `consumer_groups` = 2 on the pipeline,
`synth/roles.py`): the body was lowered for one consumer warpgroup (threads 0..127), its
K loop between the turn barriers of warpgroup 0 (`take_turn`):

    bar.sync   TURN + 0, 256      wait for this warpgroup's turn at the tensor cores
    the K loop                    (waits on the full barriers, wgmmas, releases)
    if the block has a next tile: bar.arrive TURN + 1, 256    the next warpgroup's turn
    wait_group 0; release the last stage; the epilogue

and `consumer_group` makes warpgroup g's copy: threads `tid - 128·g`, its block barriers
its own `bar.sync 1+g, 128`, its TMA-store staging its own share of the staging buffer,
the tile loop's iterations g, g+2, … (the ring's use count comes from the iteration
index, so its stages and phases follow; the producer walks every tile in order, filling
the ring in the order the turns take it), its turns renumbered (sync on TURN + g, hand
over to TURN + (g+1) % 2). The last warpgroup opens warpgroup 0's first turn where the
block has a tile, so every `bar.arrive` meets a `bar.sync` and none is left at exit.

Why the turns are needed for correctness and not only for speed: a warpgroup's first
wait on a stage is for a use two or more phases after the last one it waited on, and a
parity wait cannot tell phases two apart. Taking turns, warpgroup g starts waiting on a
tile's stages only after the other warpgroup finished waiting on the previous tile's,
so every wait is at most one phase ahead of the barrier (without them the emulator
reports a read of a stage not yet loaded, or a deadlock).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from tegula.arch.wgmma import WARPGROUP
from tegula.errors import SynthesisError
from tegula.ir.ops import ForLoop
from tegula.lower.addressing import scalar_expr
from tegula.lower.async_ir import (NamedBarrier, Role, Roles, SmemDesc, Wgmma, WgmmaCommit,
                                   WgmmaFence)
from tegula.lower.thread_ir import (TID, Assign, Barrier, Comment, Expr, For, If, Shuffle, Stmt,
                                    Var, all_of, walk)
from tegula.lower.wgmma_waits import register_arrays


@dataclass
class WarpRoles:
    """The producer role of a warp-specialized pipeline, kept on the lowering context until
    the kernel body is complete and splits into `Roles` (`split_roles`)."""

    plan: object  # synth.roles.RolesPlan (read by its fields: lowering does not import synth)
    producer: list
    loc: str
    multicast: bool = False  # peers write this block's shared memory: a cluster barrier at exit
    tile_loop: object = None  # ping-pong: the enclosing ir ForLoop the consumer groups split
    ring_buffers: tuple = ()  # the ring's shared buffers (ping-pong: all they may share)
    #: Ping-pong: TMA-store staging buffers (name -> elements of one warpgroup's share).
    staging: dict = field(default_factory=dict)

    @property
    def block_threads(self) -> int:
        return self.plan.block_threads


#: Ping-pong named barriers: consumer warpgroup g's own barrier (its `__syncthreads`) is
#: OWN_BARRIER + g, its turn TURN_BARRIER + g (ids 1..15; 0 is `__syncthreads`).
OWN_BARRIER = 1
TURN_BARRIER = 8


def take_turn(tile_loop: ForLoop, k_loop: For) -> list[Stmt]:
    """A ping-pong consumer's K loop between its turn barriers, as consumer warpgroup 0
    runs it (`consumer_group` renumbers them for the others): wait for its turn (bar.sync
    on its own turn barrier, with the warpgroup before it, which arrived there when its
    main loop ended), run the main loop, then hand the turn to the next warpgroup
    (bar.arrive on its barrier) where the block has a next tile for it. The last
    iteration's wgmmas may still run: the next warpgroup's queue behind them while this
    one waits for them and runs its epilogue."""
    turn_threads = 2 * WARPGROUP
    next_tile = (Var(tile_loop.var.name) + tile_loop.step).lt(scalar_expr(tile_loop.stop))
    return [Comment("ping-pong: wait for this warpgroup's turn at the tensor cores"),
            NamedBarrier(TURN_BARRIER, turn_threads), k_loop,
            Comment("ping-pong: the next warpgroup's turn (its main loop starts while this "
                    "one finishes its wgmmas and runs the epilogue)"),
            If(next_tile, [NamedBarrier(TURN_BARRIER + 1, turn_threads, arrive=True)])]


def split_roles(roles: WarpRoles, body: list) -> list:
    """The kernel body as `Roles`: the consumer runs `body` (its block barriers become
    named barriers over the consumer's threads), the producer its TMA loop. Ping-pong:
    each consumer warpgroup runs its own copy of `body` (`consumer_group`)."""
    plan = roles.plan
    if getattr(plan, "turns", False):
        return [Roles(turn_taking_consumers(roles, body) + [_producer(roles)])]
    if getattr(plan, "pingpong", False):
        consumers = [Role(f"consumer{g}", TID.lt((g + 1) * plan.consumer_threads),
                          consumer_group(roles, body, g), plan.consumer_registers,
                          loc=f"{role_line(roles, 'consumer')}: consumer warpgroup {g} of the "
                              f"tg.pipeline (wgmma, ping-pong)")
                     for g in range(plan.consumer_groups)]
    else:
        consumers = [Role("consumer", TID.lt(plan.consumer_threads),
                          map_barriers(body, lambda: [NamedBarrier(1, plan.consumer_threads)]),
                          plan.consumer_registers,
                          loc=f"{role_line(roles, 'consumer')}: consumer of the tg.pipeline "
                              f"(wgmma)")]
    return [Roles(consumers + [_producer(roles)])]


def role_line(roles: WarpRoles, role: str) -> str:
    """`file:line` naming `role` in reports and comments: its `tg.producer` /
    `tg.consumer` block where the source stated the roles, else the pipeline's line."""
    line = dict(getattr(roles.plan, "stated_lines", ())).get(role)
    return roles.loc if line is None else f"{roles.loc.rsplit(':', 1)[0]}:{line}"


def _producer(roles: WarpRoles) -> Role:
    plan = roles.plan
    first_producer = plan.block_threads - plan.producer_threads
    return Role("producer", TID.ge(first_producer), roles.producer, plan.producer_registers,
                loc=f"{role_line(roles, 'producer')}: producer of the tg.pipeline (TMA)")


def consumer_group(roles: WarpRoles, body: list, g: int) -> list:
    """Ping-pong consumer warpgroup g's copy of the consumer `body`, lowered for one
    warpgroup of threads 0..127 and warpgroup 0's turns (`take_turn`): its threads are
    `tid - 128·g` there, its block barriers its own named barrier, its TMA-store staging
    its own share of the staging buffer (synthesis made one per warpgroup), it runs the tile
    loop's iterations g, g + G, … (G warpgroups; the ring's use count comes from the
    iteration index, so its stages and phases follow), and it syncs on turn barrier g and
    hands the turn to g + 1 (mod G). The last warpgroup opens warpgroup 0's first turn."""
    plan, loop = roles.plan, roles.tile_loop
    groups, threads = plan.consumer_groups, plan.consumer_threads
    _check_private_shared(body, roles)

    def renumber(s):
        share = roles.staging.get(getattr(s, "buffer", None))
        if share is not None and g:  # its own staging buffer
            return [replace(s, offset=s.offset + g * share)]
        if isinstance(s, Barrier):
            return [NamedBarrier(OWN_BARRIER + g, threads)]
        if isinstance(s, NamedBarrier) and TURN_BARRIER <= s.id < TURN_BARRIER + groups:
            return [replace(s, id=TURN_BARRIER + (s.id - TURN_BARRIER + g) % groups)]
        if isinstance(s, For) and s.var.name == loop.var.name:
            found.append(s)
            return [For(s.var, s.start + g * s.step, s.stop, s.step * groups, s.body, s.unroll)]
        return None

    found: list = []
    mine = map_stmts(body, renumber)
    if len(found) != 1:
        raise SynthesisError(f"ping-pong consumers: the tile loop {loop.var.name} appears "
                             f"{len(found)} times in the consumer's code (expected once)",
                             loc=loop.loc)
    if g:
        from tegula.lower.lower import substitute
        mine = substitute(mine, {TID.name: TID - g * threads})
    if g == groups - 1:
        first = scalar_expr(loop.start).lt(scalar_expr(loop.stop))
        mine = [Comment("ping-pong: open consumer warpgroup 0's first turn"),
                If(first, [NamedBarrier(TURN_BARRIER, 2 * WARPGROUP, arrive=True)])] + mine
    return mine


def turn_taking_consumers(roles: WarpRoles, body: list) -> list[Role]:
    """The cooperative consumer of two warpgroups taking turns inside the pipeline loop
    (`take_turns_in_loop`), as one role per warpgroup running one shared body: its block
    barriers become a named barrier over both, and its turn barriers are chosen by `tid`.
    The emulator runs the roles as coroutines, so one warpgroup can wait at its turn while
    the other runs; codegen emits a body that two roles share once (their conditions
    joined), so the GPU runs one copy of the code."""
    plan = roles.plan
    mine = take_turns_in_loop(
        map_barriers(body, lambda: [NamedBarrier(OWN_BARRIER, plan.consumer_threads)]),
        roles.loc)
    return [Role(f"consumer{g}", TID.lt((g + 1) * WARPGROUP), mine, plan.consumer_registers,
                 loc=f"{role_line(roles, 'consumer')}: consumer warpgroup {g} of the "
                     f"tg.pipeline (wgmma, turns in the loop)")
            for g in range(2)]


def take_turns_in_loop(body: list, loc: str) -> list:
    """`body` with the two consumer warpgroups taking turns at the tensor cores in the
    pipeline loop (FlashAttention-3's ping-pong). A turn is the run of gemms around the
    loop's longest stretch of register work (the softmax between `s = q @ k.T` and
    `acc += p @ v`): warpgroup g waits for its turn (bar.sync TURN + g) before the run's
    first gemm and hands the tensor cores over (bar.arrive TURN + 1 - g) once its last is
    issued, then does its register work while the other warpgroup's wgmmas run.

    Where the run crosses the loop's back edge (the plain loop: `acc += p_j @ v_j`, then
    `s_{j+1}`), both warpgroups issue `s_0` outside any turn, then take turns strictly:
    warpgroup 1 opens warpgroup 0's first turn, iteration 0 hands nothing over and
    warpgroup 0 hands its last turn over after the loop (`_turns_across_the_back_edge`:
    why a warpgroup must sync before it arrives again). Where it lies in one iteration
    (the overlapped loop issues `s_{j+1}` and `acc += p_j @ v_j` together), warpgroup 0
    goes first: warpgroup 1 opens its first turn before the loop and skips its last
    hand-over, so that no arrive is left at exit."""
    found: list = []

    def rewrite(s):
        if isinstance(s, For) and sum(isinstance(x, WgmmaCommit) for x in s.body) >= 2:
            found.append(s)
            return _loop_with_turns(s)
        return None

    out = map_stmts(body, rewrite)
    if len(found) != 1:
        raise SynthesisError(f"consumers='pingpong' (turns in the loop): expected one "
                             f"pipeline loop of two gemms or more in the consumer's code, "
                             f"found {len(found)}", loc=loc)
    return out


def _turn(arrive: bool, iteration_guard: Expr | None = None, after: tuple = ()) -> Stmt:
    """Warpgroup g's sync on its own turn barrier, or its arrive on the other's; a guard
    (warpgroup 1's arrive) skips the arrive where it is false. `after`: the registers the
    sync waits for (`_turn_operands`)."""
    threads = 2 * WARPGROUP
    first = NamedBarrier(TURN_BARRIER + (1 if arrive else 0), threads, arrive, after)
    second = NamedBarrier(TURN_BARRIER + (0 if arrive else 1), threads, arrive, after)
    return If(TID.lt(WARPGROUP), [first],
              [If(iteration_guard, [second])] if iteration_guard is not None else [second])


def _is_register_work(s: Stmt) -> bool:
    """Arithmetic on registers: a shuffle, or an assignment reading registers (not a fill)."""
    return isinstance(s, Shuffle) or (isinstance(s, Assign) and bool(register_arrays(s.value)))


def _turn_operands(stmts: list[Stmt]) -> tuple:
    """The register operands (A fragments) of the wgmmas in `stmts`, each once, in order.

    A turn's sync waits for them (`NamedBarrier.after`): ptxas schedules register work
    across a bar.sync, which names no register, and sank the plain loop's whole softmax
    (every MUFU.EX2, SASS at D = 64 and 128) below the sync before `acc += p @ v`, its only
    reader: the warpgroup then held the tensor cores through its softmax and the turns
    overlapped nothing. With the sync's barrier id depending on p's fragment, the softmax
    that makes it runs before the turn is taken."""
    found: list = []
    for s in stmts:
        if isinstance(s, Wgmma) and not isinstance(s.a, SmemDesc):
            found += [r for r in s.a if r not in found]
    return tuple(found)


def _loop_with_turns(loop: For) -> list[Stmt]:
    """`loop` with the turn barriers of `take_turns_in_loop` (and warpgroup 1's opening
    arrive before it where the turn lies inside one iteration); each sync waits for the
    register operands of the gemms its turn issues (`_turn_operands`)."""
    body = loop.body
    fences = [i for i, s in enumerate(body) if isinstance(s, WgmmaFence)]
    commits = [i for i, s in enumerate(body) if isinstance(s, WgmmaCommit)]
    n = len(commits)
    # Register work after gemm i's commit, up to gemm i+1's fence (the last: around the
    # back edge). Fills (constants into a gemm's zeroed accumulator) do not count.
    work = []
    for i in range(n):
        between = (body[commits[i] + 1:fences[i + 1]] if i + 1 < n
                   else body[commits[i] + 1:] + body[:fences[0]])
        work.append(sum(_is_register_work(s) for s in between))
    last = max(range(n), key=lambda i: work[i])   # the turn ends with gemm `last` ...
    first = (last + 1) % n                         # ... and starts with the one after
    sync_at, arrive_at = fences[first], commits[last] + 1
    opener = If(all_of([TID.ge(WARPGROUP), loop.start.lt(loop.stop)]),
                [NamedBarrier(TURN_BARRIER, 2 * WARPGROUP, arrive=True)])
    if arrive_at <= sync_at:  # the turn crosses the back edge: sync, then arrive next time
        return _turns_across_the_back_edge(loop, sync_at, arrive_at, opener)
    more = (loop.var + loop.step).lt(loop.stop)
    after = _turn_operands(body[sync_at:arrive_at])
    new = (body[:sync_at] + [_turn(arrive=False, after=after)] + body[sync_at:arrive_at]
           + [_turn(arrive=True, iteration_guard=more)] + body[arrive_at:])
    return [Comment("turns: consumer warpgroup 1 opens warpgroup 0's first turn"), opener,
            For(loop.var, loop.start, loop.stop, loop.step, new, loop.unroll)]


def _turns_across_the_back_edge(loop: For, sync_at: int, arrive_at: int,
                                opener: Stmt) -> list[Stmt]:
    """The plain loop's turns: turn j is `acc += p_j @ v_j` and `s_{j+1}` (sync before the
    first, arrive after the second's commit, in the next iteration), taken strictly in
    turn: warpgroup 1 opens warpgroup 0's first turn, iteration 0's arrive is skipped
    (`s_0` ends no turn), and warpgroup 0 hands its last turn over after the loop.

    A warpgroup must never arrive twice on the other's barrier before the other syncs
    there once: the second arrive would complete the barrier alone (two arrivals of 128
    make the 256), and the other's sync would then wait for a third that never comes.
    With each iteration arriving before it syncs (before 2026-11-25), warpgroup 1 could
    pass its own sync (warpgroup 0 arrives right after its scores' gemm) and arrive again
    while warpgroup 0 still ran its softmax ahead of its sync: once the softmax stayed
    above the sync (`_turn_operands`), the 4x32x4096 D=64 forward hung on the H100."""
    body = loop.body
    after = _turn_operands(body[sync_at:] + body[:arrive_at])
    handover = If(loop.start.lt(loop.var), [_turn(arrive=True)])
    new = (body[:arrive_at] + [handover] + body[arrive_at:sync_at]
           + [_turn(arrive=False, after=after)] + body[sync_at:])
    closer = If(all_of([TID.lt(WARPGROUP), loop.start.lt(loop.stop)]),
                [NamedBarrier(TURN_BARRIER + 1, 2 * WARPGROUP, arrive=True)])
    return [Comment("turns: consumer warpgroup 1 opens warpgroup 0's first turn"), opener,
            For(loop.var, loop.start, loop.stop, loop.step, new, loop.unroll),
            Comment("turns: warpgroup 0 hands its last turn to warpgroup 1"), closer]


def _check_private_shared(body: list, roles: WarpRoles) -> None:
    """Ping-pong consumers share the block's shared memory: only the ring (read by their
    wgmmas, written by the producer) and the TMA-store staging (one share per warpgroup)
    may be in it (synthesis refuses other shared tiles, `roles.why_not_pingpong`; this
    catches what lowering itself adds)."""
    for s in walk(body):
        for buffer in _buffers_of(s):
            if buffer not in roles.ring_buffers and buffer not in roles.staging:
                raise SynthesisError(f"ping-pong consumers: the consumer's code uses shared "
                                     f"buffer {buffer}, which both consumer warpgroups "
                                     f"would use at once", loc=roles.tile_loop.loc)


def _buffers_of(s) -> list[str]:
    found = [s.buffer] if isinstance(getattr(s, "buffer", None), str) else []
    for operand in (getattr(s, "a", None), getattr(s, "b", None)):
        if isinstance(operand, SmemDesc):
            found.append(operand.buffer)
    return found


def map_barriers(stmts: list, replacement) -> list:
    """`stmts` with every block `Barrier` (in loop and branch bodies too) replaced by the
    statements `replacement()` returns."""
    return map_stmts(stmts, lambda s: replacement() if isinstance(s, Barrier) else None)


def map_stmts(stmts: list, rewrite) -> list:
    """`stmts` with each statement (in loop and branch bodies too, inner ones first)
    replaced by the list `rewrite(statement)` returns, or kept where it returns None."""
    out: list = []
    for s in stmts:
        if isinstance(s, For):
            s = For(s.var, s.start, s.stop, s.step, map_stmts(s.body, rewrite), s.unroll)
        elif isinstance(s, If):
            s = If(s.cond, map_stmts(s.then, rewrite), map_stmts(s.otherwise, rewrite))
        new = rewrite(s)
        out += [s] if new is None else new
    return out
