"""Address arithmetic: from tile coordinates to thread-IR index expressions.

A register tile's TV layout `L` gives, for thread `tid` and register `v`, the tile's
flat index `L(tid, v) = L_thread(tid) + L_value(v)` (a CuTe layout's value is the sum of
its modes' values), and the flat index splits into per-dim coordinates colexicographically.
`ThreadCoords` computes each thread's part once (as `Let` statements) when the value part
never carries into another digit — true for every layout synthesis builds, and checked —
so an element's coordinate is `base_d + constant`.

Global tiles turn coordinates into element indices of their tensor (origin + steps, times
the tensor's strides, with stride 1 along the contiguous dim known at compile time) and
bounds predicates; shared tiles into element offsets within their buffer through the
synthesized or pinned (possibly swizzled, possibly hierarchical within a dim) layout,
evaluated by the same `layout.swizzle.buffer_offset` synthesis costs candidates with.
"""
from __future__ import annotations

import numpy as np

from tegula.ir.scalar import (ArrivalFlag, BlockIndex, GridSize, LoopIndex, ScalarArg,
                              ScalarBinOp, ScalarConst, ScalarLoad, SMCount, TensorExtent,
                              known_non_negative, positive_constant)
from tegula.ir.values import GlobalTile, SharedTile
from tegula.layout.cute import Layout
from tegula.layout.swizzle import buffer_offset
from tegula.lower.thread_ir import (BLOCK_IDS, GRID_SIZES, NUM_SMS, TID, Const, Expr, Let,
                                    LoadScalar, Var, _bin, all_of, as_expr)

#: A kernel scalar's operator -> its index operator. The user's `//` and `%` may see
#: negative or zero operands, so they keep floor semantics (`floordiv`, `mod`) instead of
#: the C division lowering uses on its own non-negative values.
_SCALAR_OPS = {"+": "+", "-": "-", "*": "*", "//": "floordiv", "%": "mod",
               "min": "min", "max": "max"}


def scalar_expr(x) -> Expr:
    """The thread-IR expression of a block-uniform tile-IR scalar."""
    if isinstance(x, int):
        return Const(x)
    if isinstance(x, ScalarConst):
        return Const(x.value)
    if isinstance(x, BlockIndex):
        return BLOCK_IDS[x.axis]
    if isinstance(x, GridSize):
        return GRID_SIZES[x.axis]
    if isinstance(x, SMCount):
        return NUM_SMS
    if isinstance(x, (LoopIndex, ArrivalFlag)):
        return Var(x.name)
    if isinstance(x, TensorExtent):
        return Var(f"{x.tensor}_shape{x.dim}")
    if isinstance(x, ScalarArg):
        return Var(x.name)
    if isinstance(x, ScalarBinOp):
        op = _SCALAR_OPS[x.op]
        if op in ("floordiv", "mod") and known_non_negative(x.lhs) and positive_constant(x.rhs):
            op = x.op  # floor == C's truncation here: keep C's `/` (`cdiv(K, BK)`)
        return _bin(op, scalar_expr(x.lhs), scalar_expr(x.rhs))
    if isinstance(x, ScalarLoad):
        return scalar_load_expr(x)
    raise TypeError(f"not a kernel scalar: {x!r}")


def scalar_load_expr(x: ScalarLoad) -> Expr:
    """`tensor[coords]` as an index expression (thread_ir.LoadScalar)."""
    return LoadScalar(x.tensor, tuple(scalar_expr(c) for c in x.coords), x.dtype)


def condition_expr(cond) -> Expr:
    """The thread-IR predicate of a block-uniform tile-IR `Condition`."""
    from tegula.ir.scalar import Condition
    from tegula.lower.thread_ir import BinOp
    if not isinstance(cond, Condition):
        raise TypeError(f"not a kernel condition: {cond!r}")
    if cond.op == "not":
        return BinOp("==", condition_expr(cond.lhs), Const(0))
    if cond.op in ("and", "or"):
        return BinOp(cond.op, condition_expr(cond.lhs), condition_expr(cond.rhs))
    return BinOp(cond.op, scalar_expr(cond.lhs), scalar_expr(cond.rhs))


def split_index(flat: Expr | int, shape: tuple) -> list:
    """Colexicographic coordinates of a flat tile index."""
    coords = []
    for d, extent in enumerate(shape):
        coords.append(flat % extent if d < len(shape) - 1 else flat)
        flat = flat // extent
    return coords


class ThreadCoords:
    """Per-thread coordinate bases of TV layouts, bound once with `Let` and reused.

    `coords(tv, shape, v)` gives the tile coordinate (one Expr per dim) of register v.
    """

    def __init__(self) -> None:
        self.prologue: list = []
        self._bases: dict = {}

    def _base(self, tv: Layout, shape: tuple, thread: Expr) -> list | None:
        """Let-bound per-dim bases of the thread part, or None if values carry."""
        key = (str(tv), tuple(shape), str(thread))
        if key not in self._bases:
            self._bases[key] = self._make_base(tv, shape, thread) if _carry_free(tv, shape) else None
        return self._bases[key]

    def _make_base(self, tv: Layout, shape: tuple, thread: Expr) -> list:
        thread_flat = tv[0](thread)
        every_thread = tv[0].all_offsets()
        names: list = []
        for d, coord in enumerate(split_index(thread_flat, shape)):
            known = _coord(every_thread, shape, d)
            if (known == known[0]).all():  # the same in every thread (a dim held in the
                names.append(Const(int(known[0])))  # values): a constant C can fold
                continue
            var = Var(f"c{len(self._bases)}_{d}")
            self.prologue.append(Let(var, as_expr(coord)))
            names.append(var)
        return names

    def coords(self, tv: Layout, shape: tuple, value: int | Expr, thread: Expr = TID) -> list:
        """Tile coordinate of register `value` of `thread` under `tv`."""
        if isinstance(value, int) and thread is TID:
            base = self._base(tv, shape, thread)
            if base is not None:
                offsets = split_index(int(tv[1](value)), shape)
                return [b + o for b, o in zip(base, offsets)]
        return split_index(as_expr(tv[0](thread)) + as_expr(tv[1](value)), shape)


