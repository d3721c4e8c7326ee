"""Bit-matrix algebra over GF(2) on Python ints.

A vector of F2^n is an int whose bit ``i`` is coordinate ``i``. A matrix is a list of its
*columns*, each an int: the matrix ``A`` with columns ``a_0 .. a_{k-1}`` maps the input
``x`` (an int over k bits) to ``A·x = XOR of a_j for every set bit j of x``.

Everything here rests on ONE routine, :func:`eliminate`: Gauss-Jordan elimination of the
columns, kept in reduced echelon form (each pivot bit appears in exactly one reduced
vector), with every reduced vector remembering which original columns XOR to it. From
that single record we read the rank, the kernel (dependent columns give kernel vectors),
membership in the span and a particular solution of ``A·x = b``, inverses, complements of
a span, and intersections of spans. Keeping one routine means one place to get right.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Iterable, Sequence

from tegula.layout.errors import LayoutError

#: Above this kernel dimension the minimal-weight search stops being exhaustive and
#: becomes a greedy descent (documented in :func:`min_weight_solution`).
EXACT_MIN_WEIGHT_NULLITY = 10


def popcount(x: int) -> int:
    """Number of set bits (the Hamming weight of a vector)."""
    return bin(x).count("1")


def bits_of(x: int) -> list[int]:
    """Indices of the set bits of ``x``, ascending."""
    out = []
    i = 0
    while x:
        if x & 1:
            out.append(i)
        x >>= 1
        i += 1
    return out


def is_pow2(n: int) -> bool:
    """True for 1, 2, 4, ... (sizes of F2 spaces)."""
    return n > 0 and n & (n - 1) == 0


def log2_exact(n: int, what: str = "size") -> int:
    """log2 of a power of two, else LayoutError naming ``what``."""
    if not is_pow2(n):
        raise LayoutError(f"{what} {n} is not a power of two, so it is not an F2 space")
    return n.bit_length() - 1


def mat_vec(cols: Sequence[int], x: int) -> int:
    """``A·x``: XOR of the columns selected by the set bits of ``x``."""
    y = 0
    j = 0
    while x:
        if x & 1:
            y ^= cols[j]
        x >>= 1
        j += 1
    return y


def mat_mul(outer: Sequence[int], inner: Sequence[int]) -> list[int]:
    """Columns of ``outer · inner`` (apply ``inner`` first)."""
    return [mat_vec(outer, c) for c in inner]


@dataclass
class Elimination:
    """The record of Gauss-Jordan elimination of a column list (see :func:`eliminate`).

    ``pivots`` maps a pivot bit to ``(vector, combo)``: ``vector`` is a reduced vector of
    the span whose highest set bit is the pivot bit and which has no other pivot bit set
    (reduced echelon form); ``combo`` says which original columns XOR to it.
    ``independent`` lists the indices of columns that raised the rank (a basis of the
    span, in the order given); ``kernel`` holds one kernel vector per dependent column
    (that column plus the earlier columns it depends on), together a basis of the kernel.
    """

    cols: tuple[int, ...]
    pivots: dict[int, tuple[int, int]] = field(default_factory=dict)
    independent: list[int] = field(default_factory=list)
    kernel: list[int] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return len(self.pivots)

    def reduce(self, v: int) -> tuple[int, int]:
        """Reduce ``v`` against the span: returns ``(residue, combo)`` with
        ``v == residue ^ A·combo`` and ``residue`` free of pivot bits (so ``residue == 0``
        iff ``v`` is in the span). One pass suffices because the form is reduced."""
        residue, combo = v, 0
        for p, (vec, c) in self.pivots.items():
            if (v >> p) & 1:
                residue ^= vec
                combo ^= c
        return residue, combo

    def solve(self, b: int) -> int | None:
        """A particular solution ``x`` of ``A·x = b``, or None if ``b`` is not in the span."""
        residue, combo = self.reduce(b)
        return combo if residue == 0 else None

    def _insert(self, vec: int, combo: int) -> None:
        # Keep the form reduced: clear the new pivot bit from every older vector.
        p = vec.bit_length() - 1
        for q, (w, c) in list(self.pivots.items()):
            if (w >> p) & 1:
                self.pivots[q] = (w ^ vec, c ^ combo)
        self.pivots[p] = (vec, combo)


def eliminate(cols: Iterable[int]) -> Elimination:
    """THE elimination routine: Gauss-Jordan over GF(2) on bit-packed columns.

    Columns are processed in order; a column that reduces to zero is dependent on the
    earlier ones and its combination is a kernel vector, otherwise its reduced form
    becomes a new pivot (its highest set bit). Cost O(k · rank) int operations.
    """
    e = Elimination(cols=tuple(cols))
    for j, col in enumerate(e.cols):
        if col < 0:
            raise LayoutError(f"column {j} is negative ({col}); F2 vectors are non-negative ints")
        residue, combo = e.reduce(col)
        combo ^= 1 << j
        if residue == 0:
            e.kernel.append(combo)
        else:
            e.independent.append(j)
            e._insert(residue, combo)
    return e


# ----------------------------------------------------------------------------------------
# Everything below is built on `eliminate`.


def rank(cols: Iterable[int]) -> int:
    """Dimension of the span of ``cols``."""
    return eliminate(cols).rank


def nullspace(cols: Sequence[int]) -> list[int]:
    """A basis of ``{x : A·x = 0}`` (vectors over ``len(cols)`` bits)."""
    return list(eliminate(cols).kernel)


def span_basis(vectors: Iterable[int]) -> list[int]:
    """A basis of the span made of the given vectors themselves (first-come order)."""
    vs = list(vectors)
    return [vs[j] for j in eliminate(vs).independent]


def in_span(vectors: Sequence[int], v: int) -> bool:
    """Whether ``v`` is an XOR of some of ``vectors``."""
    return eliminate(vectors).solve(v) is not None


def solve(cols: Sequence[int], b: int) -> int | None:
    """A particular solution of ``A·x = b`` (free variables zero), or None."""
    return eliminate(cols).solve(b)


def complement(vectors: Sequence[int], nbits: int) -> list[int]:
    """Unit vectors completing a basis of ``span(vectors)`` to a basis of F2^nbits.

    The reduced vectors have pairwise distinct highest bits (their pivots); adding the unit
    vectors of the non-pivot bits gives ``nbits`` vectors with distinct highest bits, hence
    a basis. Unit vectors are chosen because they are the simplest (weight one) complement.
    """
    e = eliminate(vectors)
    if any(p >= nbits for p in e.pivots):
        raise LayoutError(f"vectors {list(vectors)} do not fit in {nbits} bits")
    return [1 << i for i in range(nbits) if i not in e.pivots]


def intersection(u: Sequence[int], v: Sequence[int]) -> list[int]:
    """A basis of ``span(u) ∩ span(v)``.

    A kernel vector ``(a, b)`` of the concatenation ``[u | v]`` says ``U·a == V·b``; those
    common values span the intersection (every common value arises that way).
    """
    u = list(u)
    e = eliminate(u + list(v))
    mask = (1 << len(u)) - 1
    return span_basis(mat_vec(u, k & mask) for k in e.kernel)


def reduce_min_int(x: int, kernel: Sequence[int]) -> int:
    """The numerically smallest element of the coset ``x + span(kernel)``.

    Reduce ``x`` by an echelon basis of the kernel from the highest pivot down: clearing a
    pivot bit can only lower the number, and the result is unique.
    """
    basis = sorted((vec for vec, _ in eliminate(kernel).pivots.values()), reverse=True)
    for vec in basis:
        if (x >> (vec.bit_length() - 1)) & 1:
            x ^= vec
    return x


def min_weight_solution(e: Elimination, b: int, prefer: int | None = None) -> int | None:
    """The solution of ``A·x = b`` chosen by the free-variable policy, or None.

    Policy (used by every pseudo-inverse in tegula): if ``prefer`` (a candidate ``x``) is a
    solution, take it. Otherwise take a solution of minimal Hamming weight — the fewest
    input bits, i.e. the fewest hardware resources, produce the value — breaking ties by
    the smallest integer, i.e. the lowest input bits (registers before lanes before warps
    in the usual dimension order). The search over the coset ``x0 + kernel`` is exhaustive
    while the kernel has at most ``EXACT_MIN_WEIGHT_NULLITY`` dimensions; beyond that it is
    a greedy descent from the smallest-integer solution (XOR single or pairs of kernel
    basis vectors while the weight drops), which may miss the optimum.
    """
    x0 = e.solve(b)
    if x0 is None:
        return None
    if prefer is not None and mat_vec(e.cols, prefer) == b:
        return prefer
    kernel = e.kernel
    best = reduce_min_int(x0, kernel)
    if not kernel:
        return best
    key = (popcount(best), best)
    if len(kernel) <= EXACT_MIN_WEIGHT_NULLITY:
        # Enumerate the coset in Gray-code order: one XOR per element.
        x = best
        for i in range(1, 1 << len(kernel)):
            x ^= kernel[(i & -i).bit_length() - 1]
            k = (popcount(x), x)
            if k < key:
                best, key = x, k
        return best
    moves = list(kernel) + [a ^ c for a, c in combinations(kernel, 2)]
    improved = True
    while improved:
        improved = False
        for m in moves:
            k = (popcount(best ^ m), best ^ m)
            if k < key:
                best, key, improved = best ^ m, k, True
    return best
