"""The emulator's `tg.last_arrival` (`lower/arrivals.py: LastArrivalStmt`) and the order
it makes between blocks.

Executing it: a block barrier; thread 0's atomic increment of the counter element as the
catalogue's `atom.acq_rel.gpu.global.inc.u32` computes it (`arch/arrivals.py`: wraps to 0
at the `count`-th arrival); the flag (did thread 0 read count − 1?) in every thread, as
`bar.red.or.pred` gives it; a second barrier. Errors, each naming the statement: a
counter holding a value outside 0 … count − 1 (never zeroed, or a launch that stopped
half-way), arrivals on one counter with different counts, a count below 1, a counter
element outside its tensor, a call under divergent control flow or inside a warp role.

Ordering. Blocks run one after another here, so a block reading what another stored would
always see it; `global_races` reports such a read as a race unless something orders it.
An arrival is that something: it releases every store the block made before it and
acquires everything released on the same counter by earlier arrivals (the atomics on one
address form one release sequence; what those blocks had acquired comes along). The
bookkeeping, all per launch:

* per block (in its environment, names no kernel variable can take): how many arrivals it
  has made (`RELEASES`) and, per other unit (block or cluster), the number of that unit's
  arrivals whose releases it has acquired (`ACQUIRED`);
* per counter element (on the counter's `GlobalTensor`): the same map for everything
  released on it so far, and the count its arrivals use;
* per stored element (`GlobalRaces.epoch`): the storing block's `RELEASES` at the store.

A read of an element another unit stored is ordered exactly when the reader acquired more
of that unit's arrivals than the unit had made when it stored (`released_to`): a store
after the writer's arrival, or a read before the reader's own, is still a race.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from tegula.arch.arrivals import ATOM_INC_ACQ_REL, BAR_RED_OR
from tegula.dtypes import i32
from tegula.emulate.errors import EmulationError
from tegula.emulate.exprs import compile_expr
from tegula.emulate.global_races import tracker
from tegula.emulate.memory import block_writer
from tegula.emulate.state import BlockState, per_thread, uniform_int
from tegula.emulate.stats import OpStats

Run = Callable[[BlockState], None]

#: Environment keys of a block's arrival bookkeeping (not C identifiers: no variable).
RELEASES = "@arrivals:releases"
ACQUIRED = "@arrivals:acquired"


class CounterRecord:
    """What the arrivals on one counter tensor released, per counter element offset."""

    def __init__(self) -> None:
        self.released: dict[int, dict[int, int]] = {}
        self.count: dict[int, int] = {}


def release_epoch(state: BlockState) -> int:
    """How many arrivals the block has made: the stamp of a store it makes now."""
    return state.env.get(RELEASES, 0)


def released_to(state: BlockState, units: np.ndarray, epochs: np.ndarray) -> np.ndarray:
    """Mask over elements stored by `units` at release epochs `epochs`: the reading block
    of `state` has acquired an arrival of that unit made after the store."""
    acquired = state.env.get(ACQUIRED)
    ordered = np.zeros(np.shape(units), dtype=bool)
    if acquired:
        for unit, count in acquired.items():
            ordered |= (units == unit) & (epochs < count)
    return ordered


def _merge(into: dict[int, int], other: dict[int, int]) -> None:
    for unit, count in other.items():
        if count > into.get(unit, 0):
            into[unit] = count


def compile_last_arrival(s, ctx, st: OpStats, what: str) -> Run:
    dt = ctx.tensor(s.tensor, what)
    if dt != i32:
        raise EmulationError(f"{what}: the counter {s.tensor!r} is {dt}, not i32")
    index, count = compile_expr(s.index), compile_expr(s.count)
    inside = compile_expr(s.pred) if s.pred is not None else None
    name, var = s.tensor, s.var.name

    def run(state: BlockState) -> None:
        if state.task is not None:
            raise EmulationError(f"{what}: last_arrival inside {state.task.label()}: every "
                                 f"thread of the block must arrive")
        if not state.full:
            off = int(np.count_nonzero(~state.mask))
            raise EmulationError(f"{what}: last_arrival under divergent control flow ({off} "
                                 f"of {state.threads} threads do not reach it)")
        state.smem.barrier()
        n = uniform_int(count(state.env), state, what)
        at = int(per_thread(index(state.env), state.threads)[0])   # thread 0's atomic
        if inside is not None and not bool(per_thread(inside(state.env), state.threads)[0]):
            raise EmulationError(f"{what}: the counter element is outside tensor {name!r} "
                                 f"(the GPU traps)")
        if n < 1:
            raise EmulationError(f"{what}: count is {n}; at least one block must arrive")
        t = state.tensors[name]
        offs = np.array([at], dtype=np.int64)
        t.check(offs, what)
        old = int(t.load(offs)[0])
        if not 0 <= old < n:
            raise EmulationError(
                f"{what}: the counter {name!r} (element {at}) holds {old} when block "
                f"{state.bid} arrives, outside 0 .. {n - 1} (count {n}): zero it before the "
                f"first launch (a launch that stopped half-way, or another count, left it); "
                f"the GPU traps")
        record = t.__dict__.setdefault("arrivals", CounterRecord())
        earlier = record.count.setdefault(at, n)
        if earlier != n:
            raise EmulationError(f"{what}: blocks arrive on counter {name!r} (element {at}) "
                                 f"with count {earlier} and {n}; one count per counter")
        returned, new = ATOM_INC_ACQ_REL.execute(old, n - 1)
        value = np.array([int(new)], dtype=np.int32)
        if state.smem.check_races:  # atomics commute with atomics, not with other accesses
            tracker(t).write(t, offs, value, np.zeros(1, dtype=np.int64), state, what,
                             commutes=True)
        t.store(offs, value)
        _release_acquire(state, record.released.setdefault(at, {}))
        last = np.zeros(state.threads, dtype=bool)
        last[0] = int(returned) == n - 1
        state.smem.barrier()
        state.env[var] = int(BAR_RED_OR.execute(last))
        st.add(state.active_warps(), 4)
    return run


def _release_acquire(state: BlockState, sequence: dict[int, int]) -> None:
    """The block's arrival on a counter whose release sequence so far is `sequence`."""
    unit = block_writer(state.bid, state.cluster)
    releases = release_epoch(state) + 1
    acquired = dict(state.env.get(ACQUIRED) or {})
    _merge(acquired, sequence)                   # acquire: every earlier arrival's release
    acquired.pop(unit, None)
    state.env[ACQUIRED] = acquired
    _merge(sequence, acquired)                   # release: what it acquired comes along,
    _merge(sequence, {unit: releases})           # and its own stores before this arrival
    state.env[RELEASES] = releases


__all__ = ["compile_last_arrival", "release_epoch", "released_to", "RELEASES", "ACQUIRED"]
