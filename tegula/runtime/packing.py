"""Kernel parameter values in host memory, laid out once and rewritten in place per launch.

`cuLaunchKernel` takes the parameters as a `void*[]`: one pointer per parameter, to bytes
the driver copies during the call. Where those bytes sit on the host is ours to choose;
the kernel's own parameter layout is the driver's business. So a `ParamBuffer` is one
preallocated ctypes buffer plus the fixed `void*[]` into it, and it may order the values
however packing is cheapest: a prepared launch puts the values that change between its
launches (data pointers, scalars, tensor maps) first and packs only that prefix, the
extents and strides written once.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import Sequence

from tegula.codegen.params import ParamSpec

#: Host alignment of the buffer's start: a tensor map's 128 bytes are read from a 64-byte
#: aligned address (CUtensorMap is declared alignas(64)); every other value needs less.
BUFFER_ALIGN = 64


def param_layout(params: list[ParamSpec]) -> tuple[struct.Struct, list[int]]:
    """The packed byte layout of the parameter values: a Struct and each value's offset
    (every value aligned to its `alignment` — its own size, 64 bytes for a tensor map — as
    the kernel's parameter space lays them out)."""
    fmt, offsets, offset = "<", [], 0
    for p in params:
        pad = (-offset) % p.alignment
        fmt += "x" * pad
        offset += pad
        offsets.append(offset)
        fmt += p.fmt
        offset += p.size
    return struct.Struct(fmt), offsets


class ParamBuffer:
    """One set of parameter values as the driver reads them.

    `order` lists the `specs` slots in buffer order (default: `param_list` order); the
    first `dynamic` of them form the prefix `pack_prefix` rewrites. `address` is the
    `void**` to hand the driver (parameter i's pointer is `pointers[i]`, in `param_list`
    order whatever the buffer order). `lock` guards pack-then-launch: the driver copies
    the values during the launch call, so the buffer is free again when it returns."""

    def __init__(self, specs: Sequence[ParamSpec], order: Sequence[int] | None = None,
                 dynamic: int = 0):
        order = list(range(len(specs))) if order is None else list(order)
        in_order = [specs[s] for s in order]
        self.struct, offsets = param_layout(in_order)
        self.offsets = offsets  # each value's byte offset from `start`, in buffer order
        self.prefix = param_layout(in_order[:dynamic])[0]  # same offsets: a prefix
        self.buffer = ctypes.create_string_buffer(max(1, self.struct.size) + BUFFER_ALIGN)
        self.start = -ctypes.addressof(self.buffer) % BUFFER_ALIGN
        base = ctypes.addressof(self.buffer) + self.start
        addresses = [0] * len(specs)
        for position, slot in enumerate(order):
            addresses[slot] = base + offsets[position]
        self.pointers = (ctypes.c_void_p * max(1, len(specs)))(*addresses)
        self.address = ctypes.c_void_p(ctypes.addressof(self.pointers))
        self.address_value = ctypes.addressof(self.pointers)  # the same, as an int
        self.lock = threading.Lock()

    def pack(self, values: Sequence) -> None:
        """Write every value (in buffer order)."""
        self.struct.pack_into(self.buffer, self.start, *values)

    def pack_prefix(self, values: Sequence) -> None:
        """Write the first `dynamic` values (in buffer order)."""
        self.prefix.pack_into(self.buffer, self.start, *values)

    def value_bytes(self, slot: int, size: int) -> bytes:
        """The bytes parameter `slot` (param_list order) currently holds (for tests)."""
        return ctypes.string_at(self.pointers[slot], size)
