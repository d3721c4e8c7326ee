"""Tile IR values: where a tile lives and how it maps onto storage.

Three kinds of tile, one per memory scope:

* `GlobalTile` — a strided view of a global tensor argument. It is pure address
  arithmetic (no storage): tile coordinate `i` maps to tensor coordinate
  `c[d] = origin[d] + sum(i[k] * dims[k].step for k with dims[k].tensor_dim == d)`.
  `a.tile((BM, BK), (m, None))` gives dims (rows, cols, k-tiles) with origin (m*BM, 0);
  slicing the k-tile dim with `k` moves the origin to (m*BM, k*BK). Elements outside the
  tensor's extents are out of bounds: loads of them are predicated off, stores skipped.
* `SharedTile` — a view of one stage of a shared-memory buffer (`SharedAlloc`). The
  buffer's layout (offset ← coordinate, possibly swizzled) is synthesized once per buffer.
* `RegisterTile` — a tile distributed over the threads of the block. Its layout is a
  thread-value (TV) layout `(thread, value) → tile index`, synthesized (or pinned by the user).

Register tiles are mutable variables (ops write into them), which makes loop-carried
accumulators natural: the tile IR is not SSA, and a register tile has one layout for its
whole life; synthesis inserts an explicit conversion where two uses disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count
from typing import Any, ClassVar

from tegula.dtypes import DType
from tegula.errors import SourceLocation
from tegula.ir.scalar import Scalar, ScalarLike

_ids = count()


@dataclass(frozen=True)
class GlobalArg:
    """A global tensor parameter of the kernel (pointer + extents + strides)."""

    name: str
    dtype: DType
    rank: int


@dataclass(frozen=True)
class ViewDim:
    """One dimension of a global view: `extent` elements along tensor dim `tensor_dim`,
    `step` tensor elements apart. `extent` may be a runtime scalar (e.g. the number of
    k-tiles)."""

    tensor_dim: int
    extent: ScalarLike
    step: ScalarLike


@dataclass(eq=False)
class Tile:
    """Base of all tile values: an element type, a shape, and where it was made."""

    dtype: DType
    shape: tuple
    name: str
    loc: SourceLocation | None
    id: int = field(default_factory=lambda: next(_ids), init=False)

    @property
    def rank(self) -> int:
        return len(self.shape)

    scope: ClassVar[str] = "tile"  # each subclass names its memory scope

    def __repr__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        return f"%{self.name}: {self.scope}<{dims}, {self.dtype}>"


@dataclass(eq=False, repr=False)
class GlobalTile(Tile):
    arg: GlobalArg = None  # type: ignore[assignment]
    origin: tuple = ()      # one ScalarLike per tensor dim
    dims: tuple = ()        # one ViewDim per tile dim
    #: (tensor dim, exclusive upper bound in tensor coordinates) per dim a slice with a stop
    #: narrowed (`a[start:end, :]`): elements at or past it are out of bounds like those
    #: past the tensor's extent, in every view derived from this one (tiles included).
    limits: tuple = ()

    scope: ClassVar[str] = "global"


@dataclass(eq=False)
class SharedAlloc:
    """A shared-memory buffer of `stages` copies of a (shape) tile. `layout` is None until
    synthesis chooses it (or the user pins one); it maps a tile coordinate to an element
    offset within one stage."""

    dtype: DType
    shape: tuple
    stages: int
    name: str
    loc: SourceLocation | None
    layout: Any = None
    pinned: bool = False
    id: int = field(default_factory=lambda: next(_ids), init=False)


@dataclass(eq=False, repr=False)
class SharedTile(Tile):
    alloc: SharedAlloc = None  # type: ignore[assignment]
    stage: ScalarLike = 0      # which stage (taken modulo alloc.stages by lowering)
    permutation: tuple = ()    # tile dim k is alloc dim permutation[k] (a transposed view)

    scope: ClassVar[str] = "shared"


@dataclass(eq=False, repr=False)
class RegisterTile(Tile):
    layout: Any = None     # TV layout, set by synthesis or pinned by the user
    pinned: bool = False

    scope: ClassVar[str] = "register"


def is_static_shape(shape: tuple) -> bool:
    return all(isinstance(s, int) for s in shape)


def describe(tile: Tile) -> str:
    """`%name: scope<dims, dtype>` — how errors and the printer name a tile."""
    return repr(tile)


__all__ = ["GlobalArg", "ViewDim", "Tile", "GlobalTile", "SharedAlloc", "SharedTile",
           "RegisterTile", "Scalar", "is_static_shape", "describe"]
