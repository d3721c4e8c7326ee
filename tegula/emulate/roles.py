"""Warp roles as coroutines: run the roles of an `async_ir.Roles` statement concurrently.

A producer loop that waits on "empty" mbarriers the consumer arrives at cannot be run role
after role: it would wait forever for an arrival that comes later in program order. Each
role therefore runs its body in its own Python thread, but with *strict baton passing*:
exactly one role runs at any moment, so the emulation stays deterministic and numpy never
runs two statements at once. The scheduler (the thread that reached `Roles`) hands the
baton to a role; the role runs until it finishes or blocks at a statement whose condition
does not hold yet (`MBarrierWait`, `NamedBarrier`), and hands the baton back. The scheduler
then resumes the next role, in role order after the last one, whose wait condition now
holds (`role_order` "listed" or "reversed" says which role starts). When no role can run and some have not finished, every role is blocked: that is a
deadlock on the GPU, reported as an `EmulationError` listing each role's name, source line
and the statement it waits at — the emulator never hangs.

**Random interleavings** (`role_order="random:SEED"`). The two fixed orders run a role
until it blocks, so a role that releases a resource too early (arrives at an "empty"
barrier before its wgmma has read the stage) is never caught: it keeps the baton until its
next wait, by which time the reads are done. With a seed, every asynchronous statement is
also a *scheduling point* (`yield_point`, before and after it: each wait, arrive, TMA or
wgmma issue, commit, fence): the running coroutine draws from the block's random stream
which runnable coroutine goes on — itself, another role, or (a role of a clustered
block) another block of the cluster. Blocking waits pick the next runnable coroutine from
that stream too. The stream is seeded by (SEED, block), so a run is deterministic per
seed; yields wait on nothing, so deadlock reports are unchanged.

**Warpgroups as units.** Under the listed order a role is one coroutine and its
warpgroups run in lockstep. Under the other orders (reversed, stall, random) each warpgroup of a role
is a coroutine of its own (`scheduling_units`): two cooperative consumer warpgroups can
drift apart, as on the GPU, so a stage one of them released while the other still had to
read it is reported (the lockstep hides it). Races between them are judged by the
happens-before model of `order.py`.

**Stalls at arrivals** (`role_order="stall"` or `"stall-reversed"`). A role that keeps
running until it blocks never lets another run *ahead* of it, and random yields rarely
hold one back long enough: a warpgroup that arrives on the other's turn barrier and is
then slow (its softmax) while the other passes its own sync and arrives a second time was
never explored (the ping-pong deadlock of 2be99ba: two arrivals of 128 completed a
256-thread barrier alone). Under these orders the roles start in listed (reversed) order
and run until they block, but a role that has just arrived — `bar.arrive` on a named
barrier, or an mbarrier arrive that carries no transaction bytes (a release: a consumer
handing a stage back, locally or to a peer of its cluster) — *stalls*: it goes on only
when no role that has not stalled can run, the most recently stalled first. So the role
that arrived first is held right after its arrive while the others (the producer too: its
`expect_tx` arrives are no stall points) run as far ahead as they can: a role lapping
another then arrives twice in one generation, which is reported
(`async_ops._check_lapping`), and a stage released before its wgmma read it is refilled
while the read is still pending, which is reported too. Each warpgroup is a coroutine of
its own, as under the reversed and random orders.

Outside `Roles` the whole block is one coroutine: a wait whose condition does not hold
can never be satisfied, and is the same deadlock report (`block_until`).

**Clusters.** The blocks of one thread-block cluster run together (`run_cluster`): each
block is a coroutine of a cluster-level `Scheduler`, and a block's own role scheduler
nests inside it. When every role of a block is blocked, the block does not deadlock at
once: it blocks on the cluster scheduler until one of its roles may go on (a peer's
multicast copy completed its bytes, a peer's remote arrive released a stage, the peers
reached the cluster barrier), and the other blocks run meanwhile. Only when every block
of the cluster is blocked is it a deadlock, reported per block with each role's source
line and the statement it waits at. `Cluster` holds the peers' states (what remote
arrives and multicast copies write) and the cluster barrier; a peer that has exited may
not be written to (`Cluster.peer`).
"""
from __future__ import annotations

