"""The handles a kernel body holds: global tensors and views, shared buffers, register tiles.

Handles are thin wrappers around tile IR values (`handle.ir`). They exist only during
tracing and give the user Python syntax — `a.tile(...)`, `ga[:, :, k]`, `sa[k]`, `x * y`,
`x.to(f16)` — while the traced kernel holds nothing but IR objects. Keeping the operators
off the IR classes matters: synthesis keys dicts by tiles and compares them by identity,
which an overloaded `==` would break.
"""
from __future__ import annotations

import operator
from typing import Any

from tegula.dtypes import DType
from tegula.errors import TraceError
from tegula.ir.scalar import Scalar, cdiv, constant_value
from tegula.ir.values import (GlobalArg, GlobalTile, RegisterTile, SharedAlloc, SharedTile,
                              Tile, ViewDim, describe)
from tegula.lang.trace import current, fail, user_location


# -- shapes ---------------------------------------------------------------------------------
def static_shape(shape: Any, op: str) -> tuple[int, ...]:
    """`shape` as a tuple of positive ints, or a TraceError saying why it is not one."""
    if not isinstance(shape, (tuple, list)):
        shape = (shape,)
    out = []
    for extent in shape:
        if isinstance(extent, Scalar):
            raise fail(op, f"tile shape {shape_text(shape)} has the run-time value {extent}; "
                           f"tile shapes must be known at trace time (use tg.constexpr)")
        try:
            value = operator.index(extent)
        except TypeError:
            raise fail(op, f"tile shape {shape_text(shape)} must hold integers, "
                           f"got {extent!r}") from None
        if isinstance(extent, bool) or value <= 0:
            raise fail(op, f"tile shape {shape_text(shape)} must hold positive integers")
        out.append(value)
    if not out:
        raise fail(op, "a tile needs at least one dimension")
    return tuple(out)


def shape_text(shape: Any) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def same_extent(a: Any, b: Any) -> bool:
    """Equal extents: equal ints, or the same run-time expression."""
    ca, cb = constant_value(a), constant_value(b)
    if ca is not None or cb is not None:
        return ca == cb
    return a is b or str(a) == str(b)


def same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(same_extent(x, y) for x, y in zip(a, b))


def index_value(x: Any, op: str, what: str):
    """An int or Scalar usable as an index / coordinate, else a TraceError."""
    if isinstance(x, Scalar):
        return x
    if not isinstance(x, bool):
        try:
            return operator.index(x)
        except TypeError:
            pass
    raise fail(op, f"{what} must be an integer or a kernel scalar (tg.block_id, a loop "
                   f"index, a tensor extent), got {x!r}")


# -- handle base ----------------------------------------------------------------------------
class TileHandle:
    """What every handle shares: the IR tile behind it (each subclass's `ir` property),
    its shape and element type."""

    ir: Tile  # provided by every subclass as a property
    # Kernel scalars leave their operators to tiles (`n < cols`): see ir.scalar._with_tile.
    __tegula_tile__ = True

    @property
    def shape(self) -> tuple:
        return tuple(self.ir.shape)

    @property
    def dtype(self) -> DType:
        return self.ir.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return describe(self.ir)

    def __bool__(self) -> bool:
        raise fail("bool()", f"{describe(self.ir)} is a tile whose values are known only when "
                             f"the kernel runs; Python `if` cannot test it (use tg.where)")

    __hash__ = object.__hash__


def as_tile(x: Any, op: str, what: str = "operand") -> Tile:
    """The IR tile behind a handle, or a TraceError naming what was passed instead."""
    if isinstance(x, TileHandle):
        return x.ir
    if isinstance(x, Tile):
        return x
    raise fail(op, f"{what} must be a tile (a global view, a shared tile or a register tile), "
                   f"got {type(x).__name__} {x!r}")


