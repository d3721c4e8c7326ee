"""`tg.cumsum` and `tg.scan` in the emulator against numpy, every element checked.

Shapes cover the three levels of the lowering (runs in registers, lanes, warps): rows
scanned inside one thread, rows over a few lanes, rows over several warps, extents that
are not powers of two (a row of 100 is 4 lanes × 25 registers), tiles smaller than the
thread count (replica threads), ragged tensors (the tile's tail is the load's fill), both
axes, forward and reverse, on sm_90a and sm_80. Exactness where the arithmetic allows it:
integer scans (wrapping), max scans and non-commutative integer combines compare bit for
bit; float sums within a bound of the summation order."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula import f32, i32
from tegula.layout.cute import Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scan_kernels import (SHAPES, affine_scan, chunked_affine, cumsum_f16,  # noqa: E402
                          cumsum_i32, cumsum_tile, max_and_first, rand)

TARGETS = ("sm_90a", "sm_80")


def blocks_of(x: np.ndarray, bm: int, bn: int, fill=0) -> np.ndarray:
    """The (blocks, BM, BN) tiles the kernels see: x padded with the load's fill."""
    m = -(-x.shape[0] // bm) * bm
    padded = np.full((m, bn), fill, dtype=x.dtype)
    padded[:x.shape[0], :x.shape[1]] = x
    return padded.reshape(-1, bm, bn)


def unblock(t: np.ndarray, m: int, n: int) -> np.ndarray:
    return t.reshape(-1, t.shape[-1])[:m, :n]


def scanned(fn, t: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """`fn` (an accumulate along an axis) of the tiles, flipped around it when reversed."""
    if reverse:
        return np.flip(fn(np.flip(t, axis), axis), axis)
    return fn(t, axis)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("M,N,BM,BN,threads", SHAPES)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_f32_equals_numpy(M, N, BM, BN, threads, axis, reverse, target):
    x = rand(M, N, seed=M + N)
    y = np.full((M, N), np.nan, np.float32)
    tg.emulate(cumsum_tile, (tg.cdiv(M, BM),), x, y, BM=BM, BN=BN, AXIS=axis,
               REVERSE=reverse, threads=threads, target=target)
    tiles = blocks_of(x.astype(np.float64), BM, BN)
    want = unblock(scanned(np.cumsum, tiles, 1 + axis, reverse), M, N)
    # Any summation order is within (terms) * eps * sum|x| of the exact prefix; a wrong
    # scan is off by whole elements (>= 0.25).
    magnitude = unblock(scanned(np.cumsum, np.abs(tiles), 1 + axis, reverse), M, N)
    bound = (max(BM, BN) * 1.2e-7) * magnitude + 1e-30
    assert np.all(np.abs(y - want) <= bound), np.abs(y - want).max()


def test_cumsum_propagates_nan_and_inf():
    """A NaN poisons every later element of its row (and only those); +inf stays +inf
    until a -inf arrives (then NaN) — as np.cumsum."""
    M, N = 4, 70
    x = rand(M, N, seed=11)
    x[0, 10] = np.nan
    x[1, 0] = np.inf
    x[2, 33] = np.inf
    x[2, 50] = -np.inf
    x[3, 69] = np.nan         # the last element: nothing before it changes
    for reverse in (False, True):
        y = np.full((M, N), 7.0, np.float32)
        tg.emulate(cumsum_tile, (1,), x, y, BM=4, BN=72, AXIS=1, REVERSE=reverse)
        with np.errstate(invalid="ignore"):          # inf + -inf: NaN, as wanted
            want = scanned(np.cumsum, x.astype(np.float64), 1, reverse)
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
        np.testing.assert_array_equal(np.isposinf(y), np.isposinf(want))
        np.testing.assert_array_equal(np.isneginf(y), np.isneginf(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(y[finite], want[finite], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("M,N,BM,BN,threads", [(3, 1000, 2, 1024, 128), (5, 37, 4, 40, 64)])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_i32_wraps_exactly(M, N, BM, BN, threads, reverse):
    x = np.random.default_rng(3).integers(-2**30, 2**30, (M, N)).astype(np.int32)
    y = np.zeros((M, N), np.int32)
    tg.emulate(cumsum_i32, (tg.cdiv(M, BM),), x, y, BM=BM, BN=BN, REVERSE=reverse,
               threads=threads)
    want = scanned(np.cumsum, x.astype(np.int64), 1, reverse)
    np.testing.assert_array_equal(y, want.astype(np.int32))   # int64 -> int32 wraps
    assert np.any(np.abs(want) > 2**31)                         # the test did wrap


def test_cumsum_f16_accumulates_in_f32():
    """4000 values near 1: summed in f16 the prefix would stall near 2048 (f16's spacing
    there is 2); accumulated in f32 each result is its exact prefix rounded once."""
    x = np.random.default_rng(5).uniform(0.9, 1.1, (1, 4000)).astype(np.float16)
    y = np.zeros((1, 4000), np.float16)
    tg.emulate(cumsum_f16, (1,), x, y)
    exact = np.cumsum(x.astype(np.float64), axis=1)
    ulp = np.spacing(exact.astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(y.astype(np.float64) - exact) <= ulp), \
        np.abs(y.astype(np.float64) - exact).max()


def affine_reference(a: np.ndarray, b: np.ndarray, reverse: bool):
    """The composed maps element by element (Python ints masked to i32)."""
    def wrap(v: int) -> int:
        return (v + 2**31) % 2**32 - 2**31
    pa, pb = np.zeros_like(a), np.zeros_like(b)
    order = range(a.shape[1] - 1, -1, -1) if reverse else range(a.shape[1])
    for r in range(a.shape[0]):
        acc = None
        for j in order:
            x = (int(a[r, j]), int(b[r, j]))
            acc = x if acc is None else (wrap(acc[0] * x[0]), wrap(x[0] * acc[1] + x[1]))
            pa[r, j], pb[r, j] = acc
    return pa, pb


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("M,N,BM,BN,threads", [
    (3, 1000, 2, 1024, 128),    # 2 rows of 64 lanes: two warps per row
    (1, 2048, 1, 2048, 256),    # 8 warps per row
    (5, 45, 4, 48, 64),         # 48 = 16 lanes x 3 registers
    (4, 7, 4, 7, 128),          # one thread per row, replicas
])
@pytest.mark.parametrize("reverse", [False, True])
def test_non_commutative_tuple_scan_exact(M, N, BM, BN, threads, reverse, target):
    rng = np.random.default_rng(M * N)
    a = rng.integers(-5, 6, (M, N)).astype(np.int32)
    a[a == 0] = 3
    b = rng.integers(-1000, 1000, (M, N)).astype(np.int32)
    pa, pb = np.zeros_like(a), np.zeros_like(b)
    tg.emulate(affine_scan, (tg.cdiv(M, BM),), a, b, pa, pb, BM=BM, BN=BN,
               REVERSE=reverse, threads=threads, target=target)
    # The tile's tail holds fill=1 (a) and 0 (b): the identity map, so it changes no
    # element in bounds even when reversed.
    want_a, want_b = affine_reference(a, b, reverse)
    np.testing.assert_array_equal(pa, want_a)
    np.testing.assert_array_equal(pb, want_b)


@pytest.mark.parametrize("M,N,BM,BN,threads", SHAPES[:5])
@pytest.mark.parametrize("axis", [0, 1])
def test_max_scan_and_first_scan_exact(M, N, BM, BN, threads, axis):
    x = rand(M, N, seed=7)
    x[0, N // 2] = np.nan      # tg.maximum propagates NaN, as np.maximum
    mx, first = (np.full((M, N), 5.0, np.float32) for _ in range(2))
    tg.emulate(max_and_first, (tg.cdiv(M, BM),), x, mx, first, BM=BM, BN=BN, AXIS=axis,
               threads=threads)
    tiles = blocks_of(x, BM, BN, fill=-np.inf)
    np.testing.assert_array_equal(
        mx, unblock(np.maximum.accumulate(tiles, axis=1 + axis), M, N))
    first_of_tile = np.take(tiles, [0], axis=1 + axis)
    np.testing.assert_array_equal(
        first, unblock(np.broadcast_to(first_of_tile, tiles.shape), M, N))


# A layout decided elsewhere: one element per thread in column-major order, pinned.
@tg.kernel(threads=128)
def pinned_then_scanned(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    t = tg.load(x.tile((16, 8), (0, 0)))
    p = tg.rearrange(t, layout=Layout((128, 1), (1, 0)))
    tg.copy(tg.cumsum(p, 1), y.tile((16, 8), (0, 0)))


def test_scan_of_a_tile_laid_out_elsewhere_is_converted():
    x = rand(16, 8, seed=9)
    y = np.full((16, 8), np.nan, np.float32)
    tg.emulate(pinned_then_scanned, (1,), x, y)
    np.testing.assert_allclose(y, np.cumsum(x.astype(np.float64), axis=1), rtol=1e-6,
                               atol=1e-6)
    text = tg.explain(pinned_then_scanned)
    assert "converted from r1 for the scan" in text
    # 16 rows of 8 on 128 threads: one row per 8 lanes, one element each.
    assert "each thread scans runs of 1 element(s) along the axis (1 row(s) per thread), " \
        "then across 8 lanes" in text


# -- a carried state across loop iterations -------------------------------------------------
@tg.kernel(threads=64)
def chunked_cumsum(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4,
                   BN: tg.constexpr = 32, FROM_LAST: tg.constexpr = False):
    """The cumsum of whole rows, BN columns at a time: each chunk's scan is offset by the
    total of the chunks before it, carried by rebinding `carry` in the loop."""
    m = tg.block_id(0)
    n = x.shape[1]
    carry = tg.zeros((BM, 1), f32)
    for k in tg.range(tg.cdiv(n, BN)):
        t = tg.load(x.tile((BM, BN), (m, k)))
        c = tg.cumsum(t, 1) + carry
        tg.copy(c, y.tile((BM, BN), (m, k)))
        if FROM_LAST:   # the scan's last column seeds the next chunk
            last = tg.arange(BN)[None, :] == BN - 1
            carry = tg.sum(tg.where(last, c, 0.0), 1)
        else:
            carry = carry + tg.sum(t, 1)


@pytest.mark.parametrize("from_last", [False, True])
@pytest.mark.parametrize("M,N,BM,BN", [(5, 100, 4, 32), (3, 64, 4, 16), (6, 7, 2, 8)])
def test_carried_state_across_chunks(M, N, BM, BN, from_last):
    x = rand(M, N, seed=N)
    y = np.full((M, N), np.nan, np.float32)
    tg.emulate(chunked_cumsum, (tg.cdiv(M, BM),), x, y, BM=BM, BN=BN, FROM_LAST=from_last)
    want = np.cumsum(x.astype(np.float64), axis=1)
    bound = N * 1.2e-7 * np.cumsum(np.abs(x.astype(np.float64)), axis=1)
    assert np.all(np.abs(y - want) <= bound), np.abs(y - want).max()


# (M, N, BM, BN, threads, axis): rows of one thread (n = 1), of lanes, of several warps.
CHUNKED = [
    (3, 200, 2, 64, 128, 1),      # 64 lanes per row: two warps, four chunks (last ragged)
    (5, 77, 4, 16, 64, 0),        # along axis 0: 16 = 16 lanes x 1
    (1, 1000, 1, 256, 128, 1),    # one row over 4 warps, 2 registers each
    (2, 300, 2, 512, 128, 1),     # one chunk, mostly fill
    (64, 10, 64, 3, 128, 1),      # each thread scans whole runs: no shuffle at all
    (6, 45, 2, 8, 32, 1),         # 8 = 8 lanes x 1; six chunks
]


@pytest.mark.parametrize("M,N,BM,BN,threads,axis", CHUNKED)
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_continued_from_initial_returns_the_carry(M, N, BM, BN, threads, axis, reverse):
    """`initial=` and the carry: a chunked scan equals the scan of the whole row, bit for
    bit (non-commutative i32 combine), and the last carry is the row's last state."""
    rng = np.random.default_rng(M + N)
    a = rng.integers(-5, 6, (M, N)).astype(np.int32)
    a[a == 0] = 3
    b = rng.integers(-1000, 1000, (M, N)).astype(np.int32)
    flip = (lambda x: x) if axis == 1 else (lambda x: np.ascontiguousarray(x.T))
    pa, pb = (np.full((M, N) if axis == 1 else (N, M), 7, np.int32) for _ in range(2))
    last = np.full((M, 1) if axis == 1 else (1, M), 7, np.int32)
    tg.emulate(chunked_affine, (tg.cdiv(M, BM),), flip(a), flip(b), pa, pb, last, BM=BM,
               BN=BN, AXIS=axis, REVERSE=reverse, threads=threads)
    want_a, want_b = affine_reference(a, b, reverse)
    np.testing.assert_array_equal(flip(pa), want_a)
    np.testing.assert_array_equal(flip(pb), want_b)
    np.testing.assert_array_equal(last.ravel(), want_b[:, 0 if reverse else -1])


# -- other ranks, and a scan whose result is rebound in a loop ------------------------------
@tg.kernel(threads=64)
def scans_of_other_ranks(x: tg.Tensor[f32], v: tg.Tensor[f32, 1], y3: tg.Tensor[f32, 3],
                         yv: tg.Tensor[f32, 1], AXIS: tg.constexpr = 1):
    t = tg.load(x.tile((4, 12), (0, 0)))
    row = tg.load(v.tile((20,), (0,)))
    cube = t[:, :, None] * row[None, None, :]                            # (4, 12, 20)
    tg.copy(tg.scan(cube, AXIS, tg.maximum), y3.tile((4, 12, 20), (0, 0, 0)))
    tg.copy(tg.cumsum(row, 0, reverse=True), yv.tile((20,), (0,)))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_rank_one_and_rank_three_tiles(axis):
    x, v = rand(3, 11, seed=1), rand(19, seed=2)      # ragged in every dim
    y3, yv = np.zeros((3, 11, 19), np.float32), np.zeros(19, np.float32)
    tg.emulate(scans_of_other_ranks, (1,), x, v, y3, yv, AXIS=axis)
    cube = x[:, :, None] * v[None, None, :]
    padded = np.zeros((4, 12, 20), np.float32)        # the tiles' tails load as 0
    padded[:3, :11, :19] = cube
    want = np.maximum.accumulate(padded, axis=axis)[:3, :11, :19]
    np.testing.assert_array_equal(y3, want)
    want = np.flip(np.cumsum(np.flip(v.astype(np.float64))))
    np.testing.assert_allclose(yv, want, rtol=1e-5, atol=1e-5)


@tg.kernel(threads=32)
def repeated_cumsum(x: tg.Tensor[i32], y: tg.Tensor[i32], TIMES: tg.constexpr = 3):
    acc = tg.load(x.tile((2, 40), (0, 0)))
    for _ in tg.range(TIMES):
        acc = tg.cumsum(acc, 1)          # the scan's result carried to the next iteration
    tg.copy(acc, y.tile((2, 40), (0, 0)))


def test_scan_result_rebound_in_a_loop():
    x = np.random.default_rng(4).integers(-9, 10, (2, 40)).astype(np.int32)
    y = np.zeros_like(x)
    tg.emulate(repeated_cumsum, (1,), x, y, TIMES=3)
    want = x.astype(np.int64)
    for _ in range(3):
        want = np.cumsum(want, axis=1)
    np.testing.assert_array_equal(y, want.astype(np.int32))
