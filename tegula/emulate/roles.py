"""Warp roles as coroutines: run the roles of an `async_ir.Roles` statement concurrently.

A producer loop that waits on "empty" mbarriers the consumer arrives at cannot be run role
after role: it would wait forever for an arrival that comes later in program order. Each
role therefore runs its body in its own Python thread, but with *strict baton passing*:
exactly one role runs at any moment, so the emulation stays deterministic and numpy never
runs two statements at once. The scheduler (the thread that reached `Roles`) hands the
baton to a role; the role runs until it finishes or blocks at a statement whose condition
does not hold yet (`MBarrierWait`, `NamedBarrier`), and hands the baton back. The scheduler
then resumes the next role, in role order after the last one, whose wait condition now
holds. When no role can run and some have not finished, every role is blocked: that is a
deadlock on the GPU, reported as an `EmulationError` listing each role's name, source line
and the statement it waits at — the emulator never hangs.

Outside `Roles` the whole block is one coroutine: a wait whose condition does not hold
can never be satisfied, and is the same deadlock report (`block_until`).
"""
from __future__ import annotations

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
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"tegula-role-{name}",
                                       daemon=True)

    def label(self) -> str:
        return f"role {self.name!r}" + (f" ({self.loc})" if self.loc else "")

    def _main(self) -> None:
        self.baton.acquire()
        try:
            if not self.scheduler.aborted:
                self.body(self.state)
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
    """Runs a block's roles with one baton (see the module docstring)."""

    def __init__(self):
        self.tasks: list[RoleTask] = []
        self.handback = threading.Semaphore(0)  # released by a role: "I stopped"
        self.aborted = False

    def add(self, name: str, loc: str, body: Callable, state) -> RoleTask:
        task = RoleTask(self, name, loc, body, state)
        self.tasks.append(task)
        return task

    def run(self, where: Callable[[], str]) -> None:
        """Run every task to completion in the calling thread's stead; raise the first
        error of a role, or a deadlock report when all unfinished roles are blocked."""
        for t in self.tasks:
            t.thread.start()
        last = -1
        try:
            while True:
                task = self._next_runnable(last)
                if task is None:
                    if all(t.done for t in self.tasks):
                        return
                    raise EmulationError(self.deadlock_report(where()))
                last = self.tasks.index(task)
                task.waiting = None
                task.baton.release()
                self.handback.acquire()
                if task.error is not None:
                    raise task.error
        finally:
            self._stop()

    def _next_runnable(self, last: int) -> RoleTask | None:
        n = len(self.tasks)
        for step in range(1, n + 1):
            t = self.tasks[(last + step) % n]
            if not t.done and (t.waiting is None or t.waiting.ready()):
                return t
        return None

    def deadlock_report(self, where: str) -> str:
        lines = [f"deadlock: every role is blocked ({where})"]
        for t in self.tasks:
            if t.done:
                lines.append(f"  {t.label()}: finished")
            elif t.waiting is not None:
                lines.append(f"  {t.label()} waits at {t.waiting.describe()}"
                             + _loops(t.state))
        return "\n".join(lines)

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


def block_until(state, wait: Wait) -> None:
    """A blocking statement: return once `wait` holds. In a role, other roles run in
    between; in the block's single coroutine, a wait that does not hold now never will."""
    if wait.ready():
        return
    task = state.task
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
        scheduler = Scheduler()
        for name, loc, cond, body in roles:
            c = cond(state.env)
            sel = np.broadcast_to(np.asarray(c).astype(bool), (state.threads,))
            mask = state.mask & sel & ~taken
            taken |= mask
            if not mask.any():
                continue
            _check_uniform(mask, state.threads, f"{what}: role {name!r}")
            role_state = state.for_role(mask)
            role_state.task = scheduler.add(name, loc, body, role_state)
        if state.asyncs.role_order == "reversed":
            scheduler.tasks.reverse()
        st.add(state.active_warps())
        scheduler.run(lambda: f"block {state.bid}")
    return run


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


__all__ = ["Scheduler", "RoleTask", "Wait", "block_until", "compile_roles"]
