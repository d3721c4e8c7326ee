"""The emulator runs warp-specialized TMA + mbarrier + wgmma thread IR right: the Hopper
samples against numpy on random data, at shapes that do not divide the tiles (so TMA's
zero fill is what makes the edge tiles right: unwritten shared memory reads as NaN)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.arch.smem_matrix import swizzle_bytes_address
from tegula.dtypes import f32
from tegula.emulate import run_thread_kernel
from tegula.lower.async_ir import (FenceBarrierInit, MBarrierArray, MBarrierArrive, MBarrierInit,
                                   MBarrierWait, TensorMapParam, TmaLoad)
from tegula.lower.thread_ir import (TID, BLOCK_IDS, Barrier, Const, For, GlobalStore, Reg,
                                    RegArray, SharedBuffer, SharedLoad, TensorParam, ThreadKernel,
                                    Var)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_kernels import (gemm_inputs, gemm_kernel, gemm_reference, round_trip_kernel,  # noqa: E402
                           run_gemm, run_with_deadline)


def _assert_gemm(c, a, b):
    ref = gemm_reference(a, b)
    # f32 accumulation rounded after every wgmma (K/16 roundings of sums of |a·b|).
    bound = 1e-6 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T) + 1e-30
    err = np.abs(c.astype(np.float64) - ref)
    assert not np.isnan(c).any(), "an element was not written or read unfilled memory"
    assert (err <= bound).all(), f"max error {err.max()} (bound {bound[err > bound].min()})"


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
@pytest.mark.parametrize("m, n, k, block_n, stages", [
    (97, 130, 200, 64, 2),     # nothing divides: edge boxes zero-filled in M, N and K
    (64, 64, 64, 64, 2),       # one tile, one k-step
    (70, 200, 72, 128, 3),     # k-tiles fewer than stages
    (33, 40, 330, 64, 3),      # more k-tiles than stages: the ring wraps, parities flip
])
def test_warp_specialized_gemm_matches_numpy(m, n, k, block_n, stages, role_order):
    a, b, c = gemm_inputs(m, n, k, seed=m + n + k)
    report = run_gemm(gemm_kernel(block_n, stages), a, b, c, block_n, role_order)
    _assert_gemm(c, a, b)
    blocks = -(-m // 64) * -(-n // block_n)
    k_tiles = -(-k // 64)
    # Every box moves its full bytes, zero-filled parts included.
    assert report.kind("TmaLoad").bytes == blocks * k_tiles * (64 + block_n) * 64 * 2
    assert report.kind("Wgmma").count == blocks * k_tiles * 4 * 4   # 4 k16 steps, 4 warps


def test_gemm_propagates_nan_and_inf():
    a, b, c = gemm_inputs(80, 72, 96, seed=3)
    a[5, 7] = np.nan
    b[9, 70] = np.inf
    run_gemm(gemm_kernel(), a, b, c)
    ref = gemm_reference(a, b)
    assert np.isnan(c[5]).all()
    assert np.array_equal(np.isnan(c), np.isnan(ref)) and np.array_equal(np.isinf(c),
                                                                          np.isinf(ref))
    ok = np.isfinite(ref)
    assert np.allclose(c[ok], ref[ok], rtol=1e-5, atol=1e-4)


def test_tma_round_trip_writes_only_inside_the_tensor():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((70, 45)).astype(np.float32)
    y = np.full(x.shape, np.nan, dtype=np.float32)
    report = run_with_deadline(lambda: run_thread_kernel(round_trip_kernel(), (2, 2),
                                                         {"x": x, "y": y}))
    assert np.array_equal(y, x + 1)
    assert report.kind("TmaStore").bytes == 4 * 64 * 32 * 4


def _box_dump_kernel(rows: int, cols: int, swizzle: int) -> ThreadKernel:
    """Each block TMA-loads the (rows, cols) f32 box at its tile of x and every thread copies
    box elements, read back through the swizzle, to the same place in `y`, which is padded
    to whole boxes: y shows exactly what TMA put in shared memory, zero fill included."""
    threads = 128
    bx, by = BLOCK_IDS[0], BLOCK_IDS[1]
    tile = SharedBuffer("tile", f32, rows * cols, 0)
    bar = MBarrierArray("bar", 1, rows * cols * 4)
    v, j = RegArray("v", f32, 1), Var("j")
    e = j * threads + TID                      # element of the box, row-major
    # The swizzle acts on byte addresses; f32 elements are 4 bytes.
    swz = {0: e, 128: e ^ (((e >> 5) & 7) << 2), 64: e ^ (((e >> 5) & 3) << 2)}[swizzle]
    row, col = by * rows + e // cols, bx * cols + e % cols
    one = TID.eq(0)
    body = [MBarrierInit("bar", Const(0), 1, pred=one), FenceBarrierInit(), Barrier(),
            MBarrierArrive("bar", Const(0), pred=one, tx_bytes=rows * cols * 4),
            TmaLoad("tile", Const(0), "x_map", [bx * cols, by * rows], "bar", Const(0), pred=one),
            MBarrierWait("bar", Const(0), parity=Const(0)),
            For(j, Const(0), Const(rows * cols // threads), 1, [
                SharedLoad(Reg(v, Const(0)), "tile", swz, 1),
                GlobalStore("y", row * Var("y_stride0") + col, Reg(v, Const(0)), 1)])]
    return ThreadKernel(
        "box_dump", threads,
        [TensorParam("x", f32, 2),
         TensorMapParam("x_map", "x", f32, dims=(1, 0), box=(cols, rows), swizzle=swizzle),
         TensorParam("y", f32, 2, writes=True)],
        [v], [tile], body, mbarriers=[bar])


@pytest.mark.parametrize("swizzle, cols", [(0, 8), (128, 32), (64, 16)])
def test_tma_zero_fills_outside_the_tensor(swizzle, cols):
    rows = 16
    rng = np.random.default_rng(swizzle)
    x = rng.standard_normal((37, 3 * cols - 3)).astype(np.float32) + 10.0  # never 0
    grid = (-(-x.shape[1] // cols), -(-x.shape[0] // rows))
    y = np.full((grid[1] * rows, grid[0] * cols), np.nan, dtype=np.float32)
    run_with_deadline(lambda: run_thread_kernel(_box_dump_kernel(rows, cols, swizzle), grid,
                                                {"x": x, "y": y}))
    expected = np.zeros_like(y)
    expected[:x.shape[0], :x.shape[1]] = x
    assert np.array_equal(y, expected)


def test_box_dump_reads_the_catalogue_swizzle():
    """The test kernel's own swizzle formula is the catalogue's (on byte addresses)."""
    e = np.arange(4096)
    for swizzle, formula in ((128, e ^ (((e >> 5) & 7) << 2)), (64, e ^ (((e >> 5) & 3) << 2))):
        assert np.array_equal(swizzle_bytes_address(e * 4, swizzle), formula * 4)


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_consumer_keeping_one_wgmma_group_in_flight_is_right(role_order):
    """CUTLASS's consumer: wait_group 1, so a stage is released one iteration late (once
    the group reading it retired); the emulator must accept it and get it right."""
    from tegula.lower.async_ir import MBarrierArrive, WgmmaWait
    from tegula.lower.thread_ir import If

    from async_kernels import loop_body, role_body
    stages = 3
    kernel = gemm_kernel(64, stages)
    consumer = role_body(kernel, "consumer")
    body = loop_body(consumer)
    kt = Var("kt")
    body[body.index(next(s for s in body if isinstance(s, WgmmaWait)))] = WgmmaWait(1)
    body[body.index(next(s for s in body if isinstance(s, MBarrierArrive)))] = If(
        Const(0).lt(kt), [MBarrierArrive("empty", (kt + (stages - 1)) % stages)])
    loop = next(s for s in consumer if isinstance(s, For) and s.var == kt)
    consumer.insert(consumer.index(loop) + 1, WgmmaWait(0))
    a, b, c = gemm_inputs(100, 64, 500, seed=11)
    run_gemm(kernel, a, b, c, role_order=role_order)
    _assert_gemm(c, a, b)


def test_tma_stores_count_for_output_coverage():
    """What a TMA store writes is recorded for tg.emulate's coverage check — only the
    elements inside the tensor (the box's edge parts are skipped)."""
    x = np.random.default_rng(2).standard_normal((70, 45)).astype(np.float32)
    y = np.full(x.shape, np.nan, dtype=np.float32)
    report = run_with_deadline(lambda: run_thread_kernel(
        round_trip_kernel(), (2, 2), {"x": x, "y": y}, track_writes=["y"]))
    assert report.written["y"].all()
    y = np.full(x.shape, np.nan, dtype=np.float32)
    report = run_with_deadline(lambda: run_thread_kernel(
        round_trip_kernel(), (1, 1), {"x": x, "y": y}, track_writes=["y"]))
    written = report.written["y"].reshape(x.shape)
    assert written[:64, :32].all() and written.sum() == 64 * 32
