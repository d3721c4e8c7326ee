"""What the README says about arrays of types numpy lacks: bf16 reaches the emulator as
float32 values (rounded to bf16, nearest even, when loaded; outputs come back as float32
holding bf16 values) or as uint16 bit patterns (outputs come back as bit patterns)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import bf16
from tegula.emulate.errors import EmulationError
from tegula.kernels.copy import copy_config, copy_kernel


def _copy(x: np.ndarray, y: np.ndarray) -> None:
    grid, constexprs = copy_config(x.shape, bf16)
    tg.emulate(copy_kernel(bf16), grid, x, y, **constexprs)


def test_bf16_as_float32_values_is_rounded_on_load_and_returned_as_float32():
    # Ties to even: 1 + 2**-8 lies halfway between 1 (even) and 1 + 2**-7 (odd) and gives 1;
    # 1 + 3 * 2**-8 lies halfway between 1 + 2**-7 (odd) and 1 + 2**-6 (even), rounds up.
    x = np.array([[1.0, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 3.140625, -np.inf, np.nan]],
                 np.float32)
    y = np.full_like(x, 7.0)
    _copy(x, y)
    assert y.dtype == np.float32
    expected = np.array([[1.0, 1.0, 1 + 2.0 ** -6, 3.140625, -np.inf, np.nan]], np.float32)
    assert np.array_equal(y, expected, equal_nan=True)


def test_bf16_as_uint16_bit_patterns_comes_back_as_bit_patterns():
    x = np.array([[0x3F80, 0x4049, 0xFF80, 0x0001]], np.uint16)  # 1, 3.140625, -inf, tiny
    y = np.zeros_like(x)
    _copy(x, y)
    assert y.dtype == np.uint16 and np.array_equal(y, x)


def test_bf16_from_another_numpy_type_is_refused():
    x = np.ones((1, 4), np.float16)
    with pytest.raises(EmulationError, match="float32 values or uint16 bit patterns"):
        _copy(x, np.zeros((1, 4), np.float32))
