"""Whether the iterations of a persistent kernel's tile loop touch global memory apart.

Ping-pong (`synth/roles.py`) gives two consumer warpgroups alternate iterations of the
tile loop around a pipeline, with no order between one's epilogue and the other's. That
is right only where no two iterations store to one global element, and no iteration
reads what another stored. `global_dependence` proves both or says why it cannot:

* **Stores apart.** Each store's tile origin is decomposed per tensor dim into
  `S * q + r`, `r` the same in every iteration and `S` at least the tile's extent there
  (`_grid_index`), so tiles with different grid indices `q` are disjoint. The stores are
  apart if the tile loop's index can be recovered from the grid indices
  (`_recovers_index`): through `+`/`-` of loop-invariant terms, `*` by a non-zero factor
  (a non-zero constant, the grid size, the SM count), the pair `e // W`, `e % W` (`e` is
  `W * (e // W) + e % W` for any W, 0 included under the run-time `//` and `%`), and the
  library's grouped tile order (`tegula.kernels.schedule.grouped_tile`, one-to-one on
  `[0, X * Y)` where the loop provably stays). `t % 4`, `t // 2` or an index table
  `idx[t]` recover nothing: refused.
* **One tile per tensor.** Several stores to one tensor must address the same tile (the
  same origin and shape); a read of a tensor the loop stores to must read exactly that
  tile (its own iteration's, in program order); atomics to a tensor the loop also reads
  are refused alike (another iteration's adds land in no order with the read), and so is
  a tile addressed through an index table the loop writes.

Conservative by design: what is not proven is refused (cooperative consumers), with the
reason `tegula explain` prints. Run-time aliasing of two tensor arguments is not seen
(the emulator's global race check catches a block's races, `emulate/global_races.py`).
"""
from __future__ import annotations

from tegula.ir.ops import AtomicAdd, Copy, ForLoop, walk_ops
from tegula.ir.scalar import (BlockIndex, GridSize, LoopIndex, ScalarArg, ScalarBinOp,
                              ScalarConst, ScalarLoad, SMCount, TensorExtent,
                              known_non_negative, scalar_op)
from tegula.ir.values import GlobalTile, describe


def key(x) -> tuple:
    """A hashable structural key of a kernel scalar (Scalars compare by identity)."""
    if isinstance(x, int):
        return ("const", x)
    if isinstance(x, ScalarConst):
        return ("const", x.value)
    if isinstance(x, ScalarBinOp):
        return ("op", x.op, key(x.lhs), key(x.rhs))
    if isinstance(x, ScalarLoad):
        return ("load", x.tensor, tuple(key(c) for c in x.coords))
    if isinstance(x, LoopIndex):
        return ("loop", x.name)
    if isinstance(x, (BlockIndex, GridSize)):
        return (type(x).__name__, x.axis)
    if isinstance(x, TensorExtent):
        return ("extent", x.tensor, x.dim)
    if isinstance(x, ScalarArg):
        return ("arg", x.name)
    if isinstance(x, SMCount):
        return ("sms",)
    return ("other", id(x))


def _indices(x) -> set:
    """Names of the loop indices a kernel scalar reads (index tables' coordinates too)."""
    if isinstance(x, LoopIndex):
        return {x.name}
    if isinstance(x, ScalarBinOp):
        return _indices(x.lhs) | _indices(x.rhs)
    if isinstance(x, ScalarLoad):
        return set().union(*(_indices(c) for c in x.coords))
    return set()


def _positive_count(x, cluster: tuple) -> bool:
    """Known to be >= 1 whenever the kernel runs: the grid size and the SM count, and the
    grid size over a constant dividing the cluster's extent along its axis (a launch has
    whole clusters)."""
    if isinstance(x, (GridSize, SMCount)):
        return True
    return (isinstance(x, ScalarBinOp) and x.op == "//" and isinstance(x.lhs, GridSize)
            and isinstance(x.rhs, ScalarConst) and x.rhs.value >= 1
            and tuple(cluster)[x.lhs.axis] % x.rhs.value == 0)


def _tables(x) -> set:
    """Names of the tensors a kernel scalar loads from (index tables)."""
    if isinstance(x, ScalarBinOp):
        return _tables(x.lhs) | _tables(x.rhs)
    if isinstance(x, ScalarLoad):
        return {x.tensor}.union(*(_tables(c) for c in x.coords))
    return set()


def _nonzero(x, cluster: tuple) -> bool:
    """Known to be non-zero whenever the kernel runs."""
    if isinstance(x, (int, ScalarConst)):
        return (x.value if isinstance(x, ScalarConst) else x) != 0
    return _positive_count(x, cluster)


