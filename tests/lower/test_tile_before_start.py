"""A tile that reaches before its tensor's start is out of bounds, like one past its end.

Session 10: bounds predicates tested only the upper edge, so `x.tile(t, (m - 1, n))` in
block 0 (a stencil's halo, a shifted window), an int argument or a loaded offset that
put a coordinate below 0 read memory before the tensor on the GPU (no error) and was an
out-of-bounds EmulationError about thread IR in the emulator. Coordinates not known to
be >= 0 now get a lower-bound test (`lower/addressing.global_address`); those known to
be (block and loop indices, extents, their sums and products) cost nothing. A static
negative slice bound, which Python would count from the end, is a TraceError.
"""
import os

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32, i32
from tegula.build import build
from tegula.codegen import emit_cuda
from tegula.errors import TraceError

TARGETS = ["sm_90a", "sm_80"]


@tg.kernel(threads=64)
def previous_rows(x: tg.Tensor[f32], y: tg.Tensor[f32], z: tg.Tensor[f32], BM: tg.constexpr = 4,
                  BN: tg.constexpr = 16):
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m - 1, 0)), fill=-5.0)     # block 0: rows -4..-1
    tg.copy(t, y.tile((BM, BN), (m, 0)))
    tg.copy(t * 2.0, z.tile((BM, BN), (m - 1, 0)))          # block 0's store: dropped


@tg.kernel(threads=64)
def from_row(x: tg.Tensor[f32], y: tg.Tensor[f32], first: int, BM: tg.constexpr = 4,
             BN: tg.constexpr = 16):
    m = tg.block_id(0)
    t = tg.load(x[first:, :].tile((BM, BN), (m, 0)), fill=-5.0)
    tg.copy(t, y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=64)
def gather_rows(x: tg.Tensor[f32], rows: tg.Tensor[i32, 1], y: tg.Tensor[f32],
                BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((1, BN), (rows[m], 0)), fill=-5.0), y.tile((1, BN), (m, 0)))


@tg.kernel(threads=128)
def shifted_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32], shift: int,
                 BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32,
                 STAGES: tg.constexpr = 2):
    m, n = tg.block_id(0), tg.block_id(1)
    ga, gb = a.tile((BM, BK), (m - shift, None)), b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):       # TMA on sm_90a: its own bounds
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc, c.tile((BM, BN), (m, n)))


@tg.kernel(threads=64)
def last_rows(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    tg.copy(tg.load(x[-2:, :].tile((BM, BN), (0, 0))), y.tile((BM, BN), (0, 0)))


def _rows(n=10, cols=16):
    return np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)


def previous_rows_reference(x):
    ref = np.full_like(x, -5.0)
    ref[4:] = x[:-4]
    return ref


@pytest.mark.parametrize("target", TARGETS)
def test_a_tile_before_the_start_loads_the_fill_and_stores_nothing(target):
    x = _rows(12)
    y, z = np.full_like(x, np.nan), np.full_like(x, np.nan)
    tg.emulate(previous_rows, (3,), x, y, z, target=target, check_coverage=False)
    assert np.array_equal(y, previous_rows_reference(x))
    assert np.array_equal(z[:8], 2 * previous_rows_reference(x)[4:])   # blocks 1, 2
    assert np.isnan(z[8:]).all()                                         # nothing stored


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("first", [-3, 0, 2])
def test_a_run_time_slice_start_below_zero(target, first):
    x = _rows(10)
    y = np.full_like(x, np.nan)
    tg.emulate(from_row, (3,), x, y, first, target=target, check_coverage=False)
    rows = np.arange(10) + first
    want = np.where(((rows >= 0) & (rows < 10))[:, None], x[np.clip(rows, 0, 9)], -5.0)
    assert np.array_equal(y, want)


@pytest.mark.parametrize("target", TARGETS)
def test_a_loaded_row_index_below_zero(target):
    x = _rows(10)
    rows = np.array([3, -1, 9, -7, 0], np.int32)
    y = np.full((5, 16), np.nan, np.float32)
    tg.emulate(gather_rows, (5,), x, rows, y, target=target)
    want = np.where((rows >= 0)[:, None], x[np.maximum(rows, 0)], -5.0)
    assert np.array_equal(y, want)


@pytest.mark.parametrize("target", TARGETS)
def test_a_pipelined_operand_tile_before_the_start(target):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    c = np.full((128, 64), np.nan, np.float32)
    tg.emulate(shifted_gemm, (2, 1), a, b, c, 1, target=target)
    want = np.zeros((128, 64))
    want[64:] = a[:64].astype(np.float64) @ b.astype(np.float64).T
    assert np.all(np.abs(c - want) <= 1e-5 * (np.abs(a[:64]).astype(np.float64)
                                              @ np.abs(b).T.astype(np.float64)).max())


def test_a_negative_slice_bound_is_refused_at_its_line():
    x = _rows(8)
    with pytest.raises(TraceError, match=r"slice start -2 is negative: .* count from the "
                                         r"start of the dim, not from its end") as err:
        tg.emulate(last_rows, (1,), x, np.zeros((4, 16), np.float32))
    assert f"{os.path.basename(__file__)}:67" in str(err.value)


def test_coordinates_known_non_negative_get_no_lower_bound_test():
    @tg.kernel(threads=64)
    def shifted_copy(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4,
                     BN: tg.constexpr = 16):
        m = tg.block_id(0)
        tg.copy(tg.load(x.tile((BM, BN), (m + 1, 0))), y.tile((BM, BN), (m, 0)))
    plain = emit_cuda(build(shifted_copy, {}, None, "sm_80").thread_kernel)
    assert ">= 0" not in plain
    shifted = emit_cuda(build(previous_rows, {}, None, "sm_80").thread_kernel)
    assert ">= 0" in shifted


@pytest.mark.gpu
def test_tiles_before_the_start_on_the_gpu():
    import torch
    x = torch.from_numpy(_rows(12)).cuda()
    y, z = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    previous_rows[(3,)](x, y, z)
    assert np.array_equal(y.cpu().numpy(), previous_rows_reference(_rows(12)))
    assert np.array_equal(z.cpu().numpy()[:8], 2 * previous_rows_reference(_rows(12))[4:])
    assert np.isnan(z.cpu().numpy()[8:]).all()
    rows = torch.tensor([3, -1, 9, -7, 0], dtype=torch.int32, device="cuda")
    g = torch.full((5, 16), float("nan"), device="cuda")
    gather_rows[(5,)](x[:10], rows, g)
    r = rows.cpu().numpy()
    assert np.array_equal(g.cpu().numpy(),
                          np.where((r >= 0)[:, None], _rows(12)[np.maximum(r, 0)], -5.0))
    rng = np.random.default_rng(3)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    c = torch.full((128, 64), float("nan"), device="cuda")
    shifted_gemm[(2, 1)](torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c, 1)
    want = np.zeros((128, 64))
    want[64:] = a[:64].astype(np.float64) @ b.astype(np.float64).T
    assert np.all(np.abs(c.cpu().numpy() - want) <= 1e-3)