# -- global memory --------------------------------------------------------------------------
class GlobalView(TileHandle):
    """A strided view of a global tensor (`GlobalTile`): pure address arithmetic."""

    def __init__(self, tile: GlobalTile):
        self._tile = tile

    @property
    def ir(self) -> GlobalTile:
        return self._tile

    def _derive(self, origin: list, dims: list, limits: tuple | None = None) -> GlobalView:
        arg = self._tile.arg
        tile = GlobalTile(dtype=arg.dtype, shape=tuple(d.extent for d in dims),
                          name=current("a global view").fresh_name(f"{arg.name}."),
                          loc=user_location(), arg=arg, origin=tuple(origin), dims=tuple(dims),
                          limits=self._tile.limits if limits is None else limits)
        return GlobalView(tile)

    def _narrowed(self, limits: tuple, tensor_dim: int, bound: Any) -> tuple:
        """`limits` with tensor dim `tensor_dim` also bounded by `bound` (exclusive)."""
        from tegula.lang.scalars import scalar_extremum
        old = dict(limits)
        if tensor_dim in old:
            bound = scalar_extremum("min", old[tensor_dim], bound)
        old[tensor_dim] = bound
        return tuple(sorted(old.items()))

    def tile(self, tile_shape: Any, coord: Any = None) -> GlobalView:
        """Cut the view into tiles of `tile_shape`. Per dim, `coord` is a tile index (the
        view starts at `coord * tile` along it) or None (the dim is split: a tile-sized dim
        here plus a new trailing dim of `cdiv(extent, tile)` tiles)."""
        op = "tile()"
        sizes = static_shape(tile_shape, op)
        if len(sizes) != self.rank:
            raise fail(op, f"{describe(self.ir)} has {self.rank} dims but the tile shape "
                           f"{shape_text(sizes)} has {len(sizes)}")
        coords = (None,) * self.rank if coord is None else coord
        if not isinstance(coords, (tuple, list)):
            coords = (coords,)
        if len(coords) != self.rank:
            raise fail(op, f"{describe(self.ir)} has {self.rank} dims but the tile coordinate "
                           f"has {len(coords)} entries (use None for a dim to split)")
        origin = list(self._tile.origin)
        dims, trailing = [], []
        for dim, size, c in zip(self._tile.dims, sizes, coords):
            dims.append(ViewDim(dim.tensor_dim, size, dim.step))
            if c is None:
                trailing.append(ViewDim(dim.tensor_dim, cdiv(dim.extent, size), size * dim.step))
            else:
                c = index_value(c, op, "a tile coordinate")
                origin[dim.tensor_dim] = origin[dim.tensor_dim] + c * (size * dim.step)
        return self._derive(origin, dims + trailing)

    def __getitem__(self, index: Any) -> GlobalView:
        """`view[:, :, k]`: an index removes its dim (moving the origin); `a:b` narrows it."""
        op = "view[...]"
        items = self._expand_index(index, op)
        origin = list(self._tile.origin)
        dims, limits = [], self._tile.limits
        for dim, item in zip(self._tile.dims, items):
            td = dim.tensor_dim
            if isinstance(item, slice):
                if item.step not in (None, 1):
                    raise fail(op, "slices of a global view cannot have a step")
                start = 0 if item.start is None else index_value(item.start, op, "a start")
                stop = dim.extent if item.stop is None else index_value(item.stop, op, "a stop")
                for name, bound in (("start", start), ("stop", stop)):
                    if isinstance(bound, int) and bound < 0:
                        # Python counts these from the end; tegula's count from the
                        # tensor's start (a negative one reaches before it): say so.
                        raise fail(op, f"slice {name} {bound} is negative: a view's slice "
                                       f"bounds count from the start of the dim, not from "
                                       f"its end; write the bound from the dim's extent "
                                       f"(view.shape[d] - {-bound} for dim d)")
                if item.stop is not None:
                    # Tiles cut from this view may reach past `stop` (a partial last
                    # tile): those elements must be out of bounds, as past the tensor's end.
                    limits = self._narrowed(limits, td, origin[td] + stop * dim.step)
                origin[td] = origin[td] + start * dim.step
                dims.append(ViewDim(td, stop - start, dim.step))
                continue
            k = index_value(item, op, "an index")
            extent = constant_value(dim.extent)
            if isinstance(k, int) and (k < 0 or (extent is not None and k >= extent)):
                raise fail(op, f"index {k} is outside dim of extent {dim.extent} of "
                               f"{describe(self.ir)}")
            origin[td] = origin[td] + k * dim.step
        if not dims:  # every dim indexed: one element, loaded as a kernel scalar
            from tegula.lang.scalars import scalar_load
            return scalar_load(self, origin)
        return self._derive(origin, dims, limits)

    def _expand_index(self, index: Any, op: str) -> list:
        items = list(index) if isinstance(index, tuple) else [index]
        if sum(1 for i in items if i is Ellipsis) > 1:
            raise fail(op, "at most one ... in an index")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items[at:at + 1] = [slice(None)] * (self.rank - len(items) + 1)
        if len(items) > self.rank:
            raise fail(op, f"{len(items)} indices for {describe(self.ir)} of rank {self.rank}")
        if any(i is None for i in items):
            raise fail(op, "None (new axis) is not supported when indexing a global view")
        return items + [slice(None)] * (self.rank - len(items))

    def transpose(self, *perm: int) -> GlobalView:
        """The same elements with dims reordered (`perm` defaults to reversing them)."""
        perm = _check_perm(perm, self.rank, "transpose()")
        dims = [self._tile.dims[p] for p in perm]
        return self._derive(list(self._tile.origin), dims)

    @property
    def T(self) -> GlobalView:
        return self.transpose()


