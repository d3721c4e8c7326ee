"""TMA tensor maps (`CUtensorMap`): checked in Python, encoded by the driver, cached.

A Hopper kernel that copies tiles with TMA (`async_ir.TmaLoad` / `TmaStore`) takes one
128-byte `CUtensorMap` per mapped tensor as a `const __grid_constant__` parameter. The map
describes the global tensor (base address, extents, byte strides) and the box one copy
moves (extents in elements, shared-memory swizzle). The user passes the tensor; the
runtime derives the map from it at launch (`async_ir.TensorMapParam` says which tensor,
which dimension order, which box and swizzle).

`cuTensorMapEncodeTiled` rejects what the hardware cannot do with a bare
`CUDA_ERROR_INVALID_VALUE`. `tensor_map_fields` checks every such rule first, in pure
Python, and says which tensor broke which rule and how to fix it. `encode_tensor_map` then
calls the driver with: dims innermost first, global strides in bytes for dims 1.., element
strides 1, no interleave, the swizzle mode of the box, L2 promotion 128 B, and
out-of-bounds elements filled with zeros (`OOB_FILL_NONE` means "no NaN request": zeros).

Encoding costs microseconds, so a launch does not encode again what it encoded before:
`TensorMapCache` keeps the 128 bytes per (pointer, dtype, shape, strides, dims, box,
swizzle), bounded so a program streaming through fresh allocations does not grow it.
"""
from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from typing import Callable, Sequence

from tegula.dtypes import DType
from tegula.errors import LaunchError

#: Size of a `CUtensorMap` and the alignment the driver and the parameter space need.
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64

#: The hardware's limits (CUDA driver API, cuTensorMapEncodeTiled).
MAX_RANK = 5
MAX_BOX = 256
MAX_EXTENT = 2**32
MAX_STRIDE_BYTES = 2**40
SWIZZLES = (0, 32, 64, 128)

#: tegula dtype -> CUtensorMapDataType member. TMA only moves bytes (out-of-bounds fill is
#: all-zero bits, which is 0 in every type), so one-byte types travel as UINT8.
_DATA_TYPES = {
    "f16": "FLOAT16", "bf16": "BFLOAT16", "f32": "FLOAT32", "i32": "INT32",
    "i8": "UINT8", "u8": "UINT8", "f8e4m3": "UINT8", "f8e5m2": "UINT8", "bool": "UINT8",
}


