"""CuTe swizzles and composed layouts: the shared-memory side of the layout algebra.

A `Swizzle(bits, base, shift)` is CuTe's `Swizzle<B,M,S>`: a bijection on integer offsets
that XORs one bit field into another. Writing an offset in binary,

    0b...YYY.....ZZZ...      the low `base` bits are kept,
           ^^^               YYY: `bits` bits starting at bit `base + max(0, shift)`
                 ^^^         ZZZ: `bits` bits starting at bit `base - min(0, shift)`

the swizzle replaces ZZZ by ZZZ xor YYY (`shift` is how far YYY moves right to land on
ZZZ; a negative shift moves it left). YYY itself is unchanged, so the map is an involution
whenever the fields do not overlap (`|shift| >= bits`, which CuTe requires).

Example (the usual f16 tile with 128-byte rows): with byte offsets, `Sw<3,4,3>` keeps the
16-byte chunk's inner bytes (bits 0..3), and XORs the row number (bits 7..9: rows of 128
bytes) into the chunk number (bits 4..6). On f16 *element* offsets the same pattern is
`Sw<3,3,3>` (8 elements = 16 bytes). Either way the 8 chunks of one column of an 8-row
tile fall into 8 different 16-byte bank groups, so ldmatrix reads are conflict free.

A `ComposedLayout(outer, offset, inner)` is CuTe's composed layout: the function
`x -> outer(offset + inner(x))`. Its domain (shape, size, coordinates) is the inner
layout's; `outer` is usually a swizzle. Shared-memory tensors of tegula carry either a
plain `Layout` or a `ComposedLayout(swizzle, 0, layout)` (Hexcute's `M = S o m`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tegula.layout.errors import LayoutError


def _shift_right(x: Any, s: int) -> Any:
    """x >> s for s >= 0, x << -s otherwise (CuTe's shiftr on a signed shift)."""
    return x >> s if s >= 0 else x << -s


@dataclass(frozen=True)
class Swizzle:
    """CuTe's `Swizzle<B,M,S>`: XOR `bits` bits found `shift` above bit `base` into bit `base`."""

    bits: int
    base: int
    shift: int

    def __post_init__(self) -> None:
        for name in ("bits", "base", "shift"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise LayoutError(f"Swizzle {name} must be an int, got {value!r}")
        if self.bits < 0 or self.base < 0:
            raise LayoutError(f"Swizzle<{self.bits},{self.base},{self.shift}>: bits and base "
                              "must be non-negative")
        if abs(self.shift) < self.bits:
            raise LayoutError(f"Swizzle<{self.bits},{self.base},{self.shift}>: |shift| must be "
                              "at least bits, or the XORed fields overlap and the map is not "
                              "a bijection")

    @property
    def yyy_mask(self) -> int:
        """The source field: the bits that are XORed into the target field."""
        return ((1 << self.bits) - 1) << (self.base + max(0, self.shift))

    @property
    def zzz_mask(self) -> int:
        """The target field: the bits that change."""
        return ((1 << self.bits) - 1) << (self.base - min(0, self.shift))

    def __call__(self, offset: Any) -> Any:
        """The swizzled offset. Works on ints and on integer numpy arrays alike."""
        if self.bits == 0:
            return offset
        if not _is_concrete(offset):
            raise LayoutError(f"{self} cannot be applied to the symbolic offset {offset}: "
                              "a swizzle needs the offset's bits")
        return offset ^ _shift_right(offset & self.yyy_mask, self.shift)

    @property
    def is_identity(self) -> bool:
        """True when the swizzle changes no offset (no bits are XORed)."""
        return self.bits == 0

    def inverse(self) -> Swizzle:
        """A swizzle is its own inverse: YYY is unchanged, so XORing it again restores ZZZ."""
        return self

    def size(self) -> int:
        """The period: offsets are permuted within aligned blocks of this many."""
        return 1 << (self.bits + self.base + abs(self.shift))

    def cosize(self) -> int:
        return self.size()

    def __str__(self) -> str:
        return f"Sw<{self.bits},{self.base},{self.shift}>"

    def __repr__(self) -> str:
        return f"Swizzle({self.bits}, {self.base}, {self.shift})"


def _is_concrete(x: Any) -> bool:
    """Ints and integer arrays have bits; symbolic extents do not."""
    if isinstance(x, int):
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and getattr(dtype, "kind", "") in "iu"


class ComposedLayout:
    """CuTe's composed layout `outer o offset o inner`: x -> outer(offset + inner(x)).

    The domain is `inner`'s: `shape`, `size`, `rank` and coordinates are the inner layout's,
    so a ComposedLayout is called exactly like a `Layout` (index, coordinate, or several
    coordinates). `outer` is any callable on offsets (a `Swizzle`, or a `Layout`).
    """

    __slots__ = ("outer", "offset", "inner")

    def __init__(self, outer: Any, offset: Any, inner: Any):
        if not callable(outer) or not callable(inner):
            raise LayoutError(f"ComposedLayout needs callable outer and inner functions, got "
                              f"{outer!r} and {inner!r}")
        self.outer = outer
        self.offset = offset
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.outer(self.offset + self.inner(*args, **kwargs))

    # ---- the domain is the inner layout's --------------------------------------------------

    @property
    def shape(self) -> Any:
        return self.inner.shape

    @property
    def size(self) -> Any:
        return _attr_value(self.inner, "size")

    @property
    def rank(self) -> Any:
        return _attr_value(self.inner, "rank")

    @property
    def cosize(self) -> Any:
        """One past the largest offset the composed map can reach.

        A swizzle permutes offsets within aligned blocks of `swizzle.size()`, so the inner
        layout's cosize rounded up to such a block bounds the composed codomain.
        """
        inner = _attr_value(self.inner, "cosize") + self.offset
        if isinstance(self.outer, Swizzle):
            block = self.outer.size()
            return inner if self.outer.is_identity else -(-inner // block) * block
        return _attr_value(self.outer, "cosize")

    def all_offsets(self) -> Any:
        """Every offset in index order, vectorized: the swizzle works on numpy arrays."""
        return self.outer(self.offset + self.inner.all_offsets())

    def is_injective(self) -> bool:
        import numpy as np

        offsets = self.all_offsets()
        return len(np.unique(offsets)) == len(offsets)

    def compose(self, tiler: Any) -> ComposedLayout:
        """self o tiler: the swizzle stays outermost, the tiler composes with the inner layout."""
        from tegula.layout.algebra import composition

        return ComposedLayout(self.outer, self.offset, composition(self.inner, tiler))

    # ---- identity ---------------------------------------------------------------------------

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, ComposedLayout):
            return NotImplemented
        return ((self.outer, self.inner) == (other.outer, other.inner)
                and _same(self.offset, other.offset))

    def __hash__(self) -> int:
        return hash((ComposedLayout, self.outer, self.offset, self.inner))

    def __str__(self) -> str:
        return f"{self.outer} o {self.offset} o {self.inner}"

    def __repr__(self) -> str:
        return f"ComposedLayout({self.outer!r}, {self.offset!r}, {self.inner!r})"


def _attr_value(obj: Any, name: str) -> Any:
    """obj.name(), or obj.name where the Layout API exposes it as a property."""
    value = getattr(obj, name)
    return value() if callable(value) else value


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except LayoutError:
        return False


def make_swizzled_layout(swizzle: Swizzle, layout: Any, offset: Any = 0) -> ComposedLayout | Any:
    """A shared-memory layout `swizzle o offset o layout`; the identity swizzle adds nothing.

    With the identity swizzle and no offset the plain layout is returned, so "unswizzled"
    stays one type.
    """
    if swizzle.is_identity and _same(offset, 0):
        return layout
    return ComposedLayout(swizzle, offset, layout)


def swizzle_for_row_bytes(row_bytes: int, element_bytes: int) -> Swizzle:
    """The CuTe swizzle that makes the 16-byte chunks of one column of 8 rows conflict-free.

    Offsets are in elements of `element_bytes`. The 32 banks span 128 bytes = 8 chunks, so
    the swizzle XORs the index of a row's 128-byte line (bits 3.. of the chunk index, hence
    shift 3) into the chunk field of a row (`log2(row_bytes / 16)` bits), above the chunk's
    inner elements (base `log2(16 / element_bytes)`). 128-byte rows of f16 give `Sw<3,3,3>`,
    64-byte rows of f16 `Sw<2,3,3>`, 128-byte rows of f32 `Sw<3,2,3>`.
    """
    if element_bytes not in (1, 2, 4, 8, 16) or row_bytes not in (16, 32, 64, 128):
        raise LayoutError(f"no 16-byte-chunk swizzle for {row_bytes}-byte rows of "
                          f"{element_bytes}-byte elements")
    bits = (row_bytes // 16).bit_length() - 1
    base = (16 // element_bytes).bit_length() - 1
    return Swizzle(bits, base, 3)


def _swizzle_parts(layout: ComposedLayout, operation: str) -> tuple:
    """`(swizzle, offset, inner)` of a swizzled layout `S o off o A`, or why it has none."""
    from tegula.layout.algebra import _Inadmissible
    from tegula.layout.cute import Layout

    if not isinstance(layout.outer, Swizzle) or not isinstance(layout.inner, Layout):
        raise _Inadmissible(f"{operation} of a composed layout needs a Swizzle outside and a "
                            f"plain layout inside; {layout} has {layout.outer!r} and "
                            f"{layout.inner!r}")
    return layout.outer, layout.offset, layout.inner


def swizzled_left_inverse(layout: ComposedLayout) -> ComposedLayout:
    """`(S o off o A)⁻¹ = A⁻¹ o (-off) o S` (a swizzle is an involution), for
    `algebra.left_inverse`. The result's domain is the codomain `[0, cosize)`."""
    from tegula.layout.algebra import _left_inverse
    from tegula.layout.cute import Layout

    swizzle, offset, inner = _swizzle_parts(layout, "left_inverse")
    codomain = ComposedLayout(swizzle, 0, Layout(layout.cosize))
    return ComposedLayout(_left_inverse(inner), -offset, codomain)


def swizzled_right_inverse(layout: ComposedLayout) -> Any:
    """`A⁻¹ o S` on the longest prefix of offsets that `S` keeps inside the range of
    `A`'s right inverse, for `algebra.right_inverse`."""
    from tegula.layout.algebra import _Inadmissible, right_inverse
    from tegula.layout.cute import Layout

    swizzle, offset, inner = _swizzle_parts(layout, "right_inverse")
    if not _same(offset, 0):
        raise _Inadmissible(f"right_inverse of {layout} needs the offset 0, not {offset}")
    inverse = right_inverse(inner)
    n = inverse.size
    # S permutes aligned blocks of its period, so prefixes that are such blocks (or lie
    # below the bits S reads) are closed; search the largest closed prefix.
    while n > 1 and not all(swizzle(i) < n for i in range(n)):
        n = 1 << ((n - 1).bit_length() - 1)
    if n <= 1:
        return Layout(1, 0)
    return ComposedLayout(inverse, 0, ComposedLayout(swizzle, 0, Layout(n)))


__all__ = ["Swizzle", "ComposedLayout", "make_swizzled_layout", "swizzle_for_row_bytes",
           "swizzled_left_inverse", "swizzled_right_inverse"]


def buffer_offset(layout: Any, coords: list) -> Any:
    """The element offset of a shared buffer's coordinate (one integer per dim) under its
    layout, a plain `Layout` or a swizzled `ComposedLayout(Swizzle, offset, Layout)` with
    one top-level mode per dim.

    Each dim's coordinate is read through its whole mode, so a mode hierarchical within
    one dim (`(8,(4,4)):(4,(1,32))`: column c at `c % 4 + 32 * (c // 4)`) is addressed
    right, then the offset and swizzle apply. The one code for every consumer: it needs only
    `+ * // % & ^ >> <<`, so it evaluates Python ints, numpy integer arrays (synthesis's
    costing of candidate layouts) and thread-IR index expressions (lowering) alike.
    """
    inner = layout.inner if isinstance(layout, ComposedLayout) else layout
    if len(coords) != inner.rank:
        raise LayoutError(f"a coordinate of rank {len(coords)} given to the layout {layout} "
                          f"of rank {inner.rank}")
    offset: Any = 0
    for coord, mode in zip(coords, inner.modes()):
        offset = _plus(offset, _mode_offset(coord, mode.flat_shape, mode.flat_stride))
    if isinstance(layout, ComposedLayout):
        if not _same(layout.offset, 0):
            offset = offset + layout.offset
        swizzle = layout.outer
        if not isinstance(swizzle, Swizzle):
            raise LayoutError(f"the buffer layout {layout} is composed with {swizzle!r}; "
                              f"only a Swizzle can be evaluated on addresses")
        if not swizzle.is_identity:
            offset = offset ^ _shift_right(offset & swizzle.yyy_mask, swizzle.shift)
    return offset


def _mode_offset(coord: Any, shapes: tuple, strides: tuple) -> Any:
    """One mode's offset of a coordinate along it, split colexicographically over the
    mode's leaves (the last leaf takes the rest); zero-stride and size-1 leaves add
    nothing, so a flat mode is just `coord * stride`."""
    offset: Any = 0
    for i, (extent, stride) in enumerate(zip(shapes, strides)):
        last = i == len(shapes) - 1
        if stride != 0 and (extent != 1 or last):
            digit = coord if last else coord % extent
            offset = _plus(offset, digit * stride)
        if not last and extent != 1:
            coord = coord // extent
    return offset


def _plus(total: Any, term: Any) -> Any:
    """total + term, with a literal 0 dropped (index expressions stay as written)."""
    if isinstance(total, int) and total == 0:
        return term
    if isinstance(term, int) and term == 0:
        return total
    return total + term
