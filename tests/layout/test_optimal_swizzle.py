"""optimal_swizzle: never beaten by any shared layout of an exhaustive / sampled family,
and conflict-free on the classic cases."""
from __future__ import annotations

import random
from functools import lru_cache
from itertools import product

import pytest

from tegula.layout import f2
from tegula.layout.banks import bank_conflicts
from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout
from tegula.layout.optimal_swizzle import optimal_swizzle, swizzle_cost

try:
    from tests.layout.test_banks import (ROWCOL32, make_dist, make_shared, oracle_wavefronts,
                                         rand_invertible, rand_permutation_cols)
except ImportError:  # pytest puts this folder on sys.path when tests/ is no package
    from test_banks import (ROWCOL32, make_dist, make_shared, oracle_wavefronts,
                            rand_invertible, rand_permutation_cols)


@lru_cache(maxsize=None)
def all_invertible(nbits: int) -> tuple[tuple[int, ...], ...]:
    """Every invertible nbits x nbits matrix (as columns): each column outside the span of
    the previous ones."""
    out = [()]
    for _ in range(nbits):
        nxt = []
        for cols in out:
            span = {0}
            for c in cols:
                span |= {x ^ c for x in span}
            nxt.extend(cols + (c,) for c in range(1, 1 << nbits) if c not in span)
        out = nxt
    return tuple(out)


def best_in_family(family, outs, reader, writer, eb, **kw):
    return min(swizzle_cost(make_shared(list(c), outs), reader, writer, eb, **kw).key for c in family)


def rand_dist(nb, lane, warp, rng, outs, zero=False):
    reg = nb - lane - warp
    cols = rand_invertible(nb, rng) if rng.random() < 0.6 else rand_permutation_cols(nb, rng)
    if zero:
        cols[rng.randrange(nb)] = 0
    return make_dist(cols, reg, lane, warp, outs)


@lru_cache(maxsize=None)
def _family_inverses() -> tuple:
    """For EVERY shared layout of a 16-element tensor (each invertible 4x4 matrix S), the
    columns of S⁻¹ (tensor bit -> offset), computed once for all the exhaustive tests."""
    out = []
    for cols in all_invertible(4):
        e = f2.eliminate(cols)
        out.append(tuple(e.solve(1 << j) for j in range(4)))
    return tuple(out)


def exhaustive_best(outs, reader, writer, eb, **kw):
    """The best key over every shared layout of a 16-element tensor (20160 of them).

    Same per-side cost as `swizzle_cost` (its `_side_cost`), with each layout's inverse
    precomputed instead of re-eliminated per call: 20160 calls would take seconds."""
    from tegula.layout.banks import dim_cols, vector_cap_bits
    from tegula.layout.optimal_swizzle import SwizzleCost, _side_cost

    assert reader.out_dim_names == writer.out_dim_names == [n for n, _ in outs]
    cap = vector_cap_bits(eb)
    sides = [(dim_cols(lay, "register"), dim_cols(lay, "lane")) for lay in (reader, writer)]
    best = None
    for inv in _family_inverses():
        costs = [_side_cost([f2.mat_vec(inv, c) for c in regs],
                            [f2.mat_vec(inv, c) for c in lanes], cap, eb, kw["banks"],
                            kw["bank_bytes"]) for regs, lanes in sides]
        (rv, rw, ri, rn), (wv, ww, wi, wn) = costs
        key = SwizzleCost(1 << rv, 1 << wv, rw, ww, ri, wi, rn, wn).key
        best = key if best is None or key < best else best
    return best


def test_exhaustive_shortcut_agrees_with_swizzle_cost():
    """The shortcut's key for a layout is swizzle_cost's key (checked on a sample)."""
    from tegula.layout.banks import dim_cols, vector_cap_bits
    from tegula.layout.optimal_swizzle import SwizzleCost, _side_cost
    rng = random.Random(7)
    outs = [("col", 4), ("row", 4)]
    for eb in (0.5, 2):
        reader, writer = rand_dist(4, 2, 0, rng, outs), rand_dist(4, 2, 0, rng, outs)
        for i in rng.sample(range(len(all_invertible(4))), 200):
            inv = _family_inverses()[i]
            costs = [_side_cost([f2.mat_vec(inv, c) for c in dim_cols(lay, "register")],
                                [f2.mat_vec(inv, c) for c in dim_cols(lay, "lane")],
                                vector_cap_bits(eb), eb, 2, 2)
                     for lay in (reader, writer)]
            (rv, rw, ri, rn), (wv, ww, wi, wn) = costs
            shared = make_shared(list(all_invertible(4)[i]), outs)
            assert SwizzleCost(1 << rv, 1 << wv, rw, ww, ri, wi, rn, wn) == \
                swizzle_cost(shared, reader, writer, eb, banks=2, bank_bytes=2)


