"""Bank-conflict counts (F2 formula) against a brute-force enumeration of byte addresses.

The oracle implements the hardware model of :mod:`tegula.layout.banks` directly: it lists
every lane's bytes for one instruction, splits the warp into phases of consecutive lanes,
and counts, per phase, the largest number of distinct 4-byte words falling in one bank.
"""
from __future__ import annotations

import random

import pytest

from tegula.layout.banks import bank_conflicts, bank_report
from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout


# ---------------------------------------------------------------- layout builders


def rand_invertible(nbits: int, rng: random.Random) -> list[int]:
    """Columns of a random invertible nbits x nbits F2 matrix."""
    from tegula.layout import f2

    while True:
        cols = [rng.randrange(1, 1 << nbits) for _ in range(nbits)]
        if f2.rank(cols) == nbits:
            return cols


def rand_permutation_cols(nbits: int, rng: random.Random) -> list[int]:
    perm = list(range(nbits))
    rng.shuffle(perm)
    return [1 << p for p in perm]


def make_dist(cols: list[int], reg: int, lane: int, warp: int, outs) -> LinearLayout:
    """A distributed layout from flat columns: first ``reg`` columns are registers, ..."""
    assert len(cols) == reg + lane + warp
    return LinearLayout.from_packed(
        {"register": cols[:reg], "lane": cols[reg:reg + lane], "warp": cols[reg + lane:]}, outs)


def make_shared(cols: list[int], outs) -> LinearLayout:
    return LinearLayout.from_packed({"offset": cols}, outs)


def identity_shared(outs) -> LinearLayout:
    n = sum(s.bit_length() - 1 for _, s in outs)
    return make_shared([1 << i for i in range(n)], outs)


# ---------------------------------------------------------------- the oracle


