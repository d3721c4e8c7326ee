"""The asynchronous state of one emulated block: mbarriers, named barriers, wgmma and bulk
groups, and what the asynchronous proxy has done to shared memory.

Model (the contract is `tegula/lower/async_ir.py`):

* **mbarriers** keep (init count, pending arrivals, transaction bytes, completed phases).
  Another CTA of a cluster (remote arrive, multicast copy) may use one only once a
  cluster barrier followed its fenced init (`publish_inits`, `used_by_peer`).
  A phase completes when pending arrivals and transaction bytes are both zero; the
  pending count then resets to the init count. `MBarrierWait(parity=p)` goes on once the
  current phase's parity differs from `p` (`mbarrier.try_wait.parity`). Transaction
  bytes may go negative while arrivals are pending (a TMA copy completing before its
  `expect_tx`, as PTX allows), but a barrier with no pending arrival and negative bytes
  can never complete: that is reported (more bytes arrived than were expected).
* **Asynchronous copies complete at issue** (the earliest the hardware could), but what
  they wrote stays *in flight* for the threads that have not yet observed, through a
  successful `MBarrierWait`, the completion of the phase the copy signals. Reading those
  bytes, overwriting them, or copying over them again before that is an error. A named
  barrier or `__syncthreads` passes what its threads observed on to each other.
* **Asynchronous reads** (wgmma operands, TMA store sources) happen at issue too, but the
  bytes stay *being read* until the `WgmmaWait` / `BulkWait` that retires their group: a
  write to them before is an error. And what the generic proxy wrote must have been
  followed by `fence.proxy.async` from its writer before the async proxy reads it.
* **wgmma accumulators**: the result is computed at issue (in program order, so chained
  wgmmas on one accumulator are exact) but the `d` registers are *busy* until the
  `WgmmaWait` that retires the group: any other statement touching them is an error. A
  later wgmma may accumulate into busy registers only as PTX orders it (wgmma.fence: the
  accumulator accesses of wgmmas of one shape): the same instruction, each register at
  the same position of its `d`; and its register A operand must not be busy at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tegula.emulate.errors import EmulationError


def check_shared_layout(kernel) -> None:
    """mbarriers are 8-byte aligned and share no byte with a buffer or another array."""
    regions = [(b.byte_offset, b.byte_offset + b.size * b.dtype.bits // 8, f"buffer {b.name!r}")
               for b in kernel.shared]
    for m in kernel.mbarriers:
        if m.byte_offset % 8 or m.count < 1:
            raise EmulationError(f"kernel {kernel.name}: mbarrier array {m.name!r} at byte "
                                 f"{m.byte_offset} (count {m.count}) is not 8-byte aligned "
                                 "or empty")
        regions.append((m.byte_offset, m.end, f"mbarrier array {m.name!r}"))
    regions.sort()
    for (lo, hi, name), (lo2, _, name2) in zip(regions, regions[1:]):
        if lo2 < hi and (name.startswith("mbarrier") or name2.startswith("mbarrier")):
            raise EmulationError(f"kernel {kernel.name}: {name} (bytes {lo}..{hi}) overlaps "
                                 f"{name2} (from byte {lo2})")


# ---------------------------------------------------------------------- mbarriers

@dataclass
class MBarrier:
    """One 8-byte mbarrier (see the module docstring)."""

    name: str
    count: int = 0          # 0: not initialized
    pending: int = 0
    tx: int = 0
    phase: int = 0          # completed phases
    init_tid: int = -1
    fenced: bool = False    # fence.mbarrier_init by the initializing thread since the init
    cluster_visible: bool = False  # a cluster barrier since the fenced init (peers may use it)
    # Happens-before (`order.py`): what this block's arrivals released so far, and that as
    # of the last completed phase — what a wait that passes acquires (None: nothing).
    released: np.ndarray | None = None
    completed: np.ndarray | None = None

    def describe(self) -> str:
        if not self.count:
            return f"{self.name} (not initialized)"
        return (f"{self.name} in phase {self.phase} (parity {self.phase % 2}), "
                f"{self.pending} of {self.count} arrivals pending, {self.tx} tx bytes pending")


@dataclass
class WgmmaRecord:
    """One issued wgmma, until a `WgmmaWait` retires its group."""

    what: str
    regs: list[tuple[str, np.ndarray]]  # (register array, bool [size] columns) it writes
    lanes: np.ndarray                   # the warpgroup's thread indices
    smem: np.ndarray                    # shared byte addresses it reads


@dataclass
class NamedBarrierState:
    expected: int = 0
    arrived: int = 0
    generation: int = 0
    lanes: list = field(default_factory=list)    # every arrival's threads
    waiters: list = field(default_factory=list)  # those of bar.sync (not bar.arrive)
    released: np.ndarray | None = None           # what the arrivals released (order.py)


class AsyncState:
    """Everything asynchronous about one block (see the module docstring)."""

    def __init__(self, mbarrier_arrays, threads: int, smem_bytes: int, check_races: bool,
                 reg_sizes: dict[str, int], role_order: str = "listed"):
        self.threads = threads
        self.role_order = role_order  # which role the scheduler starts first (roles.py)
        self.reg_sizes = reg_sizes
        self.arrays = {m.name: m for m in mbarrier_arrays}
        self.base: dict[str, int] = {}
        self.bars: list[MBarrier] = []
        for m in mbarrier_arrays:
            self.base[m.name] = len(self.bars)
            self.bars += [MBarrier(f"{m.name}[{i}]") for i in range(m.count)]
        self.named: dict[int, NamedBarrierState] = {}
        # wgmma: per warpgroup, the open group and the committed groups not yet retired.
        groups = -(-threads // 128)
        self.wg_open: list[list[WgmmaRecord]] = [[] for _ in range(groups)]
        self.wg_committed: list[list[list[WgmmaRecord]]] = [[] for _ in range(groups)]
        self.wg_needs_fence = np.ones(groups, dtype=bool)
        self.reg_busy: dict[str, np.ndarray] = {}  # array -> in-flight count [threads, size]
        self.reg_owner: dict[str, str] = {}        # array -> the wgmma that made it busy
        #: (warpgroup, array, column) -> (instruction, position in its d, statement) of
        #: the latest wgmma accumulating there (read while the register is busy)
        self.reg_fragment: dict[tuple, tuple] = {}
        # TMA stores: per thread, the open group and committed groups (their source bytes).
        self.bulk_open: dict[int, list[np.ndarray]] = {}
        self.bulk_committed: dict[int, list[list[np.ndarray]]] = {}
        # Per thread, the global elements of its TMA stores in flight ((race record,
        # element offsets), `global_races.issue_tma_store`), grouped like bulk_committed.
        self.bulk_global_open: dict[int, list[tuple]] = {}
        self.bulk_global_committed: dict[int, list[list[tuple]]] = {}
        # Shared memory seen by the async proxy (per byte), and per-thread observations.
        self.tma_bar = np.full(smem_bytes, -1, dtype=np.int32)
        self.tma_phase = np.zeros(smem_bytes, dtype=np.int64)
        self.readers = np.zeros(smem_bytes, dtype=np.int32)   # pending async reads
        self.generic_seq = np.full(smem_bytes, -1, dtype=np.int64)
        self.generic_tid = np.zeros(smem_bytes, dtype=np.int32)
        self.fence_seq = np.full(threads, -1, dtype=np.int64)
        self.observed = np.zeros((max(1, len(self.bars)), threads), dtype=np.int64)
        # The role each thread runs (`roles.compile_roles`; 0 outside `Roles`): which
        # threads share the consumption of a barrier's phases (`tma_write`).
        self.role_of = np.zeros(threads, dtype=np.int32)
        # Which threads may use each barrier: its initializer, and whoever met it at a
        # barrier since (a completed phase of the barrier itself does not count).
        self.init_visible = np.zeros((max(1, len(self.bars)), threads), dtype=bool)
        # The barrier's completed-phase count at each thread's last successful wait.
        self.waited_at = np.full((max(1, len(self.bars)), threads), -1, dtype=np.int64)
        self.clock = 0

    # ------------------------------------------------------------------ mbarriers

    def barrier(self, name: str, index: int, what: str) -> tuple[int, MBarrier]:
        """(global id, state) of `name[index]`, checked declared and in range."""
        if name not in self.arrays:
            raise EmulationError(f"{what}: no mbarrier array {name!r} in the kernel "
                                 f"(declared: {sorted(self.arrays) or 'none'})")
        n = self.arrays[name].count
        if not 0 <= index < n:
            raise EmulationError(f"{what}: mbarrier index {index} outside {name}[0..{n})")
        gid = self.base[name] + index
        return gid, self.bars[gid]

    def init(self, gid: int, count: int, tid: int) -> None:
        bar = self.bars[gid]
        bar.count = bar.pending = count
        bar.tx = bar.phase = 0
        bar.init_tid, bar.fenced, bar.cluster_visible = tid, False, False
        bar.released = bar.completed = None
        self.observed[gid] = 0
        self.waited_at[gid] = -1
        self.init_visible[gid] = False
        self.init_visible[gid, tid] = True

    def publish_inits(self) -> None:
        """A cluster barrier: fenced inits become visible to the other CTAs of the cluster."""
        for bar in self.bars:
            if bar.count and bar.fenced:
                bar.cluster_visible = True

    def used_by_peer(self, gid: int, what: str, peer: str) -> None:
        """Check barrier `gid` may be used by a thread of another CTA of the cluster (a
        remote arrive, a multicast copy completing its bytes here): initialized, fenced
        (`fence.mbarrier_init.release.cluster`) and made visible by a cluster barrier."""
        bar = self.bars[gid]
        if not bar.cluster_visible:
            state = ("not initialized" if not bar.count else
                     "initialized with no fence.mbarrier_init and cluster barrier after it"
                     if not bar.fenced else "initialized with no cluster barrier after the "
                     "fence (barrier.cluster.arrive/wait)")
            raise EmulationError(f"{what}: {peer} uses mbarrier {bar.name} of another CTA of "
                                 f"the cluster, {state}: its init is not visible to the peer")

    def used(self, gid: int, lanes: np.ndarray, what: str) -> None:
        """Check barrier `gid` may be used by threads `lanes` (initialized, init visible)."""
        bar = self.bars[gid]
        if not bar.count:
            raise EmulationError(f"{what}: mbarrier {bar.name} used before mbarrier.init")
        blind = ~self.init_visible[gid, lanes]
        if blind.any():
            other = int(lanes[blind][0])
            raise EmulationError(
                f"{what}: thread {other} uses mbarrier {bar.name} initialized by thread "
                f"{bar.init_tid} with no barrier in between (the init is not visible yet: "
                "fence.mbarrier_init and __syncthreads must follow mbarrier.init)")

    def arrive(self, bar: MBarrier, arrivals: int, tx_bytes: int, what: str,
               released: np.ndarray | None = None) -> bool:
        """`arrivals` arrivals (each raising the expected bytes by `tx_bytes` first),
        releasing `released` (the arriving threads' clocks, `SharedMemory.release`);
        True when a phase completed."""
        if released is not None:
            bar.released = released if bar.released is None else np.maximum(bar.released,
                                                                              released)
        bar.tx += arrivals * tx_bytes
        bar.pending -= arrivals
        if bar.pending < 0:
            raise EmulationError(
                f"{what}: {arrivals} arrivals on mbarrier {bar.name}, which had only "
                f"{bar.pending + arrivals} of {bar.count} pending (arrival count underflow)")
        return self._maybe_complete(bar, what)

    def complete_tx(self, bar: MBarrier, nbytes: int, what: str) -> bool:
        """An async copy's `complete_tx` of `nbytes`; True when a phase completed."""
        bar.tx -= nbytes
        return self._maybe_complete(bar, what)

    def _maybe_complete(self, bar: MBarrier, what: str) -> bool:
        if bar.pending == 0 and bar.tx < 0:
            raise EmulationError(
                f"{what}: mbarrier {bar.name} received {-bar.tx} more transaction bytes than "
                "were expected (expect_tx too small, or a copy signals the wrong barrier); "
                "its phase can never complete")
        if bar.pending == 0 and bar.tx == 0:
            bar.phase += 1
            bar.pending = bar.count
            bar.completed = None if bar.released is None else bar.released.copy()
            return True
        return False

    # ------------------------------------------------------------------ shared memory

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def _unobserved(self, addrs: np.ndarray, tids: np.ndarray) -> np.ndarray:
        """Mask over `addrs` of bytes a TMA copy wrote whose phase `tids` has not observed."""
        bar = self.tma_bar[addrs]
        has = bar >= 0
        if not has.any():
            return has
        seen = self.observed[np.where(has, bar, 0), tids]
        return has & (seen <= self.tma_phase[addrs])

    def _tma_error(self, what: str, verb: str, mask, addrs, tids, describe_byte) -> None:
        i = int(np.flatnonzero(mask.ravel())[0])
        a, t = int(addrs.ravel()[i]), int(np.broadcast_to(tids, addrs.shape).ravel()[i])
        bar = self.bars[int(self.tma_bar[a])]
        raise EmulationError(
            f"{what}: {verb} of shared memory a TMA copy may still be writing: byte {a} of "
            f"buffer {describe_byte(a)} by thread {t}, before a wait observed phase "
            f"{int(self.tma_phase[a])} of mbarrier {bar.name} (which the copy completes)")

    def generic_read(self, addrs: np.ndarray, tids: np.ndarray, what: str, describe_byte) -> None:
        """A generic-proxy read (`tids` broadcast like `addrs`)."""
        bad = self._unobserved(addrs, tids)
        if bad.any():
            self._tma_error(what, "read", bad, addrs, tids, describe_byte)

    def generic_write(self, addrs: np.ndarray, tids: np.ndarray, what: str, describe_byte) -> None:
        """A generic-proxy write: not over bytes being read or written asynchronously."""
        self._no_async_readers(addrs, what, describe_byte)
        bad = self._unobserved(addrs, tids)
        if bad.any():
            self._tma_error(what, "overwrite", bad, addrs, tids, describe_byte)
        self.tma_bar[addrs] = -1
        self.generic_seq[addrs] = self.tick()
        self.generic_tid[addrs] = tids

    def _no_async_readers(self, addrs: np.ndarray, what: str, describe_byte) -> None:
        busy = self.readers[addrs] > 0
        if busy.any():
            a = int(addrs.ravel()[int(np.flatnonzero(busy.ravel())[0])])
            raise EmulationError(
                f"{what}: write to byte {a} of buffer {describe_byte(a)} while a wgmma or TMA "
                "store still reads it (before the WgmmaWait / BulkWait that retires it)")

    def async_read(self, addrs: np.ndarray, tids: np.ndarray, what: str, describe_byte,
                   written: bool = False) -> None:
        """The async proxy (wgmma, TMA store) reads `addrs` for threads `tids` (one per row
        of `addrs`, or broadcast): TMA data must be observed, generic writes fenced, and
        with `written` every byte written by something (a wgmma operand; a TMA store's
        box may hold unwritten bytes for elements outside the tensor, which it skips)."""
        t = np.broadcast_to(tids, addrs.shape)
        bad = self._unobserved(addrs, t)
        if bad.any():
            self._tma_error(what, "read (by the async proxy)", bad, addrs, t, describe_byte)
        seq = self.generic_seq[addrs]
        never = (seq < 0) & (self.tma_bar[addrs] < 0)
        if written and never.any():
            a = int(addrs.ravel()[int(np.flatnonzero(never.ravel())[0])])
            raise EmulationError(f"{what}: reads byte {a} of buffer {describe_byte(a)}, which "
                                 "nothing has written (no TMA copy, no store)")
        unfenced = (seq >= 0) & (self.fence_seq[self.generic_tid[addrs]] < seq)
        if unfenced.any():
            i = int(np.flatnonzero(unfenced.ravel())[0])
            a = int(addrs.ravel()[i])
            raise EmulationError(
                f"{what}: reads byte {a} of buffer {describe_byte(a)}, written by thread "
                f"{int(self.generic_tid[a])} through the generic proxy with no "
                "fence.proxy.async after the write (the async proxy may read stale data)")

    def tma_write(self, addrs: np.ndarray, gid: int, what: str, describe_byte) -> None:
        """A TMA load lands at `addrs`, completing on barrier `gid`'s current phase."""
        self._no_async_readers(addrs, what, describe_byte)
        prior = self.tma_bar[addrs] >= 0
        if prior.any():
            # The previous copy's data must have been observed by one thread at least, and
            # by every thread of each role that consumed it which ever waited on its
            # barrier (the consumers freed the slot). A role none of whose threads observed
            # it skips that phase: ping-pong consumer warpgroups take alternate tiles.
            ids, phases = self.tma_bar[addrs][prior], self.tma_phase[addrs][prior]
            for b in np.unique(ids).tolist():
                sel = ids == b
                waiters = np.flatnonzero(self.observed[b] > 0)
                lags = self.observed[b][waiters] <= phases[sel].max()
                consumed = np.isin(self.role_of[waiters], self.role_of[waiters[~lags]])
                behind = waiters[lags & consumed]
                if lags.all() or len(behind):
                    lagging = int(behind[0]) if len(behind) else \
                        int(waiters[0]) if len(waiters) else 0
                    self._tma_error(what, "overwrite (by another TMA copy)", np.array([True]),
                                    addrs[prior][sel][:1], np.array([lagging]), describe_byte)
        self.tma_bar[addrs] = gid
        self.tma_phase[addrs] = self.bars[gid].phase
        self.generic_seq[addrs] = -1

    def named_barrier(self, bar_id: int) -> NamedBarrierState:
        return self.named.setdefault(bar_id, NamedBarrierState())

    # ------------------------------------------------------------------ groups

    def _count_readers(self, addrs: np.ndarray, step: int) -> None:
        """readers[a] += step for each occurrence of a in `addrs` (np.add.at, faster)."""
        if addrs.size:
            self.readers += step * np.bincount(addrs, minlength=len(self.readers)).astype(
                np.int32)

    def bulk_store_issued(self, lane: int, addrs: np.ndarray) -> None:
        """A TMA store by thread `lane` reads `addrs` until its group is waited for."""
        flat = addrs.ravel()
        self._count_readers(flat, 1)
        self.bulk_open.setdefault(lane, []).append(flat)

    def bulk_global_issued(self, lane: int, record, offs: np.ndarray) -> None:
        """A TMA store by thread `lane` writes global elements `offs` of the tensor whose
        race record is `record` until a full bulk wait retires its group."""
        self.bulk_global_open.setdefault(lane, []).append((record, offs))

    def bulk_commit(self, lanes: np.ndarray) -> None:
        for t in lanes.tolist():
            if t in self.bulk_open or t in self.bulk_committed:
                self.bulk_committed.setdefault(t, []).append(self.bulk_open.pop(t, []))
                self.bulk_global_committed.setdefault(t, []).append(
                    self.bulk_global_open.pop(t, []))

    def bulk_wait(self, lanes: np.ndarray, pending: int, read_only: bool = False) -> None:
        """`cp.async.bulk.wait_group[.read] pending` by threads `lanes`: their groups but
        the newest `pending` stop reading shared memory; without `.read` their global
        writes are complete too."""
        for t in lanes.tolist():
            groups = self.bulk_committed.get(t, [])
            while len(groups) > pending:
                for flat in groups.pop(0):
                    self._count_readers(flat, -1)
            written = self.bulk_global_committed.get(t, [])
            while not read_only and len(written) > pending:
                for record, offs in written.pop(0):
                    record.retire_bulk(offs)

    def retire_global_writes(self) -> None:
        """At the end of the block: every TMA store has landed (the kernel's exit waits)."""
        for groups in [[g] for g in self.bulk_global_open.values()] + \
                list(self.bulk_global_committed.values()):
            for group in groups:
                for record, offs in group:
                    record.retire_bulk(offs)
        self.bulk_global_open.clear()
        self.bulk_global_committed.clear()

    def wgmma_issued(self, group: int, what: str, lanes: np.ndarray,
                     regs: list[tuple[str, int]], smem: np.ndarray, instr: str = "",
                     a_regs: list[tuple[str, int]] = ()) -> None:
        """Warpgroup `group` issued a wgmma (`instr`) writing registers `regs` (array,
        column: its d in order) and reading shared bytes `smem` and registers `a_regs`:
        busy until a WgmmaWait retires it (`check_wgmma_registers` first)."""
        self.check_wgmma_registers(group, what, lanes, regs, instr, a_regs)
        cols: dict[str, list[int]] = {}
        for position, (name, col) in enumerate(regs):
            cols.setdefault(name, []).append(col)
            self.reg_fragment[(group, name, col)] = (instr, position, what)
        busy = []
        for name, cs in cols.items():
            if name not in self.reg_busy:
                self.reg_busy[name] = np.zeros((self.threads, self.reg_sizes[name]),
                                               dtype=np.int32)
            # A count, not a flag: later wgmmas on the same accumulator keep it busy
            # after an earlier group retires.
            self.reg_busy[name][np.ix_(lanes, cs)] += 1
            self.reg_owner[name] = what
            busy.append((name, np.array(cs)))
        self._count_readers(smem, 1)
        self.wg_open[group].append(WgmmaRecord(what, busy, lanes, smem))

    def check_wgmma_registers(self, group: int, what: str, lanes: np.ndarray,
                              regs: list[tuple[str, int]], instr: str,
                              a_regs: list[tuple[str, int]]) -> None:
        """PTX (wgmma.fence) orders the accumulator accesses of in-flight wgmmas of one
        shape, nothing else: a busy `d` register must belong to the same instruction at
        the same position of its d, and no register A operand may be busy."""
        for name, col in a_regs:
            self.check_regs(name, slice(col, col + 1), lanes, f"{what} (register A)")
        for position, (name, col) in enumerate(regs):
            busy = self.reg_busy.get(name)
            if busy is None or not busy[lanes, col].any():
                continue
            owner = self.reg_fragment.get((group, name, col))
            if owner is None or owner[:2] != (instr, position):
                held = (f"position {owner[1]} of the d of {owner[2]} ({owner[0]})" if owner
                        else f"an accumulator of {self.reg_owner.get(name, '?')}")
                raise EmulationError(
                    f"{what}: accumulates into register {name}[{col}] (position {position} "
                    f"of its d, {instr}), which is {held}, still in flight: PTX orders "
                    "accumulator registers between in-flight wgmmas of one shape at one "
                    "fragment position only (missing wgmma.wait_group before this wgmma)")

    def touch_regs(self, name: str, col: int, count: int, mask: np.ndarray, what: str) -> None:
        """A statement other than wgmma accesses registers of a wgmma fragment array: not
        while busy, and the warpgroup's next wgmma needs a wgmma.fence first."""
        lanes = np.flatnonzero(mask)
        self.check_regs(name, slice(col, col + count), lanes, what)
        self.wg_needs_fence[np.unique(lanes // 128)] = True

    def fence_proxy(self, lanes: np.ndarray) -> None:
        self.fence_seq[lanes] = self.tick()

    def observe(self, gid: int, lanes: np.ndarray, what: str, repeat: bool = False) -> None:
        """Threads `lanes` passed a wait on barrier `gid`. Each wait of a thread must see a
        phase its previous wait did not: passing again at the same phase count means the
        parity it waited for belongs to a phase it already consumed (the parity tracking
        fell a round behind), and on the GPU it would read the stage's old data. A
        `repeat` wait is the opposite: it must pass at exactly its previous wait's phase
        (else a phase completed in between, and it waited for a newer one)."""
        phase = self.bars[gid].phase
        if repeat:
            moved = self.waited_at[gid, lanes] != phase
            if moved.any():
                t = int(lanes[moved][0])
                raise EmulationError(
                    f"{what}: thread {t} repeats its wait on mbarrier {self.bars[gid].name}, "
                    f"but its phase moved on since (now {phase} completed, then "
                    f"{int(self.waited_at[gid, t])})")
            return
        again = self.waited_at[gid, lanes] == phase
        if again.any():
            t = int(lanes[again][0])
            raise EmulationError(
                f"{what}: thread {t} passes its wait on mbarrier {self.bars[gid].name} at the "
                f"same phase ({phase} completed) as its previous wait: the parity it waits "
                "for is that of a phase it already observed (a round behind?)")
        self.waited_at[gid, lanes] = phase
        self.observed[gid, lanes] = phase

    def share_observations(self, lanes: np.ndarray, takers: np.ndarray | None = None) -> None:
        """Threads that met at a barrier know what each of them observed: all of `lanes`,
        or only `takers` (the threads that waited; a `bar.arrive` learns nothing)."""
        takers = lanes if takers is None else takers
        if len(self.bars) and len(lanes) and len(takers):
            seen = self.observed[:, lanes].max(axis=1, keepdims=True)
            self.observed[:, takers] = np.maximum(self.observed[:, takers], seen)
            visible = self.init_visible[:, lanes].any(axis=1, keepdims=True)
            self.init_visible[:, takers] |= visible

    # ------------------------------------------------------------------ wgmma registers

    def check_regs(self, name: str, cols: slice, lanes: np.ndarray, what: str) -> None:
        busy = self.reg_busy.get(name)
        if busy is not None and busy[lanes, cols].any():
            c = int(np.flatnonzero(busy[lanes, cols].any(axis=0))[0]) + (cols.start or 0)
            raise EmulationError(
                f"{what}: accesses register {name}[{c}], an accumulator of {self.reg_owner[name]} "
                "still in flight (missing wgmma.wait_group before this use)")

    def retire(self, records: list[WgmmaRecord]) -> None:
        for r in records:
            for name, cols in r.regs:
                self.reg_busy[name][np.ix_(r.lanes, cols)] -= 1
            self._count_readers(r.smem, -1)

    def unfinished(self) -> str | None:
        """At the end of a block: what asynchronous work no wait retired, if any."""
        for g, (open_, committed) in enumerate(zip(self.wg_open, self.wg_committed)):
            pending = open_ + [r for grp in committed for r in grp]
            if pending:
                return (f"warpgroup {g} ends with {len(pending)} wgmma not retired by a "
                        f"WgmmaWait (first: {pending[0].what})")
        for bar_id, named in sorted(self.named.items()):
            if named.arrived:  # a bar.arrive no bar.sync met (or threads still waiting)
                return (f"named barrier {bar_id} ends with {named.arrived} of "
                        f"{named.expected} threads arrived")
        for tid, groups in self.bulk_committed.items():
            if groups or self.bulk_open.get(tid):
                return (f"thread {tid} ends with TMA stores not waited for "
                        "(cp.async.bulk.wait_group)")
        return None


__all__ = ["check_shared_layout", "AsyncState", "MBarrier", "WgmmaRecord", "NamedBarrierState"]
