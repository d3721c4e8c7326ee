"""Common kernel idioms written as a new kernel engineer would from README.md and
docs/first-kernel.md (session 10): masked row reductions, transposes through shared memory,
broadcasts, int8/uint8 and f8 types, strided views, kernel scalars, `tg.where`, cumsum and
chunked scans, reshape/permute/bitcast, tiles smaller than the block, loop carries, early
exits. Each `Idiom` holds its kernel, grid, arguments (outputs poisoned) and a check against
numpy of every element; `test_idioms.py` runs them in the emulator on sm_90a and sm_80,
`tests/gpu/test_idioms_gpu.py` on the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import tegula as tg
from tegula import bf16, f8e4m3, f16, f32, i8, i32, u8


@dataclass
class Idiom:
    """One kernel and one launch of it. `args` are numpy arrays (views allowed) and ints in
    parameter order; `check(args)` asserts every output element against numpy."""
    kernel: object
    grid: tuple
    args: list
    check: Callable[[list], None]
    constexprs: dict = field(default_factory=dict)
    sm_90a_only: bool = False


def _nan(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype)


# -- reductions ---------------------------------------------------------------------------
@tg.kernel(threads=128)
def row_max(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 64):
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m, 0)), fill=-float("inf"))
    tg.copy(tg.max(t, 1), y.tile((BM, 1), (m, 0)))


def row_max_case(rng):
    x = rng.standard_normal((10, 50)).astype(np.float32)
    x[3, 7] = np.nan   # a NaN row reduces to NaN
    x[4, :] = -np.inf
    def check(a):
        assert np.array_equal(a[1][:, 0], x.max(1), equal_nan=True), (a[1][:, 0], x.max(1))
    return Idiom(row_max, (3,), [x, _nan((10, 1))], check)


@tg.kernel(threads=64)
def masked_row_sum(x: tg.Tensor[f32], y: tg.Tensor[f32], N: int, BM: tg.constexpr = 2,
                   BN: tg.constexpr = 128):
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m, 0)))
    t = tg.where(tg.arange(BN)[None, :] < N, t, 0.0)     # only the first N columns count
    tg.copy(tg.sum(t, 1), y.tile((BM, 1), (m, 0)))


def masked_row_sum_case(rng):
    x = rng.standard_normal((5, 100)).astype(np.float32)
    def check(a):
        ref = x[:, :37].astype(np.float64).sum(1)
        assert np.all(np.abs(a[1][:, 0] - ref) <= 1e-5 * np.abs(x[:, :37]).sum(1) + 1e-7)
    return Idiom(masked_row_sum, (3,), [x, _nan((5, 1)), 37], check)


@tg.kernel(threads=128)
def column_sum(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 64, BN: tg.constexpr = 16):
    n = tg.block_id(0)
    tg.copy(tg.sum(tg.load(x.tile((BM, BN), (0, n))), 0), y.tile((1, BN), (0, n)))


def column_sum_case(rng):
    x = rng.standard_normal((50, 40)).astype(np.float32)
    def check(a):
        ref = x.astype(np.float64).sum(0)
        assert np.all(np.abs(a[1][0] - ref) <= 1e-5 * np.abs(x).sum(0))
    return Idiom(column_sum, (3,), [x, _nan((1, 40))], check)


@tg.kernel(threads=128)
def argmin_through_shared(x: tg.Tensor[f16], y: tg.Tensor[i32], BM: tg.constexpr = 4,
                          BN: tg.constexpr = 32):
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m, 0)), fill=float("inf"))
    s = tg.shared((BM, 1), i32)
    tg.copy(tg.argmin(t, 1), s)
    tg.copy(tg.load(s) + 1, y.tile((BM, 1), (m, 0)))


def argmin_case(rng):
    x = rng.integers(-3, 3, (9, 30)).astype(np.float16)   # many ties: the first one wins
    def check(a):
        assert np.array_equal(a[1][:, 0], np.argmin(x, 1) + 1)
    return Idiom(argmin_through_shared, (3,), [x, np.full((9, 1), -5, np.int32)], check)


@tg.kernel(threads=256)
def tiny_tile(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 2, BN: tg.constexpr = 8):
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m, 0)))          # 16 elements for 256 threads
    tg.copy(t - tg.max(t, 1), y.tile((BM, BN), (m, 0)))


def tiny_tile_case(rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    def check(a):
        padded = np.pad(x, ((0, 0), (0, 1)))        # the fill 0 takes part in the max
        assert np.array_equal(a[1], x - padded.max(1, keepdims=True))
    return Idiom(tiny_tile, (3,), [x, _nan((5, 7))], check)


# -- data movement ------------------------------------------------------------------------
@tg.kernel(threads=128)
def transpose_shared(x: tg.Tensor[f32], y: tg.Tensor[f32], B: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    s = tg.shared((B, B), f32)
    tg.copy(x.tile((B, B), (m, n)), s)
    tg.copy(s.T, y.tile((B, B), (n, m)))


def transpose_case(rng):
    x = rng.standard_normal((45, 70)).astype(np.float32)
    def check(a):
        assert np.array_equal(a[1], x.T)
    return Idiom(transpose_shared, (2, 3), [x, _nan((70, 45))], check)


@tg.kernel(threads=128)
def plus_one(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 8, BN: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    tg.copy(tg.load(x.tile((BM, BN), (m, n))) + 1.0, y.tile((BM, BN), (m, n)))


def strided_views_case(rng):
    base = rng.standard_normal((30, 90)).astype(np.float32)
    x = base[:, ::3]                               # every third column
    out_base = _nan((30, 60))
    y = out_base[:, ::2]                           # every other column of the output
    def check(a):
        assert np.array_equal(a[1], x + 1)
        assert np.isnan(out_base[:, 1::2]).all()   # the columns between were not written
    return Idiom(plus_one, (4, 1), [x, y], check)


def transposed_view_case(rng):
    x = rng.standard_normal((40, 60)).astype(np.float32).T[:50, :20]
    def check(a):
        assert np.array_equal(a[1], x + 1)
    return Idiom(plus_one, (tg.cdiv(50, 8), 1), [x, _nan((50, 20))], check)


@tg.kernel(threads=64)
def store_transposed(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 8,
                     BN: tg.constexpr = 16):
    m, n = tg.block_id(0), tg.block_id(1)
    tg.copy(tg.load(x.tile((BM, BN), (m, n))), y.T.tile((BM, BN), (m, n)))


def store_transposed_case(rng):
    x = rng.standard_normal((20, 40)).astype(np.float32)
    def check(a):
        assert np.array_equal(a[1], x.T)
    return Idiom(store_transposed, (3, 3), [x, _nan((40, 20))], check)


@tg.kernel(threads=64)
def gather_rows(x: tg.Tensor[f32], idx: tg.Tensor[i32, 1], y: tg.Tensor[f32],
                BN: tg.constexpr = 64):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((1, BN), (idx[m], 0))), y.tile((1, BN), (m, 0)))


def gather_rows_case(rng):
    x = rng.standard_normal((10, 50)).astype(np.float32)
    idx = np.array([3, 0, 9, 3, 7], np.int32)
    def check(a):
        assert np.array_equal(a[2], x[idx])
    return Idiom(gather_rows, (5,), [x, idx, _nan((5, 50))], check)


@tg.kernel(threads=64)
def rows_of_a_slice(x: tg.Tensor[f32], y: tg.Tensor[f32], lo: int, hi: int,
                    BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    t = tg.load(x[lo:hi, :].tile((BM, BN), (m, 0)), fill=-1.0)
    tg.copy(t, y.tile((BM, BN), (m, 0)))


def slice_case(rng):
    x = rng.standard_normal((20, 16)).astype(np.float32)
    def check(a):
        ref = np.full((8, 16), -1.0, np.float32)
        ref[:6] = x[5:11]
        assert np.array_equal(a[1], ref)
    return Idiom(rows_of_a_slice, (2,), [x, _nan((8, 16)), 5, 11], check)


# -- broadcasts and element types ---------------------------------------------------------
@tg.kernel(threads=128)
def broadcast_affine(x: tg.Tensor[f32], r: tg.Tensor[f32], c: tg.Tensor[f32], y: tg.Tensor[f32],
                     BM: tg.constexpr = 8, BN: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    t = tg.load(x.tile((BM, BN), (m, n)))
    row = tg.load(r.tile((1, BN), (0, n)))
    col = tg.load(c.tile((BM, 1), (m, 0)))
    tg.copy(t * row + col, y.tile((BM, BN), (m, n)))


def broadcast_case(rng):
    x = rng.standard_normal((20, 40)).astype(np.float32)
    r = rng.standard_normal((1, 40)).astype(np.float32)
    c = rng.standard_normal((20, 1)).astype(np.float32)
    def check(a):
        # the GPU may contract t * row + col into one FMA: one rounding instead of two
        ref = x.astype(np.float64) * r + c
        assert np.all(np.abs(a[3] - ref) <= 2.0 ** -23 * (np.abs(x * r) + np.abs(c)))
    return Idiom(broadcast_affine, (3, 2), [x, r, c, _nan((20, 40))], check)


@tg.kernel(threads=32)
def int8_ops(x: tg.Tensor[i8], u: tg.Tensor[u8], s: tg.Tensor[i32], w: tg.Tensor[u8],
             BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    a = tg.load(x.tile((BM, BN), (m, 0)))
    b = tg.load(u.tile((BM, BN), (m, 0)))
    tg.copy(tg.sum(a.to(i32), 1), s.tile((BM, 1), (m, 0)))
    tg.copy(tg.where(b > 200, b - 200, b * 3 + 7), w.tile((BM, BN), (m, 0)))   # u8 wraps


def int8_case(rng):
    x = rng.integers(-128, 128, (6, 13)).astype(np.int8)
    u = rng.integers(0, 256, (6, 13)).astype(np.uint8)
    def check(a):
        assert np.array_equal(a[2][:, 0], x.astype(np.int32).sum(1))
        ref = np.where(u > 200, u - np.uint8(200), u * np.uint8(3) + np.uint8(7))
        assert np.array_equal(a[3], ref.astype(np.uint8))
    return Idiom(int8_ops, (2,), [x, u, np.full((6, 1), -999, np.int32),
                                  np.full((6, 13), 0xA5, np.uint8)], check)


def _e4m3_values():
    """Every finite non-negative f8e4m3 value and its code (bias 7, no infinities)."""
    values, codes = [], []
    for code in range(127):                        # 127 (S.1111.111) is NaN
        e, m = code >> 3, code & 7
        values.append((m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
        codes.append(code)
    return np.array(values), np.array(codes)


def round_e4m3(x: np.ndarray) -> np.ndarray:
    """Round to f8e4m3 by search (nearest, ties to the even code, saturating at ±448): a
    reference independent of the emulator's arithmetic."""
    values, codes = _e4m3_values()
    out = np.empty(x.shape, np.float32)
    for i, v in np.ndenumerate(x):
        d = np.abs(values - min(abs(float(v)), 448.0))
        near = np.nonzero(d == d.min())[0]
        pick = near[0] if len(near) == 1 else near[codes[near] % 2 == 0][0]
        out[i] = np.copysign(values[pick], v)
    return out