import contextvars
import random
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tegula.emulate.errors import EmulationError
from tegula.emulate.exprs import compile_expr


class _Abort(BaseException):
    """Unwinds a role's thread when the block stops (another role failed, or deadlock).
    A BaseException so that no `except Exception` in between can swallow it."""


@dataclass
class Wait:
    """What a blocked coroutine waits for: `ready()` says whether it may go on;
    `describe()` says, for a deadlock report, the statement and the state it waits on."""

    ready: Callable[[], bool]
    describe: Callable[[], str]


class RoleTask:
    """One role of a `Roles` statement running in its own thread."""

    def __init__(self, scheduler: "Scheduler", name: str, loc: str, body: Callable, state):
        self.scheduler, self.name, self.loc = scheduler, name, loc
        self.body, self.state = body, state
        self.baton = threading.Semaphore(0)  # released by the scheduler: "run now"
        self.waiting: Wait | None = None
        self.done = False
        self.kind = "role"  # or "block": one block of a cluster (`run_cluster`)
        self.error: BaseException | None = None
        self.context: contextvars.Context | None = None  # the scheduler's, at `run`
        self.thread = threading.Thread(target=self._main, name=f"tegula-role-{name}",
                                       daemon=True)

    def label(self) -> str:
        if self.kind == "block":
            return self.name
        return f"role {self.name!r}" + (f" ({self.loc})" if self.loc else "")

    def _main(self) -> None:
        self.baton.acquire()
        try:
            if not self.scheduler.aborted:
                self.context.run(self.body, self.state)
        except _Abort:
            pass
        except BaseException as e:  # handed to the scheduler, which re-raises it
            self.error = e
        finally:
            self.done = True
            self.scheduler.handback.release()

    def block(self, wait: Wait) -> None:
        """Called in this role's thread: give the baton back until `wait` holds."""
        self.waiting = wait
        self.scheduler.handback.release()
        self.baton.acquire()
        if self.scheduler.aborted:
            raise _Abort()


