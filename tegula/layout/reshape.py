"""Register reshapes: `out = x.transpose(perm).reshape(out_shape)` (numpy, C order) as a
relabelling of flat indices, so that a reshaped tile's TV layout is its source's layout
with every flat index renamed and no register moves; and bitcasts (`bitcast_tv`: the
same registers read as another type, a 32-bit one as two 16-bit halves).

TV layouts map (thread, value) to a tile's *colexicographic* flat index (`tv.py`), while
numpy's reshape is row-major, so a reshape that merges or splits dims renames flat
indices; the renaming is itself a CuTe layout whenever the two shapes have a common
refinement (every extent met on the way divides the other: always for powers of two),
and the reshaped tile's TV layout is its composition with the source's.

* `reshape_sources(x_shape, perm, out_shape)` — for each flat index of `out`, the flat
  index of the element of `x` it holds (a table; what lowering and constraint checks use);
* `reshaped_tv(tv, x_shape, perm, out_shape, inverse=False)` — the TV layout of `out`
  given x's (or, with `inverse`, x's given out's), or None where the renaming is no CuTe
  layout (synthesis then converts).
"""
from __future__ import annotations

import numpy as np

from tegula.layout.algebra import composition
from tegula.layout.cute import Layout
from tegula.layout.errors import LayoutError
from tegula.layout.tv import projected_tv, tile_size, tile_strides


def reshape_sources(x_shape: tuple, perm: tuple, out_shape: tuple) -> np.ndarray:
    """`sources[f]`: the colexicographic flat index in `x` of the element that `out` =
    x.transpose(perm).reshape(out_shape) holds at colexicographic flat index f."""
    flat = np.arange(tile_size(x_shape), dtype=np.int64).reshape(x_shape, order="F")
    return np.transpose(flat, perm).reshape(out_shape).ravel(order="F")


def _factors(x_shape: tuple, perm: tuple, out_shape: tuple) -> list[tuple] | None:
    """The common refinement of the transposed x's dims and out's dims, walked from the
    fastest (last, C order) dim of both: (x dim, its extent below this factor, out dim,
    its extent below this factor, extent) per factor, or None where an extent met on the
    way neither divides nor is divided by the other (e.g. (2, 3) -> (3, 2))."""
    y_dims = [d for d in reversed(perm) if x_shape[d] != 1]
    o_dims = [d for d in reversed(range(len(out_shape))) if out_shape[d] != 1]
    factors: list[tuple] = []
    yi = oi = 0
    y_left = x_shape[y_dims[0]] if y_dims else 1
    o_left = out_shape[o_dims[0]] if o_dims else 1
    y_below = o_below = 1
    while yi < len(y_dims) and oi < len(o_dims):
        step = min(y_left, o_left)
        if max(y_left, o_left) % step:
            return None
        factors.append((y_dims[yi], y_below, o_dims[oi], o_below, step))
        y_left, o_left = y_left // step, o_left // step
        y_below, o_below = y_below * step, o_below * step
        if y_left == 1:
            yi, y_below = yi + 1, 1
            y_left = x_shape[y_dims[yi]] if yi < len(y_dims) else 1
        if o_left == 1:
            oi, o_below = oi + 1, 1
            o_left = out_shape[o_dims[oi]] if oi < len(o_dims) else 1
    return factors


def _renaming(from_shape: tuple, to_shape: tuple, factors: list[tuple], forward: bool
              ) -> Layout:
    """The CuTe layout from `from_shape`'s flat index to `to_shape`'s: per dim of
    from_shape its factors (least significant first), each with the stride of its place
    in to_shape's flat index."""
    to_strides = tile_strides(to_shape)
    shape, stride = [], []
    for d in range(len(from_shape)):
        mine = [(f[1], f[2], f[3], f[4]) if forward else (f[3], f[0], f[1], f[4])
                for f in factors if (f[0] if forward else f[2]) == d]
        mine.sort()
        if not mine:                       # an extent-1 dim
            shape.append(1)
            stride.append(0)
            continue
        shape.append(tuple(e for _, _, _, e in mine) if len(mine) > 1 else mine[0][3])
        strides = tuple(to_strides[dim] * below for _, dim, below, _ in mine)
        stride.append(strides if len(mine) > 1 else strides[0])
    return Layout(tuple(shape), tuple(stride))


def reshaped_tv(tv: Layout, x_shape: tuple, perm: tuple, out_shape: tuple,
                inverse: bool = False) -> Layout | None:
    """The TV layout of `out` = x.transpose(perm).reshape(out_shape) when x has layout
    `tv` (each thread holds the same elements in the same registers), or with `inverse`
    x's layout given out's `tv`; None where the renaming is no CuTe layout."""
    factors = _factors(tuple(x_shape), tuple(perm), tuple(out_shape))
    if factors is None:
        return None
    renaming = (_renaming(tuple(out_shape), tuple(x_shape), factors, forward=False) if inverse
                else _renaming(tuple(x_shape), tuple(out_shape), factors, forward=True))
    try:
        return composition(renaming, tv)
    except LayoutError:
        return None


def bitcast_tv(tv: Layout, x_shape: tuple, split: bool) -> Layout:
    """The TV layout of `tg.bitcast(x)` when x has layout `tv`: each thread reads its own
    registers; split in two (32 to 16 bits), register v becomes registers 2v (the low
    half: flat index f of x, index 0 of the new last dim) and 2v + 1 (f + size of x)."""
    if not split:
        return tv
    return Layout((tv[0].shape, (2, tv[1].shape)),
                  (tv[0].stride, (tile_size(tuple(x_shape)), tv[1].stride)))


def bitcast_source_tv(tv: Layout, out_shape: tuple, split: bool) -> Layout | None:
    """A layout for x that gives each thread the elements a bitcast's output `tv` reads
    (split: the output's last dim dropped; registers may repeat), or None."""
    if not split:
        return tv
    try:
        return projected_tv(tv, tuple(out_shape), len(out_shape) - 1)
    except LayoutError:
        return None


def has_renaming(x_shape: tuple, perm: tuple, out_shape: tuple) -> bool:
    """True if the reshape's renaming of flat indices is a CuTe layout (every extent met
    on the way divides the other); reshapes to and from a flat tile always have one."""
    return _factors(tuple(x_shape), tuple(perm), tuple(out_shape)) is not None


def is_plain_reshape(x_shape: tuple, perm: tuple, out_shape: tuple) -> bool:
    """True if out only inserts or removes size-1 dims of x (no dim moves, merges or
    splits): every flat index stays, and both tiles share one layout."""
    kept = [d for d in perm if x_shape[d] != 1]
    return kept == sorted(kept) and \
        [x_shape[d] for d in kept] == [e for e in out_shape if e != 1]


__all__ = ["reshape_sources", "reshaped_tv", "bitcast_tv", "bitcast_source_tv", "has_renaming",
           "is_plain_reshape"]
