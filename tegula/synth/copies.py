"""Copies between global memory and registers or shared memory: vector widths.

A global access of `w` elements per lane is one instruction when the `w` elements are
consecutive in memory and `w * elem_bytes` aligned. Consecutive: the tile dim being
walked must be the tensor's contiguous dim with step 1, and the thread's registers must
hold `w` consecutive elements along it. Aligned: the data pointer, every other stride,
and the tile origin along that dim must be multiples of `w`. And since a vector is
predicated as a whole, the extent along that dim must be a multiple of `w` too (so a
boundary vector is wholly in or out). The facts come from `synth.facts`.
"""
from __future__ import annotations

import math

import numpy as np

from tegula.ir.scalar import (BlockIndex, LoopIndex, ScalarArg, ScalarBinOp, ScalarConst,
                              TensorExtent)
from tegula.ir.values import GlobalTile
from tegula.layout.cute import Layout
from tegula.synth.facts import MAX_DIVISOR, TensorFacts
from tegula.layout.tv import tv_coords


def scalar_divisor(x, facts: dict) -> int:
    """A power of two (≤ 16) known to divide the block-uniform scalar `x`."""
    if isinstance(x, int):
        return _pow2_divisor(x)
    if isinstance(x, ScalarConst):
        return _pow2_divisor(x.value)
    if isinstance(x, TensorExtent):
        return facts[x.tensor].extent_divisors[x.dim] if x.tensor in facts else 1
    if isinstance(x, (BlockIndex, LoopIndex, ScalarArg)):
        return 1
    if isinstance(x, ScalarBinOp):
        a, b = scalar_divisor(x.lhs, facts), scalar_divisor(x.rhs, facts)
        if x.op == "*":
            return min(MAX_DIVISOR, a * b)
        if x.op in ("+", "-"):
            return math.gcd(a, b)
    return 1


def _pow2_divisor(v: int) -> int:
    d = 1
    while d < MAX_DIVISOR and v % (2 * d) == 0:
        d *= 2
    return d


def contiguous_tile_dim(view: GlobalTile, facts: TensorFacts) -> int | None:
    """The tile dim that walks the tensor's contiguous dim with step 1, if any."""
    if facts.contiguous_dim is None:
        return None
    for k, dim in enumerate(view.dims):
        if dim.tensor_dim == facts.contiguous_dim and dim.step == 1:
            return k
    return None


def global_vector_limit(view: GlobalTile, facts: dict,
                        allow_tail: bool = False) -> tuple[int | None, int]:
    """(tile dim, largest vector in elements) that the tensor's facts allow for `view`,
    before looking at how registers are distributed. With `allow_tail` the extent along
    the contiguous dim need not be a multiple of the vector: lowering then splits the one
    vector that straddles the edge into predicated elements (see `needs_tail`)."""
    tensor_facts = facts[view.arg.name]
    k = contiguous_tile_dim(view, tensor_facts)
    bits = view.arg.dtype.bits
    if k is None:
        return None, 1
    c = tensor_facts.contiguous_dim
    limit = 128 // bits
    limit = min(limit, tensor_facts.align_bytes * 8 // bits)
    divisors = [scalar_divisor(view.origin[c], facts)]
    if not allow_tail:
        divisors.append(tensor_facts.extent_divisors[c])
    divisors += [tensor_facts.stride_divisors[d] for d in range(tensor_facts.rank) if d != c]
    divisors += [scalar_divisor(dim.step, facts) for j, dim in enumerate(view.dims)
                 if j != k and dim.tensor_dim == c]
    extent = view.dims[k].extent
    divisors.append(_pow2_divisor(extent) if isinstance(extent, int) else 1)
    for d in divisors:
        limit = math.gcd(limit, d)
    return k, max(1, limit)


def register_run_length(tv: Layout, shape: tuple, dim: int, cap: int) -> int:
    """Largest power-of-two w ≤ cap such that registers v0..v0+w-1 (v0 a multiple of w) of
    every thread hold consecutive elements along `dim`, starting at a multiple of w."""
    coords = tv_coords(tv, shape)
    values = coords.shape[1]
    w = cap
    while w > 1:
        if values % w == 0:
            grouped = coords.reshape(coords.shape[0], values // w, w, len(shape))
            step = np.zeros(len(shape), dtype=np.int64)
            step[dim] = 1
            expected = grouped[:, :, :1, :] + np.arange(w)[:, None] * step
            if np.array_equal(grouped, expected) and np.all(grouped[:, :, 0, dim] % w == 0):
                return w
        w //= 2
    return 1


def needs_tail(view: GlobalTile, facts: dict, width: int) -> bool:
    """True if vectors of `width` along the contiguous dim may straddle the tensor's edge
    (its extent is not known to be a multiple of `width`)."""
    tensor_facts = facts[view.arg.name]
    c = tensor_facts.contiguous_dim
    return (width > 1 and c is not None and view.arg.dtype.bits >= 8
            and tensor_facts.extent_divisors[c] % width != 0)


def global_access_vector(view: GlobalTile, tv: Layout, facts: dict) -> tuple[int | None, int]:
    """(tile dim, vector width) for moving a register tile with layout `tv` to/from `view`
    (vectors may straddle the edge: check `needs_tail`)."""
    # Packed 4-bit elements cannot be moved one by one (half a byte), so no tails for them.
    k, limit = global_vector_limit(view, facts, allow_tail=view.arg.dtype.bits >= 8)
    if k is None:
        return None, 1
    return k, register_run_length(tv, tuple(view.shape), k, limit)