@pytest.mark.parametrize("seed", range(2))
def test_tiny_exhaustive(seed):
    # 16 elements, 4 lanes, 4 registers; a 2-bank x 2-byte "wavefront" makes conflicts bite
    rng = random.Random(seed)
    outs = [("col", 4), ("row", 4)]
    reader = rand_dist(4, 2, 0, rng, outs)
    writer = rand_dist(4, 2, 0, rng, outs)
    eb = [1, 2][seed % 2]
    kw = dict(banks=2, bank_bytes=2)
    got = swizzle_cost(optimal_swizzle(reader, writer, eb, **kw), reader, writer, eb, **kw).key
    assert got == exhaustive_best(outs, reader, writer, eb, **kw)


# One side holds a contiguous run in its registers, the other holds single elements along
# another direction (or none): only one side can vectorize. Written as (register, lane)
# columns over the 4 bits of a 4x4 tensor (col bits 1, 2; row bits 4, 8).
ONE_SIDED = [
    # vectorized side: 4 contiguous cols in registers; other side: a column in registers
    ([1, 2], [4, 8], [4, 8], [1, 2]),
    # ... other side: no registers at all, lanes along rows first
    ([1, 2], [4, 8], [], [4, 8, 1, 2]),
    # ... other side: one register down a column, lanes mixing both dims
    ([1, 2], [8, 4], [8], [1, 4, 2]),
    # two contiguous elements vs a transposed pair
    ([1], [2, 4, 8], [4], [8, 1, 2]),
    # a run of 8 elements vs single elements
    ([1, 2, 4], [8], [8], [1, 2, 4]),
]


@pytest.mark.slow
@pytest.mark.parametrize("case, eb, vectorized", [
    (0, 1, "writer"), (1, 1, "reader"), (1, 2, "writer"), (2, 1, "reader"),
    (2, 0.5, "writer"), (3, 0.5, "reader"), (4, 2, "writer"), (4, 0.5, "reader"),
])
def test_one_sided_vectorization_exhaustive(case, eb, vectorized):
    """Never beaten by ANY shared layout of the tensor, including sub-byte elements
    (0.5 bytes: 4-bit data), whichever side is the one that vectorizes."""
    vreg, vlane, oreg, olane = ONE_SIDED[case]
    outs = [("col", 4), ("row", 4)]
    vec_side = make_dist(vreg + vlane, len(vreg), len(vlane), 0, outs)
    other = make_dist(oreg + olane, len(oreg), len(olane), 0, outs)
    reader, writer = (other, vec_side) if vectorized == "writer" else (vec_side, other)
    kw = dict(banks=2, bank_bytes=2)
    got = swizzle_cost(optimal_swizzle(reader, writer, eb, **kw), reader, writer, eb, **kw)
    assert got.key == exhaustive_best(outs, reader, writer, eb, **kw)
    # some side does use the longest run (fewest instructions comes first)
    assert max(got.read_vec_elems, got.write_vec_elems) == min(1 << len(vreg), int(16 / eb))


