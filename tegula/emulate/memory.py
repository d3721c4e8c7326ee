"""Global tensors, the block's shared memory with race checking, and bank-conflict counting.

Global tensors
--------------
Each kernel tensor parameter is bound to a numpy array. The kernel addresses it by element
offset from its first element (offset = sum(coord_i * stride_i), strides in elements as the
kernel reads them from `{t}_stride{i}`), so the emulator views the array's memory as a flat
1-D array starting at its first element (negative strides are rejected). Element types
numpy lacks may be passed either as float32 values (bf16, f8: rounded to the type on load)
or as their raw bit patterns (uint16 for bf16, uint8 for f8). Packed 4-bit tensors are uint8
arrays of bytes, two elements per byte (element 0 in the low nibble); their logical last
extent is twice the array's.

Shared memory and races
-----------------------
One uint8 buffer per block, initially all 0xFF bytes (NaN / -1: unwritten data shows). With
race checking on, two accesses to a byte by different threads, one a write, race unless
synchronization orders one before the other: happens-before with per-warp vector clocks
(`order.HappensBefore`; `__syncthreads` and `bar.sync` order their threads both ways,
`bar.arrive` and an mbarrier arrive only release, a passed mbarrier wait acquires). Every
byte remembers its last write and the reads since; for bytes written by `cp.async`, the
issuing thread and its group. `cp.async` copies complete at issue (the model), but their
bytes count as *in flight* until the issuing thread's `cp.async.wait_group` has retired
their group; reading them before, or from another thread not ordered after that wait
(a barrier), is a race, as is overwriting them while in flight. Several threads writing
the same byte within *one* statement is a race too (a replicated value must have exactly
one writer: on the GPU the writes land in an unspecified order, and a cp.async replica
with src-size 0 writes zeros).
The same holds for global stores (`several_writers`). Global memory has the block-internal
races too (two threads of a block storing one element with different values, or reading
one another thread stored, with no barrier between): `global_races`, on the same clocks.

Bank conflicts
--------------
Model (as `tegula.layout.banks`): 32 banks of 4 bytes; a warp instruction moving V bytes
per lane is served in phases of min(32, 128/V) consecutive lanes (all 32 lanes for
V <= 4, half-warps for 8 B, quarter-warps for 16 B); a phase costs, over banks, the max
number of *distinct* 4-byte words it touches in that bank (same word = broadcast). The
ideal is one wavefront per phase with an active lane; conflicts = wavefronts - ideal.
"""
from __future__ import annotations

import numpy as np

from tegula.arch.memory import RED_ADD
from tegula.dtypes import DType, bf16, f8e4m3, f8e5m2
from tegula.emulate.errors import EmulationError
from tegula.emulate.order import HappensBefore
from tegula.emulate.values import bits_dtype, from_bits, round_to, storage_dtype, to_bits
from tegula.lower.thread_ir import SharedBuffer

_NEVER = np.iinfo(np.int64).max


