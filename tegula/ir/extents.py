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
    """Tile dim elements loaded along `tensor`'s dim `dim`, at coordinates `coords`."""

    tensor: str
    dim: int
    coords: tuple


@dataclass(frozen=True)
class Assumption:
    """`what` at `loc` assumes tensor `a[0]`'s dim `a[1]` and `b[0]`'s `b[1]` are equal."""

    what: str
    loc: Any
    a: tuple[str, int]
    b: tuple[str, int]


class _Provenance:
    """Per tile dim, the sources of its elements (register tiles by id, shared tiles by
    allocation dim)."""

    def __init__(self) -> None:
        self.registers: dict[int, list[set]] = {}
        self.shared: dict[int, list[set]] = {}

    def of(self, tile) -> list[frozenset]:
        if isinstance(tile, GlobalTile):
            return [Sources({Source(tile.arg.name, d.tensor_dim,
                                    (str(tile.origin[d.tensor_dim]), str(d.step), d.extent))})
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
            found += [Assumption("tg.gemm", op.loc, x, y)
                      for x in sorted({(s.tensor, s.dim) for s in a[1]})
                      for y in sorted({(s.tensor, s.dim) for s in b[1]}) if x != y]
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
        unique.setdefault((a.loc, frozenset((a.a, a.b))), a)
    return list(unique.values())


def _same_coordinates(what: str, loc, sources) -> list[Assumption]:
    """Pairs of different tensor dims among `sources` read at the same coordinates."""
    groups: dict[tuple, set] = {}
    for s in sources:
        groups.setdefault(s.coords, set()).add((s.tensor, s.dim))
    pairs = []
    for dims in groups.values():
        ordered = sorted(dims)
        pairs += [Assumption(what, loc, ordered[0], other) for other in ordered[1:]]
    return pairs


def mismatch(kernel_name: str, traced: TracedKernel, shapes: dict) -> tuple[str, Any] | None:
    """(a message, the op's source location) for the first assumption these tensor
    `shapes` (each tensor's logical shape at a launch) break, or None."""
    for a in assumptions(traced):
        (ta, da), (tb, db) = a.a, a.b
        ea, eb = shapes[ta][da], shapes[tb][db]
        if ea != eb:
            how = "contracts" if a.what == "tg.gemm" else "combines element by element"
            return (f"kernel {kernel_name}: {a.what} {how} {ta}'s dim {da} (extent {ea}) with "
                    f"{tb}'s dim {db} (extent {eb}), which must be equal: {ta} has shape "
                    f"{tuple(shapes[ta])}, {tb} has shape {tuple(shapes[tb])} (to use part "
                    f"of a tensor, pass a view of that part)"), a.loc
    return None


__all__ = ["Source", "Assumption", "assumptions", "mismatch"]
