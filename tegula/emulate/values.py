"""Element values in the emulator: storage types, rounding to a type, bit patterns.

Registers hold each element type in a numpy *storage* type (`DType.numpy_name`): f32 in
float32, f16 in float16, ints in their numpy int, and the types numpy lacks — bf16 and the
two f8s — in float32 holding exactly a value of the type. Every write to a register or to
memory goes through `round_to`, which is what the hardware's conversions produce:

* **f16**: numpy's float32 -> float16 cast: round to nearest even, overflow -> ±inf
  (`cvt.rn.f16.f32`).
* **bf16**: round the float32 bit pattern to its upper 16 bits, nearest even
  (`cvt.rn.bf16.f32`); overflow rounds to ±inf, NaN stays a (quiet) NaN.
* **f8e4m3** (E4M3FN: bias 7, no infinities, max 448, NaN = S.1111.111) and **f8e5m2**
  (bias 15, IEEE-like, max 57344): round to nearest even with saturation, as
  `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` (what CUDA's `__nv_fp8_*` constructors use):
  magnitudes beyond the largest finite value, infinities included, become ±max; NaN stays
  NaN.
* **float -> int**: truncate toward zero and saturate to the type's range, NaN -> 0
  (`cvt.rzi.sat`, which is PTX's default for float-to-int).
* **int -> int**: C wraparound (two's complement truncation).
* **int -> float**: round to nearest even.

Packed 4-bit types (i4, u4) are held one nibble per register element (0..15, uint8).
"""
from __future__ import annotations

import numpy as np

from tegula.dtypes import DType, bf16, f8e4m3, f8e5m2

_BITS_DTYPE = {8: np.uint8, 16: np.uint16, 32: np.uint32, 4: np.uint8}


def storage_dtype(dt: DType) -> np.dtype:
    """The numpy type registers of element type `dt` are held in."""
    if dt.is_packed:
        return np.dtype(np.uint8)
    return np.dtype(dt.numpy_name)


def bits_dtype(dt: DType) -> np.dtype:
    """The unsigned numpy type of `dt`'s bit pattern in memory."""
    return np.dtype(_BITS_DTYPE[dt.bits])


# ---------------------------------------------------------------------- f8 tables

def _f8_decode_table(exp_bits: int, man_bits: int, bias: int, fn: bool) -> np.ndarray:
    """float32 value of every 8-bit code. `fn`: E4M3FN style (no inf, only S.1111.111 NaN)."""
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e = (codes >> man_bits) & ((1 << exp_bits) - 1)
    m = codes & ((1 << man_bits) - 1)
    emax = (1 << exp_bits) - 1
    normal = (1.0 + m / (1 << man_bits)) * np.power(2.0, e - bias)
    sub = (m / (1 << man_bits)) * 2.0 ** (1 - bias)
    val = sign * np.where(e == 0, sub, normal)
    if fn:
        nan = (e == emax) & (m == (1 << man_bits) - 1)
    else:
        val = np.where((e == emax) & (m == 0), sign * np.inf, val)
        nan = (e == emax) & (m != 0)
    return np.where(nan, np.nan, val).astype(np.float32)


_F8 = {}
for _dt, _args in ((f8e4m3, (4, 3, 7, True)), (f8e5m2, (5, 2, 15, False))):
    _table = _f8_decode_table(*_args)
    _pos = _table[:128]
    _finite = np.flatnonzero(np.isfinite(_pos))
    # Positive finite codes in increasing value order are consecutive from 0.
    _max_code = int(_finite.max())
    _F8[_dt.name] = (_table, _pos[: _max_code + 1].astype(np.float64), _max_code)


def _f8_encode(x: np.ndarray, dt: DType) -> np.ndarray:
    """Round float values to the nearest f8 code (RNE, satfinite); returns uint8 codes."""
    table, pos, max_code = _F8[dt.name]
    x = np.asarray(x, dtype=np.float64)
    mag = np.abs(x)
    hi = np.clip(np.searchsorted(pos, mag, side="left"), 0, max_code)
    lo = np.clip(hi - 1, 0, max_code)
    d_lo = np.abs(mag - pos[lo])
    d_hi = np.abs(pos[hi] - mag)
    # Ties go to the even code (mantissa LSB 0): codes are consecutive in value order.
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo)
    code = np.where(mag >= pos[max_code], max_code, code)  # saturate, inf included
    code = code | np.where(np.signbit(x), 0x80, 0)
    nan_code = 0x7F
    code = np.where(np.isnan(x), nan_code, code)
    return code.astype(np.uint8)


def _f8_decode(codes: np.ndarray, dt: DType) -> np.ndarray:
    return _F8[dt.name][0][np.asarray(codes, dtype=np.int64) & 0xFF]


# ---------------------------------------------------------------------- bf16

def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns of float values (RNE on the float32 pattern)."""
    shape = np.shape(x)  # ascontiguousarray makes a 0-d array 1-d: keep the caller's shape
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    nan = np.isnan(f)
    rounded = np.where(nan, (bits >> 16) | 0x40, rounded)  # keep sign, force quiet NaN
    return rounded.astype(np.uint16).reshape(shape)


def _bf16_from_bits(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


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
        if dt.name == "f32":
            return x.astype(np.float32) if x.dtype != np.float32 else x
        xf = _round_to_odd_f32(x) if x.dtype == np.float64 else x.astype(np.float32)
        if dt.name == "f16":
            with np.errstate(over="ignore"):
                return xf.astype(np.float16)
        if dt == bf16:
            return _bf16_from_bits(_bf16_bits(xf))
        return _f8_decode(_f8_encode(xf, dt), dt)
    if dt.name == "bool":
        return x.astype(bool)
    if dt.is_packed:
        return (_to_int(x, np.int64) & 0xF).astype(np.uint8)
    if x.dtype.kind == "f":
        info = np.iinfo(store)
        with np.errstate(invalid="ignore"):
            t = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
        return np.clip(t, info.min, info.max).astype(store)
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
        return _bf16_bits(v)
    if dt in (f8e4m3, f8e5m2):
        return _f8_encode(v, dt)
    if dt.is_packed:
        return (v.astype(np.uint8) & 0xF)
    if dt.name == "bool":
        return v.astype(np.uint8)
    return v.astype(storage_dtype(dt), copy=False).view(bits_dtype(dt))


def from_bits(bits: np.ndarray, dt: DType) -> np.ndarray:
    """Bit patterns (unsigned ints) -> storage values of type `dt`."""
    b = np.ascontiguousarray(bits)
    if dt == bf16:
        return _bf16_from_bits(b)
    if dt in (f8e4m3, f8e5m2):
        return _f8_decode(b, dt)
    if dt.is_packed:
        return (b.astype(np.uint8) & 0xF)
    if dt.name == "bool":
        return b.astype(bool)
    return b.astype(bits_dtype(dt), copy=False).view(storage_dtype(dt))


def max_finite(dt: DType) -> float:
    """The largest finite value of a float type."""
    if dt in (f8e4m3, f8e5m2):
        table, pos, max_code = _F8[dt.name]
        return float(pos[max_code])
    if dt == bf16:
        return float(_bf16_from_bits(np.array([0x7F7F], dtype=np.uint16))[0])
    return float(np.finfo(storage_dtype(dt)).max)
