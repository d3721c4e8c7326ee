"""The CuTe layout algebra: worked examples from the CuTe docs and the Hexcute paper, and
property-based checks of every operation's defining equation on random layouts."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

try:  # the tests folder may or may not be a package
    from tests.layout.cute_strategies import (
        compact_layouts, injective_layouts, layouts, permuted_compact)
except ImportError:
    from cute_strategies import compact_layouts, injective_layouts, layouts, permuted_compact
from tegula.layout import (
    LayoutError, append, blocked_product, can_complement, can_compose, can_divide, can_invert,
    can_product, coalesce, complement, composition, filter_layout, flat_divide, flat_product,
    left_inverse, logical_divide, logical_product, make_layout, make_layout_tv,
    make_ordered_layout, max_common_layout, max_common_vector, prepend, raked_product,
    right_inverse, select, tile_to_shape, tiled_divide, tiled_product, zipped_divide,
    zipped_product,
)
from tegula.layout.cute import Layout

P = Layout.parse
FAST = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
# For the checks whose every example evaluates several layouts in full.
QUICK = settings(FAST, max_examples=60)


def offsets(layout: Layout) -> list[int]:
    return [int(x) for x in layout.all_offsets()]


def same_function(a: Layout, b: Layout) -> bool:
    return a.size == b.size and offsets(a) == offsets(b)


def composed_offsets(a: Layout, b: Layout) -> list[int]:
    """`a(b(i))` for every i, past a's end included: composition extends a as CuTe C++
    does (coalesce_x), which is exactly `Layout`'s own evaluation past the end."""
    return [a(int(j)) for j in b.all_offsets()]


# ------------------------------------------------------------------ worked examples


@pytest.mark.parametrize("before, after", [
    ("(2,(1,6)):(1,(6,2))", "12:1"),
    ("(4,2):(1,4)", "8:1"),
    ("(4,2):(2,1)", "(4,2):(2,1)"),
    ("(1,1):(3,5)", "1:0"),
    ("(2,1,3):(0,7,0)", "6:0"),
    ("((2,2),8):((1,16),2)", "(2,2,8):(1,16,2)"),
])
def test_coalesce_examples(before, after):
    assert coalesce(P(before)) == P(after)


def test_coalesce_by_mode_keeps_rank():
    layout = P("((2,4),(3,5)):((1,2),(8,24))")
    assert coalesce(layout, (1, 1)) == P("(8,15):(1,8)")
    assert coalesce(layout, (1,)) == P("(8,(3,5)):(1,(8,24))")


def test_filter_is_cutes_name_too():
    from tegula.layout import algebra
    assert algebra.filter is filter_layout


def test_errors_of_divides_and_products_name_the_operands():
    with pytest.raises(LayoutError) as err:
        logical_divide(P("(6,4):(1,10)"), P("4:4"))
    assert "logical_divide((6,4):(1,10), 4:4)" in str(err.value)
    with pytest.raises(LayoutError) as err:
        blocked_product(P("(2,2):(1,1)"), P("2:1"))
    assert "blocked_product((2,2):(1,1), 2:1)" in str(err.value) and "injective" in str(err.value)
    with pytest.raises(LayoutError, match="too|modes"):
        logical_divide(P("8:1"), (2, 2))


def test_filter_removes_broadcast_and_unit_modes():
    assert filter_layout(P("(2,1,3,4):(1,9,0,4)")) == P("(2,4):(1,4)")
    assert filter_layout(P("(2,1,3,4):(1,9,0,2)")) == P("8:1")
    assert filter_layout(P("(4,3):(0,0)")) == P("1:0")


@pytest.mark.parametrize("a, b, result", [
    ("(6,2):(8,2)", "(4,3):(3,1)", "((2,2),3):((24,2),8)"),     # CuTe docs
    ("20:2", "(5,4):(4,1)", "(5,4):(8,2)"),                     # CuTe docs
    ("(10,2):(16,4)", "(5,4):(1,5)", "(5,(2,2)):(16,(80,4))"),  # CuTe docs
    ("(4,8):(8,1)", "8:1", "(4,2):(8,1)"),
    ("(4,8):(8,1)", "4:0", "4:0"),
    ("12:3", "(2,3):(1,2)", "(2,3):(3,6)"),
])
def test_composition_examples(a, b, result):
    assert composition(P(a), P(b)) == P(result)
    assert can_compose(P(a), P(b)) is None


