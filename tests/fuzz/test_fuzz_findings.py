"""Compiler bugs the fuzzer found, as regression tests (a finding not fixed yet is a strict
xfail here, which turns XPASS once fixed; then it becomes a plain test).

Broadcast operands without a projected layout (python -m tegula.fuzz --seed 20261124
--program 110, shrunk): a tile read through a transposed shared view is spread over the
threads in flat order (thread t holds consecutive elements down the columns), and where the
column extent does not divide the thread count no CuTe layout gives a broadcast operand
(a row of an argmax or sum) the elements each register meets. Synthesis leaked the layout
algebra's 'composition(...) is not admissible' at the decorator line; the elementwise op is
now computed in a coalesced partition with conversions around it (`synth.propagate`).
"""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32, i32

TARGETS = ["sm_90a", "sm_80"]


@tg.kernel(threads=32)
def _transposed_with_argmax(x0: tg.Tensor[i32], x1: tg.Tensor[f16], o0: tg.Tensor[i32],
                            BM: tg.constexpr = 3, BN: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    s1 = tg.shared((BN, BM), i32)
    tg.copy(x0.tile((BN, BM), (n, m)), s1)
    v1 = tg.load(s1.T)
    v4 = tg.argmax(tg.load(x1.tile((BM, BN), (m, n))).to(f32), 0)
    v7 = v4 < v1  # noqa: F841 — unused, but its layout meeting v1's is what failed
    s2 = tg.shared((BM, BN), i32)
    tg.copy(v1, s2)
    tg.copy(s2, o0.tile((BM, BN), (m, n)))


@pytest.mark.parametrize("target", TARGETS)
def test_transposed_tile_meeting_an_argmax_compiles_and_is_right(target):
    rng = np.random.default_rng(0)
    M, N = 5, 40
    x0 = rng.integers(-1000, 1000, (N, M)).astype(np.int32)
    x1 = rng.standard_normal((M, N)).astype(np.float16)
    o0 = np.full((M, N), -7, np.int32)
    tg.emulate(_transposed_with_argmax, (tg.cdiv(M, 3), tg.cdiv(N, 32)), x0, x1, o0,
               target=target)
    assert np.array_equal(o0, x0.T)


@tg.kernel(threads=32)
def _transposed_where_argmax(x0: tg.Tensor[i32], x1: tg.Tensor[f32], o0: tg.Tensor[i32],
                             BM: tg.constexpr = 3, BN: tg.constexpr = 32):
    """The finding with its comparison used: where(argmax < v, v, argmax) per element.
    Only shared memory touches v and the result, so nothing anchors them: v is spread over
    the threads in flat order (the default), and the where takes v's layout."""
    m, n = tg.block_id(0), tg.block_id(1)
    s1 = tg.shared((BN, BM), i32)
    tg.copy(x0.tile((BN, BM), (n, m)), s1)
    v1 = tg.load(s1.T)
    v4 = tg.argmax(tg.load(x1.tile((BM, BN), (m, n)), fill=float("-inf")), 0)  # rows past M lose
    s2 = tg.shared((BM, BN), i32)
    tg.copy(tg.where(v4 < v1, v1, v4), s2)
    tg.copy(s2, o0.tile((BM, BN), (m, n)))


def _argmax_in_tiles(x, bm):
    """argmax along dim 0 within each block of `bm` rows (the tail block shorter)."""
    rows = []
    for start in range(0, x.shape[0], bm):
        block = x[start:start + bm]
        rows.append(np.broadcast_to(np.argmax(block, axis=0), block.shape))
    return np.concatenate(rows, axis=0).astype(np.int32)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("threads,bm,bn,m,n", [
    (32, 3, 32, 5, 40),     # the finding
    (32, 7, 32, 9, 50),     # another row count that does not divide 32
    (64, 3, 64, 4, 70),     # 64 threads
    (64, 6, 32, 8, 33),     # a flat pass crossing two rows of columns
    (128, 3, 128, 5, 130),  # 128 threads
    (32, 5, 24, 7, 30),     # 120 elements over 32 threads: not flat order (coalesced)
])
def test_transposed_tile_meets_argmax_row_in_use(target, threads, bm, bn, m, n):
    rng = np.random.default_rng(threads + bm)
    x0 = rng.integers(0, 8, (n, m)).astype(np.int32)    # small values: both sides of <
    x1 = rng.standard_normal((m, n)).astype(np.float32)
    o0 = np.full((m, n), -7, np.int32)
    tg.emulate(_transposed_where_argmax, (tg.cdiv(m, bm), tg.cdiv(n, bn)), x0, x1, o0,
               BM=bm, BN=bn, threads=threads, target=target)
    arg = _argmax_in_tiles(x1, bm)
    v = x0.T
    assert np.array_equal(o0, np.where(arg < v, v, arg))


@tg.kernel(threads=32)
def _transposed_minus_row_sums(x0: tg.Tensor[f32], o0: tg.Tensor[f32],
                               BM: tg.constexpr = 3, BN: tg.constexpr = 32):
    """Both broadcast directions of one flat-order tile: v - rowsum(v) + colmax(v)."""
    m, n = tg.block_id(0), tg.block_id(1)
    s1 = tg.shared((BN, BM), f32)
    tg.copy(x0.tile((BN, BM), (n, m)), s1, fill=0.0)
    v = tg.load(s1.T)
    s2 = tg.shared((BM, BN), f32)
    tg.copy(v - tg.sum(v, 1) + tg.max(v, 0), s2)
    tg.copy(s2, o0.tile((BM, BN), (m, n)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bm,bn", [(3, 32), (5, 32), (3, 64), (5, 16)])
def test_transposed_tile_meets_its_own_row_and_column_reductions(target, bm, bn):
    rng = np.random.default_rng(bm * bn)
    m, n = bm, bn  # one block: the reductions see the whole tile, no fill
    x0 = rng.standard_normal((n, m)).astype(np.float32)
    o0 = np.full((m, n), np.nan, np.float32)
    tg.emulate(_transposed_minus_row_sums, (1, 1), x0, o0, BM=bm, BN=bn, target=target)
    v = x0.T
    expected = v - v.sum(axis=1, keepdims=True) + v.max(axis=0, keepdims=True)
    np.testing.assert_allclose(o0, expected, rtol=1e-5, atol=1e-5)


@tg.kernel(threads=32)
def _transposed_plus_loaded_row(x0: tg.Tensor[f32], r: tg.Tensor[f32], o0: tg.Tensor[f32],
                                BM: tg.constexpr = 3, BN: tg.constexpr = 32):
    """A broadcast row with a layout of its own (loaded from global) meeting the tile."""
    m, n = tg.block_id(0), tg.block_id(1)
    s1 = tg.shared((BN, BM), f32)
    tg.copy(x0.tile((BN, BM), (n, m)), s1)
    row = tg.load(r.tile((1, BN), (0, n)))
    s2 = tg.shared((BM, BN), f32)
    tg.copy(tg.load(s1.T) * row, s2)
    tg.copy(s2, o0.tile((BM, BN), (m, n)))


@pytest.mark.parametrize("target", TARGETS)
def test_transposed_tile_times_a_loaded_row(target):
    rng = np.random.default_rng(3)
    m, n = 5, 40
    x0 = rng.standard_normal((n, m)).astype(np.float32)
    r = rng.standard_normal((1, n)).astype(np.float32)
    o0 = np.full((m, n), np.nan, np.float32)
    tg.emulate(_transposed_plus_loaded_row, (tg.cdiv(m, 3), tg.cdiv(n, 32)), x0, r, o0,
               target=target)
    np.testing.assert_array_equal(o0, x0.T * r)


@pytest.mark.gpu
@pytest.mark.parametrize("threads,bm,bn,m,n", [(32, 3, 32, 5, 40), (128, 3, 128, 5, 130)])
def test_transposed_tile_meets_argmax_row_on_the_gpu(threads, bm, bn, m, n):
    """The conversions around the elementwise op, emitted and run on the GPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(threads)
    x0 = rng.integers(0, 8, (n, m)).astype(np.int32)
    x1 = rng.standard_normal((m, n)).astype(np.float32)
    o0 = torch.full((m, n), -7, dtype=torch.int32, device="cuda")
    _transposed_where_argmax[(tg.cdiv(m, bm), tg.cdiv(n, bn))](
        torch.from_numpy(x0).cuda(), torch.from_numpy(x1).cuda(), o0, BM=bm, BN=bn,
        threads=threads)
    arg = _argmax_in_tiles(x1, bm)
    assert np.array_equal(o0.cpu().numpy(), np.where(arg < x0.T, x0.T, arg))
