"""Races on global memory: between the threads of one block, between blocks, and reads
of a TMA store still in flight.

Within a block. The shared-memory race model (`memory.SharedMemory`, `order.HappensBefore`)
orders the accesses of a block's threads by its barriers, named barriers and mbarriers.
Global memory has the same hazards within a block: two warps storing one element, or a
thread reading an element another thread stored, with nothing ordering them (ping-pong
consumer warpgroups whose tile map sends two iterations to one tile, or whose iteration
reads what the other's wrote). On the GPU the result is whichever access lands first; the
emulator, running one warp after another, would silently pick one order. This module
reports them with the same happens-before clocks, at element granularity:

* **write after write**: an element last stored by another thread of the same block, that
  store not ordered before this one, and the values differ (the same value stored twice,
  a replicated row, is harmless);
* **read after write**: an element last stored by another thread of the same block, that
  store not ordered before this read (a thread's own stores are always ordered).

Between blocks. Blocks of one launch have no order at all (but for `tg.last_arrival`: an
arrival orders the stores a block made before it before the reads of a block arriving
later on the same counter, `emulate/arrivals.py`), yet the emulator runs them one after
another. So a *unit*
(a block, or a thread-block cluster, whose blocks can order their accesses) that

* reads an element another unit stored (or added to atomically) in the same launch, or
* stores a different value to an element another unit read in the same launch, or
* stores a different value to an element another unit stored

is an error naming both blocks: on the GPU the answer depends on which block runs first
(a user tile map whose output tiles overlap, an in-place kernel whose blocks read their
neighbours' elements). Atomic adds commute with each other and are not compared.

TMA stores in flight. A TMA store (or bulk reduce-add) writes global memory
asynchronously: the data is there only after the issuing thread's
`cp.async.bulk.wait_group` (not `.read`, which only frees the shared source) retires its
group. The emulator writes at issue but marks the box's elements *pending* until that
wait (`issue_bulk` / `retire_bulk`, driven by `AsyncState.bulk_wait`); a load, cp.async,
TMA load, generic store or second TMA store of a pending element is an error (the async
proxy does not order two TMA stores to one address; the lowering's epilogue waits for the
earlier stores' writes before its first round). TMA reduce-adds in flight commute.

Kept cheap: the record exists only for tensors the kernel writes (made before the launch
runs, `machine.run_thread_kernel`, so reads before the first store are seen); a tensor only
read has none and its reads are not looked up. Per access, a few vectorized lookups.
Tracked: generic loads/stores, cp.async reads, TMA copies (the issuing lane), atomic adds
(as writes that commute). Not tracked: scalar loads (`offsets[e]`) of a written tensor.
Two arguments passed as the identical array (an in-place kernel) share one record.
"""
from __future__ import annotations

import numpy as np

from tegula.emulate.errors import EmulationError


