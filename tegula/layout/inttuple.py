"""Hierarchical integer tuples: the shapes, strides and coordinates of CuTe layouts.

An *int-tuple* is either a leaf or a Python tuple of int-tuples. A leaf is anything that
is not a tuple: usually an `int`, but it may be a symbolic extent (`tegula.layout.symbolic`)
that supports `+ - * // %` and comparisons. Every function here therefore touches leaves
only through those operators, through `gcd`, and through `is_static` where a concrete
value is truly needed; it never asks `isinstance(leaf, int)`.

Coordinates are *colexicographic*: the leftmost mode varies fastest, exactly as in CuTe.
"""
from __future__ import annotations

import math
import numbers
from functools import reduce
from typing import Any, Callable, Iterator

from tegula.layout import symbolic
from tegula.layout.errors import LayoutError

IntTuple = Any  # a leaf or a (nested) tuple of leaves


def is_tuple(x: Any) -> bool:
    """True for an inner node of an int-tuple; everything else is a leaf."""
    return isinstance(x, tuple)


def is_static(x: IntTuple) -> bool:
    """True when every leaf is a concrete integer (so numpy and sorting may be used on it)."""
    if is_tuple(x):
        return all(is_static(e) for e in x)
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def normalize(x: IntTuple) -> IntTuple:
    """The same int-tuple with concrete integers (numpy scalars too) as plain Python ints.

    Lists are accepted as tuples so that users may write shapes either way.
    """
    if isinstance(x, (tuple, list)):
        return tuple(normalize(e) for e in x)
    if isinstance(x, bool):
        raise LayoutError(f"a layout extent must be an integer, got the bool {x!r}")
    if isinstance(x, numbers.Integral):
        return int(x)
    return x


def to_str(x: IntTuple) -> str:
    """CuTe notation of an int-tuple: `((2,2),8)`, no spaces."""
    if is_tuple(x):
        return "(" + ",".join(to_str(e) for e in x) + ")"
    return str(x)


# --------------------------------------------------------------------------- structure


def flatten(x: IntTuple) -> tuple:
    """The leaves of an int-tuple in order, as a flat tuple (a leaf becomes a 1-tuple)."""
    if not is_tuple(x):
        return (x,)
    out: list = []
    for e in x:
        out.extend(flatten(e))
    return tuple(out)


def iter_leaves(x: IntTuple) -> Iterator[Any]:
    """The leaves of an int-tuple in order, lazily."""
    if is_tuple(x):
        for e in x:
            yield from iter_leaves(e)
    else:
        yield x


def unflatten(flat: tuple, profile: IntTuple) -> IntTuple:
    """Rebuild the nesting of `profile` from the leaves `flat` (inverse of `flatten`)."""
    leaves = iter(flat)

    def build(p: IntTuple) -> IntTuple:
        if is_tuple(p):
            return tuple(build(e) for e in p)
        return next(leaves)

    return build(profile)


def rank(x: IntTuple) -> int:
    """Number of top-level modes: 1 for a leaf, `len` for a tuple."""
    return len(x) if is_tuple(x) else 1


def depth(x: IntTuple) -> int:
    """Nesting depth: 0 for a leaf, 1 for a flat tuple, and so on."""
    if is_tuple(x):
        return 1 + max((depth(e) for e in x), default=0)
    return 0


def mode(x: IntTuple, i: int) -> IntTuple:
    """The i-th top-level mode; a leaf is its own only mode (CuTe's `get<0>` of an integer)."""
    if is_tuple(x):
        return x[i]
    if i != 0:
        raise LayoutError(f"mode {i} asked of the rank-1 int-tuple {to_str(x)}")
    return x


def congruent(a: IntTuple, b: IntTuple) -> bool:
    """True when `a` and `b` have the same tree structure (leaf values are ignored)."""
    if is_tuple(a) and is_tuple(b):
        return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b))
    return not is_tuple(a) and not is_tuple(b)


def weakly_congruent(a: IntTuple, b: IntTuple) -> bool:
    """True when `b` refines `a`: every leaf of `a` sits where `b` has a leaf or a subtree."""
    if not is_tuple(a):
        return True
    if not is_tuple(b):
        return False
    return len(a) == len(b) and all(weakly_congruent(x, y) for x, y in zip(a, b))


def compatible(a: IntTuple, b: IntTuple) -> bool:
    """True when every coordinate of shape `a` is also a coordinate of shape `b`.

    That is: sizes agree, and wherever `a` has a tuple `b` has a tuple of the same length
    (a leaf of `a` may stand for a whole subtree of `b` of the same size).
    """
    if not is_tuple(a):
        return product(a) == product(b)
    if not is_tuple(b):
        return False
    return len(a) == len(b) and all(compatible(x, y) for x, y in zip(a, b))


# --------------------------------------------------------------------------- arithmetic


def gcd(a: Any, b: Any) -> Any:
    """Greatest common divisor of two leaves.

    The single entry point for gcd, so that symbolic extents can plug in their own rule.
    """
    if is_static(a) and is_static(b):
        return math.gcd(a, b)
    return symbolic.sym_gcd(a, b)  # decided by the facts, or a LayoutError saying what is unknown


def known_divides(d: Any, x: Any) -> bool | None:
    """Three-valued `x % d == 0`: None when symbolic facts cannot decide it (never raises)."""
    if (type(d) is int and type(x) is int) or (is_static(d) and is_static(x)):
        return x % d == 0
    return symbolic.divides(d, x)


