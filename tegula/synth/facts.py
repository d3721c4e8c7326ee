"""What is known about a kernel's tensor arguments when it is compiled.

Like Triton, tegula specializes a kernel on divisibility facts of its arguments: which
dimension is contiguous (stride 1), the largest power of two dividing each extent and
each stride (up to the element count of the widest vector, 16 bytes: 32 for 4-bit
types, 16 for every other type), and the pointer's alignment in bytes (up to 16). Those
facts decide vector widths: a 16-byte load needs an aligned base, row strides that keep
every row aligned, and an extent that makes each vector wholly in or out of bounds. The
facts are part of the compilation cache key, so a launch with different facts compiles a
different variant; the caps keep tensors that differ only beyond what any vector can use
on one variant.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_VECTOR_BYTES = 16  # the widest global access, and the cap on alignment facts
# The largest divisor any fact or index divisor holds: a 16-byte vector of 4-bit elements.
MAX_DIVISOR = MAX_VECTOR_BYTES * 8 // 4
# Divisor facts of 8-bit and wider types stop here (a 16-byte vector has at most 16 of
# them); 16 rather than the vector's own count so that keys of those types stay as they
# were before 4-bit types needed 32.
_WIDE_TYPE_CAP = 16


def divisor_cap(elem_bits: float) -> int:
    """The cap on extent and stride divisor facts for elements of `elem_bits` bits: the
    elements of one 16-byte vector for sub-byte types (32 for 4-bit), 16 otherwise."""
    if elem_bits < 8:
        return max(_WIDE_TYPE_CAP, int(MAX_VECTOR_BYTES * 8 // elem_bits))
    return _WIDE_TYPE_CAP


def power_of_two_divisor(x: int, cap: int = MAX_DIVISOR) -> int:
    """The largest power of two ≤ cap dividing x (x = 0 counts as divisible by anything)."""
    d = 1
    while d < cap and x % (d * 2) == 0:
        d *= 2
    return d


@dataclass(frozen=True)
class TensorFacts:
    """Facts about one global tensor argument.

    `contiguous_dim` is the dim whose stride is 1 (None if none is); `extent_divisors[d]`
    and `stride_divisors[d]` are the largest powers of two ≤ `divisor_cap` of the element
    type (32 for 4-bit, else 16) dividing extent/stride d; `align_bytes` the largest power
    of two ≤ 16 dividing the data pointer's address;
    `index_bits` is 32 when every element offset fits in an int (so address arithmetic can
    stay 32-bit, as in Triton), else 64.
    """

    rank: int
    contiguous_dim: int | None
    extent_divisors: tuple
    stride_divisors: tuple
    align_bytes: int
    index_bits: int = 32

    @staticmethod
    def of(shape: tuple, strides: tuple, address: int, elem_bytes: float) -> "TensorFacts":
        """Facts of a tensor with these extents, element strides and data address, whose
        elements are `elem_bytes` bytes each (0.5 for 4-bit types)."""
        cap = divisor_cap(elem_bytes * 8)
        contiguous = None
        for d in reversed(range(len(shape))):
            if strides[d] == 1:
                contiguous = d
                break
        span = sum((s - 1) * abs(d) for s, d in zip(shape, strides) if s > 0)
        return TensorFacts(
            rank=len(shape),
            contiguous_dim=contiguous,
            extent_divisors=tuple(power_of_two_divisor(s, cap) for s in shape),
            # A dim of extent 1 is never stepped along, so its stride cannot misalign.
            stride_divisors=tuple(cap if n == 1 else power_of_two_divisor(s, cap)
                                  for n, s in zip(shape, strides)),
            align_bytes=power_of_two_divisor(address, MAX_VECTOR_BYTES),
            index_bits=32 if span < 2**31 - 1 else 64,
        )

    @staticmethod
    def assume_row_major(rank: int, index_bits: int = 32,
                         elem_bits: float = 16) -> "TensorFacts":
        """The facts of a contiguous, 16-byte aligned, nicely sized row-major tensor of
        `elem_bits`-bit elements (with offsets under 2^31 unless told otherwise) — what
        `tegula explain`/`tegula compile` assume when no arguments are given."""
        cap = divisor_cap(elem_bits)
        return TensorFacts(rank, rank - 1, (cap,) * rank, (cap,) * rank, MAX_VECTOR_BYTES,
                           index_bits)

    def key(self) -> tuple:
        return (self.rank, self.contiguous_dim, self.extent_divisors, self.stride_divisors,
                self.align_bytes, self.index_bits)
