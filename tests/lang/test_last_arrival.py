"""`tg.last_arrival`: the last block of a group merges what the others stored (emulated),
the order it makes between blocks, and its errors."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32, i32
from tegula.emulate.errors import EmulationError
from tegula.errors import TegulaError


@tg.kernel(threads=128)
def split_sum(x: tg.Tensor[f32, 2], part: tg.Tensor[f32, 2], out: tg.Tensor[f32, 1],
              counters: tg.Tensor[i32, 1], BN: tg.constexpr = 64, S: tg.constexpr = 8,
              STORE_AFTER: tg.constexpr = False):
    """Row r's sum: block (s, r) sums x[r, s*BN : (s+1)*BN] into part[r, s]; the last of
    the row's blocks adds the parts in order. STORE_AFTER: the part is stored after the
    arrival (a race the emulator must report)."""
    s, r = tg.block_id(0), tg.block_id(1)
    v = tg.load(x[r:r + 1, :].tile((1, BN), (0, s)))
    mine = part[r:r + 1, :].tile((1, 1), (0, s))
    if not STORE_AFTER:
        tg.copy(tg.sum(v, 1), mine)
    last = tg.last_arrival(counters.tile((1,), (r,)), tg.num_programs(0))
    if STORE_AFTER:
        tg.copy(tg.sum(v, 1), mine)
    with tg.if_(last):
        every = tg.load(part[r:r + 1, :].tile((1, S), (0, 0)))
        tg.copy(tg.sum(every, 1)[:, 0], out.tile((1,), (r,)))


def _run(rows: int, splits: int, counters: np.ndarray | None = None, **options):
    rng = np.random.default_rng(rows * 100 + splits)
    x = rng.standard_normal((rows, splits * 64)).astype(np.float32)
    part = np.full((rows, splits), np.nan, np.float32)
    out = np.full((rows,), np.nan, np.float32)
    counters = np.zeros(rows, np.int32) if counters is None else counters
    tg.emulate(split_sum, (splits, rows), x, part, out, counters, BN=64, S=splits, **options)
    return x, part, out, counters


@pytest.mark.parametrize("rows,splits", [(3, 8), (2, 1), (1, 5)])
def test_the_last_block_merges_every_part_and_leaves_the_counter_zero(rows, splits):
    x, part, out, counters = _run(rows, splits)
    expected = x.reshape(rows, splits, 64).sum(-1, dtype=np.float64)
    np.testing.assert_allclose(part, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, expected.sum(-1), rtol=1e-5, atol=1e-4)
    assert (counters == 0).all()                     # ready for the next launch
    _, _, again, counters = _run(rows, splits, counters)   # a second launch, same counters
    np.testing.assert_array_equal(again, out)


def test_a_store_after_the_arrival_is_a_race():
    # (the last block's own store is not ordered before its read either: found first)
    with pytest.raises(EmulationError, match="race"):
        _run(2, 4, STORE_AFTER=True)


@pytest.mark.parametrize("store_first", [True, False])
def test_only_stores_before_the_writers_arrival_are_ordered_for_the_last_block(store_first):
    @tg.kernel(threads=32)
    def one(part: tg.Tensor[f32, 1], out: tg.Tensor[f32, 1], counters: tg.Tensor[i32, 1],
            FIRST: tg.constexpr = True):
        s = tg.block_id(0)
        if FIRST:
            tg.copy(tg.full((1,), 1.0, f32) + s, part.tile((1,), (s,)))
        last = tg.last_arrival(counters.tile((1,), (0,)), tg.num_programs(0))
        if not FIRST:
            tg.copy(tg.full((1,), 1.0, f32) + s, part.tile((1,), (s,)))
        with tg.if_(last & (s != 0)):                  # reads only block 0's part
            tg.copy(tg.load(part.tile((1,), (0,))), out.tile((1,), (0,)))

    args = (np.zeros(3, np.float32), np.zeros(1, np.float32), np.zeros(1, np.int32))
    if store_first:
        tg.emulate(one, (3,), *args, FIRST=True)
        assert args[1][0] == 1.0
        return
    with pytest.raises(EmulationError, match=r"race between blocks on element 0 .*block "
                                             r"\(2, 0, 0\) reads it, block \(0, 0, 0\) stored"):
        tg.emulate(one, (3,), *args, FIRST=False)


def test_a_counter_not_zeroed_is_reported():
    with pytest.raises(EmulationError, match="holds 9 .*outside 0 .. 3"):
        _run(2, 4, np.array([0, 9], np.int32))


def test_a_counter_left_half_way_makes_the_wrong_block_last_and_that_is_a_race():
    # 2 of 4 arrivals already counted: block 1 is "last" and reads parts 2 and 3 before
    # their blocks store them; the later stores are reported.
    with pytest.raises(EmulationError, match="race between blocks"):
        _run(1, 4, np.array([2], np.int32))


def test_arrivals_with_different_counts_are_reported():
    @tg.kernel(threads=32)
    def mixed(counters: tg.Tensor[i32, 1], out: tg.Tensor[f32, 1]):
        count = tg.minimum(tg.block_id(0) + 1, 2)            # block 0: 1, block 1: 2
        with tg.if_(tg.last_arrival(counters.tile((1,), (0,)), count)):
            tg.copy(tg.full((1,), 1.0, f32), out.tile((1,), (tg.block_id(0),)))

    with pytest.raises(EmulationError, match="with count 1 and 2"):
        tg.emulate(mixed, (2,), np.zeros(1, np.int32), np.zeros(2, np.float32),
                   check_coverage=False)


def _kernel_with(body):
    @tg.kernel(threads=32)
    def k(counters: tg.Tensor[i32, 1], values: tg.Tensor[f32, 1]):
        body(counters, values)
    return k


@pytest.mark.parametrize("body,message", [
    (lambda c, v: [tg.last_arrival(c.tile((1,), (i,)), 2) for i in tg.range(2)],
     "not inside a loop"),
    (lambda c, v: tg.last_arrival(v.tile((1,), (0,)), 2), "i32"),
    (lambda c, v: tg.last_arrival(c.tile((2,), (0,)), 2), "one element"),
    (lambda c, v: tg.last_arrival(c.tile((1,), (0,)), 0), "at least 1"),
    (lambda c, v: tg.last_arrival(c.tile((1,), (0,)), 2.0), "count must be an int"),
])
def test_refusals_name_the_op(body, message):
    with pytest.raises(TegulaError, match=message) as info:
        _kernel_with(body).trace()
    assert "tg.last_arrival" in str(info.value)


def test_the_cuda_holds_the_release_acquire_atomic_and_the_broadcast():
    from tegula.build import build
    source = build(split_sum, dict(BN=64, S=8), target="sm_90a").cuda_source()
    assert "atom.acq_rel.gpu.global.inc.u32" in source
    assert "bar.red.or.pred" in source
    assert "__trap()" in source
    from tegula.ir.printer import format_kernel
    assert "arrived0 = last_arrival %counters" in format_kernel(split_sum.trace(BN=64, S=8))


@tg.kernel(threads=128)
def gemm_then_arrive(a: tg.Tensor[tg.f16, 2], b: tg.Tensor[tg.f16, 2], c: tg.Tensor[f32, 2],
                     counters: tg.Tensor[i32, 1], out: tg.Tensor[f32, 1]):
    m = tg.block_id(0)
    ga, gb = a.tile((64, 64), (m, None)), b.tile((64, 64), (0, None))
    acc = tg.zeros((64, 64), f32)
    sa, sb = tg.shared((64, 64), tg.f16, stages=2), tg.shared((64, 64), tg.f16, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=2):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc, c.tile((64, 64), (m, 0)))
    with tg.if_(tg.last_arrival(counters.tile((1,), (0,)), tg.num_programs(0))):
        tg.copy(tg.load(c.tile((1, 1), (0, 0)))[0, :], out.tile((1,), (0,)))


def test_an_arrival_in_a_warp_role_is_refused_at_its_line():
    """After a warp-specialized pipeline the rest of the body runs in the consumer role:
    its barriers would wait forever for the producer warpgroup."""
    from tegula.build import build
    with pytest.raises(TegulaError, match="tg.last_arrival: the kernel runs in warp roles") \
            as info:
        build(gemm_then_arrive, dict(warp_specialize=True), target="sm_90a")
    assert "gemm_then_arrive" in str(info.value)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    c, out = np.zeros((128, 64), np.float32), np.zeros(1, np.float32)
    tg.emulate(gemm_then_arrive, (2,), a, b, c, np.zeros(1, np.int32), out,
               warp_specialize=False)
    assert out[0] == c[0, 0] and np.isclose(c[0, 0], a[0].astype(np.float32) @ b[0])
