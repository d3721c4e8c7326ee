"""Symbolic extents: exact arithmetic, sound decisions, clear refusals."""
from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tegula.layout.algebra import (can_compose, coalesce, complement, composition,
                                   logical_divide, max_common_vector, right_inverse,
                                   zipped_divide)
from tegula.layout.cute import Layout
from tegula.layout.errors import LayoutError
from tegula.layout.symbolic import (Sym, divides, divisibility, is_static, is_symbolic,
                                    known_equal, substitute, sym, sym_gcd, sym_max, sym_min,
                                    symbols_of)

# Declaration order is print order of products: M before K prints `M*K`.
M = sym("M")
K = sym("K", multiple_of=8)
N = sym("N", multiple_of=16)


# ---- arithmetic and printing -------------------------------------------------------------


def test_printing():
    assert str(K) == "K"
    assert str(K * 8) == "8*K" == str(8 * K)
    assert str(2 * K) == "2*K"
    assert str(M * K) == "M*K"
    assert str(K // 8) == "K//8"
    assert str(3 * K // 8) == "3*K//8"
    assert str(K - 8) == "K - 8"
    assert str(-K + 3) == "-K + 3"
    assert str(M * K + 8 * K + 16) == "M*K + 8*K + 16"
    assert str(K * K) == "K**2"


def test_results_that_lose_every_symbol_are_ints():
    for value, expected in [(K - K, 0), (K // K, 1), ((8 * K) // K, 8), (K % 8, 0),
                            ((K + 3) % 8, 3), ((M * K) // (M * K), 1)]:
        assert type(value) is int and value == expected


def test_exact_division():
    assert (M * K) // K == M
    assert (M * K + 8 * K) // K == M + 8
    assert (K // 8) * 8 == K
    assert (K + 5) // 8 == K // 8  # floor: K/8 is an integer, 5//8 == 0
    assert (16 * M) // 4 == 4 * M


def test_divisibility_and_static():
    assert divisibility(K) == 8
    assert divisibility(8 * K) == 64
    assert divisibility(K // 8) == 1
    assert divisibility(K + 4) == 4
    assert divisibility(M * K) == 8
    assert divisibility(12) == 12
    assert is_static(3) and is_static((1, (2, 3)))
    assert not is_static(K) and not is_static((1, (K, 3)))
    assert is_symbolic((M, 1)) and symbols_of((M, (K, 1))) == {"M", "K"}


# ---- decisions ---------------------------------------------------------------------------


def test_decidable_questions_return_plain_bools():
    assert (K * 8) % 16 == 0
    assert K % 8 == 0
    assert K % 4 == 0
    assert K >= 8 and K > 7 and not K < 8
    assert M >= 1 and M > 0
    assert N >= 16 and sym_min(N, 16) == 16
    assert K != 12          # 12 is not a multiple of 8
    assert 8 * K != 0
    assert bool(K)
    assert K == sym("K", multiple_of=8)
    assert K + 1 > K
    assert abs(-K) == K


@pytest.mark.parametrize("question,message", [
    (lambda: K % 16, "cannot decide whether K is divisible by 16: only K % 8 == 0 is known"),
    (lambda: K % 16 == 0, "K is divisible by 16"),
    (lambda: K // 16, "K // 16"),
    (lambda: M < 16, "M < 16: only M >= 1 is known"),
    (lambda: K == 16, "K == 16"),
    (lambda: bool(K - 8), "K - 8 is nonzero"),
    (lambda: M == K, "M == K"),
    (lambda: sym_min(M, 16), "min(M, 16)"),
    (lambda: sym_gcd(K, 16), "gcd(K, 16)"),
    (lambda: 16 % K, "16 % K"),
    (lambda: int(K), "symbolic"),
    (lambda: K / 8, "use //"),
])
def test_undecidable_questions_raise_with_reasons(question, message):
    with pytest.raises(LayoutError, match=message.replace("*", r"\*").replace("(", r"\(")
                       .replace(")", r"\)")):
        question()


def test_known_equal_and_divides_never_raise():
    assert known_equal(K, K) and known_equal((K, 1), (K, 1))
    assert not known_equal(K, 8) and not known_equal(M, 1)
    assert divides(8, K) is True and divides(16, K) is None and divides(16, K + 3) is False
    assert divides(16, K + 8) is None and divides(4, K + 2) is False


def test_gcd_min_max():
    assert sym_gcd(2 * K, 16) == 16
    assert sym_gcd(K, 4) == 4
    assert sym_gcd(M * K, K) == K
    assert sym_gcd(12, 18) == 6
    assert sym_min(K, 4) == 4 and sym_max(K, 4) == K
    assert sym_min(M, 1) == 1 and sym_max(1, M) == M
    assert sym_min(N // 16, 1) == 1


def test_conflicting_facts_are_an_error():
    with pytest.raises(LayoutError, match="declared twice"):
        K + sym("K", multiple_of=4)


def test_bad_declarations():
    for kwargs in ({"multiple_of": 0}, {"at_least": 0}):
        with pytest.raises(LayoutError):
            sym("Z", **kwargs)
    with pytest.raises(LayoutError):
        sym("not a name")


def test_at_least_bounds():
    T = sym("T", multiple_of=8, at_least=20)
    assert T >= 24 and T > 16
    assert sym_min(T, 24) == 24
    assert "T >= 24" in repr(T)


def test_substitute_checks_facts():
    assert substitute(M * K + 3, {"M": 5, "K": 16}) == 83
    assert substitute((K, (M, 2)), {"M": 2, "K": 8}) == (8, (2, 2))
    with pytest.raises(LayoutError, match="violates"):
        substitute(K, {"K": 12})
    with pytest.raises(LayoutError, match="no value"):
        substitute(K, {})


def test_hash_is_consistent_with_equality():
    assert hash(K * M) == hash(M * K)
    assert len({K, sym("K", multiple_of=8), 2 * K, K + K}) == 2


# ---- soundness: every decided answer holds for every admissible assignment ------------------

A = sym("A", multiple_of=4)
B = sym("B")
C = sym("C", multiple_of=2, at_least=6)
ATOMS = [A, B, C, 1]
ASSIGNMENTS = [dict(zip("ABC", v)) for v in itertools.product((4, 8, 12, 32), (1, 2, 3, 7),
                                                              (6, 8, 10, 64))]


@st.composite
def polys(draw):
    """Small polynomials in A, B, C with integer coefficients."""
    terms = draw(st.lists(st.tuples(st.integers(-6, 6), st.sampled_from(ATOMS),
                                    st.sampled_from(ATOMS)), min_size=1, max_size=3))
    return sum((c * x * y for c, x, y in terms), 0)


def _check(question, concrete):
    """If the symbolic question is decided, it agrees with every concrete assignment."""
    try:
        answer = question()
    except (LayoutError, ZeroDivisionError):
        return
    for values in ASSIGNMENTS:
        expected = concrete(values)
        got = substitute(answer, values) if isinstance(answer, Sym) else answer
        assert got == expected, values


def _ev(x, values):
    return substitute(x, values) if isinstance(x, Sym) else x


@given(polys(), polys(), st.integers(1, 24))
@settings(max_examples=250, deadline=None)
def test_decisions_are_sound(p, q, n):
    _check(lambda: p == q, lambda v: _ev(p, v) == _ev(q, v))
    _check(lambda: p < q, lambda v: _ev(p, v) < _ev(q, v))
    _check(lambda: p >= q, lambda v: _ev(p, v) >= _ev(q, v))
    _check(lambda: p % n, lambda v: _ev(p, v) % n)
    _check(lambda: p // n, lambda v: _ev(p, v) // n)
    _check(lambda: p + q, lambda v: _ev(p, v) + _ev(q, v))
    _check(lambda: p * q, lambda v: _ev(p, v) * _ev(q, v))
    _check(lambda: p // q, lambda v: _ev(p, v) // _ev(q, v))
    _check(lambda: p % q, lambda v: _ev(p, v) % _ev(q, v))
    _check(lambda: sym_min(p, q), lambda v: min(_ev(p, v), _ev(q, v)))
    _check(lambda: sym_max(p, q), lambda v: max(_ev(p, v), _ev(q, v)))
    _check(lambda: sym_gcd(p, q), lambda v: math.gcd(_ev(p, v), _ev(q, v)))
    d = divisibility(p)
    for values in ASSIGNMENTS:
        assert (_ev(p, values) % d == 0) if d else _ev(p, values) == 0


# ---- the CuTe algebra on symbolic layouts ---------------------------------------------------



def _at(layout, values):
    """The static layout a symbolic one becomes at concrete symbol values."""
    return Layout(substitute(layout.shape, values), substitute(layout.stride, values))


ROW_MAJOR = Layout((M, K), (K, 1))


def test_row_major_global_layout_prints_and_evaluates():
    assert str(ROW_MAJOR) == "(M,K):(K,1)"
    assert ROW_MAJOR(3, 5) == 3 * K + 5
    assert str(ROW_MAJOR((3, 5))) == "3*K + 5"
    assert ROW_MAJOR.size == M * K
    assert Layout.parse("(M,K):(K,1)", {"M": M, "K": K}) == ROW_MAJOR
    assert hash(Layout((M, K), (K, 1))) == hash(ROW_MAJOR)
    assert ROW_MAJOR != Layout((16, K), (K, 1))
    assert coalesce(ROW_MAJOR) == ROW_MAJOR  # K*M == K is not provable: no merge


def test_tiling_a_row_major_tensor_by_a_static_tiler():
    tile = composition(ROW_MAJOR, (Layout(16, 1), Layout(64, 1)))
    assert str(tile) == "(16,64):(K,1)"
    # A 16-row slab composed with a column-major 16x64 tiler gives the same tile.
    slab = Layout((16, K), (K, 1))
    assert composition(slab, Layout((16, 64), (1, 16))) == tile
    for values in ({"M": 32, "K": 64}, {"M": 16, "K": 128}):
        static = composition(_at(slab, values), Layout((16, 64), (1, 16)))
        assert static == _at(tile, values)


def test_zipped_divide_with_divisibility_facts():
    rows, cols = sym("R", multiple_of=16), sym("C", multiple_of=64)
    gmem = Layout((rows, cols), (cols, 1))
    tiled = zipped_divide(gmem, (16, 64))
    assert str(tiled) == "((16,64),(R//16,C//64)):((C,1),(16*C,64))"
    values = {"R": 48, "C": 128}
    assert _at(tiled, values) == zipped_divide(_at(gmem, values), (16, 64))


def test_undecidable_tilings_raise_clear_errors():
    # Whether a 16x64 column-major tiler fits depends on M >= 16.
    with pytest.raises(LayoutError, match="M < 16"):
        composition(ROW_MAJOR, Layout((16, 64), (1, 16)))
    assert "M < 16" in can_compose(ROW_MAJOR, Layout((16, 64), (1, 16)))
    # A partial last tile (M not a multiple of 16) has no polynomial extent.
    with pytest.raises(LayoutError, match="16 divides M"):
        logical_divide(ROW_MAJOR, (16, 64))
    with pytest.raises(LayoutError, match="64 divides K"):
        logical_divide(Layout((16, K), (K, 1)), (16, 64))
    with pytest.raises(LayoutError, match="16 divides M\\*K"):
        complement(Layout(16, 1), M * K)


def test_max_common_vector_with_symbolic_row_stride():
    # Two 8-element rows, K apart: contiguous only if K == 8, which is not known.
    assert max_common_vector(Layout((8, 2), (1, K)), Layout(16)) == 8
    wide = sym("W", multiple_of=16)
    assert max_common_vector(Layout((8, 2), (1, wide)), Layout(16)) == 8
    assert max_common_vector(Layout((8, 2), (1, 8)), Layout(16)) == 16
    # A 16x64 tile of a row-major tensor against a row-major shared tile: one row of 64.
    assert max_common_vector(Layout((16, 64), (K, 1)), Layout((16, 64), (64, 1))) == 64
    assert max_common_vector(ROW_MAJOR, ROW_MAJOR) == M * K


def test_right_inverse_of_a_symbolic_layout():
    inv = right_inverse(ROW_MAJOR)
    assert str(inv) == "(K,M):(M,1)"
    values = {"M": 3, "K": 16}
    static, static_inv = _at(ROW_MAJOR, values), _at(inv, values)
    assert all(static(static_inv(i)) == i for i in range(48))
