"""A Python number meeting a tile takes the type of the tile's values — in every form
(binary operators on either side, maximum/minimum, comparisons, where on either branch,
fill, full), for every element type, with numbers a wrong type would get wrong (-inf, NaN,
1e30, -0.0, negative and extreme integers). Issue 8, item 1: `tg.where(c, t, -inf)` typed
the number like the bool condition and produced 1.0.
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.errors import TegulaError
from tegula.kernels.common import poisoned, random_input

sys.path.insert(0, str(Path(__file__).resolve().parent))
from regression_kernels import (ALL_TYPES, number_expressions, number_reference,  # noqa: E402
                                numbers_for, numbers_kernel)

SHAPE = (8, 16)


def _nonzero_input(rng, dtype):
    x = random_input(rng, SHAPE, dtype, 3.0)
    x[x == 0] = 1  # never zeros as input (a wrong answer of 0 must not pass)
    return x


@pytest.mark.parametrize("dtype", ALL_TYPES, ids=str)
def test_every_form_of_number_and_tile_matches_numpy(dtype):
    rng = np.random.default_rng(zlib.crc32(str(dtype).encode()))
    forms, values = tuple(number_expressions(dtype)), numbers_for(dtype)
    x = _nonzero_input(rng, dtype)
    y = poisoned((SHAPE[0] * len(forms) * len(values), SHAPE[1]), dtype)
    tg.emulate(numbers_kernel(dtype, forms, values, SHAPE), (1,), x, y)
    k = 0
    for form in forms:
        for n in values:
            got = y[k * SHAPE[0]:(k + 1) * SHAPE[0]]
            want = number_reference(form, x, n, dtype)
            assert np.array_equal(got, want, equal_nan=dtype.is_float), \
                f"{dtype} {form} with {n}: got {got[:2]} want {want[:2]}"
            k += 1


def test_where_with_minus_infinity_is_the_issue_example():
    @tg.kernel(threads=64)
    def masked(x: tg.Tensor[tg.f32], y: tg.Tensor[tg.f32]):
        t = tg.load(x.tile((8, 16), (0, 0)))
        tg.copy(tg.where(t > 0, t, -float("inf")), y.tile((8, 16), (0, 0)))

    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    y = poisoned(SHAPE, tg.f32)
    tg.emulate(masked, (1,), x, y)
    assert np.array_equal(y, np.where(x > 0, x, -np.inf))


@pytest.mark.parametrize("dtype,number", [(tg.i8, 300), (tg.u8, -1), (tg.i32, 2**31),
                                          (tg.i8, 1.5), (tg.i32, float("inf"))])
def test_numbers_that_do_not_fit_an_integer_tile_are_errors(dtype, number):
    @tg.kernel(threads=32)
    def bad(x: tg.Tensor[dtype], y: tg.Tensor[dtype]):
        t = tg.load(x.tile((4, 8), (0, 0)))
        tg.copy(tg.where(t > 0, t, number), y.tile((4, 8), (0, 0)))

    x = np.ones((4, 8), dtype=np.dtype(dtype.numpy_name))
    with pytest.raises(TegulaError, match=f"tg.where.*{dtype}"):
        tg.emulate(bad, (1,), x, x.copy())


def test_integer_copy_fill_must_fit_the_type():
    @tg.kernel(threads=32)
    def bad(x: tg.Tensor[tg.i8], y: tg.Tensor[tg.i8]):
        tg.copy(tg.load(x.tile((4, 8), (0, 0)), fill=-129), y.tile((4, 8), (0, 0)))

    x = np.ones((3, 8), dtype=np.int8)
    with pytest.raises(TegulaError, match="tg.copy.*-129.*i8"):
        tg.emulate(bad, (1,), x, np.ones((4, 8), dtype=np.int8))
