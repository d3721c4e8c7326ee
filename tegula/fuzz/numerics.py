"""Element types as the fuzzer's reference model sees them, written from the formats'
definitions (IEEE 754 and the OCP 8-bit float spec) with numpy only — deliberately not
from `tegula.emulate` or `tegula.codegen`, so the model and the compiler cannot share a
mistake.

Float values are held in float64 arrays holding exactly a value of the element type;
integers in int64 arrays holding a value of the type; bools in bool arrays.

* Rounding to a float type is round to nearest, ties to even. f16, bf16 and f32 overflow
  to ±inf; the 8-bit floats saturate to ±max (PTX `cvt.rn.satfinite`), infinities
  included; NaN stays NaN.
* Float to integer truncates toward zero, saturates to the type's range, NaN gives 0
  (PTX `cvt.rzi.sat`). Integer to integer wraps (two's complement). Integer to float
  rounds to nearest even — to f32 first for the narrower floats, as torch's conversion
  and the emitted code (`(float)` then `cvt.rn`) do: rounding twice can differ from
  rounding once (an i32 rounding to f32 exactly halfway between two bf16 values).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: `exponent_bits`, `mantissa_bits` (stored),
    `saturates` (the 8-bit formats' conversions clamp instead of overflowing) and
    `max_finite` (E4M3FN spends its top mantissa code on NaN, so it is 448, not 480)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    max_finite: float
    saturates: bool = False

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal number (subnormals share its spacing)."""
        return 2 - (1 << (self.exponent_bits - 1))

    @property
    def unit_roundoff(self) -> float:
        return 2.0 ** -(self.mantissa_bits + 1)

    @property
    def overflow_threshold(self) -> float:
        """Magnitudes at or above this round to infinity (max + half an ulp)."""
        top = np.floor(np.log2(self.max_finite))
        return self.max_finite + 2.0 ** (top - self.mantissa_bits - 1)


FLOATS = {
    "f32": FloatFormat("f32", 8, 23, float(np.finfo(np.float32).max)),
    "f16": FloatFormat("f16", 5, 10, 65504.0),
    "bf16": FloatFormat("bf16", 8, 7, float.fromhex("0x1.fep127")),
    "f8e4m3": FloatFormat("f8e4m3", 4, 3, 448.0, saturates=True),
    "f8e5m2": FloatFormat("f8e5m2", 5, 2, 57344.0, saturates=True),
}
INTS = {"i32": (-2**31, 2**31 - 1), "i8": (-128, 127), "u8": (0, 255)}
FLOAT_TYPES = tuple(FLOATS)
INT_TYPES = tuple(INTS)
BOOL = "bool"


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


def _exponent(mag: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """floor(log2(mag)) for positive finite magnitudes, clamped below to the format's
    smallest normal exponent (subnormals are spaced like the smallest normals)."""
    with np.errstate(divide="ignore"):
        _, e = np.frexp(mag)
    return np.maximum(e.astype(np.int64) - 1, fmt.min_exponent)


def ulp(values, dtype: str) -> np.ndarray:
    """The spacing of `dtype`'s values at each of `values` (float64)."""
    fmt = FLOATS[dtype]
    mag = np.abs(np.asarray(values, dtype=np.float64))
    mag = np.where(np.isfinite(mag), mag, fmt.max_finite)
    return np.ldexp(1.0, _exponent(mag, fmt) - fmt.mantissa_bits)


def round_float(values, dtype: str) -> np.ndarray:
    """`values` rounded to the float type `dtype` (RNE), as float64."""
    fmt = FLOATS[dtype]
    x = np.asarray(values, dtype=np.float64)
    mag = np.abs(x)
    finite = np.isfinite(mag)
    safe = np.where(finite, mag, 1.0)
    step = np.ldexp(1.0, _exponent(safe, fmt) - fmt.mantissa_bits)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.round(safe / step) * step  # exact scaling; np.round ties to even
    if fmt.saturates:
        rounded = np.minimum(rounded, fmt.max_finite)
        rounded = np.where(finite, rounded, np.where(np.isnan(mag), np.nan, fmt.max_finite))
    else:
        rounded = np.where(rounded > fmt.max_finite, np.inf, rounded)
        rounded = np.where(finite, rounded, mag)
    return np.copysign(rounded, x)


def wrap_int(values, dtype: str) -> np.ndarray:
    """Integers wrapped into `dtype`'s range (C's two's-complement truncation)."""
    low, high = INTS[dtype]
    span = high - low + 1
    v = np.asarray(values).astype(np.int64)
    return (v - low) % span + low


def float_to_int(values, dtype: str) -> np.ndarray:
    """Truncate toward zero, saturate, NaN -> 0."""
    low, high = INTS[dtype]
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        t = np.trunc(np.nan_to_num(x, nan=0.0, posinf=high, neginf=low))
    return np.clip(t, low, high).astype(np.int64)


def convert(values, src: str, dst: str) -> np.ndarray:
    """Exact values of type `src` converted to type `dst` (see the module docstring)."""
    v = np.asarray(values)
    if dst == BOOL:
        return v != 0  # NaN != 0 holds: NaN converts to true, as in C
    if src == BOOL:
        v = v.astype(np.int64)
        src = "i32"
    if is_float(dst):
        v = v.astype(np.float64)
        if not is_float(src) and dst != "f32":  # through f32, as torch and the code do
            v = round_float(v, "f32")
        return round_float(v, dst)
    if is_float(src):
        return float_to_int(v, dst)
    return wrap_int(v, dst)


def number_as(value: float, dtype: str):
    """A Python number operand as a value of `dtype` (numbers take their tile's type)."""
    if is_float(dtype):
        return float(round_float(np.float64(value), dtype))
    if dtype == BOOL:
        return bool(value)
    return int(wrap_int(np.int64(int(value)), dtype))


def storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """Model values in the numpy type that `tg.emulate` and torch take for `dtype`
    (bf16 and the 8-bit floats as float32 holding exactly the value)."""
    if dtype in ("f16",):
        return values.astype(np.float16)
    if is_float(dtype):
        return values.astype(np.float32)
    return values.astype({"i32": np.int32, "i8": np.int8, "u8": np.uint8}[dtype])


__all__ = ["FloatFormat", "FLOATS", "INTS", "FLOAT_TYPES", "INT_TYPES", "BOOL", "is_float",
           "is_int", "ulp", "round_float", "wrap_int", "float_to_int", "convert",
           "number_as", "storage"]