class _TileLoop:
    """The tile loop's index and what varies between (or within) its iterations."""

    def __init__(self, loop: ForLoop, cluster: tuple):
        self.loop, self.cluster = loop, tuple(cluster) + (1,) * (3 - len(cluster))
        self.varying = {loop.var.name} | {op.var.name for op in walk_ops(loop.body)
                                          if isinstance(op, ForLoop)}

    def invariant(self, x) -> bool:
        return not (_indices(x) & self.varying)

    def below(self, x, bound) -> bool:
        """x (an index the body sees) is provably in [0, bound) in every iteration: x is
        the loop's index (constant step) or `start + i * step` (run-time step, which
        `tg.range` gives a trip count of max(0, -((start - stop) // step)), `step` >= 1)."""
        loop = self.loop
        if isinstance(x, LoopIndex) and x.name == loop.var.name:
            return loop.step > 0 and known_non_negative(loop.start) and \
                key(loop.stop) == key(bound)
        if not (isinstance(x, ScalarBinOp) and x.op == "+" and isinstance(x.rhs, ScalarBinOp)
                and x.rhs.op == "*" and key(x.rhs.lhs) == key(loop.var)):
            return False
        start, step = x.lhs, x.rhs.rhs
        trips = scalar_op("max", 0, scalar_op("-", 0, scalar_op(
            "//", scalar_op("-", start, bound), step)))
        # A step not known non-zero at trace time is counted with a factor min(1, |step|).
        nonzero = scalar_op("min", 1, scalar_op("max", step, scalar_op("-", 0, step)))
        return (_positive_count(step, self.cluster) and known_non_negative(start)
                and key(loop.start) == key(0)
                and key(loop.stop) in (key(trips), key(scalar_op("*", trips, nonzero))))


def _grid_index(origin, span: int | None, tl: _TileLoop):
    """The grid index q of a tile origin `S * q + r` (r invariant, S >= span), or None."""
    if span is None or tl.invariant(origin):
        return None
    e, scale = origin, 1
    while isinstance(e, ScalarBinOp):
        if e.op in ("+", "-") and tl.invariant(e.rhs):
            e = e.lhs
        elif e.op in ("+", "-") and tl.invariant(e.lhs):
            e = e.rhs
        elif e.op == "*" and isinstance(e.rhs, ScalarConst) and e.rhs.value != 0:
            scale, e = scale * abs(e.rhs.value), e.lhs
        elif e.op == "*" and isinstance(e.lhs, ScalarConst) and e.lhs.value != 0:
            scale, e = scale * abs(e.lhs.value), e.rhs
        else:
            break
    return e if scale >= span else None


def _grouped_index(n, known: dict, tl: _TileLoop):
    """The index x if `n` is the column of `grouped_tile(x, X, Y, g)` whose row is known
    too and x provably stays in [0, X * Y) (where the map is one-to-one), else None."""
    if not (isinstance(n, ScalarBinOp) and n.op == "//" and isinstance(n.lhs, ScalarBinOp)
            and n.lhs.op == "%" and isinstance(n.rhs, ScalarBinOp) and n.rhs.op == "min"
            and isinstance(n.rhs.rhs, ScalarConst) and isinstance(n.rhs.lhs, ScalarBinOp)
            and n.rhs.lhs.op == "-"):
        return None
    x, per_band, g, X = n.lhs.lhs, n.lhs.rhs, n.rhs.rhs.value, n.rhs.lhs.lhs
    if g < 1:
        return None
    if g == 1:
        Y = per_band
    elif isinstance(per_band, ScalarBinOp) and per_band.op == "*" and \
            key(per_band.lhs) == key(g):
        Y = per_band.rhs
    else:
        return None
    band = scalar_op("//", x, per_band)
    first = scalar_op("*", band, g)
    rows = scalar_op("min", scalar_op("-", X, first), g)
    within = scalar_op("%", x, per_band)
    m = scalar_op("+", first, scalar_op("%", within, rows))
    if key(scalar_op("//", within, rows)) != key(n) or key(m) not in known:
        return None
    if not (tl.invariant(X) and tl.invariant(Y) and tl.below(x, scalar_op("*", X, Y))):
        return None
    return x


def _recovers_index(grid: list, tl: _TileLoop) -> bool:
    """Whether the tile loop's index is a function of the grid indices (module
    docstring): then distinct iterations have distinct tiles."""
    known = {key(q): q for q in grid}
    target = key(tl.loop.var)
    grew = True
    while grew and target not in known:
        grew = False
        for e in list(known.values()):
            for found in _recovered_from(e, known, tl):
                if key(found) not in known:
                    known[key(found)] = found
                    grew = True
    return target in known


