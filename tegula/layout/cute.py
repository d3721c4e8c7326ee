"""CuTe layouts: functions from coordinates to offsets given by a shape and a stride.

A `Layout` is a pair of congruent int-tuples `shape:stride`. A coordinate `c` of the
shape (natural, hierarchical, or a single integer read colexicographically) maps to the
offset `sum(c_i * d_i)` over the leaves. Printing uses CuTe notation exactly
(`((2,2),8):((1,16),2)`, `8:1`), so any result can be checked against CuTe by hand.

Layouts are immutable values: equality and hashing are structural (two layouts that are
the same function but have different shapes are different values; compare
`coalesce(a) == coalesce(b)` or `a.all_offsets()` for functional equality).
"""
from __future__ import annotations

import re
from typing import Any, Iterator, Mapping

import numpy as np

from tegula.layout import inttuple as it
from tegula.layout.errors import LayoutError
from tegula.layout.inttuple import IntTuple


class Layout:
    """A CuTe layout `shape:stride`; strides default to compact column-major."""

    __slots__ = ("_shape", "_stride", "_flat_shape", "_flat_stride", "_hash", "_offsets",
                 "memo")

    def __init__(self, shape: IntTuple, stride: IntTuple | None = None):
        if stride is None:
            shape = it.normalize(shape)
            stride = it.prefix_product(shape)
        flat_shape: list = []
        flat_stride: list = []
        try:
            shape, stride = _normalize_pair(shape, stride, flat_shape, flat_stride)
        except _Incongruent:
            raise LayoutError(f"shape {it.to_str(it.normalize(shape))} and stride "
                              f"{it.to_str(it.normalize(stride))} are not congruent "
                              "(they must have the same nesting)") from None
        for extent in flat_shape:
            # Only concrete extents can be checked here; symbols carry their own facts.
            if type(extent) is int and extent < 1:
                raise LayoutError(f"shape {it.to_str(shape)} has the extent {extent}; "
                                  "extents must be at least 1")
        self._shape = shape
        self._stride = stride
        # Evaluation walks the leaves, so keep them flat once rather than recursing per call.
        self._flat_shape = tuple(flat_shape)
        self._flat_stride = tuple(flat_stride)
        self._hash: int | None = None
        self._offsets: np.ndarray | None = None
        # Results of pure functions of this (immutable) layout, e.g. its coalesced form.
        self.memo: dict[str, Any] = {}

    # ------------------------------------------------------------------ construction

    @classmethod
    def parse(cls, text: str, symbols: Mapping[str, Any] | None = None) -> Layout:
        """Read CuTe notation: `((2,2),8):((1,16),2)`, `8:1`, or a bare shape `(4,8)`.

        A bare shape gets compact column-major strides. Names (such as `K`) are looked up
        in `symbols`, so symbolic layouts can be written as text too. CuTe's `_` prefix for
        static integers (`_8`) is accepted and ignored.
        """
        parts = text.split(":")
        if len(parts) > 2:
            raise LayoutError(f"cannot parse layout {text!r}: more than one ':'")
        shape = _parse_inttuple(parts[0], text, symbols or {})
        stride = _parse_inttuple(parts[1], text, symbols or {}) if len(parts) == 2 else None
        return cls(shape, stride)

    # ------------------------------------------------------------------ properties

    @property
    def shape(self) -> IntTuple:
        """The shape int-tuple."""
        return self._shape

    @property
    def stride(self) -> IntTuple:
        """The stride int-tuple, congruent to the shape."""
        return self._stride

    @property
    def flat_shape(self) -> tuple:
        """The leaves of the shape, in colexicographic mode order."""
        return self._flat_shape

    @property
    def flat_stride(self) -> tuple:
        """The leaves of the stride, matching `flat_shape`."""
        return self._flat_stride

    @property
    def size(self) -> Any:
        """Number of coordinates: the product of the shape."""
        return it.product(self._shape)

    @property
    def cosize(self) -> Any:
        """One past the offset of the last coordinate, `L(size-1) + 1` (as in CuTe).

        For non-negative strides this is one past the largest offset.
        """
        last = 0
        for s, d in zip(self._flat_shape, self._flat_stride):
            last = last + (s - 1) * d
        return last + 1

    @property
    def rank(self) -> int:
        """Number of top-level modes (1 for an integral shape)."""
        return it.rank(self._shape)

    @property
    def depth(self) -> int:
        """Nesting depth of the shape (0 for an integral shape)."""
        return it.depth(self._shape)

    def is_static(self) -> bool:
        """True when every extent and stride is a concrete integer."""
        return it.is_static(self._flat_shape) and it.is_static(self._flat_stride)

    # ------------------------------------------------------------------ modes

    def __getitem__(self, i: int) -> Layout:
        """The i-th top-level mode as a layout (a rank-1 layout is its own mode 0)."""
        if it.is_tuple(self._shape):
            return Layout(self._shape[i], self._stride[i])
        if i not in (0, -1):
            raise LayoutError(f"mode {i} asked of the rank-1 layout {self}")
        return self

    # Modes are reached with `modes()` or `layout[i]`; iterating a layout directly would be
    # ambiguous (modes? offsets?), so it is refused.
    __iter__ = None

    def modes(self) -> list[Layout]:
        """The top-level modes, in order."""
        return [self[i] for i in range(self.rank)]

    def flatten(self) -> Layout:
        """The same function with all nesting removed (one mode per leaf)."""
        if not it.is_tuple(self._shape):
            return self
        return Layout(self._flat_shape, self._flat_stride)

    # ------------------------------------------------------------------ evaluation

    def __call__(self, *coord: Any) -> Any:
        """Offset of a coordinate: `L(i)` for a 1-D index, `L((m,n))` or `L(m, n)`.

        A 1-D index is read colexicographically; an index past the end extends the last
        mode (CuTe semantics, relied on by composition). A negative 1-D index follows
        CuTe C++'s truncating division, so `L(-i) == -L(i)` (layouts with negative strides
        and their inverses produce such indices).
        """
        if len(coord) == 1:
            coord = coord[0]
        if it.is_tuple(coord):
            return it.crd2idx(coord, self._shape, self._stride)
        return self._index_to_offset(coord)

    def _index_to_offset(self, index: Any) -> Any:
        """Evaluate at a 1-D index over the flat modes, the hot path of synthesis."""
        shapes, strides = self._flat_shape, self._flat_stride
        if not shapes:
            return 0
        if isinstance(index, (int, np.integer)) and index < 0:
            return -self._index_to_offset(-index)
        offset = 0
        for s, d in zip(shapes[:-1], strides[:-1]):
            offset = offset + (index % s) * d
            index = index // s
        return offset + index * strides[-1]

    def offsets_of(self, indices: np.ndarray) -> np.ndarray:
        """Vectorized `L(i)` for an integer array of 1-D indices (static layouts only)."""
        self._require_static("vectorized evaluation")
        signed = np.asarray(indices, dtype=np.int64)
        index = np.abs(signed)  # negative indices: L(-i) == -L(i), as in `__call__`
        offset = np.zeros_like(index)
        shapes, strides = self._flat_shape, self._flat_stride
        if not shapes:
            return offset
        for s, d in zip(shapes[:-1], strides[:-1]):
            offset += (index % s) * d
            index = index // s
        return np.sign(signed + (signed == 0)) * (offset + index * strides[-1])

    def all_offsets(self) -> np.ndarray:
        """`[L(0), L(1), ..., L(size-1)]` as a read-only int64 array, computed once.

        Built as an outer sum mode by mode, so its cost is linear in the size.
        """
        if self._offsets is None:
            self._require_static("evaluating every offset")
            offsets = np.zeros(1, dtype=np.int64)
            for s, d in zip(self._flat_shape, self._flat_stride):
                # Later modes vary slower (colexicographic), so they form the outer axis.
                steps = np.arange(s, dtype=np.int64) * d
                offsets = (steps[:, None] + offsets[None, :]).ravel()
            offsets.setflags(write=False)
            self._offsets = offsets
        return self._offsets

    def coordinates(self) -> Iterator[IntTuple]:
        """Every natural coordinate of the shape, in colexicographic order."""
        self._require_static("enumerating coordinates")
        for i in range(self.size):
            yield it.idx2crd(i, self._shape)

    def is_injective(self) -> bool:
        """True when distinct coordinates map to distinct offsets (checked by evaluation)."""
        offsets = self.all_offsets()
        return len(np.unique(offsets)) == len(offsets)

    def _require_static(self, what: str) -> None:
        if not self.is_static():
            raise LayoutError(f"{what} needs static extents and strides, but {self} is symbolic")

    # ------------------------------------------------------------------ value semantics

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return _structurally_equal(self._shape, other._shape) and \
            _structurally_equal(self._stride, other._stride)

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self._shape, self._stride))
        return self._hash

    def __str__(self) -> str:
        return f"{it.to_str(self._shape)}:{it.to_str(self._stride)}"

    def __repr__(self) -> str:
        return f"Layout.parse('{self}')"


