"""`round_to` from float64 rounds once: the emulator's exact sums (an mma's k-step, held in
float64) used to go float64 -> float32 -> f16/bf16, two roundings that land an ulp off
where the float32 step makes a tie (an f16-accumulator mma.sync then disagreed with the
f16 wgmma, which rounds once, in 10 of 10,500 elements of a 70x150x200 GEMM)."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f8e4m3, f16
from tegula.emulate.values import round_to


def test_f16_from_float64_rounds_once_on_random_and_near_tie_values():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100_000) * rng.choice([1e-7, 1e-3, 1.0, 300.0, 6e4], 100_000)
    halves = np.float16(rng.standard_normal(2000))
    half_ulp = np.spacing(halves).astype(np.float64) / 2
    near_ties = np.concatenate([halves + half_ulp + 1e-12 * np.abs(halves),   # just above
                                halves + half_ulp,                            # exact ties
                                halves + half_ulp - 1e-12 * np.abs(halves)])  # just below
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-300, -1e-300, 1e39,
                         65519.99, 65520.0, 2.0 ** -25, 2.0 ** -25 + 2.0 ** -60])
    x = np.concatenate([x, near_ties, specials])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)          # numpy converts float64 to half directly
    got = round_to(x, f16)
    assert got.dtype == np.float16
    assert np.array_equal(got.view(np.uint16)[~np.isnan(x)], want.view(np.uint16)[~np.isnan(x)])
    assert np.isnan(got[np.isnan(x)]).all()


@pytest.mark.parametrize("dt,value,want", [
    (f16, 1 + 2.0 ** -11 + 2.0 ** -40, 1 + 2.0 ** -10),  # f32 would make it a tie (-> 1.0)
    (bf16, 1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -7),
    (bf16, -(1 + 2.0 ** -8 + 2.0 ** -30), -(1 + 2.0 ** -7)),
    (f8e4m3, 1 + 2.0 ** -4 + 2.0 ** -30, 1 + 2.0 ** -3),
    (f16, 1 + 2.0 ** -11, 1.0),                          # a true tie: to even
])
def test_float64_just_past_a_tie_rounds_up(dt, value, want):
    assert float(round_to(np.array([value]), dt)[0]) == want
