"""Happens-before between the threads of one emulated block: the race model behind
`memory.SharedMemory`.

Two accesses to a shared byte, at least one a write, by different threads race unless
one is ordered before the other by synchronization. The model tracks that order with
vector clocks whose unit is the warp:

* `clock` is a block-wide counter. Every access is stamped with its current value. A
  *release* by some threads takes the current value as the release stamp of their warps
  and advances the counter, so whatever those warps do afterwards has a larger stamp.
* `known[t, w]` is the largest stamp of warp w's accesses ordered before what thread t
  does next (0: none). An access stamped s by thread u is ordered before t's access iff
  u == t or s <= known[t, warp of u].
* A release by threads L yields a vector over warps: L's own stamps, and everything L's
  threads had learned (`known` rows: order is transitive). An *acquire* by threads L
  raises their `known` rows to a released vector.
* `__syncthreads` and `bar.sync` (every thread reaching the barrier): all release, all
  acquire what all released. `bar.arrive` releases and acquires nothing — the arriving
  warp goes on without waiting, so it learns nothing of the waiting threads' accesses.
  An mbarrier arrive releases into the barrier; a wait that passes acquires what its
  phases collected (`AsyncState`). A completed mbarrier phase orders nothing else: a
  thread that neither arrived nor waited learns nothing from it.

The warp as unit: a release by some lanes of a warp (an elected lane arriving for the
warp, after a warp-aligned wait) releases every access the warp made before it. Threads of
one warp are otherwise ordered only by synchronization too: a lane reading what another
lane of its warp wrote with no barrier in between is a race, as on the GPU (independent
thread scheduling).

Per shared byte the model keeps the last write (thread, stamp) and, per warp, the largest
stamp of the reads since that write with the range of reading threads (so a thread's own
reads never race its write). Reads older than the last write need no record: they were
ordered before it (checked then), and it before any later access.
"""
from __future__ import annotations

import numpy as np


class HappensBefore:
    """Vector clocks of a block's threads and the last accesses of each shared byte
    (see the module docstring)."""

    def __init__(self, nbytes: int, threads: int):
        self.threads = threads
        self.warps = -(-threads // 32)
        self.clock = 1
        self.known = np.zeros((threads, self.warps), dtype=np.int64)
        # Zero-filled arrays (lazily allocated pages): 0 means "none" for every stamp.
        self.w_tid = np.zeros(nbytes, dtype=np.int32)
        self.w_stamp = np.zeros(nbytes, dtype=np.int64)
        # Reads, per (byte, warp) at index byte * warps + warp: the latest stamp and the
        # range of reading threads since the byte's last write.
        self.r_stamp = np.zeros(nbytes * self.warps, dtype=np.int64)
        self.r_min = np.zeros(nbytes * self.warps, dtype=np.int32)
        self.r_max = np.zeros(nbytes * self.warps, dtype=np.int32)

    # ------------------------------------------------------------------ synchronization

    def _warps_of(self, lanes: np.ndarray) -> np.ndarray:
        return np.unique(np.asarray(lanes, dtype=np.int64) // 32)

    def release(self, lanes: np.ndarray) -> np.ndarray:
        """What threads `lanes` (indices) release: a vector over warps."""
        lanes = np.asarray(lanes, dtype=np.int64)
        vc = self.known[lanes].max(axis=0) if len(lanes) else np.zeros(self.warps, np.int64)
        vc[self._warps_of(lanes)] = self.clock
        self.clock += 1
        return vc

    def acquire(self, lanes: np.ndarray, vc: np.ndarray) -> None:
        lanes = np.asarray(lanes, dtype=np.int64)
        if len(lanes):
            self.known[lanes] = np.maximum(self.known[lanes], vc)

    def barrier(self, lanes: np.ndarray) -> None:
        """Threads `lanes` meet at a barrier: each is ordered after all of them."""
        self.acquire(lanes, self.release(lanes))

    # ------------------------------------------------------------------ accesses

    def _ordered(self, t: np.ndarray, other: np.ndarray, stamp: np.ndarray) -> np.ndarray:
        """Mask: the access stamped `stamp` by thread `other` is ordered before thread
        `t`'s (arrays broadcast alike; stamp 0: no access)."""
        if not stamp.any():
            return np.ones(np.shape(stamp), dtype=bool)
        return (stamp == 0) | (other == t) | (stamp <= self.known[t, other // 32])

    def ordered_for_all(self, lanes: np.ndarray, other: np.ndarray,
                        stamp: np.ndarray) -> np.ndarray:
        """Mask: the access stamped `stamp` by thread `other` is ordered before every
        thread of `lanes` (an asynchronous read made for all of them, e.g. a wgmma)."""
        floor = self.known[np.asarray(lanes, dtype=np.int64)].min(axis=0)
        return (stamp == 0) | (stamp <= floor[other // 32])

    def unordered_write(self, addrs: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Mask over `addrs`: the byte's last write is not ordered before thread `t`
        (`t` broadcast like `addrs`)."""
        return ~self._ordered(t, self.w_tid[addrs], self.w_stamp[addrs])

    def last_writer(self, addrs: np.ndarray) -> np.ndarray:
        return self.w_tid[addrs]

    def unordered_reads(self, addrs: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask over `addrs` of bytes read since their last write by a thread whose read
        is not ordered before thread `t`, such a reader) — `t`'s own reads never count."""
        slots = addrs[..., None] * self.warps + np.arange(self.warps)  # [..., warps]
        stamps = self.r_stamp[slots]
        late = stamps > self.known[t]                              # known[t]: [..., warps]
        if not late.any():
            return np.zeros(addrs.shape, dtype=bool), t
        lo, hi = self.r_min[slots], self.r_max[slots]
        tt = t[..., None]
        late &= ~((lo == tt) & (hi == tt))  # the thread's own reads
        bad = late.any(axis=-1)
        if not bad.any():
            return bad, t
        w = late.argmax(axis=-1)
        lo_w = np.take_along_axis(lo, w[..., None], axis=-1)[..., 0]
        hi_w = np.take_along_axis(hi, w[..., None], axis=-1)[..., 0]
        return bad, np.where(lo_w != t, lo_w, hi_w)

    def record_read(self, addrs: np.ndarray, t: np.ndarray) -> None:
        ft = t.ravel()
        slot = addrs.ravel() * self.warps + ft // 32
        fresh = slot[self.r_stamp[slot] == 0]
        self.r_min[fresh] = np.iinfo(np.int32).max
        self.r_max[fresh] = -1
        self.r_stamp[slot] = self.clock
        ft = ft.astype(np.int32)
        np.minimum.at(self.r_min, slot, ft)
        np.maximum.at(self.r_max, slot, ft)

    def record_write(self, addrs: np.ndarray, t: np.ndarray | None) -> None:
        """A write to `addrs` by threads `t` (None: not a generic write that later
        accesses must be ordered after, e.g. a cp.async or TMA copy tracked elsewhere)."""
        if t is None:
            self.w_stamp[addrs] = 0
        else:
            self.w_tid[addrs] = t
            self.w_stamp[addrs] = self.clock
        self.r_stamp[(addrs.ravel()[:, None] * self.warps + np.arange(self.warps)).ravel()] = 0

    def seen(self, owner: np.ndarray, stamp: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Mask: thread `owner`'s event stamped `stamp` is ordered before thread `t`."""
        return self._ordered(t, owner, stamp)


__all__ = ["HappensBefore"]