def tensor_map_fields(name: str, ptr: int, dtype: DType, shape: Sequence[int],
                      strides: Sequence[int], dims: Sequence[int], box: Sequence[int],
                      swizzle: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Check a tensor map against the hardware's rules; return (global extents, global byte
    strides of dims 1..), both in tensor-map order (innermost first).

    `shape`/`strides` are the tensor's own (strides in elements), `dims` the tensor-map
    order (dims[0] the contiguous dimension), `box` the box extents per tensor-map dim.
    Raises `LaunchError` naming `name` for anything the driver would refuse."""
    what = f"TMA tensor map of {name!r} (shape {tuple(shape)}, strides {tuple(strides)})"
    if dtype.name not in _DATA_TYPES:
        raise LaunchError(f"{what}: TMA cannot copy {dtype} elements; supported: "
                          f"{', '.join(sorted(_DATA_TYPES))}")
    rank = len(dims)
    if not 1 <= rank <= MAX_RANK:
        raise LaunchError(f"{what}: a tensor map has 1 to {MAX_RANK} dimensions, got {rank}")
    if sorted(dims) != list(range(len(shape))):
        raise LaunchError(f"{what}: dims {tuple(dims)} must order all {len(shape)} "
                          f"dimensions of the tensor")
    if len(box) != rank:
        raise LaunchError(f"{what}: box {tuple(box)} needs one extent per dimension ({rank})")
    if swizzle not in SWIZZLES:
        raise LaunchError(f"{what}: swizzle must be one of {SWIZZLES} bytes, got {swizzle}")
    if ptr % 16:
        raise LaunchError(f"{what}: data pointer 0x{ptr:x} is not 16-byte aligned, which TMA "
                          f"needs; pass a tensor that starts on a 16-byte boundary")
    esize = dtype.bits // 8
    extents = tuple(int(shape[d]) for d in dims)
    for e in extents:
        if not 1 <= e <= MAX_EXTENT:
            raise LaunchError(f"{what}: every extent must be 1 to 2^32 for TMA")
    inner = dims[0]
    if extents[0] > 1 and strides[inner] != 1:
        raise LaunchError(f"{what}: dimension {inner} must have stride 1 (TMA reads it "
                          f"contiguously); pass .contiguous()")
    byte_strides, span = [], extents[0] * esize
    for d, e in zip(dims[1:], extents[1:]):
        if e == 1:
            # One index: the stride is never multiplied by anything but 0, so any legal
            # value describes the same tensor (torch leaves odd strides on size-1 dims).
            stride = -(-span // 16) * 16
        else:
            stride = int(strides[d]) * esize
            if stride <= 0:
                raise LaunchError(f"{what}: dimension {d} has stride {strides[d]}; TMA needs "
                                  f"positive strides (no broadcast or flipped views); pass "
                                  f".contiguous()")
            if stride % 16:
                raise LaunchError(f"{what}: dimension {d} is {stride} bytes apart, not a "
                                  f"multiple of 16 as TMA needs; pad the inner dimension "
                                  f"or pass a copy")
            if stride >= MAX_STRIDE_BYTES:
                raise LaunchError(f"{what}: dimension {d}'s stride of {stride} bytes "
                                  f"exceeds TMA's 2^40")
        byte_strides.append(stride)
        span = max(span, stride * e)
    for b in box:
        if not 1 <= b <= MAX_BOX:
            raise LaunchError(f"{what}: box {tuple(box)}: every box extent must be 1 to "
                              f"{MAX_BOX} elements")
    inner_bytes = box[0] * esize
    if inner_bytes % 16:
        raise LaunchError(f"{what}: box {tuple(box)}: the inner box extent is {inner_bytes} "
                          f"bytes, TMA needs a multiple of 16")
    if swizzle and inner_bytes > swizzle:
        raise LaunchError(f"{what}: box {tuple(box)}: the inner box extent of {inner_bytes} "
                          f"bytes exceeds the {swizzle}-byte swizzle span")
    return extents, tuple(byte_strides)


def encode_tensor_map(ptr: int, dtype: DType, shape: Sequence[int], strides: Sequence[int],
                      dims: Sequence[int], box: Sequence[int], swizzle: int,
                      name: str = "tensor") -> bytes:
    """The 128 bytes of the `CUtensorMap` for a tensor (checked, then encoded by the driver
    with `cuTensorMapEncodeTiled`; see the module docstring for the fixed choices)."""
    extents, byte_strides = tensor_map_fields(name, ptr, dtype, shape, strides, dims, box,
                                              swizzle)
    return driver_encode(ptr, dtype, extents, byte_strides, box, swizzle, name)


def driver_encode(ptr: int, dtype: DType, extents: Sequence[int], byte_strides: Sequence[int],
                  box: Sequence[int], swizzle: int, name: str = "tensor") -> bytes:
    """`cuTensorMapEncodeTiled` on fields in tensor-map order, unchecked (tests compare the
    driver's verdicts with `tensor_map_fields`'); its 128 bytes."""
    from tegula.runtime.driver import check, cuda_driver
    driver = cuda_driver()
    data_type = getattr(driver.CUtensorMapDataType,
                        f"CU_TENSOR_MAP_DATA_TYPE_{_DATA_TYPES[dtype.name]}")
    swizzle_mode = getattr(driver.CUtensorMapSwizzle,
                           "CU_TENSOR_MAP_SWIZZLE_NONE" if swizzle == 0
                           else f"CU_TENSOR_MAP_SWIZZLE_{swizzle}B")
    tensor_map = check(driver.cuTensorMapEncodeTiled(
        # The bindings take the driver's sized integer types, not Python ints (a bare int
        # is "Cannot convert int to cuuint32_t" at run time; found on the H100).
        data_type, driver.cuuint32_t(len(extents)), ptr,
        [driver.cuuint64_t(int(e)) for e in extents],
        # A rank-1 map has no strides, but the bindings pass an empty list as a null
        # pointer, which the driver refuses (INVALID_VALUE, measured on an H100): give it
        # one stride it does not read.
        [driver.cuuint64_t(int(s)) for s in (list(byte_strides) or [16])],
        [driver.cuuint32_t(int(b)) for b in box],
        [driver.cuuint32_t(1) for _ in extents],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_mode,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled({name}, extents {tuple(extents)}, box {tuple(box)}, "
        f"swizzle {swizzle})")
    return ctypes.string_at(tensor_map.getPtr(), TENSOR_MAP_BYTES)


class TensorMapCache:
    """Encoded maps by (pointer, dtype, shape, strides, dims, box, swizzle), the oldest
    dropped beyond `capacity` (a hit does no bookkeeping: it is on every launch). A map depends on nothing else, so a hit is exact (an
    allocation freed and made again at the same address with the same shape gets the same,
    still correct, map). `encode` is `encode_tensor_map` (replaceable in tests)."""

    def __init__(self, capacity: int = 1024, encode: Callable[..., bytes] = encode_tensor_map):
        self.capacity = capacity
        self.encode = encode
        self._maps: OrderedDict[tuple, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._maps)

    def get(self, ptr: int, dtype: DType, shape: tuple, strides: tuple, dims: tuple,
            box: tuple, swizzle: int, name: str = "tensor") -> bytes:
        key = (ptr, dtype.name, shape, strides, dims, box, swizzle)
        found = self._maps.get(key)
        if found is not None:
            return found
        encoded = self.encode(ptr, dtype, shape, strides, dims, box, swizzle, name=name)
        with self._lock:
            self._maps[key] = encoded
            if len(self._maps) > self.capacity:
                self._maps.popitem(last=False)
        return encoded

    def clear(self) -> None:
        with self._lock:
            self._maps.clear()


#: The process's cache, used by every launch.
TENSOR_MAPS = TensorMapCache()
