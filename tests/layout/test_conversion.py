"""plan_conversion: every plan is executed by simulate_conversion and compared, element by
element, with the dst distribution of the tensor."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tegula.layout import f2
from tegula.layout.conversion import plan_conversion, simulate_conversion
from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout

OUTS = [("col", 16), ("row", 16)]  # 256 elements, flat bits 0..3 col, 4..7 row


def dist(reg, lane, warp, outs=OUTS) -> LinearLayout:
    return LinearLayout.from_packed({"register": reg, "lane": lane, "warp": warp}, outs)


def held(lay: LinearLayout) -> np.ndarray:
    """values[warp, lane, register] = flat tensor index of the element held there."""
    w, l, r = (lay.in_dim_size(n) for n in ("warp", "lane", "register"))
    out = np.zeros((w, l, r), dtype=np.int64)
    for wi in range(w):
        for li in range(l):
            for ri in range(r):
                x = lay.pack_in({"register": ri, "lane": li, "warp": wi})
                out[wi, li, ri] = lay.apply_flat(x)
    return out


def check(src, dst, eb=2):
    plan = plan_conversion(src, dst, elem_bytes=eb)
    got = simulate_conversion(plan, src, dst, held(src))
    np.testing.assert_array_equal(got, held(dst))
    return plan


def rand_inv(n, rng):
    while True:
        cols = [rng.randrange(1, 1 << n) for _ in range(n)]
        if f2.rank(cols) == n:
            return cols


def remix(cols, rng, keep_first=0):
    """Random invertible recombination of a column list (same span)."""
    m = rand_inv(len(cols), rng)
    return [f2.mat_vec(cols, c) for c in m]


def blocked(rng, nbits=8, lane=5, warp=1):
    perm = list(range(nbits))
    rng.shuffle(perm)
    cols = [1 << p for p in perm]
    reg = nbits - lane - warp
    return cols[:reg], cols[reg:reg + lane], cols[reg + lane:]


# ---------------------------------------------------------------- register renaming


def test_register_permutation_is_renaming():
    rng = random.Random(1)
    r, l, w = blocked(rng, warp=1)
    src = dist(r, l, w)
    dst = dist(list(reversed(r)), l, w)
    plan = check(src, dst)
    assert plan.kind == "registers" and plan.instruction_count == 0
    assert plan.register_map == (0, 2, 1, 3)


def test_broadcast_registers_in_dst():
    rng = random.Random(2)
    r, l, w = blocked(rng, warp=1)
    plan = check(dist(r, l, w), dist(r + [0], l, w))
    assert plan.kind == "registers"


# ---------------------------------------------------------------- shuffles


def test_paper_transpose_in_warp_shuffle_counts():
    # 16x16 fp32 in one warp of 32 lanes, 8 registers: transpose the lane/register roles
    c = lambda i: 1 << i
    r = lambda i: 1 << (4 + i)
    src = dist([c(0), c(1), c(2)], [c(3), r(0), r(1), r(2), r(3)], [])
    dst = dist([r(0), r(1), r(2)], [r(3), c(0), c(1), c(2), c(3)], [])
    plan = check(src, dst, eb=4)
    assert plan.kind == "shuffle"
    assert len(plan.rounds) == 8 and len(plan.slots) == 1
    assert plan.instruction_count == 8


def test_shuffle_vectorizes_16bit_pairs():
    c = lambda i: 1 << i
    r = lambda i: 1 << (4 + i)
    # col bit 0 stays in registers on both sides: two fp16 per 32-bit shuffle
    src = dist([c(0), c(1), c(2)], [c(3), r(0), r(1), r(2), r(3)], [])
    dst = dist([c(0), r(0), r(1)], [r(2), r(3), c(1), c(2), c(3)], [])
    plan = check(src, dst, eb=2)
    assert plan.kind == "shuffle" and len(plan.slots) == 2
    assert len(plan.rounds) == 4
    plan8 = check(src, dst, eb=8)  # 8-byte elements take two words each
    assert plan8.words_per_element == 2 and len(plan8.slots) == 1


@pytest.mark.parametrize("seed", range(25))
def test_random_in_warp_conversions(seed):
    rng = random.Random(seed)
    r, l, w = blocked(rng, warp=rng.randrange(0, 3)) if seed % 2 else (None, None, None)
    if r is None:
        cols = rand_inv(8, rng)
        nw = rng.randrange(0, 3)
        r, l, w = cols[:3 - nw], cols[3 - nw:8 - nw], cols[8 - nw:]
    src = dist(r, l, w)
    mixed = remix(r + l, rng)
    dst = dist(mixed[:len(r)], mixed[len(r):], w)
    plan = check(src, dst, eb=rng.choice([1, 2, 4]))
    assert plan.kind in ("registers", "shuffle")


def test_dst_lane_broadcast_shuffle():
    c = lambda i: 1 << i
    r = lambda i: 1 << (4 + i)
    # 8x16 tensor: dst replicates over lane bit 4
    outs = [("col", 16), ("row", 8)]
    src = dist([c(0), c(1)], [c(2), c(3), r(0), r(1), r(2)], [], outs)
    dst = dist([r(0), r(1)], [c(0), c(1), c(2), c(3), 0], [], outs)
    plan = check(src, dst)
    assert plan.kind in ("shuffle", "shared")


def test_src_fully_replicated_needs_no_shuffle():
    # every thread holds the whole 4x8 tensor: any dst is a (lane dependent) register pick
    outs = [("col", 8), ("row", 4)]
    src = dist([1, 2, 4, 8, 16], [0] * 5, [], outs)
    dst = dist([], [1, 2, 4, 8, 16], [], outs)
    plan = check(src, dst)
    assert plan.kind == "shuffle" and plan.instruction_count == 0
    assert all(rnd.local for rnd in plan.rounds)


# ---------------------------------------------------------------- shared memory


@pytest.mark.parametrize("seed", range(25))
def test_random_cross_warp_conversions(seed):
    rng = random.Random(1000 + seed)
    nw = rng.randrange(1, 3)
    a = rand_inv(8, rng) if seed % 3 else [1 << p for p in rng.sample(range(8), 8)]
    b = rand_inv(8, rng) if seed % 2 else [1 << p for p in rng.sample(range(8), 8)]
    src = dist(a[:3 - nw + 0], a[3 - nw:8 - nw], a[8 - nw:])
    dst = dist(b[:3 - nw], b[3 - nw:8 - nw], b[8 - nw:])
    if seed % 5 == 0:  # dst replicates a register
        dst = dist(b[:3 - nw] + [0], b[3 - nw:8 - nw], b[8 - nw:])
    plan = check(src, dst, eb=rng.choice([1, 2, 4, 8]))
    if plan.kind == "shared":
        assert plan.instruction_count == (len(plan.shared.store.instructions)
                                          + len(plan.shared.load.instructions))


def test_mma_to_blocked_through_shared_is_conflict_free():
    c = lambda i: 1 << i
    r = lambda i: 1 << (4 + i)
    # 16x16 fp16, 2 warps split the rows: mma-like src, 16-byte row chunks dst
    src = dist([c(0), c(3)], [c(1), c(2), r(0), r(1), r(2)], [r(3)])
    dst = dist([c(0), c(1)], [c(2), c(3), r(0), r(1), r(2)], [r(3)])
    plan = check(src, dst)
    assert plan.kind in ("shuffle", "registers")
    dst2 = dist([c(0), c(1)], [c(2), c(3), r(0), r(1), r(3)], [r(2)])
    plan2 = check(src, dst2)
    assert plan2.kind == "shared"
    assert plan2.shared.store.conflict_factor == 1 and plan2.shared.load.conflict_factor == 1
    # the common vector is 2 (col bit 0); the load widens to its 4 contiguous registers
    # (one-sided vectorization), so 3 instructions instead of 4
    assert plan2.shared.store.vec_elems == 2 and plan2.shared.load.vec_elems == 4
    assert plan2.instruction_count == 3


def test_mismatched_threads_rejected():
    with pytest.raises(LayoutError, match="keeps the thread block"):
        plan_conversion(dist([1, 2, 4], [8, 16, 32, 64, 128], []),
                        dist([1, 2, 4, 8], [16, 32, 64, 128], []))


def test_values_shape_checked():
    src = dist([1, 2, 4], [8, 16, 32, 64, 128], [])
    plan = plan_conversion(src, src)
    with pytest.raises(LayoutError, match="shape"):
        simulate_conversion(plan, src, src, np.zeros((1, 32, 4)))


@pytest.mark.parametrize("seed", range(40))
def test_random_surjective_with_broadcast(seed):
    """Random invertible layouts with some registers replicated or lanes broadcast."""
    rng = random.Random(5000 + seed)
    nw = rng.randrange(0, 3)

    def rand_layout():
        cols = rand_inv(8, rng)
        r, l, w = cols[:3 - nw], cols[3 - nw:8 - nw], cols[8 - nw:]
        for _ in range(rng.randrange(3)):
            if rng.random() < 0.5:
                r = r + [rng.choice([0, rng.randrange(256)])]
            else:  # lane j broadcasts, its direction moves into the registers
                j = rng.randrange(len(l))
                r, l = r + [l[j]], l[:j] + [0] + l[j + 1:]
        return dist(r, l, w)

    src, dst = rand_layout(), rand_layout()
    if seed % 2:  # keep the data within each warp
        nr = src.in_dim_bits("register")
        mixed = remix(list(src.bases_packed("register")) + list(src.bases_packed("lane")), rng)
        dst = dist(mixed[:nr], mixed[nr:], list(src.bases_packed("warp")))
    plan = check(src, dst, eb=rng.choice([1, 2, 4]))
    if seed % 2:
        assert plan.kind in ("registers", "shuffle")
