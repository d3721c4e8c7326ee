"""Every copy path with tiles smaller than the block (replicated layouts: exactly one
writer per location) and with fills that zero cannot imitate, at ragged edges.

Issue 8, items 3 and 4: a global -> shared cp.async of an 8x8 f32 tile with 32 threads
let replica threads issue src-size-0 copies that zeroed the owner's data, and a non-zero
`fill` came out as 0 on the cp.async path. The emulator now also reports several writers
of one location in one instruction as a race, so any path that forgets a replica fails
here even where the replicas would write equal values.
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import bf16, f8e4m3, f16, f32, i8, i32, u8
from tegula.emulate.errors import EmulationError
from tegula.kernels.common import poisoned, random_input

sys.path.insert(0, str(Path(__file__).resolve().parent))
from regression_kernels import (atomic_kernel, copy_paths_kernel, fills_for, padded,  # noqa: E402
                                same_values, shared_to_shared_kernel)

# (tile, threads): tiles of fewer elements (or vectors) than threads, odd tiles, a thread
# count that is not a power of two.
SMALL = [((8, 8), 32), ((1, 4), 128), ((4, 8), 256), ((3, 5), 64), ((2, 33), 96),
         ((16, 16), 128), ((8, 64), 32)]
TYPES = (f32, f16, bf16, f8e4m3, i32, i8, u8)


def _seed(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _run_copy_paths(dtype, tile, threads, fill, extent):
    """Emulate copy_paths on a ragged (extent) input; returns (x, outputs, report)."""
    rng = _seed(dtype, tile, threads, fill)
    x = random_input(rng, extent, dtype, 3.0)
    grid = (-(-extent[0] // tile[0]), -(-extent[1] // tile[1]))
    full = (grid[0] * tile[0], grid[1] * tile[1])
    outs = [poisoned(full, dtype) for _ in range(4)]
    report = tg.emulate(copy_paths_kernel(dtype, tile, threads, fill), grid, x, *outs)
    return x, outs, report


@pytest.mark.parametrize("tile,threads", SMALL, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", TYPES, ids=str)
def test_every_copy_path_of_a_small_ragged_tile(dtype, tile, threads):
    fill = fills_for(dtype)[0]
    extent = (2 * tile[0] - 1 if tile[0] > 1 else 1, 2 * tile[1] - 1)
    x, outs, _ = _run_copy_paths(dtype, tile, threads, fill, extent)
    want = padded(x, outs[0].shape, fill, dtype)
    for name, got in zip(("via shared", "via registers", "via both", "via load"), outs):
        assert same_values(got, want), f"{name}: {got} vs {want}"


@pytest.mark.parametrize("dtype", (f32, f16, i32, i8, u8), ids=str)
def test_every_fill_value_on_the_cp_async_and_register_paths(dtype):
    """8x8 and 8x16 tiles, 32 threads, rows 4-element aligned so that cp.async is chosen
    (the issue's path) and the ragged rows and columns take the fill."""
    kinds = set()
    for fill in fills_for(dtype):
        for tile in ((8, 8), (8, 16)):
            x, outs, report = _run_copy_paths(dtype, tile, 32, fill, (5, tile[1] + 4))
            kinds |= {k for k in report.by_kind if report.by_kind[k].count}
            want = padded(x, outs[0].shape, fill, dtype)
            for got in outs:
                assert same_values(got, want), (fill, tile)
    assert "CpAsync" in kinds  # the path of item 4 was exercised


def test_issue_example_8x8_f32_with_32_threads_is_not_zeroed():
    rng = _seed("issue")
    x = rng.standard_normal((8, 8)).astype(np.float32) + 5  # no zeros

    @tg.kernel(threads=32)
    def via_shared(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        s = tg.shared((8, 8), f32)
        tg.copy(x.tile((8, 8), (0, 0)), s)
        tg.copy(tg.load(s), y.tile((8, 8), (0, 0)))

    y = poisoned((8, 8), f32)
    report = tg.emulate(via_shared, (1,), x, y)
    assert report.kind("CpAsync").count and np.array_equal(y, x)


@pytest.mark.parametrize("tile,threads", [((8, 8), 32), ((1, 4), 128), ((3, 5), 64),
                                          ((16, 16), 256)], ids=str)
@pytest.mark.parametrize("dtype", (f32, i32), ids=str)
def test_atomic_add_from_a_replicated_tile_adds_once(dtype, tile, threads):
    rng = _seed(dtype, tile, threads)
    extent = (2 * tile[0] + 1, 2 * tile[1] - 1)
    x = random_input(rng, extent, dtype, 3.0)
    if dtype == i32:
        x = x // 4  # no overflow in acc + x
    acc = random_input(rng, extent, dtype, 3.0) // (4 if dtype == i32 else 1)
    want = acc + x
    grid = (-(-extent[0] // tile[0]), -(-extent[1] // tile[1]))
    tg.emulate(atomic_kernel(dtype, tile, threads), grid, x, acc)
    assert np.array_equal(acc, want)


def test_the_emulator_reports_two_writers_of_one_location():
    """The detector the tests above rely on: a hand-written store by every thread to one
    element is a race, not a silent last-writer-wins."""
    from tegula.emulate import run_thread_kernel
    from tegula.lower.thread_ir import (Assign, Const, GlobalStore, Literal, Reg, RegArray,
                                        TensorParam, ThreadKernel)
    r = RegArray("r", f32, 1)
    body = [Assign(Reg(r, Const(0)), Literal(1.0, f32)),
            GlobalStore("y", Const(0), Reg(r, Const(0)), 1)]
    kernel = ThreadKernel("k", 32, [TensorParam("y", f32, 1, writes=True)], [r], [], body)
    with pytest.raises(EmulationError, match="several writers"):
        run_thread_kernel(kernel, (1, 1, 1), {"y": np.zeros(4, np.float32)}, {})


@pytest.mark.parametrize("dtype,fill", [(f32, -float("inf")), (f16, 2.5), (i8, -5)], ids=str)
def test_pipelined_multi_stage_copies_take_the_fill(dtype, fill):
    """cp.async copies issued stages-1 iterations ahead (prologue and loop) honour a
    non-zero fill too: the column sums of x, padded with the fill to whole 8x16 tiles."""
    acc_t = tg.i32 if dtype == i8 else f32

    @tg.kernel(threads=64)
    def column_sums(x: tg.Tensor[dtype], out: tg.Tensor[acc_t]):
        gx = x.tile((8, 16), (None, 0))                 # (8, 16, rows/8)
        s = tg.shared((8, 16), dtype, stages=3)
        acc = tg.zeros((8, 16), acc_t)
        for k in tg.pipeline(gx.shape[2], stages=3):
            tg.copy(gx[:, :, k], s[k], fill=fill)
            acc += tg.load(s[k]).to(acc_t)
        tg.copy(tg.sum(acc, 0), out.tile((1, 16), (0, 0)))

    rng = _seed(dtype, fill)
    x = random_input(rng, (37, 12), dtype, 2.0)
    if dtype == i8:
        x = (x // 16).astype(np.int8)  # keep sums in range
    out = poisoned((1, 16), acc_t)
    report = tg.emulate(column_sums, (1,), x, out)
    full = padded(x, (40, 16), fill, dtype).astype(np.float64)
    want = full.sum(0, keepdims=True)
    assert report.kind("CpAsync").count
    if dtype == i8:
        assert np.array_equal(out, want.astype(np.int32))
    else:
        assert np.allclose(out, want, rtol=1e-5, atol=1e-5) and \
            np.array_equal(np.isinf(out), np.isinf(want))


@pytest.mark.parametrize("transpose", (False, True), ids=("same", "transposed"))
@pytest.mark.parametrize("tile,threads", [((16, 32), 128), ((8, 8), 32), ((3, 5), 64),
                                          ((64, 64), 256)], ids=str)
@pytest.mark.parametrize("dtype", (f32, f16, i8), ids=str)
def test_shared_to_shared_copies(dtype, tile, threads, transpose):
    """Copies between two shared tiles (the README promises every pair of scopes but
    global-global; this one was a SynthesisError), through registers, replicas silent."""
    x = random_input(_seed(dtype, tile, threads, transpose), tile, dtype, 3.0)
    y = poisoned(tile[::-1] if transpose else tile, dtype)
    tg.emulate(shared_to_shared_kernel(dtype, tile, threads, transpose), (1,), x, y)
    assert same_values(y, x.T if transpose else x)
