"""W4A16 test helpers shared by the emulator tests (`test_quant*.py`): random quantized
weights and the every-element check against a float64 reference. Kept apart from
test_quant.py, whose torch tests skip the whole module where torch is missing."""
from __future__ import annotations

import numpy as np

from tegula.dtypes import f16
from tegula.kernels.common import random_input
from tegula.kernels.quant import dequantize_w4
from tegula.emulate.values import round_to


def random_w4(rng, n: int, k: int, group: int, dtype, zero_point: bool = True,
              fractional: bool = False):
    """Random unpacked weights 0..15, positive scales exact in the type (bf16's in float32
    storage, rounded to bf16: the values the kernels read, so the reference uses them
    too), integer zeros (or None); `fractional`: zeros in (-0.5, 15.5) with fraction bits,
    exact in the type (f16: any f16 value there; bf16: multiples of 1/16, what its 8 bits
    hold below 16)."""
    w_q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = np.abs(random_input(rng, (n, k // group), dtype, 0.05)) + np.float32(2 ** -8)
    scales = round_to(scales.astype(np.float32), dtype).astype(
        np.float16 if dtype == f16 else np.float32)
    zeros = (rng.integers(0, 16, (n, k // group)).astype(scales.dtype) if zero_point
             else None)
    if fractional and zeros is not None:
        if dtype == f16:
            fraction = rng.uniform(-0.499, 0.499, zeros.shape)
        else:
            fraction = rng.integers(-7, 8, zeros.shape) / 16
        zeros = (zeros + fraction).astype(scales.dtype)
        assert np.any(zeros != np.round(zeros)), "no fractional zero drawn"
    return w_q, scales, zeros


def check_w4a16(c, a, w_q, scales, zeros, group, dtype, dequant_rounded: int) -> None:
    """Every element within the output's rounding (half an ulp of |ref|) plus, where a
    kernel rounds each dequantized weight to `dtype` for the tensor cores, half an ulp of
    every |a·w| a rounding (`dequant_rounded`: True or 1 for (w − zero)·scale rounded once,
    2 where a fractional zero's difference is rounded before the product), and 2^-16 of
    Σ|a·w| for the f32 sums in another order."""
    w = dequantize_w4(w_q, scales, zeros, group)
    ref = a.astype(np.float64) @ w.T
    scale = np.abs(a.astype(np.float64)) @ np.abs(w).T
    ulp = 2.0 ** -dtype.mantissa_bits
    bound = ulp / 2 * np.abs(ref) + (ulp / 2 * int(dequant_rounded) + 2.0 ** -16) * scale
    assert not np.isnan(c).any(), "unwritten (poisoned) outputs remain"
    err = np.abs(c.astype(np.float64) - ref)
    assert np.all(err <= bound), f"max error {err.max():.3g}"