class _Incongruent(Exception):
    """Internal signal of `_normalize_pair`: shape and stride nest differently."""


def _normalize_pair(shape: Any, stride: Any, flat_shape: list, flat_stride: list) -> tuple:
    """Normalize a shape and a stride together (see `inttuple.normalize`), checking that
    they are congruent and collecting their leaves, in one walk."""
    if type(shape) is int and type(stride) is int:
        flat_shape.append(shape)
        flat_stride.append(stride)
        return shape, stride
    if isinstance(shape, (tuple, list)):
        if not isinstance(stride, (tuple, list)) or len(stride) != len(shape):
            raise _Incongruent
        pairs = [_normalize_pair(s, d, flat_shape, flat_stride) for s, d in zip(shape, stride)]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    if isinstance(stride, (tuple, list)):
        raise _Incongruent
    shape, stride = it.normalize(shape), it.normalize(stride)
    flat_shape.append(shape)
    flat_stride.append(stride)
    return shape, stride


def _structurally_equal(a: IntTuple, b: IntTuple) -> bool:
    """Same nesting and the same leaves; leaves are compared by identity of value.

    Symbolic leaves may refuse `==` when it is undecidable; for value equality of layouts
    that counts as "not equal", never as an error.
    """
    if it.is_tuple(a) or it.is_tuple(b):
        return it.is_tuple(a) and it.is_tuple(b) and len(a) == len(b) and \
            all(_structurally_equal(x, y) for x, y in zip(a, b))
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except LayoutError:
        return False


