"""Shared-memory matrix addressing on Hopper: swizzle modes, wgmma matrix descriptors, and
the canonical operand buffer — ONE definition read by TMA (`tegula.arch.tma`, where a box
lands), by wgmma (`tegula.arch.wgmma`, which element a descriptor reads), by the emulator
and by synthesis (which buffer layout and descriptor fields to choose).

Swizzle modes (PTX ISA "Tensor-map swizzle modes", "Shared Memory Matrix Layout"; CuTe
`Swizzle<B,4,3>` on byte addresses). The pattern works on *absolute* shared-memory byte
addresses, 16-byte chunks (address bits [4, 7)) XORed with 128-byte line numbers
(bits [7, 10)):

    swizzle   XOR                              repeats every   CuTe
    128 B     bits [4,7) ^= bits [7,10)        1024 bytes      Swizzle<3,4,3>
     64 B     bits [4,6) ^= bits [7,9)          512 bytes      Swizzle<2,4,3>
     32 B     bit  4     ^= bit  7              256 bytes      Swizzle<1,4,3>
      0       none ("interleave")               16 bytes

A buffer written by TMA and read by wgmma must start on that repeat boundary ("swizzle
atom"), so that both see row r of the box at line phase r.

wgmma matrix descriptor (PTX ISA "Matrix Descriptor Format", sm_90a; CUTLASS
`GmmaDescriptor`), a 64-bit value:

    bits  0-13  start address >> 4          bits 32-45  stride byte offset (SBO) >> 4
    bits 16-29  leading byte offset (LBO) >> 4   bits 49-51  base offset
    bits 62-63  layout: 0 = interleave (no swizzle), 1 = 128 B, 2 = 64 B, 3 = 32 B

K-major operands (every wgmma type allows them). The operand is `rows` (M of A, or N of
B) x K elements; "core matrices" are 8 rows x 16 bytes. For row r and byte
kb = k * element_bytes of a row, the address *before* the swizzle is

    interleave:  start + (r // 8) * SBO + (r % 8) * 16 + (kb // 16) * LBO + kb % 16
    swizzle S:   start + (r // 8) * SBO + (r % 8) * S  + kb          (kb < S; LBO unused)

MN-major operands (imm-trans 1, 16-bit types; CUTLASS `make_gmma_desc<Major::MN>`'s
canonical forms): MN is contiguous, span = max(S, 16) bytes of MN per K row,

    interleave:  start + (r // 8) * SBO + (r % 8) * eb + (k % 8) * 16 + (k // 8) * LBO
    swizzle S:   start + (r // W) * LBO + (r % W) * eb + (k % 8) * S  + (k // 8) * SBO
                 (W = S / eb elements of MN per span)

(LBO and SBO swap roles between the two, as CUTLASS's descriptor builder does.)

and the hardware reads `swizzle_bytes_address(that, S)`. Successive k-steps inside one
swizzle atom advance `start` by their byte offset (CUTLASS's practice: +32 bytes per k16 step
of 16-bit operands); with the XOR on absolute addresses this reads exactly what TMA wrote.
A start address whose line bits (bits [7, 7 + log2(S/16))) are not zero would need the
descriptor's base offset, which is not modelled: it is refused with a TegulaError.

The canonical buffer (`canonical_smem_layout`): the operand tile stored as blocks of
W = max(S, 16) / element_bytes elements of its contiguous dimension (K, or MN when
MN-major); inside a block, line i of the other dimension at i * W elements (a swizzle
span, or 16 bytes, per line); blocks follow each other every rows * W (K-major) or k * W
(MN-major) elements. It is what TMA writes with a box of (W, rows) — (W, k) MN-major —
elements per block, and what wgmma reads through `operand_descriptor`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tegula.dtypes import DType
from tegula.errors import TegulaError
from tegula.layout import Layout
from tegula.layout.swizzle import ComposedLayout, Swizzle, make_swizzled_layout

#: Swizzle modes in bytes (0 = none).
SWIZZLE_MODES = (0, 32, 64, 128)

#: Descriptor layout-type field per swizzle mode (bits 62-63).
_LAYOUT_TYPE = {0: 0, 128: 1, 64: 2, 32: 3}
_SWIZZLE_OF_TYPE = {v: k for k, v in _LAYOUT_TYPE.items()}
#: XORed bits per swizzle mode.
_SWIZZLE_BITS = {0: 0, 32: 1, 64: 2, 128: 3}

#: Largest byte value a 14-bit ">> 4" descriptor field holds.
_FIELD_LIMIT = 1 << 18


def _check_swizzle(swizzle: int, what: str) -> int:
    if swizzle not in _SWIZZLE_BITS:
        raise TegulaError(f"{what}: swizzle must be one of {SWIZZLE_MODES} bytes, "
                          f"not {swizzle!r}")
    return _SWIZZLE_BITS[swizzle]


def swizzle_bytes_address(byte_addr, swizzle: int):
    """The address the hardware uses for shared byte address `byte_addr` (an int or an int
    numpy array) under swizzle mode `swizzle` (0, 32, 64, 128 bytes)."""
    bits = _check_swizzle(swizzle, "swizzle_bytes_address")
    if bits == 0:
        return byte_addr
    mask = (1 << bits) - 1
    return byte_addr ^ (((byte_addr >> 7) & mask) << 4)


def byte_swizzle(swizzle: int) -> Swizzle:
    """The mode as a CuTe swizzle on byte offsets (`Swizzle<bits, 4, 3>`)."""
    return Swizzle(_check_swizzle(swizzle, "byte_swizzle"), 4, 3)


def element_swizzle(swizzle: int, dtype: DType) -> Swizzle:
    """The mode as a CuTe swizzle on *element* offsets of `dtype` (16-bit: Swizzle<3,3,3>
    for 128 B), valid for buffers that start on a swizzle atom."""
    shift = {8: 0, 16: 1, 32: 2}.get(dtype.bits)
    if shift is None:
        raise TegulaError(f"swizzled shared buffers hold 8-, 16- or 32-bit elements, not {dtype}")
    return Swizzle(_check_swizzle(swizzle, "element_swizzle"), 4 - shift, 3)


def swizzle_atom_bytes(swizzle: int) -> int:
    """Bytes after which the swizzle pattern repeats: the alignment a swizzled buffer needs
    (1024 for 128 B, 512 for 64 B, 256 for 32 B; 16 without swizzle)."""
    bits = _check_swizzle(swizzle, "swizzle_atom_bytes")
    return 128 << bits if bits else 16


# --------------------------------------------------------------------------------------
# Descriptors
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatrixDescriptor:
    """The fields of a wgmma shared-memory matrix descriptor, in bytes (see module doc)."""

    start_address: int
    leading_bytes: int
    stride_bytes: int
    swizzle: int
    base_offset: int = 0

    def encode(self) -> int:
        """The 64-bit descriptor value."""
        return encode_descriptor(self.start_address, self.leading_bytes, self.stride_bytes,
                                 self.swizzle, self.base_offset)


def _field(name: str, byte_value: int) -> int:
    if byte_value % 16 or not 0 <= byte_value < _FIELD_LIMIT:
        raise TegulaError(f"wgmma descriptor: {name} {byte_value} must be a multiple of 16 "
                          f"in [0, {_FIELD_LIMIT}) (stored >> 4 in 14 bits)")
    return byte_value >> 4


def encode_descriptor(start_address: int, leading_bytes: int, stride_bytes: int,
                      swizzle: int, base_offset: int = 0) -> int:
    """The 64-bit wgmma descriptor for these byte fields (start: a shared-window address)."""
    _check_swizzle(swizzle, "wgmma descriptor")
    if not 0 <= base_offset < 8:
        raise TegulaError(f"wgmma descriptor: base offset {base_offset} must be in 0..7")
    return (_field("start address", start_address)
            | _field("leading byte offset", leading_bytes) << 16
            | _field("stride byte offset", stride_bytes) << 32
            | base_offset << 49
            | _LAYOUT_TYPE[swizzle] << 62)


def decode_descriptor(value: int) -> MatrixDescriptor:
    """The fields of a 64-bit descriptor value (inverse of `encode_descriptor`)."""
    value = int(value)
    if not 0 <= value < 1 << 64:
        raise TegulaError(f"wgmma descriptor {value:#x} is not a 64-bit value")
    mask = (1 << 14) - 1
    return MatrixDescriptor(start_address=(value & mask) << 4,
                            leading_bytes=((value >> 16) & mask) << 4,
                            stride_bytes=((value >> 32) & mask) << 4,
                            swizzle=_SWIZZLE_OF_TYPE[(value >> 62) & 3],
                            base_offset=(value >> 49) & 7)


def descriptor_element_addresses(desc: MatrixDescriptor | int, rows: int, k: int,
                                 dtype: DType, k_major: bool = True) -> np.ndarray:
    """Byte address wgmma reads for element (row, k) of an operand of `rows` x `k` elements
    of `dtype` described by `desc` (fields or the 64-bit value): an int64 array (rows, k).
    `k_major` False: the operand is MN-major (imm-trans 1; 16-bit types only).

    `rows` is a multiple of 8 (M = 64 for A, N for B). K-major: `k * element_bytes` a
    multiple of 16 and, with a swizzle, at most the swizzle span (one wgmma reads 32 bytes
    of K). MN-major: `k` a multiple of 8."""
    if not isinstance(desc, MatrixDescriptor):
        desc = decode_descriptor(desc)
    if desc.base_offset:
        raise TegulaError(f"wgmma descriptor: base offset {desc.base_offset} is not modelled; "
                          "start swizzled operands on a swizzle atom (base offset 0)")
    eb = dtype.bits // 8
    if k_major:
        shape_ok = dtype.bits % 8 == 0 and (k * eb) % 16 == 0
        rule = "rows a multiple of 8 and a K row a multiple of 16 bytes"
    else:
        shape_ok = dtype.bits == 16 and k % 8 == 0
        rule = "16-bit elements, rows and K multiples of 8 (MN-major)"
    if not shape_ok or rows <= 0 or rows % 8 or k <= 0:
        raise TegulaError(f"wgmma operand of {rows} x {k} {dtype}: needs {rule}")
    swz = desc.swizzle
    if k_major and swz and k * eb > swz:
        raise TegulaError(f"wgmma operand: {k * eb} bytes of K exceed the {swz}-byte swizzle span "
                          "of its descriptor")
    line_bits = _SWIZZLE_BITS[swz]
    if line_bits and (desc.start_address >> 7) & ((1 << line_bits) - 1):
        raise TegulaError(f"wgmma descriptor: start address {desc.start_address:#x} is not in the "
                          f"first 128-byte line of a {swizzle_atom_bytes(swz)}-byte swizzle atom "
                          "(that needs the base offset, not modelled)")
    r = np.arange(rows, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    if k_major:  # rows of core matrices along MN; K contiguous
        kb = kk * eb
        addr = desc.start_address + (r // 8) * desc.stride_bytes
        if swz:
            addr = addr + (r % 8) * swz + kb
        else:
            addr = addr + (r % 8) * 16 + (kb // 16) * desc.leading_bytes + kb % 16
    else:  # MN contiguous: a span (or 16 bytes) of MN per K row, K rows 8 to a group
        span = max(swz, 16) // eb
        row_bytes = max(swz, 16)
        mn_block = desc.leading_bytes if swz else desc.stride_bytes
        k_group = desc.stride_bytes if swz else desc.leading_bytes
        addr = (desc.start_address + (r // span) * mn_block + (r % span) * eb
                + (kk % 8) * row_bytes + (kk // 8) * k_group)
    return swizzle_bytes_address(addr, swz)


# --------------------------------------------------------------------------------------
# The canonical operand buffer
# --------------------------------------------------------------------------------------


def _block_elems(dtype: DType, swizzle: int) -> int:
    """W: elements per block along the contiguous dimension (K for K-major, MN for
    MN-major): a swizzle span, or 16 bytes."""
    _check_swizzle(swizzle, "canonical shared layout")
    return max(swizzle, 16) * 8 // dtype.bits


def _check_canonical(rows: int, k: int, dtype: DType, swizzle: int, k_major: bool) -> int:
    w = _block_elems(dtype, swizzle)
    if k_major and (rows <= 0 or rows % 8 or k <= 0 or k % w):
        raise TegulaError(f"canonical wgmma buffer of {rows} x {k} {dtype} with {swizzle}-byte "
                          f"swizzle: rows must be a multiple of 8 and K a multiple of {w}")
    if not k_major and (dtype.bits != 16 or rows <= 0 or rows % w or k <= 0 or k % 8):
        raise TegulaError(f"canonical MN-major wgmma buffer of {rows} x {k} {dtype} with "
                          f"{swizzle}-byte swizzle: 16-bit elements, rows a multiple of {w} "
                          "and K a multiple of 8")
    return w


def canonical_smem_layout(rows: int, k: int, dtype: DType, swizzle: int,
                          k_major: bool = True) -> ComposedLayout | Layout:
    """The buffer holding a `rows` x `k` operand as TMA writes it and wgmma reads it:
    (row, k) -> element offset (colexicographic domain (rows, k)), composed with the
    swizzle on element offsets. Valid for a buffer starting on a swizzle atom.
    K-major: blocks of W K-elements, row r at r*W inside one, blocks rows*W apart.
    MN-major: blocks of W MN-elements, K row kk at kk*W inside one, blocks k*W apart."""
    w = _check_canonical(rows, k, dtype, swizzle, k_major)
    if k_major:
        plain = Layout((rows, (w, k // w)), (w, (1, rows * w)))
    else:
        plain = Layout(((w, rows // w), k), ((1, k * w), w))
    if not swizzle:
        return plain
    return make_swizzled_layout(element_swizzle(swizzle, dtype), plain)


def canonical_byte_addresses(rows: int, k: int, dtype: DType, swizzle: int,
                             base: int, k_major: bool = True) -> np.ndarray:
    """Byte address of every (row, k) of the canonical buffer at byte address `base` (which
    must be swizzle-atom aligned): int64 (rows, k). The same addresses as
    `canonical_smem_layout`, computed on bytes."""
    w = _check_canonical(rows, k, dtype, swizzle, k_major)
    _check_aligned(base, swizzle, "canonical wgmma buffer")
    eb = dtype.bits // 8
    r = np.arange(rows, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    if k_major:
        plain = base + ((kk // w) * rows * w + r * w + kk % w) * eb
    else:
        plain = base + ((r // w) * k * w + kk * w + r % w) * eb
    return swizzle_bytes_address(plain, swizzle)


def _check_aligned(base: int, swizzle: int, what: str) -> None:
    atom = swizzle_atom_bytes(swizzle)
    if base % atom:
        raise TegulaError(f"{what}: shared byte address {base:#x} must be aligned to the "
                          f"{atom}-byte swizzle atom of {swizzle}-byte swizzle")


def operand_start_offset(row, k_offset: int, rows: int, k: int, dtype: DType, swizzle: int,
                         k_major: bool = True):
    """Element offset (before the swizzle) of element (`row`, `k_offset`) in the canonical
    buffer of `rows` x `k`: where a descriptor reading from that row and k-step starts.
    `row` may be an int or an index expression (lowering's warpgroup row, any object with
    `+` and `*` by ints); it must be a multiple of 8 (K-major) or of the block width W
    (MN-major: the descriptor's MN blocks start on a block), which is checked for ints.
    K-major: block k_offset // W, row `row` inside it, k_offset % W along it; MN-major:
    block row // W (each k * W elements), K row k_offset inside it, so row * k + k_offset * W."""
    w = _check_canonical(rows, k, dtype, swizzle, k_major)
    unit = 8 if k_major else w
    if isinstance(row, int) and (row % unit or not 0 <= row < rows):
        raise TegulaError(f"wgmma operand: first row {row} must be a multiple of {unit} in "
                          f"[0, {rows}) ({'K' if k_major else 'MN'}-major {rows} x {k} {dtype}, "
                          f"{swizzle}-byte swizzle)")
    if k_major:
        return row * w + ((k_offset // w) * rows * w + k_offset % w)
    return row * k + k_offset * w


def operand_descriptor(rows: int, k: int, dtype: DType, swizzle: int, base: int,
                       k_offset: int = 0, k_major: bool = True, row: int = 0) -> MatrixDescriptor:
    """Descriptor fields for the wgmma k-step starting at element `k_offset` (and at row
    `row`) of the canonical buffer (`rows` x `k`, at byte address `base`). `k_offset` is a
    multiple of the instruction's K (32 bytes of elements); K extents of several blocks
    (K rows wider than one swizzle span) start the step's descriptor in its block.
    MN-major (CUTLASS's canonical forms): with a swizzle LBO steps between MN blocks and
    SBO between groups of 8 K rows; without, the other way round."""
    _check_canonical(rows, k, dtype, swizzle, k_major)
    _check_aligned(base, swizzle, "wgmma operand buffer")
    eb = dtype.bits // 8
    if k_offset % (32 // eb) or not 0 <= k_offset < k:
        raise TegulaError(f"wgmma k-step offset {k_offset} must be a multiple of {32 // eb} "
                          f"in [0, {k})")
    start = base + operand_start_offset(row, k_offset, rows, k, dtype, swizzle, k_major) * eb
    leading, stride = operand_descriptor_strides(rows, k, dtype, swizzle, k_major)
    return MatrixDescriptor(start, leading_bytes=leading, stride_bytes=stride, swizzle=swizzle)


def operand_descriptor_strides(rows: int, k: int, dtype: DType, swizzle: int,
                               k_major: bool = True) -> tuple[int, int]:
    """(leading, stride) byte offsets of every descriptor into the canonical buffer of
    `rows` x `k` (they do not depend on the row or k-step read). K-major, swizzled: LBO
    unused (16), SBO = 8 rows of one span; interleave: LBO = one 16-byte K block of all
    rows, SBO = 8 rows of 16 bytes. MN-major, swizzled: LBO = one MN block (k rows of a
    span), SBO = 8 K rows of a span; interleave: LBO = 8 K rows of 16 bytes, SBO = one
    8-element MN block (k rows of 16 bytes)."""
    _check_canonical(rows, k, dtype, swizzle, k_major)
    span = max(swizzle, 16)
    if not k_major:
        return (k * span, 8 * span) if swizzle else (128, k * 16)
    return (16, 8 * swizzle) if swizzle else (rows * 16, 128)


__all__ = [
    "SWIZZLE_MODES", "swizzle_bytes_address", "byte_swizzle", "element_swizzle",
    "swizzle_atom_bytes", "MatrixDescriptor", "encode_descriptor", "decode_descriptor",
    "descriptor_element_addresses", "canonical_smem_layout", "canonical_byte_addresses",
    "operand_descriptor", "operand_descriptor_strides", "operand_start_offset",
]
