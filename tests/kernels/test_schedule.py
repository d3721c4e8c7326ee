"""The grouped-rows tile scheduler (tegula.kernels.schedule): a bijection onto the tile grid
in the documented order, the same on kernel scalars in the emulator as on Python ints, and
the persistent GEMM built on it right at ragged shapes with more tiles than blocks."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import i32
from tegula.kernels.schedule import grouped_tile

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "persistent_gemm.py"


def test_grouped_order_written_out():
    """5 x 3 tiles in groups of 2 rows: the bands are rows {0, 1}, {2, 3}, {4}."""
    order = [grouped_tile(t, 5, 3, 2) for t in range(15)]
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2),
                     (2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2),
                     (4, 0), (4, 1), (4, 2)]


@pytest.mark.parametrize("tiles_m,tiles_n,group", [(1, 1, 1), (7, 5, 3), (8, 4, 8),
                                                   (3, 9, 8), (10, 1, 4), (6, 6, 1)])
def test_every_tile_exactly_once(tiles_m, tiles_n, group):
    seen = [grouped_tile(t, tiles_m, tiles_n, group) for t in range(tiles_m * tiles_n)]
    assert sorted(seen) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]


def test_group_must_be_a_positive_int():
    with pytest.raises(ValueError, match="group must be a positive int"):
        grouped_tile(0, 4, 4, 0)


@tg.kernel(threads=32)
def schedule(y: tg.Tensor[i32], tiles_m: int, tiles_n: int, GROUP: tg.constexpr = 3):
    """Row t of y holds 1000 * m + n of tile t, written by the block that runs it."""
    for t in tg.range(tg.block_id(0), tiles_m * tiles_n, tg.num_programs(0)):
        m, n = grouped_tile(t, tiles_m, tiles_n, GROUP)
        tg.copy(tg.zeros((1, 8), i32) + (m * 1000 + n), y.tile((1, 8), (t, 0)))


@pytest.mark.parametrize("tiles_m,tiles_n,grid", [(7, 5, 4), (2, 3, 1), (4, 4, 16)])
def test_kernel_scalars_schedule_like_python_ints(tiles_m, tiles_n, grid):
    y = np.empty((tiles_m * tiles_n, 8), np.int32)
    tg.emulate(schedule, (grid,), y, tiles_m, tiles_n)
    expect = [1000 * m + n for m, n in (grouped_tile(t, tiles_m, tiles_n, 3)
                                        for t in range(tiles_m * tiles_n))]
    np.testing.assert_array_equal(y, np.repeat(np.array(expect, np.int32)[:, None], 8, 1))


@pytest.mark.parametrize("m,n,k,num_sms", [(33, 65, 40, 1), (97, 130, 72, 7), (16, 20, 8, 64)])
def test_persistent_gemm_in_the_emulator(m, n, k, num_sms):
    """One block doing every tile, a grid that does not divide the tiles, more SMs than
    tiles; the example's main checks every element against numpy."""
    spec = importlib.util.spec_from_file_location("persistent_gemm_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(m=m, n=n, k=k, num_sms=num_sms)