@tg.kernel(threads=64)
def f8_round_trip(x: tg.Tensor[f32], y: tg.Tensor[f8e4m3], z: tg.Tensor[f32],
                  BM: tg.constexpr = 4, BN: tg.constexpr = 32):
    m = tg.block_id(0)
    q = tg.load(x.tile((BM, BN), (m, 0))).to(f8e4m3)
    tg.copy(q, y.tile((BM, BN), (m, 0)))
    tg.copy(q.to(f32) * 2.0, z.tile((BM, BN), (m, 0)))


def f8_case(rng):
    x = (rng.standard_normal((5, 20)) * 100).astype(np.float32)
    x[0, :4] = [1000.0, -1000.0, 464.0, 0.0]       # saturate; 464 is a tie between 448 and NaN
    def check(a):
        ref = round_e4m3(x)
        assert np.array_equal(a[1], ref)
        assert np.array_equal(a[2], ref * 2)
    return Idiom(f8_round_trip, (2,), [x, _nan((5, 20)), _nan((5, 20))], check)


def _round_bf16(v):
    """Round float64 values to bf16 once (nearest, ties to even; normal range): rounding
    through float32 first would round twice."""
    m, e = np.frexp(np.asarray(v, np.float64))
    return (np.round(m * 2.0 ** 8) * 2.0 ** (e - 8)).astype(np.float32)


