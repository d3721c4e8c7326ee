"""Element values in the emulator: storage types, rounding to a type, bit patterns.

Registers hold each element type in a numpy *storage* type (`DType.numpy_name`): f32 in
float32, f16 in float16, ints in their numpy int, and the types numpy lacks — bf16 and the
two f8s — in float32 holding exactly a value of the type. Every write to a register or to
memory goes through `round_to`, which is what the hardware's conversions produce:

* **f16, bf16, f8e4m3, f8e5m2**: the catalogue's conversion entry from f32 computes it
  (`arch.convert.rounding_to(dt).convert`: `cvt.rn.f16.f32`, `cvt.rn.bf16.f32`,
  `cvt.rn.satfinite.{e4m3,e5m2}x2.f32`; round to nearest even, f8 saturating to the
  largest finite value, NaN stays NaN; bit patterns in `arch.formats`). float64 values
  (exact sums) are first rounded to odd in float32, so that the result is rounded once.
* **float -> int**: truncate toward zero and saturate to the s32 range, NaN -> 0 (the
  catalogue's `cvt.rzi.s32.f32`, `arch.convert.FLOAT_TO_INT`), then clamp to i8/u8's
  range (the emitter's clamp) or keep the low 4 bits (i4/u4).
* **int -> int**: C wraparound (two's complement truncation).
* **int -> float**: round to nearest even (`cvt.rn.f32.s32`, `INT_TO_FLOAT`; then to a
  narrower float as any f32 value).

Packed 4-bit types (i4, u4) are held one nibble per register element (0..15, uint8).
"""
from __future__ import annotations

import numpy as np

from tegula.arch.convert import FLOAT_TO_INT, INT_TO_FLOAT, rounding_to
from tegula.arch.formats import (F8_TYPES, bf16_bits, bf16_from_bits, f8_decode, f8_encode,
                                 f8_max_finite)
from tegula.dtypes import DType, bf16

_BITS_DTYPE = {8: np.uint8, 16: np.uint16, 32: np.uint32, 4: np.uint8}


def storage_dtype(dt: DType) -> np.dtype:
    """The numpy type registers of element type `dt` are held in."""
    if dt.is_packed:
        return np.dtype(np.uint8)
    return np.dtype(dt.numpy_name)


def bits_dtype(dt: DType) -> np.dtype:
    """The unsigned numpy type of `dt`'s bit pattern in memory."""
    return np.dtype(_BITS_DTYPE[dt.bits])


# ---------------------------------------------------------------------- public API

def _round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """float64 values to float32 rounded to odd (toward zero, the last bit set where
    inexact), so that rounding the result to nearest into a type of at most 22 significant
    bits (f16, bf16, f8) equals rounding the float64 value there once. Plain float64 ->
    float32 -> f16 rounds twice and can land an ulp off (an f16 mma accumulator's exact
    k16 sum is a float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        near = x.astype(np.float32)
        back = near.astype(np.float64)
    inexact = (back != x) & ~np.isnan(x)
    toward_zero = np.where(inexact & (np.abs(back) > np.abs(x)),
                           np.nextafter(near, np.float32(0)), near)
    bits = np.ascontiguousarray(toward_zero, dtype=np.float32).view(np.uint32)
    return (bits | inexact.astype(np.uint32)).view(np.float32).reshape(np.shape(x))


def round_to(x, dt: DType) -> np.ndarray:
    """`x` (any numpy values) converted to type `dt`, in `dt`'s storage type."""
    x = np.asarray(x)
    store = storage_dtype(dt)
    if dt.is_float:
        if x.dtype.kind in "iu":  # the cvt entries the emitted code uses, as below
            x = INT_TO_FLOAT.convert(x)
        if dt.name == "f32":
            return x.astype(np.float32) if x.dtype != np.float32 else x
        xf = _round_to_odd_f32(x) if x.dtype == np.float64 else x.astype(np.float32)
        return rounding_to(dt).convert(xf)  # the cvt entry the emitted code uses
    if dt.name == "bool":
        return x.astype(bool)
    if x.dtype.kind == "f":
        s32 = FLOAT_TO_INT.convert(x)
        if dt.is_packed:
            return (s32.astype(np.int64) & 0xF).astype(np.uint8)
        info = np.iinfo(store)
        return np.clip(s32, info.min, info.max).astype(store)
    if dt.is_packed:
        return (_to_int(x, np.int64) & 0xF).astype(np.uint8)
    return _to_int(x, store)


def _to_int(x: np.ndarray, store) -> np.ndarray:
    """Integer conversion with C wraparound."""
    if x.dtype == np.bool_:
        x = x.astype(np.int64)
    return x.astype(np.int64).astype(store) if x.dtype != store else x


def to_bits(values: np.ndarray, dt: DType) -> np.ndarray:
    """Storage values of type `dt` -> their bit patterns (unsigned, `dt.bits` wide)."""
    v = np.ascontiguousarray(values)
    if dt == bf16:
        return bf16_bits(v)
    if dt in F8_TYPES:
        return f8_encode(v, dt)
    if dt.is_packed:
        return (v.astype(np.uint8) & 0xF)
    if dt.name == "bool":
        return v.astype(np.uint8)
    return v.astype(storage_dtype(dt), copy=False).view(bits_dtype(dt))


def from_bits(bits: np.ndarray, dt: DType) -> np.ndarray:
    """Bit patterns (unsigned ints) -> storage values of type `dt`."""
    b = np.ascontiguousarray(bits)
    if dt == bf16:
        return bf16_from_bits(b)
    if dt in F8_TYPES:
        return f8_decode(b, dt)
    if dt.is_packed:
        return (b.astype(np.uint8) & 0xF)
    if dt.name == "bool":
        return b.astype(bool)
    return b.astype(bits_dtype(dt), copy=False).view(storage_dtype(dt))


def max_finite(dt: DType) -> float:
    """The largest finite value of a float type."""
    if dt in F8_TYPES:
        return f8_max_finite(dt)
    if dt == bf16:
        return float(bf16_from_bits(np.array([0x7F7F], dtype=np.uint16))[0])
    return float(np.finfo(storage_dtype(dt)).max)
