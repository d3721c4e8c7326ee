"""Two blocks storing different values to one output element (their tiles overlap: a
wrong tile coordinate, a grid larger than the tiles) give whichever block runs last on
the GPU, and the later block's in the emulator, whose blocks run in order — a test that
passes on the CPU and not on the GPU. Session 10: `tg.emulate` refuses it (with the
coverage check; since session 12 with race checking alone, `global_races`), at the store's
line; the same value stored twice, and atomics, pass."""
import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.emulate import EmulationError


@tg.kernel(threads=64)
def halved_rows(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((BM, BN), (m, 0))), y.tile((BM, BN), (m // 2, 0)))   # 2 blocks a tile


@tg.kernel(threads=64)
def column_sums_everywhere(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4,
                           BN: tg.constexpr = 16):
    # Every block stores the same (1, BN) row: the whole column's sum, the same values.
    total = tg.zeros((1, BN), f32)
    for k in tg.range(tg.cdiv(x.shape[0], BM)):
        total = total + tg.sum(tg.load(x.tile((BM, BN), (k, 0))), 0)
    tg.copy(total, y.tile((1, BN), (0, 0)))


@tg.kernel(threads=64)
def summed_rows(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.atomic_add(tg.sum(tg.load(x.tile((BM, BN), (m, 0))), 0), y.tile((1, BN), (0, 0)))


def _x(rows=16):
    return np.random.default_rng(rows).integers(-8, 8, (rows, 16)).astype(np.float32)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_two_blocks_storing_different_values_to_one_element_is_an_error(target):
    y = np.full((8, 16), np.nan, np.float32)
    with pytest.raises(EmulationError, match=r"race between blocks on element \d+ of tensor "
                                             r"'y': block .* stores .*, block .* stored .* "
                                             r"overlap") as err:
        tg.emulate(halved_rows, (4,), _x(), y, target=target)
    assert "(line 18)" in str(err.value)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_same_values_stored_by_every_block_pass(target):
    x = _x()
    y = np.full((1, 16), np.nan, np.float32)
    tg.emulate(column_sums_everywhere, (3,), x, y, target=target)
    assert np.array_equal(y[0], x.sum(0))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_atomic_adds_from_every_block_pass(target):
    x = _x()
    y = np.zeros((1, 16), np.float32)
    tg.emulate(summed_rows, (4,), x, y, target=target)
    assert np.array_equal(y[0], x.sum(0))
