"""Every worked CuTe-layout example of the Hexcute papers, recomputed with our algebra.

Sources (in ../shared/papers/):
- CGO: hexcute-layout-synthesis-cgo26.md — Fig. 1/2 (shared layout m, TV layout f),
  §V (layout constraints with free strides), Appendix C (g ∘ q⁻¹ and g∘q⁻¹(17,5) = 337).
- TL: hexcute-tile-language.md — Fig. 3/5 (packed and row-major-interleaved layouts),
  Fig. 6 (TV layout B, f(7,2) = 27), §5.2 / Appendix C (m = (4,8,8):(d2,1,d1)).
Where a figure's layout is only drawn, not written, the test says which written layout
it assumes and checks that the numbers quoted in the text agree with it.
"""
from __future__ import annotations

from tegula.layout.algebra import coalesce, composition, left_inverse, right_inverse
from tegula.layout.cute import Layout
from tegula.layout.symbolic import sym


def _tile_coord(index: int, rows: int) -> tuple[int, int]:
    """Column-major flattened tile index -> (row, col), as both papers read TV outputs."""
    return index % rows, index // rows


def _same_function(a: Layout, b: Layout) -> bool:
    return a.size == b.size and a.all_offsets().tolist() == b.all_offsets().tolist()


# ---- CGO Fig. 1 / Fig. 2 ------------------------------------------------------------------

M_SHARED = Layout.parse("((2,2),8):((1,16),2)")      # Fig. 2(a): m of Fig. 1(a)
F_TV = Layout.parse("((2,4),(2,2)):((8,1),(4,16))")  # Fig. 2(b): f of Fig. 1(b)/(c)


def test_cgo_fig1a_row_major_interleaved_shared_layout():
    assert str(M_SHARED) == "((2,2),8):((1,16),2)"
    assert M_SHARED(2, 4) == 24  # marker 1: coordinate (2,4) -> address 24
    # Row-major interleaved: rows 0/1 interleave in addresses 0..15, rows 2/3 in 16..31.
    grid = [[M_SHARED(r, c) for c in range(8)] for r in range(4)]
    assert grid[0] == list(range(0, 16, 2)) and grid[1] == list(range(1, 16, 2))
    assert grid[2] == list(range(16, 32, 2)) and grid[3] == list(range(17, 32, 2))
    assert M_SHARED[0] == Layout.parse("(2,2):(1,16)")  # "the sub-layout (2,2):(1,16) is a mode"


def test_cgo_fig2_tv_layout_maps_thread_2_value_3_to_1_5():
    assert F_TV.shape == ((2, 4), (2, 2)) and F_TV.size == 32
    assert _tile_coord(F_TV(2, 3), 4) == (1, 5)  # Fig. 2(c)
    # Fig. 1(b): 8 threads x 4 values cover the 4x8 tile exactly once.
    assert sorted(F_TV.all_offsets().tolist()) == list(range(32))
    # Marker 2: the array held by thread 2 is row 1, columns 0, 1, 4, 5.
    assert [_tile_coord(F_TV(2, v), 4) for v in range(4)] == [(1, 0), (1, 1), (1, 4), (1, 5)]


# ---- CGO Appendix C: the composite function g ∘ q⁻¹ ----------------------------------------

# Fig. 7(b) draws q, the register layout of ldmatrix.x4 over its 32x8 instruction tile
# (thread t holds row t//4 + 8j, columns 2(t%4), 2(t%4)+1 of matrix j). Written as a TV
# layout, that is the q below; the test checks that CuTe's inversion of it is exactly the
# q⁻¹ printed in the appendix.
Q = Layout.parse("((4,8),(2,4)):((64,1),(32,8))")
Q_INV = Layout.parse("((8,4),(2,4)):((4,64),(32,1))")
G = Layout.parse("((4,8,2),(2,2,2)):((32,1,128),(16,8,256))")
G_32 = Layout.parse("((4,8),(2,2,2)):((32,1),(16,8,256))")  # g restricted to 32 threads
G_Q_INV = Layout.parse("((8,2,2),(2,4)):((1,8,256),(16,32))")


def test_cgo_appendix_c_q_inverse():
    assert right_inverse(Q).flatten() == Q_INV.flatten()
    assert left_inverse(Q).flatten() == Q_INV.flatten()
    assert all(Q(Q_INV(i)) == i for i in range(256))
    assert all(Q_INV(Q(i)) == i for i in range(256))
    # ldmatrix semantics: thread 6 holds row 1, columns 4 and 5 of each 8x8 matrix.
    assert [_tile_coord(Q(6, v), 32) for v in range(4)] == [(1, 4), (1, 5), (9, 4), (9, 5)]