def _carry_free(tv: Layout, shape: tuple) -> bool:
    """True if coords(thread part + value part) == coords(thread part) + coords(value part)
    for every thread and value (so per-dim bases can be added)."""
    threads = tv[0].all_offsets()
    values = tv[1].all_offsets()
    total = threads[:, None] + values[None, :]
    for extent_index in range(len(shape)):
        a = _coord(total, shape, extent_index)
        b = _coord(threads, shape, extent_index)[:, None] + _coord(values, shape, extent_index)[None, :]
        if not np.array_equal(a, b):
            return False
    return True


def _coord(flat: np.ndarray, shape: tuple, dim: int) -> np.ndarray:
    for extent in shape[:dim]:
        flat = flat // extent
    return flat % shape[dim] if dim < len(shape) - 1 else flat


# --------------------------------------------------------------------------------------
# Global memory
# --------------------------------------------------------------------------------------

def global_address(view: GlobalTile, coords: list, contiguous_dim: int | None) -> tuple[Expr, Expr | None]:
    """(element index into the tensor, in-bounds predicate) of a tile coordinate."""
    tensor_coords = [scalar_expr(o) for o in view.origin]
    for k, dim in enumerate(view.dims):
        tensor_coords[dim.tensor_dim] = tensor_coords[dim.tensor_dim] + as_expr(coords[k]) * scalar_expr(dim.step)
    name = view.arg.name
    index: Expr = Const(0)
    bounds = []
    for d, c in enumerate(tensor_coords):
        stride = Const(1) if d == contiguous_dim else Var(f"{name}_stride{d}")
        index = index + c * stride
        if not _starts_in_tensor(view, d):
            # `x.tile(t, (m - 1, n))`, an int argument or a loaded offset: a coordinate
            # before the tensor's start is out of bounds too (it read memory before it).
            bounds.append(c.ge(Const(0)))
        bounds.append(c.lt(Var(f"{name}_shape{d}")))
    for d, upper in view.limits:  # where a slice narrowed the view (`a[start:end]`)
        bounds.append(tensor_coords[d].lt(scalar_expr(upper)))
    return index, all_of(bounds)


def _starts_in_tensor(view: GlobalTile, tensor_dim: int) -> bool:
    """True if every coordinate of `view` along `tensor_dim` is known to be >= 0: its
    origin there is (block and loop indices, extents, their sums and products) and its
    steps are, so the tile coordinates (>= 0) only add to it."""
    return known_non_negative(view.origin[tensor_dim]) and all(
        known_non_negative(dim.step) for dim in view.dims if dim.tensor_dim == tensor_dim)


# --------------------------------------------------------------------------------------
# Shared memory
# --------------------------------------------------------------------------------------

def alloc_coords(tile: SharedTile, coords: list) -> list:
    """Buffer coordinates of a (possibly transposed) shared tile view's coordinate."""
    if not tile.permutation:
        return list(coords)
    result = [None] * len(coords)
    for k, alloc_dim in enumerate(tile.permutation):
        result[alloc_dim] = coords[k]
    return result


def shared_offset(tile: SharedTile, coords: list) -> Expr:
    """Element offset within the buffer of a shared tile view's coordinate (stage included)."""
    buffer_coords = [as_expr(c) for c in alloc_coords(tile, coords)]
    offset = as_expr(buffer_offset(tile.alloc.layout, buffer_coords))
    stage_elems = int(np.prod(tile.alloc.shape))
    if tile.alloc.stages > 1:
        # The stage is a loop index (or an expression of one): C's `%` equals the floor
        # modulo the emulator computes only where it is known non-negative.
        mod = "%" if known_non_negative(tile.stage) else "mod"
        stage = _bin(mod, scalar_expr(tile.stage), Const(tile.alloc.stages))
        offset = offset + stage * stage_elems
    return offset


def replica_predicate(tv: Layout, thread: Expr = TID) -> Expr | None:
    """True for exactly one thread of each group holding the same elements: the one whose
    coordinate is 0 along every stride-0 (broadcast) sub-mode of the thread mode."""
    conds = []
    owners = np.ones(tv[0].size, dtype=bool)
    tids = np.arange(tv[0].size)
    prefix = 1
    for extent, stride in zip(tv[0].flat_shape, tv[0].flat_stride):
        if stride == 0 and extent > 1:
            conds.append(((thread // prefix) % extent).eq(0))
            owners &= (tids // prefix) % extent == 0
        prefix *= extent
    _check_one_writer(tv, owners)
    return all_of(conds)


def _check_one_writer(tv: Layout, owners: np.ndarray) -> None:
    """The owners must hold every element exactly once between them: a layout that
    replicates data other than through stride-0 thread modes would otherwise be written
    twice (a race) or not at all. Loud rather than silently wrong."""
    from tegula.errors import SynthesisError
    from tegula.layout.tv import tv_table
    table = tv_table(tv)
    held = [np.unique(row) for row in table[owners]]
    written = np.concatenate(held) if held else np.zeros(0, dtype=np.int64)
    if len(np.unique(written)) != len(written) or \
            not np.array_equal(np.unique(written), np.unique(table)):
        raise SynthesisError(f"internal: the thread-value layout {tv} replicates elements in "
                             f"a way the replica predicate cannot single out (each element "
                             f"needs exactly one writer)")
