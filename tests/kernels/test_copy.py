"""Copy and transpose in the emulator: every dtype, odd shapes, every element exact."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import f16, i8, u4
from tegula.errors import SynthesisError
from tegula.kernels.common import random_input
from tegula.kernels.copy import (COPY_DTYPES, TRANSPOSE_DTYPES, copy_emulated,
                                 transpose_emulated)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Exact equality, NaN-free inputs, comparing bit for bit where it matters (-0.0)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=str)
def test_copy_every_dtype_on_a_shape_that_does_not_divide_the_tiles(dtype):
    rng = np.random.default_rng(100 + COPY_DTYPES.index(dtype))
    x = random_input(rng, (131, 78), dtype, scale=8.0)
    assert same(copy_emulated(x, dtype), x)


@pytest.mark.parametrize("dtype", TRANSPOSE_DTYPES, ids=str)
def test_transpose_every_dtype_on_a_shape_that_does_not_divide_the_tiles(dtype):
    rng = np.random.default_rng(200 + TRANSPOSE_DTYPES.index(dtype))
    x = random_input(rng, (131, 77), dtype, scale=8.0)
    assert same(transpose_emulated(x, dtype), np.ascontiguousarray(x.T))


@pytest.mark.parametrize("shape,tiles", [((128, 128), {}), ((64, 256), dict(BM=64, BN=32)),
                                         ((5, 300), dict(BM=16, BN=128))])
def test_transpose_whole_and_partial_tiles(shape, tiles):
    """Full 16-byte vectors (cp.async into a swizzled buffer) as well as ragged edges."""
    for seed, dtype in enumerate((f16, i8)):
        x = random_input(np.random.default_rng(seed + sum(shape)), shape, dtype)
        assert same(transpose_emulated(x, dtype, **tiles), np.ascontiguousarray(x.T))


def test_copy_of_a_strided_view():
    """A view whose rows are not adjacent (row stride 100) is read through its strides."""
    big = random_input(np.random.default_rng(7), (140, 100), f16)
    x = big[3:134, 5:82]
    assert same(copy_emulated(x), np.ascontiguousarray(x))


def test_packed_transpose_is_refused_with_a_reason():
    x = random_input(np.random.default_rng(8), (64, 64), u4)
    with pytest.raises(SynthesisError, match="two per byte"):
        transpose_emulated(x, u4)
