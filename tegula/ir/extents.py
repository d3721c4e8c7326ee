"""Extents a traced kernel assumes equal, checked against each launch's tensors.

A global view masks what lies past its tensor's extent: loads give the fill value (0),
stores are dropped. So a kernel that combines two tensors element by element, or
contracts them in a `tg.gemm`, computes *something* when their extents disagree — zeros
standing in for the shorter tensor's missing elements — and no error tells the author.
numpy would refuse `x + y` or `a @ b.T` for such shapes; tegula refuses the launch.

The assumptions are read from the tile IR by following where each register or shared
tile's dimensions were loaded from (`Source`: tensor, tensor dim, and the coordinates the
view reads along it):

* a `tg.gemm` contracts operand dim 1 of `a` with operand dim 1 of `b` (`c += a @ b.T`):
  the two tensor dims they were loaded along must have equal extents;
* an element-wise op whose inputs were loaded from *the same coordinates* (the same
  origin expression, step and tile extent) along a dim of two different tensors reads
  `x[i]` and `y[i]` together: those tensor dims must have equal extents. Broadcast dims
  (extent 1) assume nothing; neither do tiles of different coordinates.

Where the coordinates are constants (`x.tile((16, 16), (1, 0))`), the elements read are
known, and an assumption is broken only if the mask differs on one of them: some element
read lies inside one tensor's extent and past the other's. A constant tile inside both
tensors (or past both) reads the same either way, so extents may differ there; this is
what lets a kernel combine `s.T` (x's top block, transposed) with x's next block.

Provenance flows through copies (global → shared → registers), casts and element-wise
ops, conversions, and gemm results (c's rows from a, its columns from b); a reduction
drops the reduced dim; anything else (index tiles, reshapes, values carried around a
loop) has no provenance and so assumes nothing. The workaround for a kernel that means
to read only part of a tensor is to pass a view of that part (`y[:, :n]`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tegula.ir.ops import Copy, Elementwise, Gemm, Rearrange, Reduce, TracedKernel, walk_ops
from tegula.ir.values import GlobalTile, RegisterTile, SharedTile

Sources = frozenset  # of Source: where one tile dim's elements come from


@dataclass(frozen=True)
class Source:
    """Tile dim elements loaded along `tensor`'s dim `dim`, at coordinates `coords`;
    `span` the tensor coordinates read, (first, step, count), where they are constants."""

    tensor: str
    dim: int
    coords: tuple
    span: tuple | None = None


@dataclass(frozen=True)
class Assumption:
    """`what` at `loc` assumes tensor `a[0]`'s dim `a[1]` and `b[0]`'s `b[1]` are equal —
    everywhere, or (`span` = (first, step, count)) on the constant coordinates read."""

    what: str
    loc: Any
    a: tuple[str, int]
    b: tuple[str, int]
    span: tuple | None = None

    def broken_by(self, extent_a: int, extent_b: int) -> bool:
        """Whether a load masks some element read differently in the two tensors."""
        if extent_a == extent_b:
            return False
        if self.span is None:
            return True
        first, step, count = self.span
        low, high = min(extent_a, extent_b), max(extent_a, extent_b)
        # the first coordinate read at or past `low`: masked in one tensor, unless >= high
        skip = max(0, -(-(low - first) // step))
        return skip < count and first + skip * step < high


class _Provenance:
    """Per tile dim, the sources of its elements (register tiles by id, shared tiles by
    allocation dim)."""

    def __init__(self) -> None:
        self.registers: dict[int, list[set]] = {}
        self.shared: dict[int, list[set]] = {}

    def of(self, tile) -> list[frozenset]:
        if isinstance(tile, GlobalTile):
            return [Sources({Source(tile.arg.name, d.tensor_dim,
                                    (str(tile.origin[d.tensor_dim]), str(d.step), d.extent),
                                    _constant_span(tile, d))})
                    for d in tile.dims]
        if isinstance(tile, RegisterTile):
            found = self.registers.get(tile.id)
            return [Sources(s) for s in found] if found else [Sources()] * tile.rank
        if isinstance(tile, SharedTile):
            found = self.shared.get(tile.alloc.id)
            if not found:
                return [Sources()] * tile.rank
            dims = tile.permutation or tuple(range(tile.rank))
            return [Sources(found[d]) if d < len(found) else Sources() for d in dims]
        return [Sources()] * len(getattr(tile, "shape", ()))

    def add(self, tile, dims: list) -> None:
        """Record `dims` (one set per tile dim) as further sources of `tile`."""
        if isinstance(tile, RegisterTile):
            table, key, order = self.registers, tile.id, range(tile.rank)
        elif isinstance(tile, SharedTile):
            table, key = self.shared, tile.alloc.id
            order = tile.permutation or tuple(range(tile.rank))
        else:
            return
        held = table.setdefault(key, [set() for _ in range(len(tile.shape))])
        for d, sources in zip(order, dims):
            if d < len(held):
                held[d] |= sources


def _constant_span(tile: GlobalTile, dim) -> tuple | None:
    """(first, step, count) of the coordinates `dim` reads along its tensor dim, where
    they are constants and no other dim of the view walks the same tensor dim."""
    first, step, count = tile.origin[dim.tensor_dim], dim.step, dim.extent
    alone = sum(d.tensor_dim == dim.tensor_dim for d in tile.dims) == 1
    static = all(isinstance(v, int) and not isinstance(v, bool) for v in (first, step, count))
    return (first, step, count) if alone and static and step > 0 else None


def assumptions(traced: TracedKernel) -> list[Assumption]:
    """Every pair of tensor dims the kernel assumes equal (module docstring)."""
    prov = _Provenance()
    found: list[Assumption] = []
    for op in walk_ops(traced.body):
        if isinstance(op, Copy):
            prov.add(op.dst, prov.of(op.src))
        elif isinstance(op, Rearrange):
            prov.add(op.out, prov.of(op.x))
        elif isinstance(op, Reduce):
            dims = prov.of(op.x)
            prov.add(op.out, [Sources() if d == op.axis else s for d, s in enumerate(dims)])
        elif isinstance(op, Gemm):
            a, b = prov.of(op.a), prov.of(op.b)
            found += [Assumption("tg.gemm", op.loc, (x.tensor, x.dim), (y.tensor, y.dim),
                                 x.span if x.coords == y.coords else None)
                      for x in _ordered(a[1]) for y in _ordered(b[1])
                      if (x.tensor, x.dim) != (y.tensor, y.dim)]
            prov.add(op.c, [a[0], b[0]])
        elif isinstance(op, Elementwise):
            out = [set() for _ in op.out.shape]
            for tile in op.inputs:
                shift = len(op.out.shape) - len(tile.shape)
                for d, sources in enumerate(prov.of(tile)):
                    if tile.shape[d] != 1 and 0 <= d + shift < len(out):
                        out[d + shift] |= sources
            for sources in out:
                found += _same_coordinates(f"tg.{op.op}" if op.op != "cast" else ".to()",
                                           op.loc, sources)
            prov.add(op.out, out)
    unique: dict[tuple, Assumption] = {}
    for a in found:
        unique.setdefault((a.loc, frozenset((a.a, a.b)), a.span), a)
    return list(unique.values())


def _ordered(sources) -> list[Source]:
    return sorted(sources, key=lambda s: (s.tensor, s.dim, str(s.coords)))


def _same_coordinates(what: str, loc, sources) -> list[Assumption]:
    """Pairs of different tensor dims among `sources` read at the same coordinates."""
    groups: dict[tuple, set] = {}
    for s in sources:
        groups.setdefault(s.coords, set()).add(s)
    pairs = []
    for group in groups.values():
        ordered = sorted({(s.tensor, s.dim) for s in group})
        spans = {s.span for s in group}
        span = spans.pop() if len(spans) == 1 else None
        pairs += [Assumption(what, loc, ordered[0], other, span) for other in ordered[1:]]
    return pairs


def mismatch(kernel_name: str, traced: TracedKernel, shapes: dict) -> tuple[str, Any] | None:
    """(a message, the op's source location) for the first assumption these tensor
    `shapes` (each tensor's logical shape at a launch) break, or None."""
    for a in assumptions(traced):
        (ta, da), (tb, db) = a.a, a.b
        ea, eb = shapes[ta][da], shapes[tb][db]
        if a.broken_by(ea, eb):
            how = "contracts" if a.what == "tg.gemm" else "combines element by element"
            where = "" if a.span is None else \
                f" at coordinates {_describe_span(a.span)} (inside one, past the other)"
            return (f"kernel {kernel_name}: {a.what} {how} {ta}'s dim {da} (extent {ea}) with "
                    f"{tb}'s dim {db} (extent {eb}){where}, which must be equal: "
                    f"{_shapes(shapes, ta, tb)} (to use part of a tensor, pass a view of that "
                    f"part)"), a.loc
    return None


def _shapes(shapes: dict, ta: str, tb: str) -> str:
    said = f"{ta} has shape {tuple(shapes[ta])}"
    return said if ta == tb else f"{said}, {tb} has shape {tuple(shapes[tb])}"


def _describe_span(span: tuple) -> str:
    first, step, count = span
    last = first + step * (count - 1)
    return f"{first}..{last}" + (f" step {step}" if step != 1 else "")


__all__ = ["Source", "Assumption", "assumptions", "mismatch"]
