"""Races the emulator's block-by-block order would hide (`emulate/global_races.py`):
a block reading an element another block stores in the same launch (either order), two
blocks storing different values with coverage off, reads of a TMA store before the bulk
wait that completes it, and `tg.emulate`'s aliasing check (`runtime/aliasing.py`)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.errors import LaunchError
from tegula.lower.async_ir import BulkWait
from tegula.lower.thread_ir import BLOCK_IDS, Barrier, Const, GlobalLoad, Reg, RegArray, Var

from .async_kernels import round_trip_kernel, run_with_deadline


@tg.kernel(threads=64)
def next_tile_doubled(y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tile = tg.load(y.tile((BM, BN), (m + 1, 0)))      # the tile block m + 1 stores
    tg.copy(tile * 2.0, y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=64)
def previous_tile_doubled(y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tile = tg.load(y.tile((BM, BN), (m - 1, 0)))      # the tile block m - 1 stored
    tg.copy(tile * 2.0, y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=64)
def own_tile_doubled(y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(y.tile((BM, BN), (m, 0))) * 2.0, y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=64)
def halved_rows(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((BM, BN), (m, 0))), y.tile((BM, BN), (m // 2, 0)))


@tg.kernel(threads=64)
def copied(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((BM, BN), (m, 0))), y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=64)
def shifted(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((BM, BN), (m + 1, 0))), y.tile((BM, BN), (m, 0)))


def _y(rows=16):
    return np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_a_block_reading_what_a_later_block_stores_is_a_race(target):
    with pytest.raises(EmulationError, match=r"race between blocks on element \d+ of tensor "
                                             r"'y': block \(1, 0, 0\) stores .* block "
                                             r"\(0, 0, 0\) read it") as err:
        tg.emulate(next_tile_doubled, (3,), _y(), target=target, check_coverage=False)
    assert "(line 24)" in str(err.value)               # the store's line


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_a_block_reading_what_an_earlier_block_stored_is_a_race(target):
    with pytest.raises(EmulationError, match=r"race between blocks on element \d+ of tensor "
                                             r"'y': block \(1, 0, 0\) reads it, block "
                                             r"\(0, 0, 0\) stored it"):
        tg.emulate(previous_tile_doubled, (4,), _y(), target=target, check_coverage=False)


def test_a_block_reading_and_storing_its_own_tile_passes():
    y = _y()
    want = y * 2
    tg.emulate(own_tile_doubled, (4,), y)
    assert np.array_equal(y, want)


def test_overlapping_output_tiles_are_refused_with_coverage_off_too():
    y = np.full((8, 16), np.nan, np.float32)
    with pytest.raises(EmulationError, match=r"race between blocks .* tensor 'y'.* overlap"):
        tg.emulate(halved_rows, (4,), _y(), y, check_coverage=False)


def test_emulate_refuses_overlapping_arguments_and_allows_identical_in_place():
    x = _y(20)
    with pytest.raises(LaunchError, match=r"tg.emulate of kernel shifted: arguments 'y' "
                                          r"\(written\) and 'x' share memory") as err:
        tg.emulate(shifted, (4,), x[:16], x[4:])       # y's rows are x's rows 4..: overlap
    assert "test_races_between_blocks.py" in str(err.value)   # the user's call line
    with pytest.raises(LaunchError, match="cannot run in place: a load of 'x'"):
        tg.emulate(shifted, (4,), x[:16], x[:16])      # reads the next tile: not in place
    want = x.copy()
    tg.emulate(copied, (2,), x[:8], x[8:16])           # disjoint halves of one array
    want[8:16] = want[:8]
    assert np.array_equal(x, want)
    tg.emulate(copied, (2,), x[:8, ::2], x[:8, 1::2], BN=8)   # interleaved columns
    want[:8, 1::2] = want[:8, ::2]
    assert np.array_equal(x, want)
    tg.emulate(copied, (4,), x[:16], x[:16])           # identical: element-wise in place
    assert np.array_equal(x, want)


def _round_trip_then_read(read_only: bool):
    """tma_round_trip with its bulk wait `.read` or full, then a barrier and every thread
    reading the first element of the box its block's TMA store wrote."""
    kernel = round_trip_kernel()
    wait = next(s for s in kernel.body if isinstance(s, BulkWait))
    wait.read_only = read_only
    r = RegArray("probe", f32, 1)
    kernel.registers.append(r)
    corner = BLOCK_IDS[1] * 64 * Var("y_stride0") + BLOCK_IDS[0] * 32
    kernel.body += [Barrier(), GlobalLoad(Reg(r, Const(0)), "y", corner, 1)]
    x = np.random.default_rng(0).standard_normal((70, 45)).astype(np.float32)
    y = np.zeros_like(x)
    return lambda: run_with_deadline(lambda: run_thread_kernel(kernel, (2, 2), {"x": x, "y": y}))


def test_reading_a_tma_store_before_its_full_bulk_wait_is_reported():
    with pytest.raises(EmulationError, match=r"reads element \d+ of tensor 'y' while a TMA "
                                             r"store to it is in flight.*not \.read"):
        _round_trip_then_read(read_only=True)()
    _round_trip_then_read(read_only=False)()           # the full wait completes the store