class Scheduler:
    """Runs a block's roles with one baton (see the module docstring). With `rng` (a
    random interleaving) the next coroutine is drawn from it; else round robin."""

    def __init__(self, outer: RoleTask | None = None, rng: random.Random | None = None,
                 stall: bool = False):
        self.tasks: list[RoleTask] = []
        # Roles stalled after an arrive (`stall_point`), the most recent last: they run
        # only when no other role can (module docstring).
        self.stall = stall
        self.stalled: list[RoleTask] = []
        self.handback = threading.Semaphore(0)  # released by a role: "I stopped"
        self.aborted = False
        # The block's own task among its cluster's blocks (roles of a clustered block):
        # when every role is blocked, the block waits there for a peer to unblock one.
        self.outer = outer
        self.rng = rng
        self.chosen: RoleTask | None = None  # who a yielding task handed the baton to
        self.yield_outer = False  # a role yielded to the other blocks of its cluster

    def add(self, name: str, loc: str, body: Callable, state) -> RoleTask:
        task = RoleTask(self, name, loc, body, state)
        self.tasks.append(task)
        return task

    def run(self, where: Callable[[], str]) -> None:
        """Run every task to completion in the calling thread's stead; raise the first
        error of a role, or a deadlock report when all unfinished roles are blocked."""
        for t in self.tasks:
            # Each body runs in the caller's context: a new thread would start from an
            # empty one, dropping the caller's numpy error state (`np.errstate`).
            t.context = contextvars.copy_context()
            t.thread.start()
        last = -1
        try:
            while True:
                if self.yield_outer:  # a role let the cluster's other blocks run first
                    self.yield_outer = False
                    self.outer.block(YIELDED)
                task = self._pick(last)
                if task is None:
                    if all(t.done for t in self.tasks):
                        return
                    if self.outer is None:
                        raise EmulationError(self.deadlock_report(where()))
                    self.outer.block(Wait(lambda last=last: self._next_runnable(last) is not None,
                                          self.blocked_roles))
                    continue
                last = self.tasks.index(task)
                task.waiting = None
                task.baton.release()
                self.handback.acquire()
                if task.error is not None:
                    raise task.error
        finally:
            self._stop()

    def _pick(self, last: int) -> RoleTask | None:
        """The task to run next: the one a yield chose, else (random interleaving) one
        drawn from the runnable ones, else the next runnable one after `last`."""
        chosen, self.chosen = self.chosen, None
        if chosen is not None and self._runnable(chosen):
            return chosen
        if self.stall:
            return self._next_runnable(last) or self._unstall()
        if self.rng is None:
            return self._next_runnable(last)
        runnable = self.runnable()
        return self.rng.choice(runnable) if runnable else None

    def runnable(self) -> list[RoleTask]:
        return [t for t in self.tasks if self._runnable(t)]

    @staticmethod
    def _runnable(t: RoleTask) -> bool:
        return not t.done and (t.waiting is None or t.waiting.ready())

    def _next_runnable(self, last: int) -> RoleTask | None:
        """The next runnable task after `last` in role order (none that is stalled)."""
        n = len(self.tasks)
        for step in range(1, n + 1):
            t = self.tasks[(last + step) % n]
            if self._runnable(t) and t not in self.stalled:
                return t
        return None

    def _unstall(self) -> RoleTask | None:
        """The most recently stalled task, once no other can run (it stalls no more)."""
        for t in reversed(self.stalled):
            if self._runnable(t):
                self.stalled.remove(t)
                return t
        return None

    def deadlock_report(self, where: str) -> str:
        return f"deadlock: every role is blocked ({where})\n" + self.task_lines("  ")

    def task_lines(self, indent: str) -> str:
        lines = []
        for t in self.tasks:
            if t.done:
                lines.append(f"{indent}{t.label()}: finished")
            elif t.waiting is not None:
                lines.append(f"{indent}{t.label()} waits at {t.waiting.describe()}"
                             + _loops(t.state))
        return "\n".join(lines)

    def blocked_roles(self) -> str:
        """What a clustered block whose roles are all blocked waits for (deadlock report)."""
        return "its roles, all blocked:\n" + self.task_lines("      ")

    def _stop(self) -> None:
        """Unwind every role thread still parked on its baton, and join them all."""
        self.aborted = True
        for t in self.tasks:
            if t.thread.is_alive() and not t.done:
                t.baton.release()
        for t in self.tasks:
            t.thread.join()


def _loops(state) -> str:
    """The loop iteration and tile op a coroutine stopped in, for deadlock reports."""
    text = ("; " + ", ".join(f"{n}={v}" for n, v in state.loops)) if state.loops else ""
    return text + (f"; implementing: {state.comment}" if state.comment else "")


#: What a yielding coroutine waits for: nothing (it stays runnable; never in a deadlock).
YIELDED = Wait(lambda: True, lambda: "a scheduling point")


def yield_point(state) -> None:
    """A scheduling point of a random interleaving (see the module docstring): draw which
    runnable coroutine goes on — this one, another role of the block, or, in a role of a
    clustered block, the cluster's other blocks — and hand the baton over if not this."""
    task = state.task or state.block_task
    if task is None or task.scheduler.rng is None:
        return
    scheduler = task.scheduler
    others = [t for t in scheduler.runnable() if t is not task]
    outer = task.kind == "role" and scheduler.outer is not None
    choice = scheduler.rng.randrange(1 + len(others) + outer)
    if choice == 0:
        return
    if choice <= len(others):
        scheduler.chosen = others[choice - 1]
    else:
        scheduler.yield_outer = True
    task.block(YIELDED)


def stall_point(state) -> None:
    """After an arrive, under the stall orders: hold this role until no other can run
    (module docstring). Elsewhere nothing happens."""
    task = state.task
    if task is None or not task.scheduler.stall:
        return
    task.scheduler.stalled.append(task)
    task.block(YIELDED)


#: The role orders (`check_role_order`): "random:SEED" besides these.
FIXED_ROLE_ORDERS = ("listed", "reversed", "stall", "stall-reversed")