class GlobalRaces:
    """Per element of one global tensor: its last tracked store — by which block (its
    `block_writer` key, -1: none), which thread, at which happens-before stamp, by which
    unit (block or cluster key) — the first unit that read it (-1: none) and whether a
    second unit did, and the TMA stores in flight on it (`pending`, made on first use)."""

    def __init__(self, size: int):
        self.block = np.full(size, -1, dtype=np.int64)
        self.tid = np.zeros(size, dtype=np.int32)
        self.stamp = np.zeros(size, dtype=np.int64)
        self.unit = np.full(size, -1, dtype=np.int64)
        self.reader = np.full(size, -1, dtype=np.int64)
        self.readers = np.zeros(size, dtype=bool)
        self.pending: np.ndarray | None = None
        # The storing block's tg.last_arrival count at the store (`emulate/arrivals.py`).
        self.epoch = np.zeros(size, dtype=np.int32)

    def _unordered(self, offs: np.ndarray, tids: np.ndarray, block: int, order) -> np.ndarray:
        """Mask over `offs`: last stored by another thread of `block`, not ordered before
        the access of thread `tids` (broadcast like `offs`)."""
        mine = self.block[offs] == block
        if not mine.any():
            return mine
        writer = self.tid[offs].astype(np.int64)
        other = mine & (writer != tids)
        if not other.any():
            return other
        seen = self.stamp[offs] <= order.known[tids, writer // 32]
        return other & ~seen

    def read(self, tensor, offs: np.ndarray, tids: np.ndarray, state, what: str) -> None:
        """Threads `tids` of `state`'s block read elements `offs` of `tensor`: raise on a
        read after write (in the block, or by another unit) or of a TMA store in flight;
        record the reading unit."""
        from tegula.emulate.arrivals import released_to
        from tegula.emulate.memory import block_writer
        block, unit = block_writer(state.bid, None), block_writer(state.bid, state.cluster)
        t = np.broadcast_to(tids, offs.shape)
        self._in_flight(tensor, offs, "reads", what)
        bad = self._unordered(offs, t, block, state.smem.order)
        if bad.any():
            i = int(np.flatnonzero(bad.ravel())[0])
            at, reader = int(offs.ravel()[i]), int(t.ravel()[i])
            raise EmulationError(
                f"{what}: global-memory race (read after write) on element {at} of tensor "
                f"{tensor.name!r}: thread {reader} reads it, thread {int(self.tid[at])} of "
                f"the same block stored it with no barrier in between (on the GPU the read "
                f"may see the value before or after the store)")
        stored = self.unit[offs]
        other = (stored >= 0) & (stored != unit)
        if other.any():  # unless an arrival (tg.last_arrival) ordered the store before
            other &= ~released_to(state, stored, self.epoch[offs])
        if other.any():
            at = int(offs[other].ravel()[0])
            raise EmulationError(
                f"{what}: race between blocks on element {at} of tensor {tensor.name!r}: "
                f"block {state.bid} reads it, block {_bid(int(self.block[at]))} stored it "
                f"in the same launch (blocks have no order: on the GPU the read may see "
                f"the value before or after the store); give each block its own output "
                f"elements, or split the work into two launches")
        first = self.reader[offs]
        self.readers[offs] |= (first >= 0) & (first != unit)
        self.reader[offs] = np.where(first >= 0, first, unit)

    def write(self, tensor, offs: np.ndarray, values: np.ndarray, tids: np.ndarray, state,
              what: str, commutes: bool = False, bulk: bool = False) -> None:
        """Threads `tids` store `values` (storage values, shaped like `offs`) to elements
        `offs` of `tensor` (`commutes`: atomic adds, not compared with other stores;
        `bulk`: a TMA store): raise on a write after write of a different value, a write
        after another unit's read that changes the value, or a generic store to an element
        a TMA store has in flight (a second TMA store too; reduce-adds commute); then record the
        stores (call before the tensor is written)."""
        from tegula.emulate.arrivals import release_epoch
        from tegula.emulate.memory import block_writer
        block, unit = block_writer(state.bid, None), block_writer(state.bid, state.cluster)
        t = np.broadcast_to(tids, offs.shape)
        if not (bulk and commutes):  # TMA reduce-adds in flight commute with each other
            self._in_flight(tensor, offs, "stores to", what)
        if not commutes:
            bad = self._unordered(offs, t, block, state.smem.order)
            self._differs(tensor, offs, values, bad, lambda at, new, old: (
                f"{what}: global-memory race (write after write) on element {at} of "
                f"tensor {tensor.name!r}: thread {int(t[offs == at].ravel()[0])} stores "
                f"{new!r}, thread {int(self.tid[at])} of the same block stored {old!r} with "
                f"no barrier in between (on the GPU either value may be left)"))
            stored = self.unit[offs]
            self._differs(tensor, offs, values, (stored >= 0) & (stored != unit),
                          lambda at, new, old: (
                f"{what}: race between blocks on element {at} of tensor {tensor.name!r}: "
                f"block {state.bid} stores {new!r}, block {_bid(int(self.block[at]))} stored "
                f"{old!r} in the same launch (on the GPU the element holds whichever block "
                f"ran last): the blocks' output tiles overlap; give each block its own "
                f"tiles (or tg.atomic_add to sum them)"))
        first = self.reader[offs]
        read = ((first >= 0) & (first != unit)) | self.readers[offs]
        self._differs(tensor, offs, values, read, lambda at, new, old: (
            f"{what}: race between blocks on element {at} of tensor {tensor.name!r}: block "
            f"{state.bid} {'adds to' if commutes else 'stores'} it, block "
            f"{_bid(int(self.reader[at]))} read it in the same launch (blocks have no order: "
            f"on the GPU that read may see the value before or after this store); an "
            f"output passed as an input is read by one block and written by another"),
            always=commutes)
        self.block[offs] = block
        self.tid[offs] = t
        self.stamp[offs] = state.smem.order.clock
        self.unit[offs] = unit
        self.epoch[offs] = release_epoch(state)

    @staticmethod
    def _differs(tensor, offs, values, bad: np.ndarray, message, always: bool = False) -> None:
        """Raise `message(at, new, old)` where `bad` elements get a value other than the one
        they hold (any `bad` element where `always`; packed tensors are not compared)."""
        if not bad.any() or (tensor.packed and not always):
            return
        if always:
            at = int(offs[bad].ravel()[0])
            raise EmulationError(message(at, "a value", "one"))
        old, new = tensor.load(offs[bad]), np.asarray(values)[bad]
        same = old == new
        if old.dtype.kind == "f":
            same |= np.isnan(old) & np.isnan(new)
        if not same.all():
            raise EmulationError(message(int(offs[bad][~same][0]), new[~same][0],
                                         old[~same][0]))

    def _in_flight(self, tensor, offs: np.ndarray, verb: str, what: str) -> None:
        if self.pending is not None and self.pending[offs].any():
            at = int(offs[self.pending[offs] > 0].ravel()[0])
            raise EmulationError(
                f"{what}: {verb} element {at} of tensor {tensor.name!r} while a TMA store to "
                f"it is in flight: the store is complete only after the issuing thread's "
                f"cp.async.bulk.wait_group (not .read) retires its group (and a barrier, "
                f"for the other threads)")

    def issue_bulk(self, offs: np.ndarray) -> None:
        """A TMA store (or bulk add) to `offs` is in flight until `retire_bulk`."""
        if self.pending is None:
            self.pending = np.zeros(self.block.size, dtype=np.int32)
        np.add.at(self.pending, offs.ravel(), 1)

    def retire_bulk(self, offs: np.ndarray) -> None:
        np.subtract.at(self.pending, offs.ravel(), 1)


def _bid(key: int) -> tuple[int, int, int]:
    """The block index of a `block_writer` key (no cluster)."""
    return key & ((1 << 31) - 1), (key >> 31) & 0xFFFF, key >> 47


def tracker(tensor) -> GlobalRaces:
    """`tensor`'s race record (made at its first tracked access)."""
    if tensor.races is None:
        tensor.races = GlobalRaces(tensor.size)
    return tensor.races


def box_offsets(tensor, dims, coords, box) -> tuple[np.ndarray, tuple]:
    """(element offsets of `tensor` inside a TMA box at `coords` of extents `box`, the
    matching slices of the box): both in tensor-map order (map dim d is tensor dim
    `dims[d]`), clipped to the tensor as the copy is; the offsets in numpy order of the
    box (its last axis map dim 0), the slices index an array of shape `reversed(box)`."""
    offs, inside = np.zeros((), dtype=np.int64), []
    for d in reversed(range(len(dims))):
        extent, stride = tensor.array.shape[dims[d]], tensor.strides[dims[d]]
        lo, hi = max(int(coords[d]), 0), min(int(coords[d]) + int(box[d]), extent)
        hi = max(hi, lo)
        offs = offs[..., None] + np.arange(lo, hi, dtype=np.int64) * stride
        inside.append(slice(lo - int(coords[d]), hi - int(coords[d])))
    return offs, tuple(inside)


def check_box(state, tensor, tm, coords, lane: int, what: str, values=None) -> None:
    """A TMA copy issued by `lane` reads (`values` None) or stores `values` (storage
    values, shape `reversed(box)`) the box of tensor map `tm` at `coords`: the block's
    global race checks (`GlobalRaces`), where race checking is on."""
    if not state.smem.check_races or tensor.packed:
        return
    offs, inside = box_offsets(tensor, tm.dims, coords, tm.box)
    if not offs.size:
        return
    if values is None:
        if tensor.races is not None:   # never stored to: nothing to read after
            tensor.races.read(tensor, offs, np.int64(lane), state, what)
    else:
        tracker(tensor).write(tensor, offs, values[inside], np.int64(lane), state, what,
                              bulk=True)


def issue_tma_store(state, tensor, tm, coords, lane: int) -> None:
    """A TMA store (or bulk add) issued by `lane` to the box of `tm` at `coords`: its
    elements are in flight until the lane's bulk wait retires the group
    (`AsyncState.bulk_wait`), where race checking is on."""
    if not state.smem.check_races or tensor.packed:
        return
    offs, _ = box_offsets(tensor, tm.dims, coords, tm.box)
    if offs.size:
        record = tracker(tensor)
        record.issue_bulk(offs)
        state.asyncs.bulk_global_issued(lane, record, offs)


__all__ = ["GlobalRaces", "tracker", "box_offsets", "check_box", "issue_tma_store"]