def test_composition_with_tilers():
    a = P("(12,(4,8)):(59,(13,1))")  # CuTe docs, "composition tilers"
    assert composition(a, (P("3:4"), P("8:2"))) == P("(3,(2,4)):(236,(26,1))")
    assert composition(a, (3, 8)) == P("(3,(4,2)):(59,(13,1))")
    assert composition(a, (None, 8)) == make_layout(a[0], P("(4,2):(13,1)"))
    # Modes the tiler does not reach are dropped (CuTe C++ behaviour).
    assert composition(P("(4,8,2):(1,4,32)"), (2,)) == P("(2):(1)")
    assert composition(P("(4,8):(8,1)"), 8) == P("(4,2):(8,1)")


def test_hexcute_appendix_c_composition():
    # g ∘ q⁻¹ from Hexcute appendix C; the paper writes the result flattened per mode.
    g = P("((4,8),(2,2,2)):((32,1),(16,8,256))")
    q_inv = P("((8,4),(2,4)):((4,64),(32,1))")
    result = composition(g, q_inv)
    assert result == P("((8,(2,2)),(2,4)):((1,(8,256)),(16,32))")
    assert same_function(result, P("((8,2,2),(2,4)):((1,8,256),(16,32))"))
    assert result((17, 5)) == 337 and (337 % 16, 337 // 16) == (1, 21)


def test_inadmissible_composition_names_both_operands():
    a, b = P("(6,4):(1,10)"), P("4:4")
    reason = can_compose(a, b)
    assert reason is not None and "divisib" in reason
    with pytest.raises(LayoutError) as err:
        composition(a, b)
    assert "(6,4):(1,10)" in str(err.value) and "4:4" in str(err.value)
    # Shape divisibility: 4 steps of stride 1 land 3 in a mode of extent 3 (3 ∤ 4).
    assert can_compose(P("(3,4):(1,8)"), P("4:1")) is not None
    # A step that stays inside one mode is fine even when nothing divides.
    assert composition(P("(6,4):(1,10)"), P("2:4")) == P("2:4")
    assert can_compose(P("(4,2):(1,4)"), (2, 2, 2)) is not None
    # negative strides compose when they all agree in sign; mixed signs do not distribute
    assert composition(P("8:1"), P("4:-1")) == P("4:-1")
    assert "mixes negative and positive" in can_compose(P("8:1"), P("(2,2):(1,-2)"))


@pytest.mark.parametrize("layout, cotarget, result", [
    ("4:1", 24, "6:4"),                 # CuTe docs
    ("6:4", 24, "4:1"),
    ("(4,6):(1,4)", 24, "1:0"),
    ("4:2", 24, "(2,3):(1,8)"),
    ("(2,4):(1,6)", 24, "3:2"),
    ("(2,2):(1,6)", 24, "(3,2):(2,12)"),
    ("(2,2):(1,6)", None, "3:2"),
    ("4:0", 8, "8:1"),
    ("(2,3):(3,1)", 30, "5:6"),
])
def test_complement_examples(layout, cotarget, result):
    assert complement(P(layout), cotarget) == P(result)


def test_inadmissible_complements():
    assert "injective" in can_complement(P("(2,2):(1,1)"), 8)
    assert "multiple" in can_complement(P("(2,2):(1,3)"), 12)
    with pytest.raises(LayoutError, match=r"complement\(\(2,2\):\(1,3\), 12\)"):
        complement(P("(2,2):(1,3)"), 12)


def test_inverses_examples():
    assert right_inverse(P("(4,2):(2,1)")) == P("(2,4):(4,1)")
    assert right_inverse(P("((8,4),(4,2)):((32,2),(8,1))")) == P("(2,4,8,4):(32,1,4,64)") \
        or same_function(composition(P("((8,4),(4,2)):((32,2),(8,1))"),
                                     right_inverse(P("((8,4),(4,2)):((32,2),(8,1))"))),
                         Layout(256))
    assert right_inverse(P("4:2")) == P("1:0")
    assert right_inverse(P("(4,3):(1,8)")) == P("4:1")
    assert left_inverse(P("(4,2):(2,1)")) == P("(2,4):(4,1)")
    assert left_inverse(P("4:2")) == P("(2,4):(0,1)")
    assert left_inverse(P("(2,2):(1,3)")) == P("(3,2):(1,2)")
    assert can_invert(P("(2,3):(3,2)")) is not None
    assert can_invert(P("(2,3):(3,2)"), "right") is None
    with pytest.raises(LayoutError, match="left_inverse"):
        left_inverse(P("(2,2):(1,1)"))


def test_logical_divide_examples():
    # CuTe docs: the 1-D and 2-D logical_divide pictures.
    assert logical_divide(P("(4,2,3):(2,1,8)"), P("4:2")) == P("((2,2),(2,3)):((4,1),(2,8))")
    a = P("(9,(4,8)):(59,(13,1))")
    tiler = (P("3:3"), P("(2,4):(1,8)"))
    assert logical_divide(a, tiler) == P("((3,3),((2,4),(2,2))):((177,59),((13,2),(26,1)))")
    assert zipped_divide(a, tiler) == P("((3,(2,4)),(3,(2,2))):((177,(13,2)),(59,(26,1)))")
    assert tiled_divide(a, tiler) == P("((3,(2,4)),3,(2,2)):((177,(13,2)),59,(26,1))")
    assert flat_divide(a, tiler) == P("(3,(2,4),3,(2,2)):(177,(13,2),59,(26,1))")
    assert logical_divide(P("24:1"), 4) == P("(4,6):(1,4)")
    assert logical_divide(a, (None, 8)) == make_layout(a[0], P("((4,2),4):((13,1),2)"))


def test_divide_of_a_matrix_by_a_tile_shape():
    # A 16x12 column-major tile split into 4x3 blocks; rest modes count blocks.
    a = Layout((16, 12))
    z = zipped_divide(a, (4, 3))
    assert z == P("((4,3),(4,4)):((1,16),(4,48))")
    assert z[0] == composition(a, (4, 3))
    assert can_divide(P("(6,4):(1,6)"), P("4:1")) is None
    assert can_divide(P("(6,4):(1,10)"), P("4:4")) is not None


def test_logical_product_examples():
    # CuTe docs: "(2,2):(4,1) ⊗ 6:1" and the 2-D blocked/raked products.
    assert logical_product(P("(2,2):(4,1)"), P("6:1")) == P("((2,2),(2,3)):((4,1),(2,8))")
    assert logical_product(P("(2,2):(4,1)"), P("4:2")) == P("((2,2),4):((4,1),8)")
    block, tiler = P("(2,5):(5,1)"), P("(3,4):(1,3)")
    assert logical_product(block, tiler) == P("((2,5),(3,4)):((5,1),(10,30))")
    assert blocked_product(block, tiler) == P("((2,3),(5,4)):((5,10),(1,30))")
    assert raked_product(block, tiler) == P("((3,2),(4,5)):((10,5),(30,1))")
    # A tuple tiler multiplies each mode inside that mode's own offsets.
    assert zipped_product(block, (P("3:1"), P("4:1"))) == P("((2,5),(3,4)):((5,1),(1,5))")
    assert tiled_product(block, (3, 4)) == P("((2,5),3,4):((5,1),1,5)")
    assert flat_product(block, (3, 4)) == P("(2,5,3,4):(5,1,1,5)")
    assert can_product(P("(2,2):(1,1)"), P("2:1")) is not None


def test_tile_to_shape_and_ordered_layouts():
    assert make_ordered_layout((2, 3, 4), (1, 0, 2)) == P("(2,3,4):(3,1,6)")
    assert make_ordered_layout((2, 3)) == P("(2,3):(1,2)")
    block = P("(2,4):(4,1)")
    tiled = tile_to_shape(block, (8, 12))
    assert tiled == P("((2,4),(4,3)):((4,8),(1,32))")
    row_major_tiles = tile_to_shape(block, (8, 12), order=(1, 0))
    assert row_major_tiles == P("((2,4),(4,3)):((4,24),(1,8))")
    with pytest.raises(LayoutError, match="divide"):
        tile_to_shape(block, (8, 10))


def test_concatenation_helpers():
    a, b = P("4:1"), P("(2,3):(4,8)")
    assert make_layout(a, b) == P("(4,(2,3)):(1,(4,8))")
    assert append(a, b) == P("(4,(2,3)):(1,(4,8))")
    assert prepend(b, a) == P("(4,2,3):(1,4,8)")
    assert append(a, up_to_rank=3) == P("(4,1,1):(1,0,0)")
    assert select(P("(2,3,4):(1,2,6)"), 2, 0) == P("(4,2):(6,1)")


def test_make_layout_tv_examples():
    # CuTe DSL documentation example (elementwise add, f32, 128-bit vectors).
    tile, tv = make_layout_tv(P("(4,32):(32,1)"), P("(4,4):(4,1)"))
    assert tile == (16, 128)
    assert tv == P("((32,4),(4,4)):((64,4),(16,1))")
    # A 32x8 column-major thread block with 4 values per thread along M.
    tile, tv = make_layout_tv(Layout((32, 8)), Layout((4, 1)))
    assert tile == (128, 8) and tv == P("(256,4):(4,1)")


def test_max_common_vector_examples():
    col, row = P("(8,4):(1,8)"), P("(8,4):(4,1)")
    assert max_common_vector(col, col) == 32
    assert max_common_vector(col, row) == 1
    assert max_common_vector(P("(8,4):(1,16)"), col) == 8
    assert max_common_vector(P("((4,2),4):((1,16),4)"), col) == 4
    assert max_common_layout(col, col) == P("32:1")
    assert max_common_layout(col, row) == P("1:0")


# ------------------------------------------------------------------ properties


@st.composite
def composable_pairs(draw):
    """A random lhs and a random rhs whose strides are built from the lhs's mode extents,
    so that admissible pairs are common; inadmissible ones are filtered out."""
    a = draw(layouts(max_modes=3, max_stride=20))
    extents = [s for s in coalesce(a).flatten().flat_shape]
    units = [1]
    for e in extents:
        units.append(units[-1] * e)
    n = draw(st.integers(1, 3))
    shape = tuple(draw(st.sampled_from([1, 2, 3, 4, 6])) for _ in range(n))
    stride = tuple(draw(st.sampled_from(units)) * draw(st.sampled_from([0, 1, 1, 2, 3]))
                   for _ in range(n))
    b = Layout(shape if n > 1 else shape[0], stride if n > 1 else stride[0])
    assume(can_compose(a, b) is None)
    return a, b


@FAST
@given(composable_pairs())
def test_composition_is_function_composition(pair):
    a, b = pair
    r = composition(a, b)
    assert r.size == b.size
    assert offsets(r) == composed_offsets(a, b)


@FAST
@given(layouts(max_modes=3, max_stride=12), layouts(max_modes=2, max_stride=12))
def test_composition_never_returns_a_wrong_layout(a, b):
    # Random pairs: either an error, or exactly the composed function.
    if can_compose(a, b) is not None:
        with pytest.raises(LayoutError):
            composition(a, b)
        return
    r = composition(a, b)
    assert offsets(r) == composed_offsets(a, b)


@QUICK
@given(layouts())
def test_coalesce_preserves_function(layout):
    c = coalesce(layout)
    assert c.size == layout.size and c.depth <= 1
    assert offsets(c) == offsets(layout)
    by_mode = coalesce(layout, tuple([1] * layout.rank)) if layout.rank > 1 else c
    assert offsets(by_mode) == offsets(layout)


@QUICK
@given(injective_layouts(), st.integers(1, 4))
def test_complement_is_disjoint_ordered_and_fills(layout, factor):
    cotarget = layout.cosize * factor
    c = complement(layout, cotarget)
    image, co_image = set(offsets(layout)), set(offsets(c))
    assert image & co_image == {0}
    strides = [d for s, d in zip(c.flat_shape, c.flat_stride) if s > 1]
    assert strides == sorted(strides)
    combined = make_layout(layout, c)
    assert sorted(offsets(combined)) == list(range(combined.size))
    assert combined.size >= cotarget


@QUICK
@given(layouts())
def test_right_inverse_property(layout):
    r = right_inverse(layout)
    assert [layout(int(j)) for j in r.all_offsets()] == list(range(r.size))


@QUICK
@given(compact_layouts())
def test_inverses_of_bijections_are_full(layout):
    r, l = right_inverse(layout), left_inverse(layout)
    assert r.size == layout.size
    assert same_function(r, l)
    assert offsets(composition(layout, r)) == list(range(layout.size))


@QUICK
@given(injective_layouts())
def test_left_inverse_property(layout):
    assert can_invert(layout) is None
    l = left_inverse(layout)
    assert [l(int(x)) for x in layout.all_offsets()] == list(range(layout.size))


@st.composite
def divisible_pairs(draw):
    """A tiler that is injective, and a compact layout whose size is a multiple of the
    tiler's cosize (with one extra mode of random extent)."""
    b = draw(injective_layouts(max_modes=2))
    extra = draw(st.sampled_from([1, 2, 3]))
    a = draw(permuted_compact((b.cosize, extra)))
    assume(can_divide(a, b) is None)
    return a, b


@QUICK
@given(divisible_pairs())
def test_divides_restrict_to_composition(pair):
    a, b = pair
    assert same_function(zipped_divide(a, b)[0], composition(a, b))
    d = logical_divide(a, b)
    assert same_function(d[0], composition(a, b))
    assert d.size >= a.size
    if d.size == a.size:
        # The tiles and their repetitions cover the layout exactly once.
        assert sorted(offsets(d)) == sorted(offsets(a))
    assert same_function(flat_divide(a, b), d) and same_function(tiled_divide(a, b), d)


@QUICK
@given(injective_layouts(max_modes=3), layouts(max_modes=2, max_stride=8))
def test_logical_product_keeps_block(block, tiler):
    assume(can_product(block, tiler) is None)
    p = logical_product(block, tiler)
    assert p[0] == block
    assert p.size == block.size * tiler.size


@QUICK
@given(compact_layouts(max_modes=2), compact_layouts(max_modes=2))
def test_blocked_and_raked_products_are_bijections(block, tiler):
    for product in (blocked_product(block, tiler), raked_product(block, tiler)):
        assert product.rank == max(block.rank, tiler.rank)
        assert sorted(offsets(product)) == list(range(block.size * tiler.size))


@st.composite
def rank2_compact(draw):
    m, n = draw(st.sampled_from([1, 2, 3, 4])), draw(st.sampled_from([1, 2, 3, 4, 8]))
    return Layout((m, n), (n, 1)) if draw(st.booleans()) else Layout((m, n))


@QUICK
@given(rank2_compact(), rank2_compact())
def test_make_layout_tv_inverts_the_raked_tile(thr, val):
    tile, tv = make_layout_tv(thr, val)
    layout_mn = raked_product(thr, val)
    assert tile == tuple(s for s in (layout_mn[0].size, layout_mn[1].size))
    assert tv.shape == (thr.size, val.size) or tv.size == thr.size * val.size
    for t in range(thr.size):
        for v in range(val.size):
            assert layout_mn(int(tv(t, v))) == t + thr.size * v


@st.composite
def same_shape_pairs(draw):
    """Two bijections with the same flat extents in different orders."""
    a = draw(compact_layouts())
    b = draw(permuted_compact(a.flat_shape))
    return a, b


@QUICK
@given(same_shape_pairs())
def test_max_common_vector_property(pair):
    a, b = pair
    n = max_common_vector(a, b)
    inv_b = right_inverse(b)
    assert n >= 1
    for i in range(n):
        assert a(int(inv_b(i))) == i and b(int(inv_b(i))) == i


# ------------------------------------------------------------------ symbolic leaves


def test_symbolic_composition_and_divide():
    symbolic = pytest.importorskip("tegula.layout.symbolic")
    M, K = symbolic.sym("M", multiple_of=16), symbolic.sym("K", multiple_of=32)
    gmem = Layout((M, K), (K, 1))
    assert composition(gmem, (16, 32)) == Layout((16, 32), (K, 1))
    assert coalesce(Layout((4, K), (1, 4))) == Layout(4 * K, 1)
    assert str(composition(Layout(K, 2), 8)) == "8:2"


def test_swizzled_operands_outside_composition_are_layout_errors():
    """Regression: a ComposedLayout reached attribute lookups deep in the algebra
    (AttributeError / TypeError); now each operation either supports it exactly or
    says which operation refused which layout."""
    from tegula.layout import ComposedLayout, Swizzle, complement, logical_product, zipped_divide
    sw = ComposedLayout(Swizzle(2, 0, 3), 0, P("(8,8):(8,1)"))
    divided = logical_divide(sw, P("4:1"))
    assert all(divided(i) == sw(i) for i in range(64))  # the divide is a reshaping
    for op, call in [("complement", lambda: complement(sw)), ("coalesce", lambda: coalesce(sw)),
                     ("complement", lambda: logical_product(sw, P("2:1"))),
                     ("zipped", lambda: zipped_divide(sw, P("4:1")))]:
        with pytest.raises(LayoutError, match=op):
            call()