def _recovered_from(e, known: dict, tl: _TileLoop):
    if not isinstance(e, ScalarBinOp):
        return
    if e.op in ("+", "-"):
        if tl.invariant(e.rhs):
            yield e.lhs
        if tl.invariant(e.lhs):
            yield e.rhs
    elif e.op == "*":
        if _nonzero(e.rhs, tl.cluster) and tl.invariant(e.rhs):
            yield e.lhs
        if _nonzero(e.lhs, tl.cluster) and tl.invariant(e.lhs):
            yield e.rhs
    elif e.op in ("//", "%"):
        partner = ("op", "%" if e.op == "//" else "//", key(e.lhs), key(e.rhs))
        if tl.invariant(e.rhs) and partner in known:
            yield e.lhs
        x = _grouped_index(e, known, tl) if e.op == "//" else None
        if x is not None:
            yield x


def _spans(tile: GlobalTile) -> dict | None:
    """Elements each tensor dim of the tile covers (None: a run-time extent or step)."""
    spans: dict = {}
    for d in tile.dims:
        if not (isinstance(d.extent, int) and isinstance(d.step, int)):
            return None
        spans[d.tensor_dim] = spans.get(d.tensor_dim, 0) + (d.extent - 1) * abs(d.step)
    return {k: v + 1 for k, v in spans.items()}


def _tile_key(tile: GlobalTile) -> tuple:
    return (tuple(key(c) for c in tile.origin),
            tuple((d.tensor_dim, key(d.extent), key(d.step)) for d in tile.dims))


def _line(op) -> str:
    return str(op.loc.lineno) if op.loc else "?"


def _stores_apart(op: Copy, tl: _TileLoop) -> bool:
    spans = _spans(op.dst) or {}
    grid = [q for d, c in enumerate(op.dst.origin)
            if (q := _grid_index(c, spans.get(d), tl)) is not None]
    return _recovers_index(grid, tl)


def global_dependence(tile_loop: ForLoop, cluster: tuple = (1, 1, 1)) -> str:
    """Why two iterations of `tile_loop` may touch one global element, one of them
    storing ("" where the module docstring's rules prove they cannot); `cluster`: the
    kernel's."""
    tl = _TileLoop(tile_loop, cluster)
    inside = list(walk_ops(tile_loop.body))
    stores = [op for op in inside if isinstance(op, Copy) and isinstance(op.dst, GlobalTile)]
    adds = [op for op in inside if isinstance(op, AtomicAdd) and isinstance(op.dst, GlobalTile)]
    stored: dict = {}
    for op in stores:
        name = op.dst.arg.name
        if name in stored and _tile_key(stored[name].dst) != _tile_key(op.dst):
            return (f"the stores to {name} at lines {_line(stored[name])} and {_line(op)} "
                    f"address different tiles, which two iterations of the tile loop may "
                    f"both reach (ping-pong would not order them)")
        stored.setdefault(name, op)
        if not _stores_apart(op, tl):
            return (f"the store to {describe(op.dst)} (line {_line(op)}) is not shown to "
                    f"reach a different tile in every iteration of the tile loop (a tile "
                    f"map like t % 4 or t // 2, or an index table, may send two iterations "
                    f"to one tile, whose last write ping-pong would not order)")
    added = {op.dst.arg.name: op for op in adds}
    for op in inside:
        for tile in [t for t in (getattr(op, "src", None), getattr(op, "dst", None))
                     if isinstance(t, GlobalTile)]:
            for name in set().union(*(_tables(c) for c in tile.origin)) & (set(stored) |
                                                                           set(added)):
                return (f"{describe(tile)} (line {_line(op)}) is addressed through "
                        f"{name}, which the tile loop also writes: an iteration may read an "
                        f"entry another wrote, in no order under ping-pong")
    for op in inside:
        if not (isinstance(op, Copy) and isinstance(op.src, GlobalTile)):
            continue
        name = op.src.arg.name
        if name in added:
            return (f"the load of {describe(op.src)} (line {_line(op)}) reads {name}, which "
                    f"the tile loop also adds to atomically (line {_line(added[name])}): "
                    f"another iteration's adds would land in no order with it")
        if name in stored and _tile_key(stored[name].dst) != _tile_key(op.src):
            return (f"the load of {describe(op.src)} (line {_line(op)}) reads {name}, which "
                    f"the tile loop stores to (line {_line(stored[name])}), not only the "
                    f"tile its own iteration stores: it may read what an earlier iteration "
                    f"wrote, which ping-pong's other warpgroup writes in no order with it")
    return ""


__all__ = ["global_dependence", "key"]