@pytest.mark.parametrize("seed", range(8))
def test_sampled_family_never_better(seed):
    # 256 elements, 8 lanes, 8 banks of 4 bytes: random writers/readers, 400 random layouts
    rng = random.Random(100 + seed)
    outs = [("col", 16), ("row", 16)]
    reader = rand_dist(8, 3, rng.randrange(2), rng, outs, zero=seed % 4 == 0)
    writer = rand_dist(8, 3, rng.randrange(2), rng, outs)
    if seed % 3 == 0:  # give them a common register direction
        w = writer.bases_packed("register")[0]
        reader = LinearLayout.from_packed(
            {"register": [w] + list(reader.bases_packed("register"))[1:],
             "lane": reader.bases_packed("lane"), "warp": reader.bases_packed("warp")}, outs)
        if reader.rank() < 8:
            return
    if reader.rank() < 8:
        return
    kw = dict(banks=8, bank_bytes=4)
    for eb in (1, 2, 4):
        opt = optimal_swizzle(reader, writer, eb, **kw)
        got = swizzle_cost(opt, reader, writer, eb, **kw)
        family = [rand_invertible(8, rng) for _ in range(80)]
        family += [rand_permutation_cols(8, rng) for _ in range(40)]
        assert got.key <= best_in_family(family, outs, reader, writer, eb, **kw), (seed, eb)
        # the F2 cost agrees with the enumeration oracle, each side at its own vector
        assert set(oracle_wavefronts(opt, reader, eb, got.read_vec_elems, 8, 4)) == \
            {got.read_wavefronts}
        assert set(oracle_wavefronts(opt, writer, eb, got.write_vec_elems, 8, 4)) == \
            {got.write_wavefronts}


def xor_swizzles(nbits, row_lo, lo=0):
    """Layouts ``offset -> tensor`` that XOR each row bit (``>= row_lo``) into any subset of
    the bits ``lo .. row_lo-1`` (the XOR swizzles of a row-major tile, CuTe's included)."""
    base = [1 << i for i in range(nbits)]
    choices = []
    for i in range(row_lo, nbits):
        choices.append([m << lo for m in range(1 << (row_lo - lo))])
    for masks in product(*choices):
        cols = list(base)
        for i, m in zip(range(row_lo, nbits), masks):
            cols[i] = (1 << i) | m
        yield cols


def mma_a_fp16(outs):
    """mma.m16n8k16 A fragment of a 16x16 fp16 tile (paper Prop. 9.2): col bits 0..3 are
    flat bits 0..3, row bits 0..3 are flat bits 4..7."""
    c = lambda i: 1 << i
    r = lambda i: 1 << (4 + i)
    return LinearLayout.from_packed(
        {"register": [c(0), r(3), c(3)], "lane": [c(1), c(2), r(0), r(1), r(2)], "warp": []},
        outs)


def row_major_16b(outs):
    """Row-major writer: 8 contiguous fp16 per thread, two threads per 16-element row."""
    c = lambda i: 1 << i
    r = lambda i: 1 << (4 + i)
    return LinearLayout.from_packed(
        {"register": [c(0), c(1), c(2)], "lane": [c(3), r(0), r(1), r(2), r(3)], "warp": []},
        outs)


def test_mma_fragment_via_row_major_write_is_conflict_free():
    outs = [("col", 16), ("row", 16)]
    reader, writer = mma_a_fp16(outs), row_major_16b(outs)
    s = optimal_swizzle(reader, writer, 2)
    cost = swizzle_cost(s, reader, writer, 2)
    assert cost.vec_elems == 2  # only col bit 0 is in registers on both sides
    # ... but one side still moves 16 bytes (8 elements) per instruction
    assert max(cost.read_vec_elems, cost.write_vec_elems) == 8
    assert cost.read_wavefronts == cost.read_ideal and cost.write_wavefronts == cost.write_ideal
    # the plain row-major layout is NOT conflict free for this reader
    plain = make_shared([1 << i for i in range(8)], outs)
    assert bank_conflicts(plain, reader, 2, vec_elems=2) > 1
    # and it beats every XOR swizzle of the row-major layout
    best = min(swizzle_cost(make_shared(c, outs), reader, writer, 2).key
               for c in xor_swizzles(8, 4, lo=1))
    assert cost.key <= best