@tg.kernel(threads=64)
def bf16_square_plus_one(x: tg.Tensor[bf16], y: tg.Tensor[bf16], BN: tg.constexpr = 64):
    n = tg.block_id(0)
    a = tg.load(x.tile((1, BN), (0, n)))
    tg.copy(a * a + 1.0, y.tile((1, BN), (0, n)))


def bf16_case(rng):
    x = _round_bf16(rng.standard_normal((1, 100)))
    def check(a):
        # 16-bit arithmetic rounds the product, or an FMA rounds once (both exact in f64)
        xd = x.astype(np.float64)
        once = _round_bf16(xd * xd + 1)
        twice = _round_bf16(_round_bf16(xd * xd).astype(np.float64) + 1)
        bad = ~((a[1] == once) | (a[1] == twice))
        assert not bad.any(), (f"{int(bad.sum())} of {bad.size} wrong: x {x[bad][:4]}, got "
                               f"{a[1][bad][:4]}, once {once[bad][:4]}, twice {twice[bad][:4]}")
    return Idiom(bf16_square_plus_one, (2,), [x, _nan((1, 100))], check)


@tg.kernel(threads=32)
def reshape_permute_bitcast(x: tg.Tensor[f32], y: tg.Tensor[f32], z: tg.Tensor[i32],
                            BM: tg.constexpr = 4, BN: tg.constexpr = 8):
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m, 0)))
    r = tg.permute(tg.reshape(t, (BM, 2, BN // 2)), (0, 2, 1))
    tg.copy(tg.reshape(r, (BM, BN)), y.tile((BM, BN), (m, 0)))
    tg.copy(tg.bitcast(t, i32), z.tile((BM, BN), (m, 0)))


def reshape_case(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    def check(a):
        assert np.array_equal(a[1], x.reshape(8, 2, 4).transpose(0, 2, 1).reshape(8, 8))
        assert np.array_equal(a[2], x.view(np.int32))
    return Idiom(reshape_permute_bitcast, (2,), [x, _nan((8, 8)), np.full((8, 8), -99, np.int32)],
                 check)


@tg.kernel(threads=32)
def int_scalars(x: tg.Tensor[i32, 1], y: tg.Tensor[i32, 1], z: tg.Tensor[i32, 1], d: int,
                BN: tg.constexpr = 32):
    t = tg.load(x.tile((BN,), (0,)))
    tg.copy(t * d + 5 - t // d, y.tile((BN,), (0,)))
    tg.copy(t % d, z.tile((BN,), (0,)))


def int_scalars_case(rng, d=-7):
    x = rng.integers(-1000, 1000, 32).astype(np.int32)
    def check(a):
        if d == 0:   # torch's floor_divide / remainder conventions for a zero divisor
            assert np.array_equal(a[1], x * 0 + 5 + 1) and np.array_equal(a[2], x)
        else:
            assert np.array_equal(a[1], x * d + 5 - x // d)
            assert np.array_equal(a[2], x % d)
    return Idiom(int_scalars, (1,), [x, np.full_like(x, -99), np.full_like(x, -99), d], check)


# -- loops, scans, branches ---------------------------------------------------------------
@tg.kernel(threads=128)
def log_sum_exp(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 32):
    m = tg.block_id(0)
    xv = x.tile((BM, BN), (m, None))
    mx = tg.full((BM, 1), -float("inf"), f32)
    s = tg.zeros((BM, 1), f32)
    for k in tg.range(xv.shape[2]):                # online max and sum, carried
        t = tg.load(xv[:, :, k], fill=-float("inf"))
        new = tg.maximum(mx, tg.max(t, 1))
        s = s * tg.exp(mx - new) + tg.sum(tg.exp(t - new), 1)
        mx = new
    tg.copy(mx + tg.log(s), y.tile((BM, 1), (m, 0)))


def lse_case(rng):
    x = rng.standard_normal((9, 100)).astype(np.float32)
    def check(a):
        ref = np.log(np.exp(x.astype(np.float64)).sum(1))
        assert np.all(np.abs(a[1][:, 0] - ref) <= 1e-5 * np.abs(ref) + 1e-6)
    return Idiom(log_sum_exp, (3,), [x, _nan((9, 1))], check)


@tg.kernel(threads=64)
def running_max(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 2, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    xv, yv = x.tile((BM, BN), (m, None)), y.tile((BM, BN), (m, None))
    h = tg.full((BM, 1), -float("inf"), f32)
    for k in tg.range(xv.shape[2]):                # a chunked scan, continued by its carry
        out, h = tg.scan(tg.load(xv[:, :, k], fill=-float("inf")), 1, tg.maximum, initial=h)
        tg.copy(out, yv[:, :, k])


def running_max_case(rng):
    x = rng.standard_normal((5, 50)).astype(np.float32)
    x[1, 20] = np.nan
    def check(a):
        assert np.array_equal(a[1], np.maximum.accumulate(x, 1), equal_nan=True)
    return Idiom(running_max, (3,), [x, np.full_like(x, 7.0)], check)


@tg.kernel(threads=64)
def reverse_cumsum(x: tg.Tensor[i8], y: tg.Tensor[i8], BM: tg.constexpr = 16, BN: tg.constexpr = 8):
    n = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (0, n)))
    tg.copy(tg.cumsum(t, 0, reverse=True), y.tile((BM, BN), (0, n)))


def reverse_cumsum_case(rng):
    x = rng.integers(-128, 128, (16, 10)).astype(np.int8)
    def check(a):   # integer cumsums wrap in the tile's type
        ref = np.cumsum(x[::-1].astype(np.int64), 0)[::-1].astype(np.int8)
        assert np.array_equal(a[1], ref)
    return Idiom(reverse_cumsum, (2,), [x, np.full_like(x, 0x5A)], check)


@tg.kernel(threads=64)
def row_prefix(x: tg.Tensor[f32], y: tg.Tensor[f32], rows: int, BN: tg.constexpr = 32):
    n = tg.block_id(0)
    acc = tg.zeros((1, BN), f32)
    for r in tg.range(rows):
        acc += tg.load(x.tile((1, BN), (r, n)))
        tg.copy(acc, y.tile((1, BN), (r, n)))


def row_prefix_case(rng):
    x = rng.standard_normal((7, 40)).astype(np.float32)
    def check(a):
        assert np.array_equal(a[1], np.cumsum(x, 0, dtype=np.float32))
    return Idiom(row_prefix, (2,), [x, _nan((7, 40)), 7], check)


@tg.kernel(threads=32)
def every_other_down(x: tg.Tensor[f32, 1], y: tg.Tensor[f32, 1], start: int, stop: int,
                     BN: tg.constexpr = 8):
    acc = tg.zeros((BN,), f32)
    xv = x.tile((BN,), (None,))
    for k in tg.range(start, stop, -2):
        acc = acc * 0.5 + tg.load(xv[:, k])
    tg.copy(acc, y.tile((BN,), (0,)))


def every_other_down_case(rng):
    x = rng.standard_normal(60).astype(np.float32)
    def check(a):
        acc = np.zeros(8, np.float64)
        for k in range(6, -1, -2):
            acc = acc * 0.5 + x[8 * k:8 * k + 8]
        assert np.all(np.abs(a[1] - acc) <= 2.0 ** -22 * 4)
    return Idiom(every_other_down, (1,), [x, _nan(8), 6, -1], check)


@tg.kernel(threads=64)
def transpose_in_branch(x: tg.Tensor[f32], y: tg.Tensor[f32], flag: int, B: tg.constexpr = 8):
    m = tg.block_id(0)
    s = tg.shared((B, B), f32)
    tg.copy(tg.load(x.tile((B, B), (m, 0))), s)
    with tg.if_(flag > 0):
        tg.copy(tg.load(s.T) * 2.0, s)             # read and rewrite the same buffer
    tg.copy(tg.load(s), y.tile((B, B), (m, 0)))


def transpose_in_branch_case(rng, flag=1):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    def check(a):
        ref = x if flag == 0 else np.concatenate([x[:8].T * 2, x[8:].T * 2])
        assert np.array_equal(a[1], ref)
    return Idiom(transpose_in_branch, (2,), [x, _nan((16, 8)), flag], check)


@tg.kernel(threads=64)
def accumulate_transposes(x: tg.Tensor[f32], y: tg.Tensor[f32], B: tg.constexpr = 16):
    m = tg.block_id(0)
    xv = x.tile((B, B), (m, None))
    s = tg.shared((B, B), f32, stages=2)
    acc = tg.zeros((B, B), f32)
    for k in tg.range(xv.shape[2]):                # a shared buffer rewritten every step
        tg.copy(xv[:, :, k], s[k])
        acc = acc + tg.load(s[k].T) * (k + 1)
    tg.copy(acc, y.tile((B, B), (0, m)))


def accumulate_transposes_case(rng):
    x = rng.standard_normal((32, 40)).astype(np.float32)
    def check(a):
        xp = np.pad(x, ((0, 0), (0, 8))).astype(np.float64)
        blocks = [sum(xp[16 * b:16 * b + 16, 16 * k:16 * k + 16].T * (k + 1) for k in range(3))
                  for b in range(2)]
        ref = np.concatenate(blocks, axis=1)
        assert np.all(np.abs(a[1] - ref) <= 1e-5 * (np.abs(ref) + 1))
    return Idiom(accumulate_transposes, (2,), [x, _nan((16, 32))], check)


@tg.kernel(threads=64)
def early_exit(x: tg.Tensor[f32], y: tg.Tensor[f32], rows: int, BM: tg.constexpr = 4,
               BN: tg.constexpr = 16):
    m = tg.block_id(0)
    with tg.if_(m * BM < rows):                   # blocks past the end do nothing
        tg.copy(tg.load(x.tile((BM, BN), (m, 0))) * 2.0, y.tile((BM, BN), (m, 0)))


def early_exit_case(rng):
    x = rng.standard_normal((10, 16)).astype(np.float32)
    def check(a):
        assert np.array_equal(a[1], x * 2)
    return Idiom(early_exit, (5,), [x, _nan((10, 16)), 10], check)


@tg.kernel(threads=64)
def grid_stride(x: tg.Tensor[f32, 1], y: tg.Tensor[f32, 1], BN: tg.constexpr = 64):
    tiles = tg.cdiv(x.shape[0], BN)
    for t in tg.range(tg.block_id(0), tiles, tg.num_programs(0)):
        tg.copy(tg.load(x.tile((BN,), (t,))) + 2.0, y.tile((BN,), (t,)))


def grid_stride_case(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    def check(a):
        assert np.array_equal(a[1], x + 2)
    return Idiom(grid_stride, (3,), [x, _nan(1000)], check)


@tg.kernel(threads=128)
def int8_gemm(a: tg.Tensor[i8], b: tg.Tensor[i8], c: tg.Tensor[i32], BM: tg.constexpr = 64,
              BN: tg.constexpr = 64, BK: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    ga, gb = a.tile((BM, BK), (m, None)), b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), i32)
    sa, sb = tg.shared((BM, BK), i8, stages=2), tg.shared((BN, BK), i8, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=2):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc, c.tile((BM, BN), (m, n)))


def int8_gemm_case(rng):
    a = rng.integers(-128, 128, (70, 80)).astype(np.int8)
    b = rng.integers(-128, 128, (50, 80)).astype(np.int8)
    def check(args):
        assert np.array_equal(args[2], a.astype(np.int32) @ b.astype(np.int32).T)
    return Idiom(int8_gemm, (2, 1), [a, b, np.full((70, 50), -7, np.int32)], check)


@tg.kernel(threads=128)
def exp_to_shared_gemm(a: tg.Tensor[f32], b: tg.Tensor[f16], c: tg.Tensor[f32],
                       BM: tg.constexpr = 64, BN: tg.constexpr = 32, BK: tg.constexpr = 32):
    m = tg.block_id(0)
    sp, sb = tg.shared((BM, BK), f16), tg.shared((BN, BK), f16)
    tg.copy(tg.exp(tg.load(a.tile((BM, BK), (m, 0)))).to(f16), sp)   # registers -> shared
    tg.copy(b.tile((BN, BK), (0, 0)), sb)
    acc = tg.zeros((BM, BN), f32)
    tg.gemm(acc, sp, sb)
    tg.copy(acc, c.tile((BM, BN), (m, 0)))


def exp_gemm_case(rng):
    a = rng.standard_normal((100, 32)).astype(np.float32)
    b = rng.standard_normal((32, 32)).astype(np.float16)
    def check(args):
        p = np.exp(a.astype(np.float64))
        bd = b.astype(np.float64)
        ref = p @ bd.T
        # p rounded to f16 (half an ulp each: 2^-11 relative, plus expf's few ulp), f32 sums
        bound = (2.0 ** -10 + 32 * 2.0 ** -23) * (np.abs(p) @ np.abs(bd).T)
        assert np.all(np.abs(args[2] - ref) <= bound)
    return Idiom(exp_to_shared_gemm, (2,), [a, b, _nan((100, 32))], check)


#: name -> case maker: the same cases in the emulator and on the GPU.
CASES = {
    "row_max": row_max_case, "masked_row_sum": masked_row_sum_case,
    "column_sum": column_sum_case, "argmin": argmin_case, "tiny_tile": tiny_tile_case,
    "transpose": transpose_case, "strided_views": strided_views_case,
    "transposed_view": transposed_view_case, "store_transposed": store_transposed_case,
    "gather_rows": gather_rows_case, "slice": slice_case, "broadcast": broadcast_case,
    "int8": int8_case, "f8": f8_case, "bf16": bf16_case, "reshape": reshape_case,
    "int_scalars": int_scalars_case, "int_scalars_zero": lambda r: int_scalars_case(r, 0),
    "lse": lse_case, "running_max": running_max_case, "reverse_cumsum": reverse_cumsum_case,
    "row_prefix": row_prefix_case, "every_other_down": every_other_down_case,
    "transpose_in_branch": transpose_in_branch_case,
    "no_transpose_in_branch": lambda r: transpose_in_branch_case(r, 0),
    "accumulate_transposes": accumulate_transposes_case, "early_exit": early_exit_case,
    "grid_stride": grid_stride_case, "int8_gemm": int8_gemm_case, "exp_gemm": exp_gemm_case,
}
