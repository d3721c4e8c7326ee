"""State shared by the lowering of every op of one kernel.

Holds the register array of each register tile, the shared buffer of each allocation,
scratch buffers and temporary registers that ops ask for, the per-thread coordinate bases
(`ThreadCoords`), and the facts the kernel was specialized on. Every name it hands out is
unique within the kernel.
"""
from __future__ import annotations

import numpy as np

from tegula.dtypes import DType
from tegula.ir.values import RegisterTile, SharedAlloc
from tegula.lower.addressing import ThreadCoords
from tegula.lower.thread_ir import Const, Reg, RegArray, SharedBuffer

SHARED_ALIGN = 128
MBARRIER_BYTES = 8


class LoweringContext:
    def __init__(self, threads: int, facts: dict, shared_offsets: dict, shared_end: int):
        self.threads = threads
        self.facts = facts
        self.coords = ThreadCoords()
        self.registers: list[RegArray] = []
        self.shared: list[SharedBuffer] = []
        self._tile_regs: dict[int, RegArray] = {}
        self._alloc_buffers: dict[int, SharedBuffer] = {}
        self._shared_offsets = shared_offsets
        self._shared_end = shared_end
        self._names: set[str] = set()
        # The asynchronous (sm_90a) path: mbarrier arrays, the tensor maps TMA copies read
        # (keyed by tensor, dims, box, swizzle), and statements that run once at kernel
        # start (mbarrier inits), before the body.
        self.mbarriers: list = []
        self.tensor_maps: dict = {}
        self.setup: list = []
        # A warp-specialized pipeline's producer role (`lower/hopper.py: WarpRoles`), set
        # when its loop is lowered; the kernel body then splits into Roles around it.
        self.warp_roles = None
        # alloc id -> the stage its wgmma descriptors read, where a TMA ring running across
        # enclosing loops decides it (`lower/pipeline.py: Ring.slot`) rather than `k % S`.
        self.ring_slots: dict = {}

    def unique(self, base: str) -> str:
        """`base`, or `base_2`, `base_3`, … — the first name not yet handed out."""
        name, n = _c_identifier(base), 1
        while name in self._names:
            n += 1
            name = f"{_c_identifier(base)}_{n}"
        self._names.add(name)
        return name

    def regs_of(self, tile: RegisterTile) -> RegArray:
        """The register array holding `tile` (size = values per thread of its layout)."""
        array = self._tile_regs.get(tile.id)
        if array is None:
            array = RegArray(self.unique(tile.name), tile.dtype, tile.layout[1].size)
            self._tile_regs[tile.id] = array
            self.registers.append(array)
        return array

    def temp_regs(self, base: str, dtype: DType, size: int) -> RegArray:
        array = RegArray(self.unique(base), dtype, size)
        self.registers.append(array)
        return array

    def buffer_of(self, alloc: SharedAlloc) -> SharedBuffer:
        buffer = self._alloc_buffers.get(alloc.id)
        if buffer is None:
            size = int(np.prod(alloc.shape)) * alloc.stages
            buffer = SharedBuffer(self.unique(f"smem_{alloc.name}"), alloc.dtype, size,
                                  self._shared_offsets[alloc.id])
            self._alloc_buffers[alloc.id] = buffer
            self.shared.append(buffer)
        return buffer

    def scratch(self, base: str, dtype: DType, size: int) -> SharedBuffer:
        """A shared buffer of `size` elements after all others (for reductions and
        conversions); each call gets its own region."""
        offset = -(-self._shared_end // SHARED_ALIGN) * SHARED_ALIGN
        buffer = SharedBuffer(self.unique(base), dtype, size, offset)
        self._shared_end = offset + int(size * dtype.bits // 8)
        self.shared.append(buffer)
        return buffer


    def mbarrier_array(self, base: str, count: int):
        """`count` mbarriers (8 bytes each, 8-byte aligned) after all other shared memory."""
        from tegula.lower.async_ir import MBarrierArray
        offset = -(-self._shared_end // MBARRIER_BYTES) * MBARRIER_BYTES
        array = MBarrierArray(self.unique(base), count, offset)
        self._shared_end = array.end
        self.mbarriers.append(array)
        return array


def reg(array: RegArray, index: int) -> Reg:
    return Reg(array, Const(int(index)))


def _c_identifier(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"t_{cleaned}"
