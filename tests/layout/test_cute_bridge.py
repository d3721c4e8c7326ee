"""CuTe <-> F2 bridge: agreement on every index, worked TV examples, and refusals."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tegula.layout import LayoutError, LinearLayout as LL
from tegula.layout.cute import Layout
from tegula.layout.cute_bridge import linear_from_cute, linear_from_cute_tv, linear_to_cute
from tegula.layout.swizzle import ComposedLayout, Swizzle

FAST = settings(max_examples=30, deadline=None)


@st.composite
def pow2_layouts(draw, distinct: bool = True):
    """Hierarchical layouts with power-of-two extents and strides that are powers of two
    or 0. With ``distinct``, the nonzero per-bit images never repeat (so the map is
    linear); otherwise strides are arbitrary small ints (often not linear)."""
    nleaves = draw(st.integers(1, 5))
    extents = [1 << draw(st.integers(0, 3)) for _ in range(nleaves)]
    if distinct:
        # Each leaf covers a block of output bits; blocks are disjoint, in random order.
        strides, pos = [0] * nleaves, 0
        for leaf in draw(st.permutations(range(nleaves))):
            pos += draw(st.integers(0, 1))
            strides[leaf] = 0 if draw(st.integers(0, 5)) == 0 else 1 << pos
            pos += extents[leaf].bit_length() - 1
    else:
        strides = [draw(st.integers(0, 9)) for _ in extents]
    # Group the leaves into up to three top-level modes, some of them nested.
    cuts = sorted(draw(st.lists(st.integers(1, nleaves - 1), max_size=2, unique=True))) \
        if nleaves > 1 else []
    shape, stride, lo = [], [], 0
    for hi in cuts + [nleaves]:
        grp_e, grp_s = tuple(extents[lo:hi]), tuple(strides[lo:hi])
        shape.append(grp_e if len(grp_e) > 1 else grp_e[0])
        stride.append(grp_s if len(grp_s) > 1 else grp_s[0])
        lo = hi
    if len(shape) == 1:
        return Layout(shape[0], stride[0])
    return Layout(tuple(shape), tuple(stride))


def agrees_everywhere(ll: LL, layout) -> bool:
    offsets = layout.all_offsets()
    return all(ll.apply_flat(i) == int(offsets[i]) for i in range(len(offsets)))


@FAST
@given(pow2_layouts())
def test_linear_cute_layouts_agree_on_every_index(layout):
    ll = linear_from_cute(layout)
    assert agrees_everywhere(ll, layout)
    assert [n for n in ll.in_dim_names] == [f"dim{k}" for k in range(layout.rank)]
    assert LL.from_cute(layout) == ll


@FAST
@given(pow2_layouts(distinct=False))
def test_arbitrary_strides_are_converted_exactly_or_refused(layout):
    try:
        ll = linear_from_cute(layout)
    except LayoutError as err:
        assert "not F2-linear" in str(err) or "power of two" in str(err)
        return
    assert agrees_everywhere(ll, layout)


@FAST
@given(pow2_layouts(), st.integers(0, 3), st.integers(0, 3), st.integers(-4, 4))
def test_swizzled_layouts_agree_on_every_index(inner, bits, base, shift):
    if abs(shift) < bits or base + min(0, shift) < 0:
        return
    composed = ComposedLayout(Swizzle(bits, base, shift), 0, inner)
    ll = linear_from_cute(composed)
    assert agrees_everywhere(ll, composed)
    # the swizzle composes as an F2 map on the offset bits
    sw = Swizzle(bits, base, shift)
    plain = linear_from_cute(inner)
    width = max(plain.total_out_bits, (sw.size() - 1).bit_length())
    p = LL.from_packed({"flat": plain.matrix()}, [("offset", 1 << width)])
    s = LL.from_packed({"offset": [sw(1 << k) for k in range(width)]}, [("offset", 1 << width)])
    assert p.compose(s).matrix() == ll.matrix()


@FAST
@given(st.data())
def test_round_trip_through_cute(data):
    nbits = data.draw(st.integers(0, 6))
    extra = data.draw(st.integers(0, 2))
    outs = data.draw(st.permutations(range(nbits + extra)))
    cols = [0 if data.draw(st.integers(0, 4)) == 0 else 1 << outs[k] for k in range(nbits)]
    split = data.draw(st.integers(0, nbits))
    ll = LL.from_packed({"flat": cols}, [("offset", 1 << (nbits + extra))]) \
        .reshape_ins([("register", 1 << split), ("lane", 1 << (nbits - split))])
    layout = linear_to_cute(ll)
    assert agrees_everywhere(ll, layout)
    back = linear_from_cute(layout, in_dims=ll.in_dims, out_dims=ll.out_dims)
    assert back == ll


def test_worked_examples():
    # (4,8):(8,1): the transpose of an 8x4 row-major tile, coordinate -> offset
    ll = linear_from_cute(Layout.parse("(4,8):(8,1)"))
    assert ll == LL({"dim0": [(8,), (16,)], "dim1": [(1,), (2,), (4,)]}, [("offset", 32)])
    assert str(linear_to_cute(ll)) == "(4,8):(8,1)" and ll.to_cute() == Layout.parse("(4,8):(8,1)")
    # broadcast: stride 0 is a zero basis
    ll = linear_from_cute(Layout.parse("(2,4):(0,1)"))
    assert ll.zero_bases("dim0") == [0]
    assert str(linear_to_cute(ll)) == "(2,4):(0,1)"
    # extent 2 with any stride is linear; the codomain covers its reach
    assert linear_from_cute(Layout.parse("2:3")).out_dims == {"offset": 4}
    # out dims split the codomain colexicographically: (M, N) tile, dim0 fastest
    ll = linear_from_cute(Layout.parse("(4,4):(4,1)"), out_dims=[("dim0", 4), ("dim1", 4)])
    assert ll.apply({"dim0": 1, "dim1": 2}) == {"dim0": 2, "dim1": 1}


def test_mma_tv_layout_is_the_papers_mma_tile():
    """CuTe's SM80 16x8x16 A operand TV layout equals the Prop. 9.2 tile (16-bit)."""
    tv = Layout.parse("((4,8),(2,2,2)):((32,1),(16,8,128))")
    ll = linear_from_cute_tv(tv, tile_shape=(16, 16))
    assert ll.in_dims == {"register": 8, "lane": 32, "warp": 1}
    paper = (LL.identity_1d(2, "register", "dim1") * LL.identity_1d(4, "lane", "dim1")
             * LL.identity_1d(8, "lane", "dim0") * LL.identity_1d(2, "register", "dim0")
             * LL.identity_1d(2, "register", "dim1")).transpose_outs(["dim0", "dim1"])
    assert ll.sublayout(["register", "lane"], ["dim0", "dim1"]) == paper
    assert ll.is_invertible()
    # 4 warps stacked along M by a product with a warp identity
    big = linear_from_cute_tv(Layout.parse("((4,8,4),(2,2,2)):((128,1,16),(64,8,512))"), (64, 16))
    assert big.in_dims == {"register": 8, "lane": 32, "warp": 4}
    assert big.bases_packed("warp") == (16, 32)  # warp w starts at row 16*w
    assert big.is_invertible()


