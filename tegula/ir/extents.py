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
* an element-wise op two of whose inputs were loaded from *the same coordinates* (the
  same origin expression, step and tile extent) along a dim of two different tensors
  reads `x[i]` and `y[i]` together: those tensor dims must have equal extents. Broadcast
  dims (extent 1) assume nothing; neither do tiles of different coordinates, nor the
  sources of one input (a shared tile written from x, later from y, holds one of them).

Where the coordinates are constants (`x.tile((16, 16), (1, 0))`), the elements read are
known, and an assumption is broken only if the mask differs on one of them: some element
read lies inside one tensor's extent and past the other's. A constant tile inside both
tensors (or past both) reads the same either way, so extents may differ there; this is
what lets a kernel combine `s.T` (x's top block, transposed) with x's next block.

Provenance flows through copies (global → shared → registers), casts and element-wise
ops, conversions, scans (`tg.scan`/`tg.cumsum`: their tiles are combined element by
element too), permutes and reshapes that only add or drop size-1 dims, bitcasts, and gemm
results (c's rows from a, its columns from b); a reduction drops the reduced dim; anything
else (index tiles, reshapes that merge or split dims) has no provenance and so assumes
nothing. The workaround for a kernel that means
to read only part of a tensor is to pass a view of that part (`y[:, :n]`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tegula.ir.ops import (Bitcast, Copy, Elementwise, ForLoop, Gemm, IfThen, Rearrange,
                           Reduce, Reshape, Scan, TracedKernel)
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

    def write(self, tile, dims: list) -> None:
        """A copy into `tile`: a single-stage shared buffer written whole now holds only
        what was copied (the sources of an earlier write are gone); anything else adds."""
        if isinstance(tile, SharedTile) and tile.alloc.stages == 1 and \
                sorted(tile.shape) == sorted(tile.alloc.shape):
            self.shared.pop(tile.alloc.id, None)
        self.add(tile, dims)

    def copy(self) -> "_Provenance":
        other = _Provenance()
        for mine, theirs in ((self.registers, other.registers), (self.shared, other.shared)):
            theirs.update({key: [set(s) for s in dims] for key, dims in mine.items()})
        return other

    def join(self, other: "_Provenance") -> None:
        """What either of two control paths left (a branch's arms, a loop's trips)."""
        for mine, theirs in ((self.registers, other.registers), (self.shared, other.shared)):
            for key, dims in theirs.items():
                held = mine.setdefault(key, [set() for _ in dims])
                for d, sources in enumerate(dims):
                    held[d] |= sources

    def __eq__(self, other) -> bool:
        return (self.registers, self.shared) == (other.registers, other.shared)


def _constant_span(tile: GlobalTile, dim) -> tuple | None:
    """(first, step, count) of the coordinates `dim` reads along its tensor dim, where
    they are constants and no other dim of the view walks the same tensor dim."""
    first, step, count = tile.origin[dim.tensor_dim], dim.step, dim.extent
    alone = sum(d.tensor_dim == dim.tensor_dim for d in tile.dims) == 1
    static = all(isinstance(v, int) and not isinstance(v, bool) for v in (first, step, count))
    return (first, step, count) if alone and static and step > 0 else None


def assumptions(traced: TracedKernel) -> list[Assumption]:
    """Every pair of tensor dims the kernel assumes equal (module docstring)."""
    found: list[Assumption] = []
    _walk(traced.body, _Provenance(), found)
    unique: dict[tuple, Assumption] = {}
    for a in found:
        unique.setdefault((a.loc, frozenset((a.a, a.b)), a.span), a)
    return list(unique.values())


def _ordered(sources) -> list[Source]:
    return sorted(sources, key=lambda s: (s.tensor, s.dim, str(s.coords)))


def _walk(ops: list, prov: _Provenance, found: list) -> None:
    """Follow provenance through `ops` in program order: a branch's arms each from the
    state before it, then joined; a loop's body from what the trips before it left, until
    that stops growing (a later trip reads what an earlier one wrote)."""
    for op in ops:
        if isinstance(op, ForLoop):
            entry = prov.copy()
            while True:
                after = entry.copy()
                _walk(op.body, after, found)
                after.join(entry)
                if after == entry:
                    break
                entry = after
            prov.join(entry)
        elif isinstance(op, IfThen):
            otherwise = prov.copy()
            _walk(op.then, prov, found)
            _walk(op.otherwise, otherwise, found)
            prov.join(otherwise)
        else:
            _visit(op, prov, found)


def _visit(op, prov: _Provenance, found: list) -> None:
    """One op's sources and the assumptions it makes."""
    if isinstance(op, Copy):
        prov.write(op.dst, prov.of(op.src))
    elif isinstance(op, Rearrange):
        prov.add(op.out, prov.of(op.x))
    elif isinstance(op, Reshape):
        prov.add(op.out, _reshaped(prov.of(op.x), op.x.shape, op.order, op.out.shape))
    elif isinstance(op, Bitcast):  # the same shape, or 32-bit to 16-bit: a last dim of 2
        dims = prov.of(op.x)
        prov.add(op.out, dims if len(op.out.shape) == len(dims) else dims + [set()])
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
        inputs = [_out_dims(prov.of(tile), tile.shape, len(op.out.shape))
                  for tile in op.inputs]
        found += _combined(f"tg.{op.op}" if op.op != "cast" else ".to()", op.loc, inputs)
        prov.add(op.out, [set().union(*(dims[d] for dims in inputs))
                          for d in range(len(op.out.shape))])
    elif isinstance(op, Scan):
        # The scanned tiles (and initials) are combined element by element, each out
        # element from the elements before it along the axis: an element-wise op whose
        # output keeps every dim's sources; the carries (extent 1 along the axis) none
        # along it.
        rank = len(op.outs[0].shape)
        inputs = [_out_dims(prov.of(tile), tile.shape, rank) for tile in op.xs + op.initials]
        found += _combined("tg.scan", op.loc, inputs)
        dims = [set().union(*(sources[d] for sources in inputs)) for d in range(rank)]
        for out in op.outs:
            prov.add(out, dims)
        for carry in op.carries:
            prov.add(carry, [set() if d == op.axis else s for d, s in enumerate(dims)])


def _reshaped(dims: list, shape: tuple, order: tuple, out_shape: tuple) -> list:
    """Sources of a `Reshape`'s output dims: `x`'s, transposed by `order`, where only
    size-1 dims come and go (each other dim keeps its extent and place); none where dims
    merge or split (their elements mix coordinates of several tensor dims)."""
    kept = [(shape[i], dims[i]) for i in order if shape[i] != 1]
    places = [i for i, extent in enumerate(out_shape) if extent != 1]
    out: list = [set() for _ in out_shape]
    if [extent for extent, _ in kept] == [out_shape[i] for i in places]:
        for (_, sources), i in zip(kept, places):
            out[i] = set(sources)
    return out


def _out_dims(dims: list, shape: tuple, rank: int) -> list[set]:
    """An input's sources per output dim (broadcast dims, extent 1, bring none)."""
    out: list[set] = [set() for _ in range(rank)]
    shift = rank - len(shape)
    for d, sources in enumerate(dims):
        if shape[d] != 1 and 0 <= d + shift < rank:
            out[d + shift] |= sources
    return out


def _combined(what: str, loc, inputs: list) -> list[Assumption]:
    """Pairs of different tensor dims that two *different* inputs read at the same
    coordinates along one output dim. (One input's sources are alternatives — a shared
    tile written from x, later from y — never combined with each other.)"""
    pairs = []
    for d in range(len(inputs[0]) if inputs else 0):
        for i, first in enumerate(inputs):
            for second in inputs[i + 1:]:
                for x in _ordered(first[d]):
                    for y in _ordered(second[d]):
                        if x.coords == y.coords and (x.tensor, x.dim) != (y.tensor, y.dim):
                            a, b = sorted(((x.tensor, x.dim), (y.tensor, y.dim)))
                            span = x.span if x.span == y.span else None
                            pairs.append(Assumption(what, loc, a, b, span))
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