class GlobalTensor(GlobalView):
    """A global tensor argument of the kernel; as a view it covers the whole tensor."""

    def __init__(self, arg: GlobalArg, tile: GlobalTile):
        super().__init__(tile)
        self.arg = arg

    def view(self) -> GlobalView:
        """The whole tensor as a view (the handle itself already is one)."""
        return self


def whole_tensor_tile(arg: GlobalArg, extents: tuple, loc) -> GlobalTile:
    """The identity view of a global argument: tile coordinate = tensor coordinate."""
    dims = tuple(ViewDim(d, extents[d], 1) for d in range(arg.rank))
    return GlobalTile(dtype=arg.dtype, shape=tuple(extents), name=arg.name, loc=loc, arg=arg,
                      origin=(0,) * arg.rank, dims=dims)


def _check_perm(perm: tuple, rank: int, op: str) -> tuple[int, ...]:
    if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
        perm = tuple(perm[0])
    if not perm:
        return tuple(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        raise fail(op, f"{tuple(perm)} is not a permutation of the {rank} dims")
    return tuple(perm)


# -- shared memory --------------------------------------------------------------------------
#: Why `buf[0:8, :]` is refused: a part of a stage has no shared layout of its own.
_SHARED_UNSLICEABLE = ("is used whole by tg.copy, tg.load and tg.gemm and cannot be sliced; "
                       "slice the global view before copying it in, or allocate a shared "
                       "buffer of the part's shape")

class SharedView(TileHandle):
    """One stage of a shared buffer (`SharedTile`), possibly with permuted dims."""

    def __init__(self, tile: SharedTile):
        self._tile = tile

    @property
    def ir(self) -> SharedTile:
        return self._tile

    def transpose(self, *perm: int) -> SharedView:
        """The same shared elements with dims reordered (`perm` defaults to reversing)."""
        perm = _check_perm(perm, self.rank, "transpose()")
        t = self.ir
        suffix = ".T" if perm == tuple(reversed(range(self.rank))) else f".permute{perm}"
        tile = SharedTile(dtype=t.dtype, shape=tuple(t.shape[p] for p in perm),
                          name=t.name + suffix, loc=user_location(), alloc=t.alloc,
                          stage=t.stage, permutation=tuple(t.permutation[p] for p in perm))
        return SharedView(tile)

    @property
    def T(self) -> SharedView:
        return self.transpose()

    def __getitem__(self, index: Any) -> SharedView:
        # A stage is used whole (copy, load, gemm); a part of it has no shared layout of
        # its own. Say so at the user's line rather than Python's "not subscriptable".
        raise fail("shared stage[...]", f"a stage of a shared buffer {_SHARED_UNSLICEABLE}")


class SharedBuffer(SharedView):
    """A shared-memory buffer (`SharedAlloc`). `buf[k]` is stage k (taken modulo the stage
    count at run time); a single-stage buffer is also usable directly as its tile."""

    def __init__(self, alloc: SharedAlloc):
        self.alloc = alloc
        self._stage0: SharedTile | None = None

    def __getitem__(self, stage: Any) -> SharedView:
        if isinstance(stage, (tuple, slice)) or stage is None or stage is Ellipsis:
            # `buf[0:8, :]` reads as slicing the tile, not picking a stage: say that.
            raise fail("shared[...]", f"%{self.alloc.name} is indexed only by a stage "
                       f"(buf[k]); a shared buffer {_SHARED_UNSLICEABLE}")
        stage = index_value(stage, "shared[stage]", "a stage index")
        if isinstance(stage, int) and stage < 0:
            raise fail("shared[stage]", f"stage index {stage} is negative")
        return SharedView(self._stage_tile(stage))

    def _stage_tile(self, stage: Any) -> SharedTile:
        a = self.alloc
        return SharedTile(dtype=a.dtype, shape=a.shape, name=f"{a.name}[{stage}]",
                          loc=user_location(), alloc=a, stage=stage,
                          permutation=tuple(range(len(a.shape))))

    @property
    def ir(self) -> SharedTile:
        if self.alloc.stages != 1:
            raise fail("shared buffer", f"%{self.alloc.name} has {self.alloc.stages} stages; "
                                        f"pick one with buf[k]")
        if self._stage0 is None:
            self._stage0 = self._stage_tile(0)
        return self._stage0

    @property
    def shape(self) -> tuple:
        return tuple(self.alloc.shape)

    @property
    def dtype(self) -> DType:
        return self.alloc.dtype

    def __repr__(self) -> str:
        a = self.alloc
        return f"%{a.name}: shared<{'x'.join(map(str, a.shape))}, {a.dtype}> x{a.stages} stages"


# -- registers ------------------------------------------------------------------------------
def new_register_tile(shape: tuple, dtype: DType, layout: Any = None) -> RegisterTile:
    """A fresh register tile, registered with the kernel being traced."""
    ctx = current("a register tile")
    tile = RegisterTile(dtype=dtype, shape=tuple(shape), name=ctx.fresh_name("r"),
                        loc=user_location(), layout=layout, pinned=layout is not None)
    return ctx.add_register_tile(tile)


class RegisterValue(TileHandle):
    """A register tile. Arithmetic makes new tiles (`y = x * tg.sigmoid(x)`); in-place
    operators (`acc += p`) and `acc.assign(expr)` write this tile. Both carry a value
    across `tg.range` iterations: a name rebound with `=` in a loop is carried by
    re-pointing the handle it ends up holding (tegula.lang.carry)."""

    def __init__(self, tile: RegisterTile):
        self._tile = tile
        self._expired: str | None = None

    @property
    def ir(self) -> RegisterTile:
        if self._expired is not None:
            raise TraceError(self._expired, user_location())
        return self._tile

    # Run-time control flow re-points handles (tegula.lang.carry): after a loop, the
    # handle a rebound name holds refers to the tile that carries the name's value.
    def _retarget(self, tile: RegisterTile) -> None:
        self._tile = tile

    def _expire(self, message: str) -> None:
        """Make every later use of this handle a TraceError saying `message`."""
        self._expired = message

    def __repr__(self) -> str:
        return describe(self._tile)

    def to(self, dtype: DType) -> RegisterValue:
        """This tile converted to `dtype` (a new tile; the same tile if already `dtype`)."""
        from tegula.lang.elementwise import cast
        return cast(self, dtype)

    def assign(self, value: Any) -> RegisterValue:
        """Overwrite this tile with `value` (a register tile of the same shape and dtype,
        or a Python number). Returns self."""
        from tegula.lang.elementwise import assign
        assign(self, value)
        return self

    # Operators build Elementwise ops; see tegula.lang.elementwise for the rules.
    def _bin(self, op: str, other: Any, reverse: bool = False):
        from tegula.lang.elementwise import binary
        return binary(op, other, self) if reverse else binary(op, self, other)

    def _inplace(self, op: str, other: Any):
        from tegula.lang.elementwise import binary
        binary(op, self, other, out=self)
        return self

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __floordiv__(self, o): return self._bin("floordiv", o)
    def __rfloordiv__(self, o): return self._bin("floordiv", o, True)
    def __mod__(self, o): return self._bin("mod", o)
    def __rmod__(self, o): return self._bin("mod", o, True)
    def __pow__(self, o): return self._bin("pow", o)
    def __rpow__(self, o): return self._bin("pow", o, True)
    def __and__(self, o): return self._bin("and", o)
    def __rand__(self, o): return self._bin("and", o, True)
    def __or__(self, o): return self._bin("or", o)
    def __ror__(self, o): return self._bin("or", o, True)
    def __xor__(self, o): return self._bin("xor", o)
    def __rxor__(self, o): return self._bin("xor", o, True)
    def __lt__(self, o): return self._bin("lt", o)
    def __le__(self, o): return self._bin("le", o)
    def __gt__(self, o): return self._bin("gt", o)
    def __ge__(self, o): return self._bin("ge", o)
    def __eq__(self, o): return self._bin("eq", o)  # type: ignore[override]
    def __ne__(self, o): return self._bin("ne", o)  # type: ignore[override]
    def __iadd__(self, o): return self._inplace("add", o)
    def __isub__(self, o): return self._inplace("sub", o)
    def __imul__(self, o): return self._inplace("mul", o)
    def __itruediv__(self, o): return self._inplace("div", o)
    def __ifloordiv__(self, o): return self._inplace("floordiv", o)
    def __imod__(self, o): return self._inplace("mod", o)

    def __neg__(self):
        from tegula.lang.elementwise import unary
        return unary("neg", self)

    def __abs__(self):
        from tegula.lang.elementwise import unary
        return unary("abs", self)

    def __invert__(self):
        from tegula.lang.elementwise import unary
        return unary("not", self)

    __hash__ = object.__hash__

    def __getitem__(self, index: Any) -> RegisterValue:
        """`t[None, :]` / `t[:, None]` (a new size-1 dim), `t[:, 0]` (drop a size-1 dim);
        register tiles cannot be sliced or indexed element by element."""
        from tegula.lang.indexing import index_register
        return index_register(self, index)

    @property
    def T(self):
        raise fail(".T", f"{describe(self.ir)} is a register tile; transpose the shared or "
                         f"global view it comes from instead")


def wrap(tile: Tile) -> TileHandle:
    """The handle class for an IR tile."""
    if isinstance(tile, RegisterTile):
        return RegisterValue(tile)
    if isinstance(tile, SharedTile):
        return SharedView(tile)
    if isinstance(tile, GlobalTile):
        return GlobalView(tile)
    raise TraceError(f"cannot wrap {tile!r}")


__all__ = ["TileHandle", "GlobalView", "GlobalTensor", "SharedView", "SharedBuffer",
           "RegisterValue", "as_tile", "wrap", "static_shape", "same_shape", "shape_text",
           "new_register_tile", "whole_tensor_tile", "index_value"]