def test_wide_tile_mma_read_16b_write():
    # 16 x 64 fp16 tile, 4 warps writing 16-byte row chunks, an mma-like reader
    outs = [("col", 64), ("row", 16)]
    c = lambda i: 1 << i
    r = lambda i: 1 << (6 + i)
    writer = LinearLayout.from_packed(
        {"register": [c(0), c(1), c(2)], "lane": [c(3), c(4), c(5), r(0), r(1)],
         "warp": [r(2), r(3)]}, outs)
    reader = LinearLayout.from_packed(
        {"register": [c(0), r(3), c(3)], "lane": [c(1), c(2), r(0), r(1), r(2)],
         "warp": [c(4), c(5)]}, outs)
    s = optimal_swizzle(reader, writer, 2)
    cost = swizzle_cost(s, reader, writer, 2)
    assert cost.vec_elems == 2 and max(cost.read_vec_elems, cost.write_vec_elems) == 8
    assert cost.read_wavefronts == cost.read_ideal and cost.write_wavefronts == cost.write_ideal
    assert set(oracle_wavefronts(s, reader, 2, cost.read_vec_elems)) == {cost.read_ideal}
    assert set(oracle_wavefronts(s, writer, 2, cost.write_vec_elems)) == {cost.write_ideal}


def test_transpose_fp32_full_vectors():
    # writer: rows in registers (4 x fp32 = 16 B), reader: the transposed assignment
    outs = [("col", 32), ("row", 32)]
    c = lambda i: 1 << i
    r = lambda i: 1 << (5 + i)
    writer = LinearLayout.from_packed(
        {"register": [c(0), c(1), r(3), r(4)], "lane": [c(2), c(3), c(4), r(0), r(1)],
         "warp": [r(2)]}, outs)
    reader = LinearLayout.from_packed(
        {"register": [c(0), c(1), c(2), c(3)], "lane": [r(0), r(1), r(2), r(3), r(4)],
         "warp": [c(4)]}, outs)
    s = optimal_swizzle(reader, writer, 4)
    cost = swizzle_cost(s, reader, writer, 4)
    assert cost.vec_elems == 4
    assert cost.read_wavefronts == cost.write_wavefronts == 4  # the ideal for 16 B


def test_one_sided_16_byte_writes_32x32_f32():
    """Regression (issue 8): the writer holds 16-byte row vectors, the reader single
    elements down a column. The old construction kept only the common (1-element)
    vector in the low offset bits, so the writer's 16-byte stores cost 16 wavefronts
    per warp; 4 (the minimum for 512 bytes) with conflict-free reads exists."""
    c = lambda i: 1 << i  # noqa: E731
    r = lambda i: 1 << (5 + i)  # noqa: E731
    writer = LinearLayout.from_packed(
        {"register": [c(0), c(1)], "lane": [r(0), r(3), c(3), r(4), c(4)],
         "warp": [r(2), r(1), c(2)]}, ROWCOL32)
    reader = LinearLayout.from_packed(
        {"register": [r(0), r(1)], "lane": [r(4), r(2), c(4), c(0), c(1)],
         "warp": [r(3), c(3), c(2)]}, ROWCOL32)
    cost = swizzle_cost(optimal_swizzle(reader, writer, 4), reader, writer, 4)
    # one side 4-wide (the reader's 4 registers down a column may take the vector just as
    # well: same instructions, same wavefronts), and no conflicts on either side
    assert cost.key == (5, 8)
    assert cost.read_wavefronts == cost.read_ideal and cost.write_wavefronts == cost.write_ideal
    # with one element per reader thread, only the writer can vectorize: it must
    reader = LinearLayout.from_packed(
        {"register": [], "lane": [r(4), r(2), c(4), c(0), c(1)],
         "warp": [r(3), c(3), c(2), r(0), r(1)]}, ROWCOL32)
    s = optimal_swizzle(reader, writer, 4)
    cost = swizzle_cost(s, reader, writer, 4)
    assert cost.write_vec_elems == 4 and cost.read_vec_elems == 1
    assert cost.write_wavefronts == 4 and cost.read_wavefronts == 1
    assert set(oracle_wavefronts(s, writer, 4, 4)) == {4}
    assert set(oracle_wavefronts(s, reader, 4, 1)) == {1}


