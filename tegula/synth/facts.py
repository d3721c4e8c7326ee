"""What is known about a kernel's tensor arguments when it is compiled.

Like Triton, tegula specializes a kernel on divisibility facts of its arguments: which
dimension is contiguous (stride 1), the largest power of two (up to 16) dividing each
extent and each stride, and the pointer's alignment in bytes. Those facts decide vector
widths: a 16-byte load needs an aligned base, row strides that keep every row aligned, and
an extent that makes each vector wholly in or out of bounds. The facts are part of the
compilation cache key, so a launch with different facts compiles a different variant.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_DIVISOR = 16


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
    and `stride_divisors[d]` are the largest powers of two ≤ 16 dividing extent/stride d;
    `align_bytes` the largest power of two ≤ 16 dividing the data pointer's address;
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
        """Facts of a tensor with these extents, element strides and data address."""
        contiguous = None
        for d in reversed(range(len(shape))):
            if strides[d] == 1:
                contiguous = d
                break
        span = sum((s - 1) * abs(d) for s, d in zip(shape, strides) if s > 0)
        return TensorFacts(
            rank=len(shape),
            contiguous_dim=contiguous,
            extent_divisors=tuple(power_of_two_divisor(s) for s in shape),
            # A dim of extent 1 is never stepped along, so its stride cannot misalign.
            stride_divisors=tuple(MAX_DIVISOR if n == 1 else power_of_two_divisor(s)
                                  for n, s in zip(shape, strides)),
            align_bytes=power_of_two_divisor(address),
            index_bits=32 if span < 2**31 - 1 else 64,
        )

    @staticmethod
    def assume_row_major(rank: int, index_bits: int = 32) -> "TensorFacts":
        """The facts of a contiguous, 16-byte aligned, nicely sized row-major tensor (with
        offsets under 2^31 unless told otherwise) — what `tegula explain`/`tegula compile`
        assume when no arguments are given."""
        return TensorFacts(rank, rank - 1, (MAX_DIVISOR,) * rank, (MAX_DIVISOR,) * rank,
                           MAX_DIVISOR, index_bits)

    def key(self) -> tuple:
        return (self.rank, self.contiguous_dim, self.extent_divisors, self.stride_divisors,
                self.align_bytes, self.index_bits)