def random_interleaving(role_order: str, key: str) -> random.Random | None:
    """The random stream of a `role_order="random:SEED"` scheduler for `key` (the block
    or cluster), or None for the fixed orders."""
    if not role_order.startswith("random:"):
        return None
    return random.Random(f"tegula.emulate roles {role_order} {key}")


def check_role_order(role_order) -> None:
    """One of `FIXED_ROLE_ORDERS` or 'random:SEED' (SEED an integer); else an
    EmulationError."""
    if isinstance(role_order, str) and (
            role_order in FIXED_ROLE_ORDERS or
            (role_order.startswith("random:") and role_order[7:].lstrip("-").isdigit())):
        return
    raise EmulationError(f"role_order must be one of {', '.join(map(repr, FIXED_ROLE_ORDERS))} "
                         f"or 'random:SEED' (SEED an integer), not {role_order!r}")


def block_until(state, wait: Wait) -> None:
    """A blocking statement: return once `wait` holds. In a role, other roles run in
    between; in the block's single coroutine, a wait that does not hold now never will."""
    if wait.ready():
        return
    task = state.task or state.block_task
    if task is None:
        raise EmulationError("deadlock: the block waits at " + wait.describe() +
                             " and no other role can make it go on" + _loops(state))
    task.block(wait)


def compile_roles(s, compile_block: Callable, st, what: str) -> Callable:
    """`async_ir.Roles`: each thread runs the first role whose condition holds for it; the
    roles run as coroutines under one `Scheduler` until all have finished."""
    roles = []
    for role in s.roles:
        if role.max_registers is not None and (role.max_registers % 8
                                               or not 24 <= role.max_registers <= 256):
            raise EmulationError(f"{what}: role {role.name!r} asks for {role.max_registers} "
                                 "registers (setmaxnreg takes a multiple of 8 in 24..256)")
        roles.append((role.name, role.loc, compile_expr(role.cond),
                      _labelled(compile_block(role.body))))

    def run(state) -> None:
        if state.task is not None:
            raise EmulationError(f"{what}: Roles inside role {state.task.name!r} (roles do "
                                 "not nest)")
        taken = np.zeros(state.threads, dtype=bool)
        order = state.asyncs.role_order
        scheduler = Scheduler(outer=state.block_task,
                              rng=random_interleaving(order, f"block {state.bid}"),
                              stall=order.startswith("stall"))
        for number, (name, loc, cond, body) in enumerate(roles, 1):
            c = cond(state.env)
            sel = np.broadcast_to(np.asarray(c).astype(bool), (state.threads,))
            mask = state.mask & sel & ~taken
            taken |= mask
            if not mask.any():
                continue
            state.asyncs.role_of[mask] = number  # which threads consume phases together
            _check_uniform(mask, state.threads, f"{what}: role {name!r}")
            for unit, label in scheduling_units(mask, order, name):
                role_state = state.for_role(unit)
                role_state.task = scheduler.add(label, loc, body, role_state)
        if order.endswith("reversed"):
            scheduler.tasks.reverse()
        st.add(state.active_warps())
        scheduler.run(lambda: f"block {state.bid}")
    return run


