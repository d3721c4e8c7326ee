"""GF(2) elimination and the bit-matrix helpers built on it, checked against brute force."""
from __future__ import annotations

from itertools import product

import pytest
from hypothesis import given, settings, strategies as st

from tegula.layout import f2
from tegula.layout.errors import LayoutError

NBITS = 6
cols_st = st.lists(st.integers(0, (1 << NBITS) - 1), min_size=0, max_size=7)


def span_brute(cols):
    out = {0}
    for c in cols:
        out |= {v ^ c for v in out}
    return out


@settings(max_examples=40, deadline=None)
@given(cols_st)
def test_rank_and_kernel(cols):
    e = f2.eliminate(cols)
    assert 1 << e.rank == len(span_brute(cols))
    assert e.rank + len(e.kernel) == len(cols)
    for k in e.kernel:
        assert k and f2.mat_vec(cols, k) == 0
    assert f2.rank(e.kernel) == len(e.kernel)
    # the independent columns alone span everything
    assert span_brute([cols[j] for j in e.independent]) == span_brute(cols)
    # reduced echelon form: pivots are highest bits, no pivot bit appears elsewhere
    for p, (vec, combo) in e.pivots.items():
        assert vec.bit_length() - 1 == p
        assert f2.mat_vec(cols, combo) == vec
        for q in e.pivots:
            assert q == p or not (vec >> q) & 1


@settings(max_examples=40, deadline=None)
@given(cols_st, st.integers(0, (1 << NBITS) - 1))
def test_solve_and_min_weight(cols, b):
    e = f2.eliminate(cols)
    x = e.solve(b)
    sols = [x for x in range(1 << len(cols)) if f2.mat_vec(cols, x) == b]
    assert (x is None) == (not sols)
    if sols:
        assert f2.mat_vec(cols, x) == b
        best = f2.min_weight_solution(e, b)
        assert best == min(sols, key=lambda s: (f2.popcount(s), s))
        assert f2.reduce_min_int(x, e.kernel) == min(sols)


@settings(max_examples=30, deadline=None)
@given(cols_st, cols_st)
def test_intersection_and_complement(u, v):
    got = f2.intersection(u, v)
    assert span_brute(got) == span_brute(u) & span_brute(v)
    assert f2.rank(got) == len(got)
    comp = f2.complement(u, NBITS)
    assert f2.rank(list(u) + comp) == NBITS
    assert len(comp) == NBITS - f2.rank(u)


def test_prefer_and_greedy():
    cols = [1, 2, 3]
    e = f2.eliminate(cols)
    assert f2.min_weight_solution(e, 3) == 0b100
    assert f2.min_weight_solution(e, 3, prefer=0b011) == 0b011
    assert f2.min_weight_solution(e, 3, prefer=0b001) == 0b100  # not a solution: ignored
    # Beyond the exhaustive limit the greedy descent still finds the obvious optimum.
    n = f2.EXACT_MIN_WEIGHT_NULLITY + 3
    cols = [1] * n + [2]
    e = f2.eliminate(cols)
    assert len(e.kernel) == n - 1
    assert f2.popcount(f2.min_weight_solution(e, 3)) == 2


def test_helpers():
    assert f2.bits_of(0b10110) == [1, 2, 4]
    assert f2.log2_exact(64) == 6
    with pytest.raises(LayoutError):
        f2.log2_exact(12)
    assert f2.mat_mul([1, 2], [3, 1]) == [3, 1]
    assert f2.in_span([1, 2], 3) and not f2.in_span([1, 2], 4)
    assert f2.span_basis([1, 1, 2, 3]) == [1, 2]
    assert f2.nullspace([1, 1]) == [0b11]
    assert f2.solve([1, 2], 4) is None
    with pytest.raises(LayoutError):
        f2.eliminate([-1])
    with pytest.raises(LayoutError):
        f2.complement([8], 3)


def test_all_small_square_matrices_inverse():
    # Every invertible 3x3 matrix: solving the unit vectors gives the inverse.
    for cols in product(range(8), repeat=3):
        e = f2.eliminate(cols)
        if e.rank < 3:
            continue
        inv = [e.solve(1 << j) for j in range(3)]
        assert f2.mat_mul(cols, inv) == [1, 2, 4]
        assert f2.mat_mul(inv, cols) == [1, 2, 4]
