"""Bit patterns of the float formats numpy lacks: bf16, f8 E4M3FN and f8 E5M2.

The conversion and atomic entries (`arch.convert`, `arch.memory.RED_ADD`) state what they
compute with these, and the emulator stores and loads such tensors with them
(`emulate/values.py`: `to_bits` / `from_bits`). Values of these types are held in float32
(each float32 holding exactly a value of the type).

* **bf16**: the upper 16 bits of the float32 pattern, rounded to nearest even
  (`cvt.rn.bf16.f32`); overflow rounds to ±inf, NaN stays a (quiet) NaN.
* **f8e4m3** (E4M3FN: bias 7, no infinities, max 448, NaN = S.1111.111) and **f8e5m2**
  (bias 15, IEEE-like, max 57344): round to nearest even with saturation, as
  `cvt.rn.satfinite.{e4m3,e5m2}x2.f32`: magnitudes beyond the largest finite value,
  infinities included, become ±max; NaN stays NaN.
"""
from __future__ import annotations

import numpy as np

from tegula.dtypes import DType, f8e4m3, f8e5m2

# ---------------------------------------------------------------------- tensor-core NaN

#: The NaN a tensor core writes into a float accumulator, whatever NaN arose: the GPU does
#: not propagate payloads. Measured for wgmma's f32 accumulator on an H100 (session 11,
#: `benchmarks/nan_payload_probe.py`: 0x7fffffff on every NaN element); mma.sync is taken to
#: write the same (NVIDIA's canonical NaN; an sm_80 cubin cannot run on the H100 to check).
_TENSOR_CORE_NAN = {np.dtype(np.float32): np.uint32(0x7FFFFFFF),
                    np.dtype(np.float16): np.uint16(0x7FFF)}


def tensor_core_nan(values: np.ndarray) -> np.ndarray:
    """Accumulator `values` (float32 or float16; other types pass through) with every NaN
    replaced by the tensor cores' canonical NaN, so the emulator's wgmma and mma.sync paths
    agree with the GPU and with each other bit for bit (numpy would keep x86's NaN of the
    operation that made it, which differs between the two paths)."""
    values = np.asarray(values)
    canon = _TENSOR_CORE_NAN.get(values.dtype)
    if canon is None or not np.isnan(values).any():
        return values
    bits = np.ascontiguousarray(values).view(canon.dtype).copy()
    bits[np.isnan(values)] = canon
    return bits.view(values.dtype)


# ---------------------------------------------------------------------- f8


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


#: f8 type name -> (value of each of the 256 codes, positive finite values in code order
#: as float64, largest finite code).
_F8: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
for _dt, _args in ((f8e4m3, (4, 3, 7, True)), (f8e5m2, (5, 2, 15, False))):
    _table = _f8_decode_table(*_args)
    _pos = _table[:128]
    _finite = np.flatnonzero(np.isfinite(_pos))
    # Positive finite codes in increasing value order are consecutive from 0.
    _max_code = int(_finite.max())
    _F8[_dt.name] = (_table, _pos[: _max_code + 1].astype(np.float64), _max_code)

F8_TYPES = (f8e4m3, f8e5m2)


def f8_encode(x: np.ndarray, dt: DType) -> np.ndarray:
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


def f8_decode(codes: np.ndarray, dt: DType) -> np.ndarray:
    """float32 values of f8 codes (exact)."""
    return _F8[dt.name][0][np.asarray(codes, dtype=np.int64) & 0xFF]


def f8_max_finite(dt: DType) -> float:
    """The largest finite value of an f8 type (448, 57344)."""
    table, pos, max_code = _F8[dt.name]
    return float(pos[max_code])


# ---------------------------------------------------------------------- bf16

def bf16_bits(x: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns of float values (RNE on the float32 pattern)."""
    shape = np.shape(x)  # ascontiguousarray makes a 0-d array 1-d: keep the caller's shape
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    nan = np.isnan(f)
    rounded = np.where(nan, (bits >> 16) | 0x40, rounded)  # keep sign, force quiet NaN
    return rounded.astype(np.uint16).reshape(shape)


def bf16_from_bits(bits: np.ndarray) -> np.ndarray:
    """float32 values of bf16 bit patterns (exact)."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)
