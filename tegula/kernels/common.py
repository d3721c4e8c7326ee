"""What every kernel family's numpy entry point shares: dtypes of arrays, poisoned outputs,
and the call into the emulator.

Outputs are allocated *poisoned* (NaN for floats, a sentinel for integers) rather than
zeroed, so an element a kernel forgot to write can never pass for a correct one.
"""
from __future__ import annotations

import numpy as np

from tegula.dtypes import DType, f16, f32, i8, i32, u8

_BY_NUMPY = {np.dtype(np.float32): f32, np.dtype(np.float16): f16, np.dtype(np.int8): i8,
             np.dtype(np.uint8): u8, np.dtype(np.int32): i32}


def dtype_of_array(x: np.ndarray, fn: str = "", name: str = "") -> DType:
    """The tegula dtype a numpy array holds (float32 means f32: bf16/f8 data, which the
    emulator keeps in float32, must be named explicitly). `fn`/`name`: the entry point and
    argument, for the message."""
    try:
        return _BY_NUMPY[x.dtype]
    except KeyError:
        where = f"tegula.kernels.{fn}: {name} has " if fn else ""
        raise TypeError(f"{where}no tegula dtype for numpy {x.dtype}; pass dtype= or "
                        f"convert the array") from None


# --------------------------------------------------------------------------------------
# Argument checks of the numpy entry points: a clear error naming the entry point, the
# argument and its shape, before anything is traced.
# --------------------------------------------------------------------------------------

def check_array(fn: str, name: str, x: object, ndim: int | None = None,
                min_ndim: int = 0) -> np.ndarray:
    """`x` after checking it is a numpy array of rank `ndim` (or at least `min_ndim`)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"tegula.kernels.{fn}: {name} must be a numpy array, got "
                        f"{type(x).__name__}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"tegula.kernels.{fn}: {name} must be {ndim}-D, got shape {x.shape}")
    if x.ndim < min_ndim:
        raise ValueError(f"tegula.kernels.{fn}: {name} must have at least {min_ndim} "
                         f"dimension(s), got shape {x.shape}")
    return x


def check_same_dtype(fn: str, **arrays: np.ndarray) -> None:
    """Every array of one numpy dtype (the kernel takes one element type for all)."""
    if len({a.dtype for a in arrays.values()}) > 1:
        listed = ", ".join(f"{n}: {a.dtype} {a.shape}" for n, a in arrays.items())
        raise TypeError(f"tegula.kernels.{fn}: arguments must share one dtype ({listed})")


def rows_of(x: np.ndarray) -> np.ndarray:
    """`x` as a contiguous (rows, last dim) array; exact for empty arrays too (where
    `reshape(-1, 0)` cannot infer the rows)."""
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    return np.ascontiguousarray(x.reshape(rows, x.shape[-1]))


def storage_of(dtype: DType) -> np.dtype:
    """The numpy type an emulated tensor of `dtype` is held in (packed 4-bit types: bytes)."""
    from tegula.emulate.values import storage_dtype
    return storage_dtype(dtype)


def poisoned(shape: tuple, dtype: DType) -> np.ndarray:
    """A fresh array for an output of `dtype`, filled with poison (see module docstring;
    the same poison `tg.emulate` puts in write-only outputs)."""
    from tegula.emulate.coverage import poison
    array = np.empty(shape, dtype=storage_of(dtype))
    poison(array)
    return array


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
           "launch_emulated", "check_array", "check_same_dtype", "rows_of"]