def oracle_wavefronts(shared, dist, elem_bytes, vec, banks=32, bank_bytes=4) -> list[int]:
    """Wavefronts of every instruction of warp 0, by enumeration (integer arithmetic)."""
    n = shared.total_in_size
    names = shared.out_dim_names
    inv = {}
    for o in range(n):
        c = shared.apply({"offset": o})
        inv[tuple(c[k] for k in names)] = o
    regs = dist.in_dim_size("register")
    lanes = dist.in_dim_size("lane")

    def off(l, r):
        c = dist.apply({"register": r, "lane": l})
        return inv[tuple(c[k] for k in names)]

    groups: dict[int, set[int]] = {}
    for r in range(regs):
        groups.setdefault(off(0, r) // vec, set()).add(r)
    # addresses in bits, so sub-byte elements (elem_bytes 0.5, ...) are modelled too
    elem_bits, word_bits = int(elem_bytes * 8), bank_bytes * 8
    per_phase = max(1, min(lanes, banks * word_bits // (vec * elem_bits)))
    out = []
    for g, rs in sorted(groups.items()):
        total = 0
        for p0 in range(0, lanes, per_phase):
            by_bank: dict[int, set[int]] = {}
            for l in range(p0, p0 + per_phase):
                offs = {off(l, r) for r in rs}
                # the group is one aligned contiguous vector in every lane (linearity)
                assert len(offs) == vec and min(offs) % vec == 0 and max(offs) - min(offs) == vec - 1
                for o in offs:
                    for b in range(o * elem_bits, (o + 1) * elem_bits):
                        w = b // word_bits
                        by_bank.setdefault(w % banks, set()).add(w)
            total += max(len(ws) for ws in by_bank.values())
        out.append(total)
    return out


ROWCOL32 = [("col", 32), ("row", 32)]


def test_row_access_is_conflict_free():
    # fp32, lanes along a row, registers down the rows: one 128-byte row per instruction
    d = make_dist([1 << 5 << i for i in range(5)] + [1 << i for i in range(5)], 5, 5, 0, ROWCOL32)
    s = identity_shared(ROWCOL32)
    rep = bank_report(s, d, 4)
    assert rep.vec_elems == 1 and rep.wavefronts == 1 and rep.conflict_factor == 1
    assert len(rep.instructions) == 32
    assert rep.total_wavefronts == 32


def test_column_access_is_32_way():
    d = make_dist([1 << i for i in range(5)] + [1 << 5 << i for i in range(5)], 5, 5, 0, ROWCOL32)
    s = identity_shared(ROWCOL32)
    # registers run along the row: 4 fp32 per vector, quarter-warp phases, all in one bank group
    rep = bank_report(s, d, 4)
    assert rep.vec_elems == 4 and rep.phases == 4
    assert rep.wavefronts == oracle_wavefronts(s, d, 4, 4)[0] == 32
    assert bank_conflicts(s, d, 4, vec_elems=1) == 32


def test_vectorized_rows_fp16():
    # 16x64 fp16: 8 contiguous per thread (16 B), 8 lanes per row, 4 rows per warp
    outs = [("col", 64), ("row", 16)]
    cols = [1 << i for i in range(3)] + [1 << i for i in range(3, 6)] + [64 << i for i in range(2)]
    d = make_dist(cols + [64 << 2, 64 << 3], 3, 5, 2, outs)
    s = identity_shared(outs)
    rep = bank_report(s, d, 2)
    assert rep.vec_elems == 8 and rep.wavefronts == 4 == rep.ideal_wavefronts
    assert bank_conflicts(s, d, 2, vec_elems=2) == oracle_wavefronts(s, d, 2, 2)[0]


def test_broadcast_lanes_are_free():
    outs = [("col", 32), ("row", 8)]
    # lanes 0..3 bits broadcast (zero), lane bit 4 and registers cover the rest
    cols = [1 << i for i in range(5)] + [0, 0, 0, 0, 32] + [64, 128]
    d = make_dist(cols, 5, 5, 2, outs)
    s = identity_shared(outs)
    assert bank_conflicts(s, d, 4, vec_elems=1) == oracle_wavefronts(s, d, 4, 1)[0]


@pytest.mark.parametrize("seed", range(24))
def test_random_layouts_match_oracle(seed):
    rng = random.Random(seed)
    nb = rng.choice([8, 9, 10])
    outs = [("col", 1 << (nb // 2)), ("row", 1 << (nb - nb // 2))]
    s = make_shared(rand_invertible(nb, rng) if seed % 2 else rand_permutation_cols(nb, rng), outs)
    lane = 5
    warp = rng.randrange(0, 2)
    reg = nb - lane - warp
    cols = rand_invertible(nb, rng) if seed % 3 else rand_permutation_cols(nb, rng)
    if seed % 5 == 0:  # a broadcast lane or register
        cols[rng.randrange(0, nb)] = 0
    # make a vector possible sometimes: first register basis = the tensor of offset 1
    if seed % 4 == 0:
        cols[0] = s.matrix()[0]
    d = make_dist(cols, reg, lane, warp, outs)
    for eb in (1, 2, 4, 8):
        rep = bank_report(s, d, eb)
        v = rep.vec_elems
        while v >= 1:
            got = bank_conflicts(s, d, eb, vec_elems=v)
            want = oracle_wavefronts(s, d, eb, v)
            assert set(want) == {got}, (seed, eb, v)
            v //= 2


def test_vec_too_large_is_rejected():
    d = make_dist([1 << 5 << i for i in range(5)] + [1 << i for i in range(5)], 5, 5, 0, ROWCOL32)
    with pytest.raises(LayoutError, match="registers of one thread"):
        bank_conflicts(identity_shared(ROWCOL32), d, 4, vec_elems=2)


def test_shape_mismatch_is_rejected():
    d = make_dist([1 << i for i in range(10)], 5, 5, 0, ROWCOL32)
    with pytest.raises(LayoutError, match="tensor shapes differ"):
        bank_conflicts(identity_shared([("col", 32), ("row", 16)]), d, 4)


def test_sub_byte_elements_match_the_oracle():
    """4-bit elements (elem_bytes=0.5): a 64x64 tile, rows of 64 nibbles (32 bytes), random
    distributed layouts against random swizzles; the F2 count agrees with the bit-level
    enumeration at every vector width the registers allow."""
    import random

    from tegula.layout import f2
    outs = [("col", 64), ("row", 64)]
    rng = random.Random(3)
    for _ in range(6):
        cols = rand_permutation_cols(12, rng)
        dist = make_dist(cols, 5, 5, 2, outs)
        shared = make_shared(rand_invertible(12, rng) if rng.random() < 0.5
                             else [1 << i for i in range(12)], outs)
        best = bank_report(shared, dist, 0.5).vec_elems
        assert best <= 32  # 16 bytes of nibbles
        v = 1
        while v <= best:
            rep = bank_report(shared, dist, 0.5, vec_elems=v)
            assert set(oracle_wavefronts(shared, dist, 0.5, v)) == {rep.wavefronts}
            v *= 2
    with pytest.raises(LayoutError, match="power of two"):
        bank_report(identity_shared(outs), make_dist(list(range(12)), 5, 5, 2, outs), 0.3)
    assert f2.is_pow2(best)