def test_cgo_appendix_c_g_is_64_threads_loading_16x32():
    assert G.size == 16 * 32 and sorted(G.all_offsets().tolist()) == list(range(512))
    # Restricting to 32 threads drops the thread sub-mode 2:128 ...
    assert G_32 == Layout((G.shape[0][:2], G.shape[1]), (G.stride[0][:2], G.stride[1]))
    # ... because threads 32..63 load the same pattern 128 elements (8 columns) further.
    assert all(G(t + 32, v) == G(t, v) + 128 for t in range(32) for v in range(8))


def test_cgo_appendix_c_composite_function():
    gq = composition(G_32, Q_INV)
    # The appendix prints mode 0 flattened; compare mode by mode, flattened.
    assert gq[0].flatten() == G_Q_INV[0].flatten()
    assert gq[1].flatten() == G_Q_INV[1].flatten()
    assert _same_function(gq, G_Q_INV)
    # It is g after q⁻¹ on every instruction-tile coordinate.
    assert all(gq(i) == G_32(Q_INV(i)) for i in range(256))
    # The worked evaluation: (17,5) -> 337 -> tensor coordinate (1,21) of the 16x32 tile.
    assert gq(17, 5) == 337 == G_Q_INV(17, 5)
    assert (337 % 16, 337 // 16) == _tile_coord(gq(17, 5), 16) == (1, 21)
    assert Layout((16, 32), (1, 16))(1, 21) == 337  # the codomain layout (16,32):(1,16)


# ---- CGO §V: layout constraints with undetermined strides -----------------------------------


def test_cgo_section5_constraint_layouts_print_with_free_strides():
    d1, d2, d1p = sym("D1"), sym("D2"), sym("D1p")
    c1 = Layout(((8, 8), 64), ((1, d1), d2))
    assert str(c1) == "((8,8),64):((1,D1),D2)"
    unified = Layout(((8, 2, 4), 64), ((1, d1p, 8), d2))  # Case 1 of Fig. 10(c)
    assert str(unified) == "((8,2,4),64):((1,D1p,8),D2)"
    assert unified.size == c1.size == 64 * 64
    assert unified(3, 0) == 3 and unified(8, 0) == d1p and unified(16, 1) == 8 + d2


# ---- TL Fig. 3 / Fig. 5 / Fig. 6 -----------------------------------------------------------


def test_tl_fig3_packed_int4_layout_is_a_bijection():
    # The paper writes ((2,2,2,4),(8,)):((1,8,128,2),(16,)); the Python 1-tuple `(8,)` is
    # built directly because CuTe notation has no trailing commas.
    packed = Layout(((2, 2, 2, 4), (8,)), ((1, 8, 128, 2), (16,)))
    assert packed.size == 256 and packed.cosize == 256
    assert sorted(packed.all_offsets().tolist()) == list(range(256))


def test_tl_fig5_layout_accepts_every_coordinate_form():
    # Fig. 5 (a) is the row-major-interleaved layout of CGO Fig. 1(a).
    a = M_SHARED
    assert a(6) == a((2, 1)) == a(((0, 1), 1)) == a(2, 1) == 18
    # Fig. 5(c): 6 -> ((0,1),1) colexicographically -> 0*1 + 1*16 + 1*2.
    assert a(6) == 0 * 1 + 1 * 16 + 1 * 2


def test_tl_fig6_tv_layout_b():
    # Fig. 6 draws B for 8 threads x 4 values over a 4x8 tile; CGO Fig. 2(b) writes this
    # figure's layout, and the quoted evaluation agrees with it.
    assert F_TV(7, 2) == 27
    assert _tile_coord(27, 4) == (3, 6)


# ---- TL §5.2 / Appendix C: m = (mf) ∘ f⁻¹ with free strides d1, d2 ----------------------


def test_tl_shared_memory_constraint_derivation():
    f = Layout(((8,), (8, 4)), ((32,), (4, 1)))  # 4x64 f16 tile, 8 threads, 16-byte ld
    assert f.size == 256 and sorted(f.all_offsets().tolist()) == list(range(256))
    f_inv = right_inverse(f)
    assert f_inv == Layout((4, 8, 8), (64, 8, 1))
    assert all(f(f_inv(i)) == i for i in range(256))
    d1, d2 = sym("d1"), sym("d2")
    m_f = Layout(((8,), (8, 4)), ((d1,), (1, d2)))  # 8 contiguous elements per thread
    m = composition(m_f, f_inv)
    assert str(m) == "(4,8,8):(d2,1,d1)"
    # m ∘ f gives back the constraint on every (thread, value) that the paper states.
    for t in range(8):
        for v in range(32):
            assert m(f(t, v)) == m_f(t, v)


def test_tl_constraint_with_concrete_strides_matches_static_algebra():
    f = Layout(((8,), (8, 4)), ((32,), (4, 1)))
    m_f = Layout(((8,), (8, 4)), ((8, ), (1, 64)))  # d1 = 8, d2 = 64: a 4x64 row-major tile
    m = composition(m_f, right_inverse(f))
    assert m == Layout((4, 8, 8), (64, 1, 8))
    assert coalesce(m) == Layout((4, 64), (64, 1))
