"""CuTe layouts <-> F2 linear layouts.

A CuTe layout ``f`` whose size is a power of two is a function from the bits of a 1-D
(colexicographic) index to an integer. It is F2-linear when ``f(i)`` is the XOR of the
images of the set bits of ``i``; then ``f(2^k)`` for every bit ``k`` is its matrix.

* A plain ``shape:stride`` layout is linear when every nonzero per-bit image
  ``stride << j`` is a distinct power of two: the integer sum of distinct powers of two
  has no carries, so it equals the XOR. That is checked structurally, without evaluation.
* Anything else (repeated or non-power-of-two strides, swizzled ``ComposedLayout``s) is
  checked by evaluating every index and comparing with the XOR of the bit images; the
  first index that disagrees is named in the error.

Naming: ``in_dims`` split the domain's flat index bits in order (first dim = lowest bits),
so a TV layout ``(thr, val)`` takes ``[("lane", 32), ("warp", W), ("register", V)]``.
``out_dims`` split the codomain integer the same way (colexicographic: a tile ``(M, N)``
becomes ``[("dim0", M), ("dim1", N)]`` with dim0 the low bits), or one ``"offset"`` dim.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from tegula.layout import f2
from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout

DimSpec = Mapping[str, int] | Sequence[tuple[str, int]] | None

#: Evaluating every index (the general linearity check) is refused above this size.
MAX_CHECKED_SIZE = 1 << 22


def _dims(spec: DimSpec) -> list[tuple[str, int]]:
    return list(spec.items()) if isinstance(spec, Mapping) else [tuple(d) for d in spec]


def _size_bits(layout: Any) -> int:
    size = getattr(layout, "size", None)
    size = size() if callable(size) else size
    if not isinstance(size, (int, np.integer)):
        raise LayoutError(f"{layout} has the symbolic size {size}; an F2 layout needs "
                          "concrete sizes")
    if not f2.is_pow2(int(size)):
        raise LayoutError(f"{layout} has size {size}, not a power of two, so it is not an F2 "
                          "linear layout (use the CuTe algebra for it)")
    return int(size).bit_length() - 1


def _structural_columns(layout: Any) -> list[int] | None:
    """Bit images of a plain static layout; None when the structural test is inconclusive."""
    shapes = getattr(layout, "flat_shape", None)
    strides = getattr(layout, "flat_stride", None)
    if shapes is None or strides is None or getattr(layout, "outer", None) is not None:
        return None
    cols: list[int] = []
    for s, d in zip(shapes, strides):
        if not isinstance(d, (int, np.integer)):
            raise LayoutError(f"{layout} has the symbolic stride {d}; an F2 layout needs "
                              "concrete strides")
        cols += [int(d) << j for j in range(int(s).bit_length() - 1)]
    nonzero = [c for c in cols if c]
    if all(f2.is_pow2(c) for c in nonzero) and len(set(nonzero)) == len(nonzero):
        return cols
    return None


def _all_offsets(layout: Any, size: int) -> np.ndarray:
    if size > MAX_CHECKED_SIZE:
        raise LayoutError(f"{layout} has {size} indices; checking linearity by evaluation is "
                          f"limited to {MAX_CHECKED_SIZE}")
    if hasattr(layout, "all_offsets"):
        return np.asarray(layout.all_offsets(), dtype=np.int64)
    return np.array([layout(i) for i in range(size)], dtype=np.int64)


def _evaluated_columns(layout: Any, nbits: int) -> list[int]:
    """Bit images ``f(2^k)``, after checking ``f(i) == XOR of images`` for every ``i``."""
    offsets = _all_offsets(layout, 1 << nbits)
    if offsets.size and offsets.min() < 0:
        i = int(np.argmin(offsets))
        raise LayoutError(f"{layout} maps index {i} to the negative offset {offsets[i]}; "
                          "F2 linear layouts have non-negative offsets")
    cols = [int(offsets[1 << k]) for k in range(nbits)]
    expected = np.zeros(1, dtype=np.int64)
    for c in cols:
        # Index bits are added from the lowest: the new half is the old half XOR the image.
        expected = np.concatenate([expected, expected ^ c])
    bad = np.nonzero(expected != offsets)[0]
    if bad.size:
        i = int(bad[0])
        parts = " ^ ".join(f"L({1 << k})={cols[k]}" for k in f2.bits_of(i))
        raise LayoutError(f"{layout} is not F2-linear: L({i}) = {int(offsets[i])} but "
                          f"{parts} = {int(expected[i])} (strides that are not distinct powers "
                          "of two add with carries)")
    return cols


def _default_in_dims(layout: Any, nbits: int) -> list[tuple[str, int]]:
    """One in dim per top-level mode: ``dim0, dim1, ...`` (a coordinate of the domain)."""
    shape = layout.shape
    if not isinstance(shape, tuple):
        return [("dim0", 1 << nbits)]
    out = []
    for k, mode in enumerate(shape):
        size = 1
        for leaf in (mode if isinstance(mode, tuple) else (mode,)):
            size *= _leaf_product(leaf)
        out.append((f"dim{k}", size))
    return out


def _leaf_product(x: Any) -> int:
    if isinstance(x, tuple):
        p = 1
        for y in x:
            p *= _leaf_product(y)
        return p
    return int(x)


def linear_from_cute(
    layout: Any, in_dims: DimSpec = None, out_dims: DimSpec = None
) -> LinearLayout:
    """The F2 linear layout of a CuTe layout (plain or swizzled), or LayoutError.

    ``in_dims`` (default: one dim ``dim<k>`` per top-level mode) split the domain index
    bits, lowest first; ``out_dims`` (default ``[("offset", 2^n)]`` just covering every
    offset) split the codomain integer, lowest first. A nonzero ``ComposedLayout`` offset
    makes the map affine, not linear, and is refused by the evaluation check.
    """
    nbits = _size_bits(layout)
    cols = _structural_columns(layout)
    if cols is None:
        cols = _evaluated_columns(layout, nbits)
    if any(c < 0 for c in cols):
        raise LayoutError(f"{layout} has negative strides; F2 linear layouts need "
                          "non-negative ones")
    reach = 0
    for c in cols:
        reach |= c
    ins = _default_in_dims(layout, nbits) if in_dims is None else _dims(in_dims)
    outs = [("offset", 1 << reach.bit_length())] if out_dims is None else _dims(out_dims)
    if sum(f2.log2_exact(s, f"in dim {n!r} size") for n, s in ins) != nbits:
        raise LayoutError(f"in dims {ins} do not split the {1 << nbits} indices of {layout}")
    out_bits = sum(f2.log2_exact(s, f"out dim {n!r} size") for n, s in outs)
    if reach.bit_length() > out_bits:
        raise LayoutError(f"{layout} reaches offsets up to {(1 << reach.bit_length()) - 1}, "
                          f"beyond the {1 << out_bits} elements of out dims {outs}")
    flat = LinearLayout.from_packed({"flat": cols}, [("offset", 1 << out_bits)])
    return flat.reshape_ins(ins).reshape_outs(outs)


def tv_in_dims(num_threads: int, num_values: int, warp_size: int = 32) -> list[tuple[str, int]]:
    """The in dims of a TV layout's domain in bit order: lane, warp, register."""
    lanes = min(num_threads, warp_size)
    if num_threads % lanes:
        raise LayoutError(f"{num_threads} threads do not fill whole warps of {warp_size}")
    return [("lane", lanes), ("warp", num_threads // lanes), ("register", num_values)]


def linear_from_cute_tv(tv: Any, tile_shape: Sequence[int] | None = None,
                        warp_size: int = 32) -> LinearLayout:
    """A TV layout ``(thr, val) -> tile index`` as a distributed layout.

    In dims come out in Triton's order ``register, lane, warp``; out dims are
    ``dim0, dim1, ...`` of ``tile_shape`` (dim0 fastest, as CuTe's colexicographic tile
    index), or one ``offset`` dim without a tile shape.
    """
    shape = tv.shape
    if not isinstance(shape, tuple) or len(shape) != 2:
        raise LayoutError(f"{tv} is not a TV layout: it needs exactly two modes (thread, value)")
    threads, values = (_leaf_product(m) for m in shape)
    outs = None if tile_shape is None else [(f"dim{k}", int(s)) for k, s in enumerate(tile_shape)]
    ll = linear_from_cute(tv, tv_in_dims(threads, values, warp_size), outs)
    return ll.transpose_ins(["register", "lane", "warp"])


def _modes_of(cols: Sequence[int], what: str) -> list[tuple[int, int]]:
    """Coalesce consecutive bit images into ``(extent, stride)`` modes."""
    modes: list[tuple[int, int]] = []
    for c in cols:
        if c and not f2.is_pow2(c):
            raise LayoutError(f"{what}: the basis {c} has several bits (a swizzle), which no "
                              "strided CuTe layout expresses")
        if modes:
            ext, stride = modes[-1]
            # A run continues when the next bit lands exactly one extent further (or is a
            # broadcast continuing a broadcast).
            if (stride == 0 and c == 0) or (stride and c == stride * ext):
                modes[-1] = (ext * 2, stride)
                continue
        modes.append((2, c))
    return modes


def linear_to_cute(ll: LinearLayout):
    """A strided CuTe ``Layout`` with the same function as ``ll``, or LayoutError.

    Domain: the in dims in order become top-level modes (a single in dim is the whole
    layout); codomain: the flattened output index (first out dim fastest). Possible when
    every nonzero basis is a power of two and they are pairwise distinct — then integer
    strides add without carries, exactly like XOR.
    """
    from tegula.layout.cute import Layout

    nonzero = [c for c in ll.matrix() if c]
    if len(set(nonzero)) != len(nonzero):
        raise LayoutError(f"{ll!r} maps two input bits to the same output bit; a strided CuTe "
                          "layout would add them with a carry instead of XOR")
    shapes, strides = [], []
    for name in ll.in_dim_names:
        modes = _modes_of(ll.bases_packed(name), f"linear_to_cute of {ll!r}, in dim {name!r}")
        if not modes:
            modes = [(1, 0)]
        if len(modes) == 1:
            shapes.append(modes[0][0])
            strides.append(modes[0][1])
        else:
            shapes.append(tuple(m[0] for m in modes))
            strides.append(tuple(m[1] for m in modes))
    if len(shapes) == 1:
        return Layout(shapes[0], strides[0])
    return Layout(tuple(shapes), tuple(strides))
