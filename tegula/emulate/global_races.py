"""Races on global memory between the threads of one block.

The shared-memory race model (`memory.SharedMemory`, `order.HappensBefore`) orders the
accesses of a block's threads by its barriers, named barriers and mbarriers. Global memory
has the same hazards within a block: two warps storing one element, or a thread reading
an element another thread stored, with nothing ordering them (ping-pong consumer
warpgroups whose tile map sends two iterations to one tile, or whose iteration reads what
the other's wrote). On the GPU the result is whichever access lands first; the emulator,
running one warp after another, would silently pick one order. This module reports them
with the same happens-before clocks, at element granularity:

* **write after write**: an element last stored by another thread of the same block, that
  store not ordered before this one, and the values differ (the same value stored twice,
  a replicated row, is harmless);
* **read after write**: an element last stored by another thread of the same block, that
  store not ordered before this read (a thread's own stores are always ordered).

Kept cheap: per stored-to tensor three arrays over its elements (allocated at its first
tracked store; a tensor only read has none and its reads are not looked up), one
vectorized lookup per access. Only generic loads/stores, cp.async reads and
TMA copies (the issuing lane) are tracked; atomics commute and are not. Accesses of
*different* blocks are `GlobalTensor._check_overlap`'s (blocks have no order at all).
"""
from __future__ import annotations

import numpy as np

from tegula.emulate.errors import EmulationError


class GlobalRaces:
    """The last tracked store of each element of one global tensor: by which block (its
    `block_writer` key, -1: none), which thread, at which happens-before stamp."""

    def __init__(self, size: int):
        self.block = np.full(size, -1, dtype=np.int64)
        self.tid = np.zeros(size, dtype=np.int32)
        self.stamp = np.zeros(size, dtype=np.int64)

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

    def read(self, tensor, offs: np.ndarray, tids: np.ndarray, block: int, order,
             what: str) -> None:
        """Threads `tids` read elements `offs` of `tensor`: raise on a read after write."""
        t = np.broadcast_to(tids, offs.shape)
        bad = self._unordered(offs, t, block, order)
        if bad.any():
            i = int(np.flatnonzero(bad.ravel())[0])
            at, reader = int(offs.ravel()[i]), int(t.ravel()[i])
            raise EmulationError(
                f"{what}: global-memory race (read after write) on element {at} of tensor "
                f"{tensor.name!r}: thread {reader} reads it, thread {int(self.tid[at])} of "
                f"the same block stored it with no barrier in between (on the GPU the read "
                f"may see the value before or after the store)")

    def write(self, tensor, offs: np.ndarray, values: np.ndarray, tids: np.ndarray,
              block: int, order, what: str) -> None:
        """Threads `tids` store `values` (storage values, shaped like `offs`) to elements
        `offs` of `tensor`: raise on a write after write of a different value, then record
        the stores (call before the tensor is written)."""
        t = np.broadcast_to(tids, offs.shape)
        bad = self._unordered(offs, t, block, order)
        if bad.any() and not tensor.packed:
            old, new = tensor.load(offs[bad]), np.asarray(values)[bad]
            same = old == new
            if old.dtype.kind == "f":
                same |= np.isnan(old) & np.isnan(new)
            if not same.all():
                at = int(offs[bad][~same][0])
                writer = int(t[bad][~same][0])
                raise EmulationError(
                    f"{what}: global-memory race (write after write) on element {at} of "
                    f"tensor {tensor.name!r}: thread {writer} stores {new[~same][0]!r}, thread "
                    f"{int(self.tid[at])} of the same block stored {old[~same][0]!r} with no "
                    f"barrier in between (on the GPU either value may be left)")
        self.block[offs] = block
        self.tid[offs] = t
        self.stamp[offs] = order.clock


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
    from tegula.emulate.memory import block_writer
    offs, inside = box_offsets(tensor, tm.dims, coords, tm.box)
    if not offs.size:
        return
    block, order = block_writer(state.bid, None), state.smem.order
    if values is None:
        if tensor.races is not None:   # never stored to: nothing to read after
            tensor.races.read(tensor, offs, np.int64(lane), block, order, what)
    else:
        tracker(tensor).write(tensor, offs, values[inside], np.int64(lane), block, order,
                              what)


__all__ = ["GlobalRaces", "tracker", "box_offsets", "check_box"]
