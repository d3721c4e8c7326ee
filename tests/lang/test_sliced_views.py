"""A slice with a stop (`x[0:5, :]`, `a[start:end, :]`, `a[:, :k]`) bounds every view cut
from it: elements of a tile at or past the stop are out of bounds — loads give the fill,
stores skip them — exactly as past the tensor's extent. Before, only the tensor's extent
bounded a tile, so a partial last tile of a slice read and wrote past the stop (found
with the grouped GEMM of test_persistent_grouped_gemm.py: a silent wrong answer)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import f16, f32

RNG = np.random.default_rng(11)


@tg.kernel(threads=32)
def copy_row_slice(x: tg.Tensor[f32], y: tg.Tensor[f32], n: int, BR: tg.constexpr = 8):
    """Row tiles of x[2:2+n] (and of its constant narrowing to 5 rows) with fill -1."""
    rows = x[2:2 + n, :][0:5, :]
    v = tg.load(rows.tile((BR, 32), (0, 0)), fill=-1.0)
    tg.copy(v, y[2:2 + n, :][0:5, :].tile((BR, 32), (0, 0)))


@pytest.mark.parametrize("n", [3, 5, 9])
def test_row_slices_bound_tiles_on_load_and_store(n):
    x = RNG.standard_normal((12, 32)).astype(np.float32)
    y = np.full_like(x, 9.0)
    tg.emulate(copy_row_slice, (1,), x, y, n, check_coverage=False)
    expect = np.full_like(x, 9.0)
    rows = min(n, 5)
    expect[2:2 + rows] = x[2:2 + rows]
    np.testing.assert_array_equal(y, expect)


@tg.kernel(threads=64)
def copy_col_slice(x: tg.Tensor[f32], y: tg.Tensor[f32], lo: tg.constexpr = 0,
                   hi: tg.constexpr = 5):
    """Columns lo … hi-1 through a 4 x 16 tile: the slice ends inside a 16-byte vector."""
    v = tg.load(x[:, lo:hi].tile((4, 16), (0, 0)), fill=-1.0)
    tg.copy(v + 1.0, y[:, lo:hi].tile((4, 16), (0, 0)))


@pytest.mark.parametrize("lo,hi", [(0, 5), (3, 13), (4, 8), (0, 16)])
def test_column_slices_do_not_let_vectors_cross_the_stop(lo, hi):
    x = RNG.standard_normal((4, 20)).astype(np.float32)
    y = np.full_like(x, 9.0)
    tg.emulate(copy_col_slice, (1,), x, y, lo=lo, hi=hi, check_coverage=False)
    expect = np.full_like(x, 9.0)
    expect[:, lo:hi] = x[:, lo:hi] + 1
    np.testing.assert_array_equal(y, expect)


@tg.kernel(threads=128)
def gemm_first_k(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16], k_used: int,
                 BM: tg.constexpr = 32, BN: tg.constexpr = 32, BK: tg.constexpr = 32):
    """c = a[:, :k_used] @ b[:, :k_used].T: the K tiles past k_used must read zeros."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a[:, :k_used].tile((BM, BK), (m, None))
    gb = b[:, :k_used].tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=2)
    sb = tg.shared((BN, BK), f16, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=2):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("k_used", [40, 17])
def test_gemm_over_a_slice_of_k(target, k_used):
    m, n, k = 40, 36, 72
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((n, k)).astype(np.float16)
    c = np.empty((m, n), np.float16)
    tg.emulate(gemm_first_k, (2, 2), a, b, c, k_used, target=target)
    a64, b64 = a[:, :k_used].astype(np.float64), b[:, :k_used].astype(np.float64)
    ref = a64 @ b64.T
    bound = 2.0 ** -10 * np.abs(ref) + k_used * 2.0 ** -24 * (np.abs(a64) @ np.abs(b64).T)
    assert np.all(np.abs(c - ref) <= bound)