def test_refusals_name_the_reason():
    with pytest.raises(LayoutError, match="not a power of two"):
        linear_from_cute(Layout.parse("6:1"))
    with pytest.raises(LayoutError, match="not F2-linear"):
        linear_from_cute(Layout.parse("(2,2):(1,1)"))
    with pytest.raises(LayoutError, match="not F2-linear"):
        linear_from_cute(Layout.parse("4:3"))
    with pytest.raises(LayoutError, match="not F2-linear"):  # an offset makes it affine
        linear_from_cute(ComposedLayout(Swizzle(1, 0, 1), 1, Layout.parse("4:1")))
    with pytest.raises(LayoutError, match="beyond"):
        linear_from_cute(Layout.parse("8:1"), out_dims=[("offset", 4)])
    with pytest.raises(LayoutError, match="do not split"):
        linear_from_cute(Layout.parse("8:1"), in_dims=[("lane", 4)])
    with pytest.raises(LayoutError, match="swizzle"):
        linear_to_cute(LL.from_packed({"offset": [1, 2, 6]}, [("offset", 8)]))
    with pytest.raises(LayoutError, match="same output bit"):
        linear_to_cute(LL.from_packed({"offset": [1, 1]}, [("offset", 2)]))
    with pytest.raises(LayoutError, match="two modes"):
        linear_from_cute_tv(Layout.parse("8:1"))
