"""Thread-value layouts: how a register tile is spread over the threads of a block.

A TV layout is a rank-2 CuTe `Layout` whose mode 0 is the thread (size = threads of the
block) and mode 1 the value (size = registers per thread); it maps `(t, v)` to the tile's
flat index, colexicographic over the tile shape (`m + M*n` for an (M, N) tile). A stride-0
sub-mode in the thread mode means threads hold copies of the same elements (a broadcast);
in the value mode, a thread holds one element in several registers.

This module builds the TV layouts synthesis needs — coalesced copy partitions, MMA
operand/accumulator tilings over a warp grid, reductions' projections — and one generic
matcher, `match_values`, that answers "which register of each thread holds element X?",
the question behind every constraint check (gemm operands, broadcasting, reductions).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tegula.layout.algebra import composition
from tegula.layout.cute import Layout
from tegula.layout.errors import LayoutError


def tile_strides(shape: tuple) -> tuple:
    """Colexicographic strides of a tile shape: (1, M, M*N, ...)."""
    strides, running = [], 1
    for extent in shape:
        strides.append(running)
        running *= extent
    return tuple(strides)


def tile_size(shape: tuple) -> int:
    size = 1
    for extent in shape:
        size *= extent
    return size


def tv_table(tv: Layout) -> np.ndarray:
    """`table[t, v] = tv(t, v)` for every thread and value (int64, threads × values)."""
    threads, values = tv[0].size, tv[1].size
    return tv.all_offsets().reshape(values, threads).T


def tv_coords(tv: Layout, shape: tuple) -> np.ndarray:
    """`coords[t, v, d]`: the tile coordinate (per dim) that thread t holds in register v."""
    flat = tv_table(tv)
    coords = []
    for extent in shape:
        coords.append(flat % extent)
        flat = flat // extent
    return np.stack(coords, axis=-1)


def coalesced_tv(shape: tuple, contiguous_dim: int, vector: int, threads: int,
                 contiguous_threads: int | None = None) -> Layout:
    """The copy partition that makes a warp's accesses to a tile coalesced.

    The tile is cut into chunks of `vector` consecutive elements along `contiguous_dim`.
    Threads are laid over the chunk grid greedily, contiguous dim first: as many threads
    along each dim as divide both its chunk count and the threads left (so any extents
    work, not only powers of two), and each thread repeats over the rest. Consecutive
    threads take consecutive chunks, so a warp reads whole runs of memory.

    `contiguous_threads` caps the first pass along the contiguous dim (32 keeps a row
    within one warp, so a reduction along it needs only shuffles); threads the other dims
    cannot take then go back to the contiguous dim (outer warps). Threads left over once
    every dim is covered hold copies (a stride-0 thread mode), which lowering predicates
    off for writes.
    """
    contig = shape[contiguous_dim]
    if contig % vector:
        raise LayoutError(f"a tile of shape {shape} cannot be cut into vectors of {vector} "
                          f"elements along dim {contiguous_dim}")
    strides = tile_strides(shape)
    dims = [contiguous_dim] + [d for d in range(len(shape)) if d != contiguous_dim]
    counts = [contig // vector] + [shape[d] for d in dims[1:]]
    unit = [vector * strides[contiguous_dim]] + [strides[d] for d in dims[1:]]
    taken = [1] * len(dims)                   # threads laid along each dim so far
    thread_shape, thread_stride = [], []
    left = threads
    caps = [contiguous_threads or threads] + [threads] * (len(dims) - 1)
    for pass_caps in (caps, [threads] * len(dims)):
        for i, cap in enumerate(pass_caps):
            along = math.gcd(counts[i] // taken[i], min(left, cap))
            if along > 1:
                thread_shape.append(along)
                thread_stride.append(unit[i] * taken[i])
                taken[i] *= along
                left //= along
    thread_shape.append(left)   # replicas: extra threads hold copies
    thread_stride.append(0)
    repeat_shape = tuple(c // t for c, t in zip(counts, taken))
    repeat_stride = tuple(u * t for u, t in zip(unit, taken))
    return Layout((tuple(thread_shape), (vector, repeat_shape)),
                  (tuple(thread_stride), (strides[contiguous_dim], repeat_stride)))


@dataclass(frozen=True)
class WarpGrid:
    """How the warps of a block tile a gemm's C tile: `wm` warps along M, `wn` along N
    (warp index = i_m + wm * i_n)."""

    wm: int
    wn: int


def mma_tiled_tv(atom_tv: Layout, atom_shape: tuple, tile_shape: tuple, grid: WarpGrid,
                 role: str) -> Layout:
    """Tile one MMA fragment layout over a block tile and a warp grid.

    `atom_tv` maps (lane, value) to the flat index of the atom's fragment tile of
    `atom_shape` (P, Q): (M, N) for the accumulator `role="c"`, (M, K) for `"a"`,
    (N, K) for `"b"`. Warps step along P (and along Q for the accumulator); warps along
    the other gemm dim hold the same operand elements (stride 0). The atom then repeats
    over the rest of the tile: value = (atom value, repeat along P, repeat along Q).
    """
    p_atom, q_atom = atom_shape
    p_tile, q_tile = tile_shape
    if role == "c":
        warps_p, warps_q, warp_strides = grid.wm, grid.wn, (p_atom, q_atom * p_tile)
    elif role == "a":
        warps_p, warps_q, warp_strides = grid.wm, 1, (p_atom, 0)
    elif role == "b":
        warps_p, warps_q, warp_strides = grid.wn, 1, (0, p_atom)
    else:
        raise ValueError(f"unknown gemm operand role {role!r}")
    if p_tile % (p_atom * warps_p) or q_tile % (q_atom * warps_q):
        raise LayoutError(f"a {tile_shape} tile is not a multiple of the {atom_shape} MMA "
                             f"fragment times the warp grid {grid.wm}x{grid.wn}")
    rep_p, rep_q = p_tile // (p_atom * warps_p), q_tile // (q_atom * warps_q)
    # Embed the atom's (P, Q) index space into the tile's colexicographic index space.
    embedded = composition(Layout((p_atom, q_atom), (1, p_tile)), atom_tv)
    lane, value = embedded[0], embedded[1]
    thread = Layout((lane.shape, (grid.wm, grid.wn)), (lane.stride, warp_strides))
    repeat = Layout((rep_p, rep_q), (p_atom * warps_p, q_atom * warps_q * p_tile))
    return Layout((thread.shape, (value.shape, repeat.shape)),
                  (thread.stride, (value.stride, repeat.stride)))


def projected_tv(tv: Layout, shape: tuple, axis: int) -> Layout:
    """The layout of `reduce(x, axis)` (extent 1 kept) when x has TV layout `tv`: every
    thread keeps its registers' positions with the coordinate along `axis` dropped.

    The result has the same (thread, value) shape as `tv`, so register v of the result
    is the reduction of the row register v belongs to (registers of one row repeat the
    same value; lowering reads one of them).
    """
    out_shape = tuple(1 if d == axis else s for d, s in enumerate(shape))
    out_strides = tile_strides(out_shape)
    # A linear map from the input's flat index to the output's: drop `axis`, keep the rest.
    projection = Layout(shape, tuple(0 if d == axis else out_strides[d] for d in range(len(shape))))
    return composition(projection, tv)


def project_flat_indices(flat: np.ndarray, from_shape: tuple, to_shape: tuple) -> np.ndarray:
    """Flat indices into a `to_shape` tile that broadcasts (extent 1) along some dims, of
    the elements at flat indices `flat` of a `from_shape` tile: the element a broadcast
    operand supplies, or the row a reduction folds an element into."""
    result = np.zeros_like(flat)
    to_strides = tile_strides(to_shape)
    rest = flat
    for d, extent in enumerate(from_shape):
        coord = rest % extent
        rest = rest // extent
        if to_shape[d] != 1:
            result = result + coord * to_strides[d]
    return result


def match_values(holder: Layout, wanted: np.ndarray) -> np.ndarray | None:
    """For each column j of `wanted` (threads × n flat indices), the register v of the
    `holder` TV layout such that every thread t holds `wanted[t, j]` in register v.

    Returns an int array of n register indices, or None if some column is held by no
    single register across all threads (the layouts disagree: a conversion is needed).
    """
    table = tv_table(holder)
    if table.shape[0] != wanted.shape[0]:
        return None
    columns = {table[:, v].tobytes(): v for v in range(table.shape[1] - 1, -1, -1)}
    found = np.empty(wanted.shape[1], dtype=np.int64)
    for j in range(wanted.shape[1]):
        v = columns.get(np.ascontiguousarray(wanted[:, j]).tobytes())
        if v is None:
            return None
        found[j] = v
    return found


def distinct_values(tv: Layout) -> list[int]:
    """Registers that hold an element no earlier register of the same thread holds, for
    every thread alike (the registers worth computing on; the rest are repeats)."""
    table = tv_table(tv)
    seen: set[bytes] = set()
    keep = []
    for v in range(table.shape[1]):
        key = table[:, v].tobytes()
        if key not in seen:
            seen.add(key)
            keep.append(v)
    return keep