_TOKEN = re.compile(r"\s*(?:(?P<int>-?_?\d+)|(?P<name>[A-Za-z][A-Za-z0-9_]*)|(?P<punct>[(),]))")


def _parse_inttuple(text: str, whole: str, symbols: Mapping[str, Any]) -> IntTuple:
    """Parse one int-tuple of CuTe notation (helper of `Layout.parse`)."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise LayoutError(f"cannot parse layout {whole!r}: unexpected {text[pos:]!r}")
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    items, used = _parse_tokens(tokens, 0, whole, symbols)
    if used != len(tokens):
        raise LayoutError(f"cannot parse layout {whole!r}: trailing text")
    return items


def _parse_tokens(tokens: list[tuple[str, str]], pos: int, whole: str,
                  symbols: Mapping[str, Any]) -> tuple[IntTuple, int]:
    """Recursive descent over the tokens: a leaf or a parenthesized, comma-separated list."""
    if pos >= len(tokens):
        raise LayoutError(f"cannot parse layout {whole!r}: it ends too early")
    kind, value = tokens[pos]
    if kind == "int":
        return int(value.replace("_", "")), pos + 1
    if kind == "name":
        if value not in symbols:
            raise LayoutError(f"cannot parse layout {whole!r}: unknown symbol {value!r}")
        return symbols[value], pos + 1
    if value != "(":
        raise LayoutError(f"cannot parse layout {whole!r}: unexpected {value!r}")
    items: list = []
    pos += 1
    if pos < len(tokens) and tokens[pos][1] == ")":
        return (), pos + 1
    while True:
        item, pos = _parse_tokens(tokens, pos, whole, symbols)
        items.append(item)
        if pos >= len(tokens):
            raise LayoutError(f"cannot parse layout {whole!r}: unbalanced parentheses")
        if tokens[pos][1] == ")":
            return tuple(items), pos + 1
        if tokens[pos][1] != ",":
            raise LayoutError(f"cannot parse layout {whole!r}: expected ',' or ')'")
        pos += 1