class GlobalTensor:
    """A kernel tensor parameter bound to a numpy array (see module docstring)."""

    def __init__(self, name: str, dtype: DType, array: np.ndarray):
        if not isinstance(array, np.ndarray):
            raise EmulationError(f"tensor {name!r}: expected a numpy array, "
                                 f"got {type(array).__name__}")
        self.name, self.dtype, self.array = name, dtype, array
        self.bits = self._check_dtype(array)
        item = array.itemsize
        if any(s < 0 for s in array.strides):
            raise EmulationError(f"tensor {name!r}: negative strides are not supported")
        if any(s % item for s in array.strides):
            raise EmulationError(f"tensor {name!r}: strides not a multiple of the element size")
        strides = [s // item for s in array.strides]
        extent = 0 if array.size == 0 else \
            1 + sum((n - 1) * s for n, s in zip(array.shape, strides))
        self.flat = np.lib.stride_tricks.as_strided(array, shape=(extent,), strides=(item,))
        # Offsets inside [0, extent) that are not elements of a strided view are holes.
        self.valid: np.ndarray | None = None
        if extent != array.size:
            valid = np.zeros(extent, dtype=bool)
            idx = np.zeros(1, dtype=np.int64)
            for n, s in zip(array.shape, strides):
                idx = (idx[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
            valid[idx] = True
            self.valid = valid
        self.packed = dtype.is_packed
        scale = 2 if self.packed else 1
        self.size = extent * scale
        # Element offsets stored to (`track_writes`), for tg.emulate's coverage check, and
        # which block (cluster) stored each last (-1: none), for `_check_overlap`.
        self.written: np.ndarray | None = None
        self.writer: np.ndarray | None = None
        # The block-internal race record (`global_races.GlobalRaces`), made on first use.
        self.races = None
        self.shape = tuple(array.shape[:-1]) + ((array.shape[-1] * scale,) if array.ndim else ())
        # In elements: a packed row's nibbles are consecutive (last stride 1), the other
        # strides count twice their bytes.
        self.strides = tuple(s * scale if d < len(strides) - 1 else s
                             for d, s in enumerate(strides))
        if self.packed and array.ndim and strides[-1] != 1 and array.shape[-1] > 1:
            raise EmulationError(f"packed tensor {name!r} must be contiguous in its last dim")

    def _check_dtype(self, array: np.ndarray) -> bool:
        """True when the array holds bit patterns rather than values."""
        dt = self.dtype
        if dt.is_packed:
            if array.dtype != np.uint8:
                raise EmulationError(f"tensor {self.name!r} ({dt}) must be a uint8 array of "
                                     "packed nibbles")
            return True
        if dt in (bf16, f8e4m3, f8e5m2):
            if array.dtype == bits_dtype(dt):
                return True
            if array.dtype == np.float32:
                return False
            raise EmulationError(f"tensor {self.name!r} is {dt}: pass float32 values or "
                                 f"{bits_dtype(dt)} bit patterns, not {array.dtype}")
        if array.dtype != storage_dtype(dt):
            raise EmulationError(f"tensor {self.name!r} is {dt} but the array is {array.dtype}")
        return False

    def check(self, offs: np.ndarray, what: str) -> None:
        """Raise unless every element offset in `offs` is an element of the tensor."""
        if offs.size == 0:
            return
        lo, hi = int(offs.min()), int(offs.max())
        bad = lo < 0 or hi >= self.size
        if not bad and self.valid is not None:
            bad = not bool(self.valid[(offs // 2) if self.packed else offs].all())
        if bad:
            flat = offs.ravel()
            wrong = flat[(flat < 0) | (flat >= self.size)]
            example = int(wrong[0]) if wrong.size else int(flat[0])
            raise EmulationError(
                f"{what}: out-of-bounds access to tensor {self.name!r} (shape {self.shape}, "
                f"{self.size} elements): element offset {example} (range {lo}..{hi})")

    def load(self, offs: np.ndarray) -> np.ndarray:
        """Storage values at element offsets (any shape; offsets already checked)."""
        if self.packed:
            byte = self.flat[offs // 2]
            return ((byte >> ((offs % 2) * 4).astype(np.uint8)) & 0xF).astype(np.uint8)
        raw = self.flat[offs]
        if self.bits:
            return from_bits(raw, self.dtype)
        return round_to(raw, self.dtype)

    def track_writes(self) -> None:
        """From now on, remember which element offsets are stored to (`written`) and by
        which block (`writer`)."""
        self.written = np.zeros(self.size, dtype=bool)
        self.writer = np.full(self.size, -1, dtype=np.int64)

    def store(self, offs: np.ndarray, values: np.ndarray, writer: int | None = None) -> None:
        """Write storage values at element offsets; `writer` identifies the storing block
        (or cluster: its blocks can order their stores) where overlaps are checked."""
        if self.written is not None:
            self.written[offs] = True
        if self.writer is not None and writer is not None:
            self._check_overlap(offs, values, writer)
        if self.packed:
            for col in range(offs.shape[-1]):  # read-modify-write one nibble column at a time
                o, v = offs[..., col], values[..., col].astype(np.uint8) & 0xF
                shift = ((o % 2) * 4).astype(np.uint8)
                byte = self.flat[o // 2]
                self.flat[o // 2] = (byte & ~(np.uint8(0xF) << shift)) | (v << shift)
            return
        self.flat[offs] = to_bits(values, self.dtype) if self.bits else values

    def _check_overlap(self, offs: np.ndarray, values: np.ndarray, writer: int) -> None:
        """Two blocks storing different values to one element: on the GPU the result is
        whichever runs last (no order between blocks), in the emulator the later block's
        — a silent difference. The same value stored twice (a replicated row) is fine."""
        before = self.writer[offs]
        other = (before >= 0) & (before != writer)
        if other.any() and not self.packed:
            old = self.load(offs[other])
            new = np.asarray(values)[other]
            same = (old == new) | (np.isnan(old) & np.isnan(new)) if old.dtype.kind == "f" \
                else old == new
            if not np.all(same):
                at = int(offs[other][~same][0])
                raise EmulationError(
                    f"tensor {self.name!r}: element offset {at} is stored by two blocks "
                    f"(or clusters) with different values ({old[~same][0]!r}, then "
                    f"{new[~same][0]!r}): their tiles overlap, and on the GPU the result is "
                    f"whichever block runs last; give each block its own tiles (or "
                    f"tg.atomic_add to sum them)")
        self.writer[offs] = writer

    def atomic_add(self, offs: np.ndarray, values: np.ndarray, entry=None) -> None:
        """tensor[offs] += values as the catalogue's `red.global.add` entry for the
        tensor's type computes it (`RED_ADD[dtype].execute`; `entry`: another entry's
        `execute`, a TMA reduce-add's), one add after another where several values hit
        one element (in the order given, as the threads' atomics may)."""
        entry = entry if entry is not None else RED_ADD.get(self.dtype.name)
        if entry is None or self.packed:
            raise EmulationError(f"atomic_add on tensor {self.name!r} of type {self.dtype}: "
                                 f"the catalogue has red.global.add for {', '.join(RED_ADD)}")
        offs, values = offs.ravel(), values.ravel()
        if self.written is not None:
            self.written[offs] = True
        # The k-th add to each element goes in round k: each round touches an element once.
        order = np.argsort(offs, kind="stable")
        sorted_offs = offs[order]
        starts = np.flatnonzero(np.r_[True, sorted_offs[1:] != sorted_offs[:-1]])
        rank = np.arange(offs.size) - np.repeat(starts, np.diff(np.r_[starts, offs.size]))
        for k in range(int(rank.max(initial=-1)) + 1):
            pick = order[rank == k]
            old = self.load(offs[pick])
            self.store(offs[pick], entry.execute(old, values[pick]))


def block_writer(bid: tuple, cluster) -> int:
    """One number per block for `GlobalTensor.store`'s overlap check — per cluster in a
    clustered launch, whose blocks may order their stores (cluster barrier)."""
    if cluster is not None:
        bid = cluster.blocks[0].bid
    x, y, z = bid
    return x + (y << 31) + (z << 47)


def several_writers(addrs: np.ndarray, tids: np.ndarray) -> np.ndarray | None:
    """Mask over `addrs` of locations that another thread also writes in the same
    instruction (`tids` broadcast like `addrs`), or None when each has one writer."""
    flat, owners = addrs.ravel(), tids.ravel()
    order = np.argsort(flat, kind="stable")
    a, t = flat[order], owners[order]
    clash = (a[1:] == a[:-1]) & (t[1:] != t[:-1])
    if not clash.any():
        return None
    mask = np.zeros(flat.size, dtype=bool)
    mask[order[1:][clash]] = True
    return mask.reshape(addrs.shape)


def _other_writer(addrs: np.ndarray, tids: np.ndarray, clash: np.ndarray) -> np.ndarray:
    """For each location, a thread other than its own writing it (for messages)."""
    first = int(np.flatnonzero(clash.ravel())[0])
    a, t = addrs.ravel(), tids.ravel()
    other = t[(a == a[first]) & (t != t[first])][0]
    return np.full(addrs.shape, other)


class SharedMemory:
    """A block's shared memory (bytes) with the race model of the module docstring."""

    def __init__(self, nbytes: int, buffers: list[SharedBuffer], threads: int, check_races: bool):
        # All-ones bytes read as NaN in every float type (and -1 as ints), so a kernel that
        # reads shared memory it never wrote shows it in its results.
        self.buf = np.full(nbytes, 0xFF, dtype=np.uint8)
        self.buffers = sorted(buffers, key=lambda b: b.byte_offset)
        self.check_races = check_races
        self.threads = threads
        # The block's `async_state.AsyncState` when the kernel has asynchronous statements:
        # it checks generic accesses against TMA copies, wgmma and TMA-store reads.
        self.async_ = None
        if check_races:
            self.order = HappensBefore(nbytes, threads)
            self.ca_tid = np.full(nbytes, -1, dtype=np.int32)
            self.ca_grp = np.zeros(nbytes, dtype=np.int64)
            self.committed = np.zeros(threads, dtype=np.int64)
            self.completed = np.zeros(threads, dtype=np.int64)
            # The clock stamp of the wait that retired each thread's cp.async group.
            self.done_stamp = np.full((threads, 8), _NEVER, dtype=np.int64)

    # ------------------------------------------------------------------ helpers

    def buffer_at(self, byte: int) -> str:
        """Name of the buffer holding `byte` (for messages)."""
        for b in self.buffers:
            if b.byte_offset <= byte < b.byte_offset + b.size * b.dtype.bits // 8:
                return f"{b.name!r} (element {(byte - b.byte_offset) * 8 // b.dtype.bits})"
        return "<no buffer>"

    def _race(self, what: str, kind: str, mask: np.ndarray, addrs: np.ndarray,
              tids: np.ndarray, other: np.ndarray, detail: str) -> None:
        i = int(np.flatnonzero(mask.ravel())[0])
        a, t, o = int(addrs.ravel()[i]), int(tids.ravel()[i]), int(other.ravel()[i])
        raise EmulationError(
            f"{what}: shared-memory race ({kind}) on byte {a} of buffer {self.buffer_at(a)}: "
            f"thread {t} vs thread {o} {detail}")

    def _async_hazard(self, addrs: np.ndarray, tids: np.ndarray | None,
                      lanes: np.ndarray | None = None):
        """(in-flight mask, not-yet-visible mask, owner) for cp.async bytes accessed by
        threads `tids` (broadcast like `addrs`), or by all of `lanes` at once."""
        owner = self.ca_tid[addrs]
        has = owner >= 0
        if not has.any():
            return None
        grp = self.ca_grp[addrs]
        ow = np.where(has, owner, 0)
        g = np.minimum(grp, self.done_stamp.shape[1] - 1)
        done = np.where(has & (grp < self.done_stamp.shape[1]), self.done_stamp[ow, g], _NEVER)
        inflight = has & (done == _NEVER)
        if lanes is not None:
            seen = self.order.ordered_for_all(lanes, ow, np.where(inflight, 0, done))
        else:
            seen = self.order.seen(ow, np.where(inflight, 0, done), tids)
        return inflight, has & ~inflight & ~seen, owner

    # ------------------------------------------------------------------ accesses

    def read(self, addrs: np.ndarray, tids: np.ndarray, what: str) -> np.ndarray:
        """Bytes at `addrs` ([n, nbytes] byte addresses) read by threads `tids` ([n])."""
        if self.check_races and addrs.size:
            t = np.broadcast_to(tids[:, None], addrs.shape)
            raw = self.order.unordered_write(addrs, t)
            if raw.any():
                self._race(what, "read after write", raw, addrs, t,
                           self.order.last_writer(addrs), "wrote it with no barrier in between")
            hz = self._async_hazard(addrs, t)
            if hz is not None:
                inflight, unseen, owner = hz
                if inflight.any():
                    self._race(what, "cp.async not waited for", inflight, addrs, t, owner,
                               "issued a cp.async to it whose group has not been waited for "
                               "(missing cp.async.wait_group)")
                if unseen.any():
                    self._race(what, "cp.async without barrier", unseen, addrs, t, owner,
                               "waited for its cp.async but no barrier followed")
            if self.async_ is not None:
                self.async_.generic_read(addrs, t, what, self.buffer_at)
            self.order.record_read(addrs, t)
        return self.buf[addrs]

    def write(self, addrs: np.ndarray, data: np.ndarray, tids: np.ndarray, what: str,
              async_group: np.ndarray | None = None) -> None:
        """Write bytes `data` ([n, nbytes]) at `addrs` by threads `tids`; `async_group` (per
        thread) marks a cp.async write."""
        if self.check_races and addrs.size:
            t = np.broadcast_to(tids[:, None], addrs.shape)
            clash = several_writers(addrs, t)
            if clash is not None:
                self._race(what, "several writers in one instruction", clash, addrs, t,
                           _other_writer(addrs, t, clash), "writes it in the same instruction")
            waw = self.order.unordered_write(addrs, t)
            if waw.any():
                self._race(what, "write after write", waw, addrs, t,
                           self.order.last_writer(addrs), "wrote it with no barrier in between")
            war, other = self.order.unordered_reads(addrs, t)
            if war.any():
                self._race(what, "write after read", war, addrs, t, other,
                           "read it with no barrier in between")
            hz = self._async_hazard(addrs, t)
            if hz is not None:
                inflight, unseen, owner = hz
                if inflight.any():
                    self._race(what, "overwrite of an in-flight cp.async", inflight, addrs, t,
                               owner, "has a cp.async to it that was not waited for")
                if unseen.any():
                    self._race(what, "cp.async without barrier", unseen, addrs, t, owner,
                               "waited for its cp.async but no barrier followed")
            if self.async_ is not None:
                self.async_.generic_write(addrs, t, what, self.buffer_at)
            if async_group is None:
                self.order.record_write(addrs, t)
                self.ca_tid[addrs] = -1
            else:  # in flight until waited for: `_async_hazard` orders it
                self.ca_tid[addrs] = t
                self.ca_grp[addrs] = np.broadcast_to(async_group[:, None], addrs.shape)
                self.order.record_write(addrs, None)
        self.buf[addrs] = data

    def check_async_read(self, addrs: np.ndarray, what: str, lanes: np.ndarray) -> None:
        """A wgmma reads `addrs` for the warpgroup `lanes`: every generic write to them (a
        store, a cp.async) must be ordered before every one of its threads, whichever
        thread made it."""
        if not self.check_races or not addrs.size:
            return
        writer = self.order.last_writer(addrs)
        raw = ~self.order.ordered_for_all(lanes, writer, self.order.w_stamp[addrs])
        if raw.any():
            i = int(np.flatnonzero(raw.ravel())[0])
            a = int(addrs.ravel()[i])
            raise EmulationError(
                f"{what}: shared-memory race (asynchronous read after write) on byte {a} of "
                f"buffer {self.buffer_at(a)}: thread {int(writer.ravel()[i])} wrote it with "
                "no barrier before this wgmma reads it")
        hz = self._async_hazard(addrs, None, lanes)
        if hz is not None:
            inflight, unseen, owner = hz
            for bad, why in ((inflight, "whose group has not been waited for (missing "
                                        "cp.async.wait_group)"),
                             (unseen, "waited for, but no barrier followed the wait")):
                if bad.any():
                    i = int(np.flatnonzero(bad.ravel())[0])
                    a = int(addrs.ravel()[i])
                    raise EmulationError(
                        f"{what}: reads byte {a} of buffer {self.buffer_at(a)}, written by a "
                        f"cp.async of thread {int(owner.ravel()[i])} {why}")

    def write_async_proxy(self, addrs: np.ndarray, data: np.ndarray, tid: int, what: str,
                          peer: bool = False) -> None:
        """A TMA load writes `data` at `addrs` for thread `tid` (its issuer). Generic
        accesses not ordered before the issuer's (a barrier, or an mbarrier the issuer
        waited on after they arrived) race with it; its own in-flight tracking is
        `AsyncState.tma_write`'s. `peer`: a multicast box issued in another block of the
        cluster, whose threads this block's clocks do not know: only that tracking (the
        peers' waits on the stage's phases) orders it."""
        if self.check_races and addrs.size and not peer:
            t = np.full(addrs.shape, tid)
            war, other = self.order.unordered_reads(addrs, t)
            if war.any():
                self._race(what, "TMA write after read", war, addrs, t, other,
                           "read it with no barrier or mbarrier wait in between")
            waw = self.order.unordered_write(addrs, t)
            if waw.any():
                self._race(what, "TMA write after write", waw, addrs, t,
                           self.order.last_writer(addrs),
                           "wrote it with no barrier or mbarrier wait in between")
        if self.check_races:
            if peer:
                self.order.w_stamp[addrs] = 0
            else:
                self.order.record_write(addrs, None)
            self.ca_tid[addrs] = -1
        self.buf[addrs] = data

    # ------------------------------------------------------------------ protocol

    def barrier(self, lanes: np.ndarray | None = None) -> None:
        """Threads `lanes` (default: the whole block) meet at a barrier."""
        if self.check_races:
            self.order.barrier(np.arange(self.threads) if lanes is None else lanes)

    def release(self, lanes: np.ndarray) -> np.ndarray | None:
        """What threads `lanes` release at an arrive (None without race checks)."""
        return self.order.release(lanes) if self.check_races else None

    def acquire(self, lanes: np.ndarray, released: np.ndarray | None) -> None:
        if self.check_races and released is not None:
            self.order.acquire(lanes, released)

    def open_group(self, tids: np.ndarray) -> np.ndarray:
        """The group index new cp.async of threads `tids` join (their uncommitted group)."""
        return self.committed[tids] if self.check_races else np.zeros(len(tids), dtype=np.int64)

    def commit(self, active: np.ndarray) -> None:
        if self.check_races:
            self.committed[active] += 1

    def wait(self, active: np.ndarray, pending: int) -> None:
        """cp.async.wait_group `pending` by the threads in `active` (bool [threads])."""
        if not self.check_races:
            return
        retired = np.maximum(self.committed - pending, self.completed)
        limit = np.where(active, retired, self.completed)
        need = int(limit.max())
        if need > self.done_stamp.shape[1]:
            grow = np.full((self.threads, max(need, 2 * self.done_stamp.shape[1])), _NEVER,
                           dtype=np.int64)
            grow[:, : self.done_stamp.shape[1]] = self.done_stamp
            self.done_stamp = grow
        lo = int(self.completed.min())
        for g in range(lo, need):
            newly = (g < limit) & (self.done_stamp[:, g] == _NEVER)
            self.done_stamp[newly, g] = self.order.clock
        self.completed = limit


_BANK_CACHE: dict[bytes, tuple[int, int]] = {}


def bank_wavefronts(addrs: np.ndarray, active: np.ndarray, nbytes: int,
                    banks: int = 32, bank_bytes: int = 4) -> tuple[int, int]:
    """(wavefronts, ideal) of warp accesses: `addrs` int [warps, 32] byte addresses of
    `nbytes`-byte accesses, `active` bool [warps, 32]. See the module docstring."""
    # Loops repeat the same pattern shifted by whole bank rows (stages, k offsets), and
    # shifting every address by a multiple of banks*bank_bytes changes no bank or word
    # distinctness: cache on the pattern relative to its first full row.
    row = banks * bank_bytes
    addrs = np.asarray(addrs, dtype=np.int64)
    base = (int(addrs.min()) // row) * row if addrs.size else 0
    key = b"".join((np.int64(nbytes * 1000 + banks).tobytes(),
                    np.int64(bank_bytes).tobytes(),
                    np.ascontiguousarray(addrs - base).tobytes(),
                    np.ascontiguousarray(active).tobytes()))
    hit = _BANK_CACHE.get(key)
    if hit is None:
        if len(_BANK_CACHE) > 8192:
            _BANK_CACHE.clear()
        hit = _BANK_CACHE[key] = _bank_wavefronts(addrs - base, active, nbytes, banks, bank_bytes)
    return hit


def _bank_wavefronts(addrs: np.ndarray, active: np.ndarray, nbytes: int,
                     banks: int, bank_bytes: int) -> tuple[int, int]:
    warps = addrs.shape[0]
    phase_lanes = 32 if nbytes <= bank_bytes else max(1, (banks * bank_bytes) // nbytes)
    nphase = 32 // phase_lanes
    words_per = max(1, nbytes // bank_bytes)
    lane = np.arange(32)
    group = (np.arange(warps)[:, None] * nphase + lane[None, :] // phase_lanes)  # [W, 32]
    words = addrs[..., None] // bank_bytes + np.arange(words_per)  # [W, 32, wp]
    sel = active
    g = np.broadcast_to(group[..., None], words.shape)[sel]
    w = words[sel]
    if w.size == 0:
        return 0, 0
    key = np.unique(g.astype(np.int64) << 32 | w.astype(np.int64))
    gu, wu = key >> 32, key & 0xFFFFFFFF
    counts = np.bincount(gu * banks + wu % banks, minlength=warps * nphase * banks)
    per_phase = counts.reshape(warps * nphase, banks).max(axis=1)
    ideal = int(np.count_nonzero(per_phase))
    return int(per_phase.sum()), ideal