def test_4_bit_elements_vectorize_and_avoid_conflicts():
    """Sub-byte data (elem_bytes=0.5): a 64x64 tile of 4-bit values, written as 16-byte
    (32-element) row chunks and read through another register assignment; both sides
    at their full vector width, conflict-free."""
    outs = [("col", 64), ("row", 64)]
    c = lambda i: 1 << i  # noqa: E731
    r = lambda i: 1 << (6 + i)  # noqa: E731
    writer = LinearLayout.from_packed(
        {"register": [c(0), c(1), c(2), c(3), c(4), r(5)], "lane": [c(5), r(0), r(1), r(2),
                                                                   r(3)],
         "warp": [r(4)]}, outs)
    reader = LinearLayout.from_packed(
        {"register": [c(0), c(1), c(2), r(3), r(4), r(5)], "lane": [r(0), r(1), r(2), c(3),
                                                                   c(4)],
         "warp": [c(5)]}, outs)
    s = optimal_swizzle(reader, writer, 0.5)
    cost = swizzle_cost(s, reader, writer, 0.5)
    # both hold cols 0-7 and row bit 5 in registers: a common 16-element vector, which
    # one side widens to 32 elements (16 bytes)
    assert cost.vec_elems == 16 and max(cost.write_vec_elems, cost.read_vec_elems) == 32
    assert cost.write_wavefronts == cost.write_ideal
    assert cost.read_wavefronts == cost.read_ideal
    assert set(oracle_wavefronts(s, writer, 0.5, cost.write_vec_elems)) == \
        {cost.write_wavefronts}
    assert set(oracle_wavefronts(s, reader, 0.5, cost.read_vec_elems)) == {cost.read_wavefronts}


def test_not_surjective_is_rejected():
    outs = [("col", 4), ("row", 4)]
    full = make_dist([1, 2, 4, 8], 2, 2, 0, outs)
    part = make_dist([1, 2, 4, 0], 2, 2, 0, outs)
    with pytest.raises(LayoutError, match="does not cover"):
        optimal_swizzle(part, full, 2)


def _check_cute(shared):
    from tegula.layout.optimal_swizzle import cute_swizzle_for

    found = cute_swizzle_for(shared)
    if found is None:
        return None
    swz, base = found
    names = shared.out_dim_names
    for o in range(shared.total_in_size):
        coord = shared.apply({"offset": o})
        assert swz(base.apply_flat(base.pack_in(coord))) == o
    return swz


def test_cute_swizzle_report():
    outs = [("col", 16), ("row", 16)]
    s = optimal_swizzle(mma_a_fp16(outs), row_major_16b(outs), 2)
    swz = _check_cute(s)
    assert swz is not None and swz.bits >= 1
    # a plain row-major layout is the identity swizzle
    assert _check_cute(make_shared([1 << i for i in range(8)], outs)).bits == 0
    # a classic Sw<3,3,3>-style layout of an 8 x 64 fp16 tile is recognized
    outs2 = [("col", 64), ("row", 8)]
    cols = [1 << i for i in range(9)]
    for i in range(3):
        cols[6 + i] |= 1 << (3 + i)
    swz = _check_cute(make_shared(cols, outs2))
    assert (swz.bits, swz.base, swz.shift) == (3, 3, 3)
    # an XOR of two unrelated high bits into one low bit is no single CuTe swizzle
    cols = [1 << i for i in range(8)]
    cols[5] |= 1
    cols[7] |= 1
    assert _check_cute(make_shared(cols, outs)) is None


def test_widened_vector_puts_the_other_sides_lane_in_the_shared_word():
    """Regression (found by local search): the reader's 8-element vector fills the
    offsets below a wavefront; which of its directions sits in the bank WORD matters to
    the scalar writer, whose lane along that direction then stays inside a word. The
    widening used the reader's register order and left the writer 2-way conflicted."""
    outs = [("col", 8), ("row", 8)]
    reader = LinearLayout({"register": [(0, 1), (1, 0), (4, 0)],
                           "lane": [(0, 2), (2, 0), (0, 4)], "warp": []}, outs)
    writer = LinearLayout({"register": [], "lane": [(2, 6), (4, 6), (0, 7), (5, 4)],
                           "warp": [(2, 4), (0, 6)]}, outs)
    kw = dict(banks=4, bank_bytes=4)
    s = optimal_swizzle(reader, writer, 2, **kw)
    cost = swizzle_cost(s, reader, writer, 2, **kw)
    assert cost.read_vec_elems == 8 and cost.write_vec_elems == 1
    assert cost.read_wavefronts == cost.read_ideal == 8
    assert cost.write_wavefronts == cost.write_ideal == 2
    assert set(oracle_wavefronts(s, writer, 2, 1, 4, 4)) == {2}
