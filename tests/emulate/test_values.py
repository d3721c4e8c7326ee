"""Dtype rounding of the emulator against known bit patterns (no torch/ml_dtypes needed)."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f8e4m3, f8e5m2, f16, i8, i32, u8
from tegula.emulate import from_bits, max_finite, round_to, to_bits


def bits(x, dt):
    return [int(b) for b in to_bits(round_to(np.asarray(x, dtype=np.float32), dt), dt)]


def test_bf16_round_to_nearest_even():
    # 1 + 2^-8 is halfway between 1 (0x3F80) and 1 + 2^-7 (0x3F81): ties to even -> 0x3F80
    # 1 + 3*2^-8 is halfway between 0x3F81 and 0x3F82: ties to even -> 0x3F82
    assert bits([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20], bf16) == \
        [0x3F80, 0x3F80, 0x3F82, 0x3F81]
    assert bits([-2.0, 3.140625, 65504.0], bf16) == [0xC000, 0x4049, 0x4780]
    assert bits([np.inf, -np.inf, 3.4e38], bf16) == [0x7F80, 0xFF80, 0x7F80]
    nan = bits([np.nan], bf16)[0]
    assert nan & 0x7F80 == 0x7F80 and nan & 0x7F
    assert max_finite(bf16) == float(np.float32(3.3895314e38))
    assert from_bits(np.array([0x3F80, 0x4049], dtype=np.uint16), bf16).tolist() == [1.0, 3.140625]


def test_f8e4m3_known_codes():
    # E4M3FN: 1.0 = 0x38, 448 = 0x7E (max), 2^-9 = 0x01 (min subnormal), NaN = 0x7F
    assert bits([1.0, -1.0, 448.0, 2**-9, 2**-6, 0.0], f8e4m3) == [0x38, 0xB8, 0x7E, 0x01, 0x08, 0]
    # satfinite: beyond the max (and infinities) clamp to +-448
    assert bits([464.0, 1e6, np.inf, -np.inf], f8e4m3) == [0x7E, 0x7E, 0x7E, 0xFE]
    assert bits([np.nan], f8e4m3) == [0x7F]
    # ties to even: 1 + 1/16 lies between 1.0 (0x38) and 1.125 (0x39) -> 0x38;
    # 1 + 3/16 between 0x39 and 0x3A -> 0x3A; 2^-10 between 0 and 2^-9 -> 0
    assert bits([1 + 1 / 16, 1 + 3 / 16, 2**-10, 1.5 * 2**-9], f8e4m3) == [0x38, 0x3A, 0x00, 0x02]
    assert bits([3.140625], f8e4m3) == [0x45]  # 3.25: nearer than 3.0
    codes = np.arange(256, dtype=np.uint8)
    vals = from_bits(codes, f8e4m3)
    finite = np.isfinite(vals)
    assert finite.sum() == 254 and np.isnan(vals[[0x7F, 0xFF]]).all()
    # every finite code round-trips
    assert np.array_equal(to_bits(vals[finite], f8e4m3), codes[finite])


def test_f8e5m2_known_codes():
    # E5M2: 1.0 = 0x3C, max 57344 = 0x7B, inf = 0x7C, min subnormal 2^-16 = 0x01
    assert bits([1.0, 57344.0, 2**-16, -2.0], f8e5m2) == [0x3C, 0x7B, 0x01, 0xC0]
    assert bits([61440.0, np.inf, -1e9], f8e5m2) == [0x7B, 0x7B, 0xFB]  # satfinite
    assert bits([1.125, 1.375], f8e5m2) == [0x3C, 0x3E]  # ties to even
    assert from_bits(np.array([0x7C, 0xFC], dtype=np.uint8), f8e5m2).tolist() == [np.inf, -np.inf]
    assert max_finite(f8e5m2) == 57344.0 and max_finite(f8e4m3) == 448.0
    vals = from_bits(np.arange(256, dtype=np.uint8), f8e5m2)
    finite = np.isfinite(vals)
    assert np.array_equal(to_bits(vals[finite], f8e5m2), np.arange(256)[finite])


def test_f16_and_ints():
    assert bits([1.0, 65504.0, 65520.0, 2**-24], f16) == [0x3C00, 0x7BFF, 0x7C00, 0x0001]
    assert round_to(np.array([3.7, -3.7, 1e10, -1e10, np.nan]), i32).tolist() == \
        [3, -3, 2**31 - 1, -2**31, 0]
    assert round_to(np.array([300, -129, 127]), i8).tolist() == [44, 127, 127]  # wraparound
    assert round_to(np.array([300.0, -5.0]), u8).tolist() == [255, 0]  # float -> int saturates


@pytest.mark.parametrize("dt", [bf16, f8e4m3, f8e5m2, f16])
def test_rounding_is_idempotent_and_monotone(dt):
    x = np.sort(np.random.default_rng(1).standard_normal(2000).astype(np.float32) * 50)
    r = round_to(x, dt).astype(np.float32)
    assert np.array_equal(round_to(r, dt).astype(np.float32), r)
    assert (np.diff(r) >= 0).all()
