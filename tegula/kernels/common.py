"""What every kernel family's numpy entry point shares: dtypes of arrays, poisoned outputs,
and the call into the emulator.

Outputs are allocated *poisoned* (NaN for floats, a sentinel for integers) rather than
zeroed, so an element a kernel forgot to write can never pass for a correct one.
"""
from __future__ import annotations

import numpy as np

from tegula.dtypes import DType, f16, f32, i4, i8, i32, u4, u8

_BY_NUMPY = {np.dtype(np.float32): f32, np.dtype(np.float16): f16, np.dtype(np.int8): i8,
             np.dtype(np.uint8): u8, np.dtype(np.int32): i32}

# Integer poison: a value a correct kernel writes only by coincidence (-0x5A..., 0xA5...).
_INT_POISON = {8: 0xA5, 32: 0x5A5A5A5A}


def dtype_of_array(x: np.ndarray) -> DType:
    """The tegula dtype a numpy array holds (float32 means f32: bf16/f8 data, which the
    emulator keeps in float32, must be named explicitly)."""
    try:
        return _BY_NUMPY[x.dtype]
    except KeyError:
        raise TypeError(f"no tegula dtype for numpy {x.dtype}; pass dtype=") from None


def storage_of(dtype: DType) -> np.dtype:
    """The numpy type an emulated tensor of `dtype` is held in (packed 4-bit types: bytes)."""
    from tegula.emulate.values import storage_dtype
    return storage_dtype(dtype)


def poisoned(shape: tuple, dtype: DType) -> np.ndarray:
    """A fresh array for an output of `dtype`, filled with poison (see module docstring)."""
    store = storage_of(dtype)
    if dtype.is_float:
        return np.full(shape, np.nan, dtype=store)
    bits = 8 if dtype in (i4, u4) else store.itemsize * 8
    return np.full(shape, _INT_POISON[bits], dtype=np.uint64).astype(store)


def logical_shape(x: np.ndarray, dtype: DType) -> tuple:
    """The element shape of an emulated tensor: packed 4-bit arrays hold two elements per
    byte along their last dim."""
    if dtype.is_packed:
        return tuple(x.shape[:-1]) + (2 * x.shape[-1],)
    return tuple(x.shape)


def random_input(rng: np.random.Generator, shape: tuple, dtype: DType,
                 scale: float = 1.0) -> np.ndarray:
    """Random data exactly representable in `dtype`, in its emulator storage: normal
    values times `scale` rounded to the type for floats, the type's whole range for
    integers, random bytes (two elements each) for packed 4-bit types."""
    from tegula.emulate.values import round_to
    if dtype.is_packed:
        return rng.integers(0, 256, size=shape[:-1] + (shape[-1] // 2,), dtype=np.uint8)
    if dtype.is_float:
        return round_to(rng.standard_normal(shape).astype(np.float32) * scale, dtype)
    info = np.iinfo(storage_of(dtype))
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=storage_of(dtype))


def launch_emulated(kernel, grid: tuple, *arrays: np.ndarray, **constexprs):
    """Run `kernel` on the CPU emulator (the same compile path as the GPU)."""
    from tegula.build import emulate
    return emulate(kernel, grid, *arrays, **constexprs)


__all__ = ["dtype_of_array", "storage_of", "poisoned", "logical_shape", "random_input",
           "launch_emulated"]
