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
from tegula.lower.async_ir import NamedBarrier, Role, Roles, SmemDesc
from tegula.lower.thread_ir import TID, Barrier, Comment, For, If, Stmt, Var, walk


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
    if getattr(plan, "pingpong", False):
        consumers = [Role(f"consumer{g}", TID.lt((g + 1) * plan.consumer_threads),
                          consumer_group(roles, body, g), plan.consumer_registers,
                          loc=f"{roles.loc}: consumer warpgroup {g} of the tg.pipeline "
                              f"(wgmma, ping-pong)")
                     for g in range(plan.consumer_groups)]
    else:
        consumers = [Role("consumer", TID.lt(plan.consumer_threads),
                          map_barriers(body, lambda: [NamedBarrier(1, plan.consumer_threads)]),
                          plan.consumer_registers,
                          loc=f"{roles.loc}: consumer of the tg.pipeline (wgmma)")]
    first_producer = plan.block_threads - plan.producer_threads
    return [Roles(consumers + [
        Role("producer", TID.ge(first_producer), roles.producer, plan.producer_registers,
             loc=f"{roles.loc}: producer of the tg.pipeline (TMA)")])]


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
