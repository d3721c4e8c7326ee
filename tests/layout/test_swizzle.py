"""CuTe swizzles (`Sw<B,M,S>`) and composed layouts, checked against CuTe's definition.

CuTe's Swizzle<B,M,S>: yyy_msk = (2^B-1) << (M + max(0,S)), zzz_msk = (2^B-1) << (M - min(0,S)),
and swizzle(x) = x ^ shiftr(x & yyy_msk, S). The tests state the expected bit patterns
directly (row number XORed into the 16-byte chunk number), not through that formula.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tegula.layout.cute import Layout
from tegula.layout.errors import LayoutError
from tegula.layout.swizzle import (ComposedLayout, Swizzle, make_swizzled_layout,
                                   swizzle_for_row_bytes)
from tegula.layout.symbolic import sym


def test_sw343_masks_are_bits_7_to_9_into_4_to_6():
    sw = Swizzle(3, 4, 3)
    assert sw.yyy_mask == 0b111 << 7
    assert sw.zzz_mask == 0b111 << 4
    assert sw.size() == 1024


def test_sw343_on_bytes_xors_row_into_16_byte_chunk():
    # f16 tile with 128-byte rows, addressed in bytes: row r, chunk c (16 B), byte b.
    sw = Swizzle(3, 4, 3)
    for r in range(8):
        for c in range(8):
            for b in (0, 5, 15):
                assert sw(r * 128 + c * 16 + b) == r * 128 + (c ^ r) * 16 + b


def test_sw333_on_f16_elements_is_the_same_pattern():
    # The same tile addressed in f16 elements: 8 elements per 16-byte chunk, 64 per row.
    sw = Swizzle(3, 3, 3)
    for r in range(16):
        for c in range(8):
            for e in range(8):
                assert sw(r * 64 + c * 8 + e) == r * 64 + (c ^ (r % 8)) * 8 + e


def test_negative_shift_moves_the_field_left():
    sw = Swizzle(2, 0, -3)  # yyy = bits 0..1, zzz = bits 3..4
    assert sw.yyy_mask == 0b11 and sw.zzz_mask == 0b11 << 3
    assert sw(0b00011) == 0b11011
    assert sw(0b11000) == 0b11000


@pytest.mark.parametrize("b,m,s", [(1, 0, 1), (2, 3, 3), (3, 3, 3), (3, 4, 3), (2, 1, -2),
                                   (3, 0, 4), (1, 2, -5)])
def test_swizzle_is_a_bijective_involution_on_its_period(b, m, s):
    sw = Swizzle(b, m, s)
    xs = np.arange(sw.size(), dtype=np.int64)
    ys = sw(xs)
    assert sorted(ys.tolist()) == xs.tolist()
    assert (sw(ys) == xs).all()
    assert sw.inverse() is sw


@given(st.integers(0, 4), st.integers(0, 5), st.integers(-8, 8), st.integers(0, 1 << 20))
@settings(max_examples=300, deadline=None)
def test_swizzle_changes_only_the_target_field(b, m, s, x):
    if abs(s) < b:
        with pytest.raises(LayoutError):
            Swizzle(b, m, s)
        return
    sw = Swizzle(b, m, s)
    y = sw(x)
    assert (x ^ y) & ~sw.zzz_mask == 0
    assert sw(y) == x


def test_vectorized_call_matches_scalar_calls():
    sw = Swizzle(3, 3, 3)
    xs = np.arange(2048, dtype=np.int32)
    assert sw(xs).tolist() == [sw(int(x)) for x in xs]


def test_identity_printing_equality():
    assert Swizzle(0, 4, 3).is_identity and Swizzle(0, 4, 3)(1234) == 1234
    assert not Swizzle(3, 4, 3).is_identity
    assert str(Swizzle(3, 4, 3)) == "Sw<3,4,3>"
    assert Swizzle(3, 4, 3) == Swizzle(3, 4, 3) != Swizzle(3, 3, 3)
    assert len({Swizzle(3, 4, 3), Swizzle(3, 4, 3), Swizzle(2, 4, 3)}) == 2


@pytest.mark.parametrize("args", [(-1, 0, 1), (1, -1, 1), (3, 0, 2), (2, 0, -1)])
def test_invalid_swizzles_are_rejected(args):
    with pytest.raises(LayoutError):
        Swizzle(*args)


def test_swizzle_refuses_symbolic_offsets():
    K = sym("K", multiple_of=8)
    with pytest.raises(LayoutError, match="symbolic"):
        Swizzle(3, 3, 3)(K)
    assert Swizzle(0, 3, 3)(K) is K


# ---- composed layouts -------------------------------------------------------------------------


def test_composed_layout_prints_like_cute():
    c = ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1)))
    assert str(c) == "Sw<3,4,3> o 0 o (8,64):(64,1)"


def test_composed_layout_evaluates_outer_of_offset_plus_inner():
    inner = Layout((8, 64), (64, 1))
    sw = Swizzle(3, 3, 3)
    c = ComposedLayout(sw, 0, inner)
    for m in range(8):
        for n in range(0, 64, 7):
            assert c(m, n) == c((m, n)) == sw(inner(m, n))
            assert c(m + 8 * n) == sw(inner(m + 8 * n))
    shifted = ComposedLayout(sw, 512, inner)
    assert shifted(3, 9) == sw(512 + inner(3, 9))


def test_composed_layout_domain_is_the_inner_layout():
    inner = Layout((8, 64), (64, 1))
    c = ComposedLayout(Swizzle(3, 3, 3), 0, inner)
    assert c.shape == (8, 64) and c.size == 512 and c.rank == 2
    assert c.cosize == 512
    offsets = c.all_offsets()
    assert offsets.tolist() == [c(i) for i in range(512)]
    assert c.is_injective()


def test_composed_layout_equality_and_hash():
    a = ComposedLayout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))
    b = ComposedLayout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))
    c = ComposedLayout(Swizzle(2, 3, 3), 0, Layout((8, 64), (64, 1)))
    d = ComposedLayout(Swizzle(3, 3, 3), 64, Layout((8, 64), (64, 1)))
    assert a == b and hash(a) == hash(b)
    assert a != c and a != d
    assert a != Layout((8, 64), (64, 1))


def test_make_swizzled_layout_keeps_plain_layouts_plain():
    layout = Layout((8, 64), (64, 1))
    assert make_swizzled_layout(Swizzle(0, 3, 3), layout) is layout
    assert make_swizzled_layout(Swizzle(3, 3, 3), layout) == \
        ComposedLayout(Swizzle(3, 3, 3), 0, layout)


def test_composed_layout_with_a_layout_outside():
    outer = Layout(16, 2)
    c = ComposedLayout(outer, 1, Layout(4, 3))
    assert [c(i) for i in range(4)] == [2 * (1 + 3 * i) for i in range(4)]


def _bank_groups(byte_offsets):
    """The 16-byte group of 4 banks each access starts in (32 banks x 4 B = 8 groups)."""
    return [(b // 16) % 8 for b in byte_offsets]


@pytest.mark.parametrize("row_bytes,elem_bytes,expected",
                         [(128, 2, Swizzle(3, 3, 3)), (64, 2, Swizzle(2, 3, 3)),
                          (32, 2, Swizzle(1, 3, 3)), (128, 4, Swizzle(3, 2, 3)),
                          (128, 1, Swizzle(3, 4, 3))])
def test_row_swizzle_makes_a_column_of_chunks_conflict_free(row_bytes, elem_bytes, expected):
    sw = swizzle_for_row_bytes(row_bytes, elem_bytes)
    assert sw == expected
    per_row = row_bytes // elem_bytes
    per_chunk = 16 // elem_bytes
    smem = ComposedLayout(sw, 0, Layout((8, per_row), (per_row, 1)))
    plain = Layout((8, per_row), (per_row, 1))
    for chunk in range(row_bytes // 16):
        # ldmatrix-style: 8 rows read the same 16-byte chunk column at once.
        swizzled = [smem(r, chunk * per_chunk) * elem_bytes for r in range(8)]
        assert len(set(_bank_groups(swizzled))) == 8
    unswizzled = [plain(r, 0) * elem_bytes for r in range(8)]
    assert len(set(_bank_groups(unswizzled))) < 8  # the conflict the swizzle removes


def test_swizzle_for_row_bytes_16_is_identity_and_bad_sizes_fail():
    assert swizzle_for_row_bytes(16, 2).is_identity
    with pytest.raises(LayoutError):
        swizzle_for_row_bytes(96, 2)