def scheduling_units(mask: np.ndarray, role_order: str, name: str) -> list[tuple]:
    """(threads, label) of the coroutines that run a role. Under the listed order the role
    is one coroutine and its warpgroups run in lockstep; under the reversed and random
    orders each warpgroup is a coroutine of its own, so one can run ahead of another
    (a consumer warpgroup still reading a stage the other released, a race between two
    warpgroups the lockstep hides). Each still runs the role's whole body."""
    groups = [g for g in range(-(-len(mask) // WARPGROUP))
              if mask[g * WARPGROUP:(g + 1) * WARPGROUP].any()]
    if role_order == "listed" or len(groups) < 2:
        return [(mask, name)]
    units = []
    for g in groups:
        unit = np.zeros_like(mask)
        unit[g * WARPGROUP:(g + 1) * WARPGROUP] = mask[g * WARPGROUP:(g + 1) * WARPGROUP]
        units.append((unit, f"{name}, warpgroup {g}"))
    return units


#: Threads of a warpgroup: the scheduling unit of a role under reversed/random orders.
WARPGROUP = 128


def _labelled(body: Callable) -> Callable:
    """Run a role's body; its errors say which role and where in it."""
    def run(state) -> None:
        try:
            body(state)
        except EmulationError as e:
            raise EmulationError(f"{e.message}\n  in {state.where()}") from None
    return run


def _check_uniform(mask: np.ndarray, threads: int, what: str) -> None:
    """A role takes whole warpgroups (whole warps in a block that has no whole warpgroups)."""
    group = 128 if threads % 128 == 0 else 32
    if threads % group:
        return
    m = mask.reshape(-1, group)
    split = m.any(axis=1) & ~m.all(axis=1)
    if split.any():
        g = int(np.flatnonzero(split)[0])
        raise EmulationError(f"{what}: takes {int(m[g].sum())} of the {group} threads of "
                             f"{'warpgroup' if group == 128 else 'warp'} {g} (a role's "
                             "condition must be warpgroup-uniform)")


# ---------------------------------------------------------------------- clusters


class Cluster:
    """The blocks of one thread-block cluster (their states by rank, x fastest, as
    `%cluster_ctarank` numbers them) and its barrier (`barrier.cluster.arrive/wait`)."""

    def __init__(self, shape: tuple, blocks: list):
        self.shape = tuple(shape)
        self.blocks = blocks
        self.arrived = 0
        self.generation = 0

    def label(self) -> str:
        return f"cluster of blocks {self.blocks[0].bid}..{self.blocks[-1].bid}"

    def peer(self, rank: int, state, what: str):
        """The state of the block of rank `rank`, which must exist and still run (after a
        block exits its shared memory is gone: a write there is undefined on the GPU)."""
        if not 0 <= rank < len(self.blocks):
            raise EmulationError(f"{what}: CTA rank {rank} outside the cluster "
                                 f"{self.shape} ({len(self.blocks)} blocks)")
        peer = self.blocks[rank]
        if peer is not state and peer.block_task is not None and peer.block_task.done:
            raise EmulationError(
                f"{what}: block {state.bid} writes to the shared memory of block {peer.bid} "
                f"(rank {rank} of its cluster), which has already exited (a cluster barrier "
                "before exit keeps every block alive while its peers may still write to it)")
        return peer

    def arrive(self, state) -> int:
        """Block `state` reached the cluster barrier; returns the generation it waits to
        see end. The last arrival releases everyone: the inits each block fenced become
        visible to its peers, and what each block's threads observed is shared."""
        gen = self.generation
        self.arrived += 1
        if self.arrived == len(self.blocks):
            self.arrived, self.generation = 0, gen + 1
            for block in self.blocks:
                release_block(block)
        return gen


def release_block(block) -> None:
    """What a (cluster) barrier does to one block: a new race epoch, its threads share
    what they observed, and its fenced mbarrier inits become visible to the cluster."""
    block.smem.barrier()
    if block.asyncs is not None:
        block.asyncs.share_observations(block.tid)
        block.asyncs.publish_inits()


def run_cluster(cluster: Cluster, run_block: Callable, role_order: str) -> None:
    """Run the blocks of `cluster` together, each as a coroutine (`run_block(state)` runs
    one to its end); a deadlock of all of them is reported with what each waits at."""
    scheduler = Scheduler(rng=random_interleaving(role_order, cluster.label()))
    for state in cluster.blocks:
        state.block_task = scheduler.add(f"block {state.bid}", "", run_block, state)
        state.block_task.kind = "block"
    if role_order.endswith("reversed"):
        scheduler.tasks.reverse()
    try:
        scheduler.run(cluster.label)
    except EmulationError as e:
        if e.message.startswith("deadlock: every role is blocked"):
            raise EmulationError(e.message.replace("every role is blocked",
                                                   "every block of the cluster is blocked", 1)
                                 ) from None
        raise


__all__ = ["Scheduler", "RoleTask", "Wait", "block_until", "compile_roles", "Cluster",
           "run_cluster", "release_block", "yield_point", "stall_point", "check_role_order",
           "random_interleaving", "YIELDED", "FIXED_ROLE_ORDERS"]