def lcm(a: Any, b: Any) -> Any:
    """Least common multiple of two leaves."""
    return a * b // gcd(a, b)


def product(x: IntTuple) -> Any:
    """Product of all leaves (the size of a shape); 1 for the empty tuple."""
    if is_tuple(x):
        return reduce(lambda acc, e: acc * product(e), x, 1)
    return x


def product_each(x: IntTuple) -> IntTuple:
    """Product of each top-level mode: `((2,3),(4,5))` becomes `(6,20)`."""
    if is_tuple(x):
        return tuple(product(e) for e in x)
    return x


def inner_product(a: IntTuple, b: IntTuple) -> Any:
    """Sum of products of corresponding leaves of two congruent int-tuples."""
    if is_tuple(a):
        return reduce(lambda acc, xy: acc + inner_product(*xy), zip(a, b), 0)
    return a * b


def elementwise(f: Callable[..., Any], *xs: IntTuple) -> IntTuple:
    """Apply `f` leaf by leaf to congruent int-tuples."""
    if is_tuple(xs[0]):
        return tuple(elementwise(f, *parts) for parts in zip(*xs))
    return f(*xs)


def prefix_product(shape: IntTuple, start: Any = 1) -> IntTuple:
    """Exclusive prefix products of `shape`: the compact column-major strides.

    Leaf `k` gets `start * (product of all leaves before k)`; the result is congruent to
    `shape`. `prefix_product((2,(3,4)))` is `(1,(2,6))`.
    """
    running = start

    def walk(s: IntTuple) -> IntTuple:
        nonlocal running
        if is_tuple(s):
            return tuple(walk(e) for e in s)
        here = running
        running = running * s
        return here

    return walk(shape)


def ceil_div(a: Any, b: Any) -> Any:
    """`ceil(a / b)` on a leaf, or on a shape folded left to right (CuTe's tuple ceil_div).

    On a tuple `a` and a leaf `b`, each mode absorbs as much of `b` as it can:
    `ceil_div((4,6), 8)` is `(1,3)`.
    """
    if is_tuple(a):
        out = []
        rest = b
        for e in a:
            out.append(ceil_div(e, rest))
            rest = ceil_div(rest, product(e))
        return tuple(out)
    if (type(a) is int and type(b) is int) or (is_static(a) and is_static(b)):
        return (a + b - 1) // b
    return symbolic.sym_ceil_div(a, b)  # exact cases only: a symbolic ceiling is no polynomial


def shape_div(a: IntTuple, b: Any) -> IntTuple:
    """Divide a shape by a leaf, mode by mode from the left, where one divides the other.

    Each mode either is divided exactly by what remains of `b`, or divides it and becomes 1
    (then `b` shrinks by that mode). `shape_div((4,6), 8)` is `(1,3)`. This is the division
    of composition and the divides; anything else has no layout meaning and is an error.
    """
    if is_tuple(a):
        out = []
        rest = b
        for e in a:
            out.append(shape_div(e, rest))
            rest = shape_div(rest, product(e))
        return tuple(out)
    if is_tuple(b):
        return shape_div(a, product(b))
    if not (is_static(a) and is_static(b)):
        return symbolic.sym_shape_div(a, b)  # asks both tests without letting one raise
    if a % b == 0:
        return a // b
    if b % a == 0:
        return 1
    raise LayoutError(f"shape_div({to_str(a)}, {to_str(b)}): neither divides the other")


# --------------------------------------------------------------------------- coordinates


def crd2idx(coord: IntTuple, shape: IntTuple, stride: IntTuple | None = None) -> Any:
    """Map a coordinate of `shape` to an offset through `stride` (compact if omitted).

    The coordinate may be natural (congruent to `shape`) or any coarser form: an integer
    standing for a whole sub-shape is split colexicographically. An integer given to the
    last mode is not reduced modulo its extent, so indices past the end extend that mode
    (composition relies on this).
    """
    if stride is None:
        stride = prefix_product(shape)
    if is_tuple(coord):
        if not is_tuple(shape) or len(coord) != len(shape):
            raise LayoutError(f"coordinate {to_str(coord)} does not fit shape {to_str(shape)}")
        return reduce(lambda acc, csd: acc + crd2idx(*csd), zip(coord, shape, stride), 0)
    if is_tuple(shape):
        if len(shape) == 0:
            return 0
        offset = 0
        for s, d in zip(shape[:-1], stride[:-1]):
            extent = product(s)
            offset = offset + crd2idx(coord % extent, s, d)
            coord = coord // extent
        return offset + crd2idx(coord, shape[-1], stride[-1])
    return coord * stride


def idx2crd(index: Any, shape: IntTuple) -> IntTuple:
    """The natural colexicographic coordinate of `index` in `shape` (inverse of crd2idx).

    Like `crd2idx`, the last mode is not reduced, so indices past the end land in it.
    """
    if not is_tuple(shape):
        return index
    if len(shape) == 0:
        return ()
    out = []
    for s in shape[:-1]:
        extent = product(s)
        out.append(idx2crd(index % extent, s))
        index = index // extent
    out.append(idx2crd(index, shape[-1]))
    return tuple(out)


def crd2crd(coord: IntTuple, src_shape: IntTuple, dst_shape: IntTuple) -> IntTuple:
    """The coordinate of `dst_shape` that has the same colexicographic index as `coord`."""
    return idx2crd(crd2idx(coord, src_shape), dst_shape)
