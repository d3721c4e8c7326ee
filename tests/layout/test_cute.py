"""The Layout value and int-tuple helpers: construction, notation, evaluation, structure."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

try:  # the tests folder may or may not be a package
    from tests.layout.cute_strategies import layouts
except ImportError:
    from cute_strategies import layouts
from tegula.layout import inttuple as it
from tegula.layout.cute import Layout
from tegula.layout.errors import LayoutError

P = Layout.parse
FAST = settings(max_examples=150, deadline=None)


# ------------------------------------------------------------------ int-tuples


def test_inttuple_structure():
    t = ((2, 3), 4, (5, (6, 7)))
    assert it.flatten(t) == (2, 3, 4, 5, 6, 7)
    assert it.rank(t) == 3 and it.rank(8) == 1
    assert it.depth(t) == 3 and it.depth(8) == 0 and it.depth((1, 2)) == 1
    assert it.product(t) == 2 * 3 * 4 * 5 * 6 * 7 and it.product(()) == 1
    assert it.product_each(t) == (6, 4, 210)
    assert it.unflatten(it.flatten(t), t) == t
    assert it.to_str(t) == "((2,3),4,(5,(6,7)))"


def test_inttuple_congruence_and_compatibility():
    assert it.congruent((2, (3, 4)), (1, (5, 6)))
    assert not it.congruent((2, (3, 4)), (1, 5))
    assert it.weakly_congruent((2, 3), ((1, 2), 3))
    assert not it.weakly_congruent(((1, 2), 3), (2, 3))
    assert it.compatible(12, (3, 4)) and it.compatible((12, 5), ((3, 4), 5))
    assert not it.compatible((3, 4), 12) and not it.compatible(12, (3, 5))


def test_prefix_product_is_column_major():
    assert it.prefix_product((2, (3, 4), 5)) == (1, (2, 6), 24)
    assert it.prefix_product(7) == 1
    assert it.prefix_product((2, 3), start=10) == (10, 20)


def test_divisions():
    assert it.shape_div((4, 6), 8) == (1, 3)
    assert it.shape_div(12, 4) == 3 and it.shape_div(4, 12) == 1
    with pytest.raises(LayoutError):
        it.shape_div(6, 4)
    assert it.ceil_div(10, 4) == 3
    assert it.ceil_div((4, 6), 8) == (1, 3)
    assert it.ceil_div((3, 5), 2) == (2, 5)
    assert it.gcd(12, 18) == 6 and it.lcm(4, 6) == 12


def test_coordinates_roundtrip():
    shape = ((2, 3), 4)
    for i in range(24):
        crd = it.idx2crd(i, shape)
        assert it.congruent(crd, shape)
        assert it.crd2idx(crd, shape) == i
    assert it.idx2crd(5, (2, 3)) == (1, 2)
    assert it.crd2crd((1, 2), (2, 3), (3, 2)) == (2, 1)
    # Past the end, the last mode absorbs the excess instead of wrapping.
    assert it.idx2crd(7, (2, 3)) == (1, 3)


# ------------------------------------------------------------------ Layout basics


def test_default_stride_is_compact_column_major():
    assert Layout((2, (3, 4))).stride == (1, (2, 6))
    assert str(Layout(8)) == "8:1"
    assert str(Layout((4, 8))) == "(4,8):(1,4)"


def test_notation_matches_cute():
    layout = Layout(((2, 2), 8), ((1, 16), 2))
    assert str(layout) == "((2,2),8):((1,16),2)"
    assert str(P("8:1")) == "8:1"
    assert str(P("(8):(1)")) == "(8):(1)"  # a rank-1 tuple stays a tuple, as in CuTe
    assert P(" ( (2, 2) , 8 ) : ( (1,16), 2 ) ") == layout
    assert P("(_4,_8):(_8,_1)") == Layout((4, 8), (8, 1))
    assert P("(4,8)") == Layout((4, 8))
    assert eval(repr(layout), {"Layout": Layout}) == layout


@pytest.mark.parametrize("text", ["(2,3", "(2,3):(1)", "2:1:1", "(2,x)", "(2;3)", "", "(2,)"])
def test_parse_errors_are_layout_errors(text):
    with pytest.raises(LayoutError):
        P(text)


def test_construction_errors():
    with pytest.raises(LayoutError, match="congruent"):
        Layout((2, 3), 1)
    with pytest.raises(LayoutError, match="at least 1"):
        Layout((2, 0))
    with pytest.raises(LayoutError):
        Layout(True)


def test_properties_of_paper_layout():
    # Hexcute Fig. 2 (a): the 4x8 row-major-interleaved shared tile.
    m = P("((2,2),8):((1,16),2)")
    assert m.size == 32 and m.cosize == 32
    assert m.rank == 2 and m.depth == 2
    assert m((2, 4)) == 24  # coordinate (2,4) -> address 24 (Hexcute Fig. 1 (a))
    assert m(((0, 1), 4)) == 24
    assert m(2, 4) == 24
    assert m[0] == P("(2,2):(1,16)") and m[1] == P("8:2")
    assert m[0][1] == P("2:16")
    assert m.flatten() == P("(2,2,8):(1,16,2)")
    assert [l for l in m.modes()] == [m[0], m[1]]


def test_rank1_layout_is_its_own_mode():
    layout = P("8:2")
    assert layout[0] is layout and layout.rank == 1 and layout.depth == 0
    with pytest.raises(LayoutError):
        layout[1]


def test_layout_is_not_iterable():
    with pytest.raises(TypeError):
        list(P("(2,3):(1,2)"))


def test_evaluation_past_the_end_extends_last_mode():
    layout = P("(2,3):(1,10)")
    assert layout(6) == 30 and layout(7) == 31


def test_cosize_with_broadcast_and_gaps():
    assert P("(4,2):(0,1)").cosize == 2
    assert P("(2,3):(1,7)").cosize == 16
    assert Layout(()).size == 1 and Layout(())(0) == 0


def test_equality_is_structural_and_hashable():
    a, b = P("(2,4):(1,2)"), P("(2,4):(1,2)")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != P("8:1")  # same function, different layout value
    assert a != "(2,4):(1,2)"
    assert P("8:1") != P("(8):(1)")


def test_offsets_of_and_coordinates():
    layout = P("(3,(2,2)):(4,(1,12))")
    idx = np.arange(layout.size)
    assert list(layout.offsets_of(idx)) == [layout(i) for i in range(layout.size)]
    coords = list(layout.coordinates())
    assert coords[1] == (1, (0, 0)) and coords[3] == (0, (1, 0))
    assert [layout(c) for c in coords] == list(layout.all_offsets())
    assert layout.is_injective() and not P("(2,2):(1,1)").is_injective()


def test_all_offsets_is_cached_and_read_only():
    layout = P("(4,8):(8,1)")
    first = layout.all_offsets()
    assert first is layout.all_offsets()
    assert first.dtype == np.int64 and not first.flags.writeable


# ------------------------------------------------------------------ properties


@FAST
@given(layouts())
def test_parse_str_roundtrip(layout):
    assert P(str(layout)) == layout


@FAST
@given(layouts())
def test_all_offsets_match_scalar_evaluation(layout):
    expect = [layout(i) for i in range(layout.size)]
    assert list(layout.all_offsets()) == expect
    for i in range(layout.size):
        assert layout(it.idx2crd(i, layout.shape)) == expect[i]


@FAST
@given(layouts())
def test_flatten_preserves_function(layout):
    flat = layout.flatten()
    assert flat.depth <= 1 and flat.size == layout.size
    assert list(flat.all_offsets()) == list(layout.all_offsets())


# ------------------------------------------------------------------ symbolic leaves


def test_symbolic_leaves_flow_through_layouts():
    symbolic = pytest.importorskip("tegula.layout.symbolic")
    K = symbolic.sym("K", multiple_of=8)
    M = symbolic.sym("M")
    layout = Layout((M, K), (K, 1))
    assert str(layout) == "(M,K):(K,1)"
    assert layout.size == M * K
    assert layout(1, 2) == K + 2
    assert P("(M,K):(K,1)", symbols={"M": M, "K": K}) == layout
    assert not layout.is_static()
    with pytest.raises(LayoutError, match="static"):
        layout.all_offsets()
