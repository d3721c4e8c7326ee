"""Output coverage: did the blocks of a grid write every element of every output?

A grid too small for its output (a `cdiv` forgotten, rows and columns swapped) leaves
elements unwritten, and on a zero-initialized output they pass for results. `tg.emulate`
therefore, by default:

1. finds the kernel's outputs in its thread IR: tensors it stores to or adds to
   atomically, TMA stores and reduce-adds included (`tensor_roles`);
2. poisons the *write-only* ones (NaN for floats, a byte pattern for integers and raw
   bits), so nothing downstream can mistake an unwritten element for a value. Tensors the
   kernel also reads (read-modify-write, atomics) are never poisoned: their contents are
   inputs. A write-only tensor is never read, so poisoning it cannot change what the
   kernel computes;
3. has the emulator record which elements were stored to (`run_thread_kernel`'s
   `track_writes`: a mask, not a comparison with the poison, so a kernel that writes NaN
   or the poison's bit pattern is still seen to have written it);
4. raises `EmulationError` naming each output with unwritten elements, how many, and a few
   of their coordinates (`check_written`).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from tegula.dtypes import DType
from tegula.emulate.errors import EmulationError
from tegula.lower.async_ir import TensorMapParam, TmaLoad, TmaStore
from tegula.lower.thread_ir import (CpAsync, GlobalAtomicAdd, GlobalLoad, GlobalStore,
                                    TensorParam, ThreadKernel, scalar_loaded_tensors, walk)

# Integer poison: a value a correct kernel writes only by coincidence.
_INT_POISON = 0xA5A5A5A5A5A5A5A5


def tensor_roles(kernel: ThreadKernel) -> tuple[set[str], set[str]]:
    """(tensors the kernel writes, tensors it reads), from its thread IR."""
    written: set[str] = set()
    read: set[str] = set()
    # TMA statements name a tensor map; the map names its tensor.
    mapped = {p.name: p.tensor for p in kernel.params if isinstance(p, TensorMapParam)}
    for stmt in walk(kernel.body):
        if isinstance(stmt, GlobalStore):
            written.add(stmt.tensor)
        elif isinstance(stmt, GlobalAtomicAdd):
            written.add(stmt.tensor)
            read.add(stmt.tensor)  # an atomic add reads what is there
        elif isinstance(stmt, (GlobalLoad, CpAsync)):
            read.add(stmt.tensor)
        elif isinstance(stmt, TmaStore):
            written.add(mapped[stmt.tensor_map])
            if stmt.reduce:  # a TMA reduce-add reads what is there
                read.add(mapped[stmt.tensor_map])
        elif isinstance(stmt, TmaLoad):
            read.add(mapped[stmt.tensor_map])
    read |= scalar_loaded_tensors(kernel.body)  # `offsets[e]` in any index expression
    return written, read


def poison(array: np.ndarray) -> None:
    """Fill `array` in place with poison: NaN for floating arrays, otherwise a repeated
    0xA5 byte pattern (integers, bit patterns of bf16/f8, packed 4-bit bytes)."""
    if np.issubdtype(array.dtype, np.floating):
        array[...] = np.nan
    else:
        array[...] = np.array(_INT_POISON, dtype=np.uint64).astype(array.dtype)


def element_offsets(array: np.ndarray, dtype: DType) -> np.ndarray:
    """The emulator's element offset of every element of `array` (in its logical shape:
    packed 4-bit arrays hold two elements per byte along the last dim)."""
    strides = [s // array.itemsize for s in array.strides]
    shape = list(array.shape)
    if dtype.is_packed and shape:  # as GlobalTensor counts them: two nibbles a byte
        strides = [2 * s for s in strides[:-1]] + strides[-1:]
        shape[-1] *= 2
    offsets = np.zeros(shape, dtype=np.int64)
    for dim, (extent, stride) in enumerate(zip(shape, strides)):
        index = np.arange(extent, dtype=np.int64) * stride
        offsets += index.reshape([-1 if d == dim else 1 for d in range(len(shape))])
    return offsets


def check_written(kernel: ThreadKernel, grid: tuple, arrays: Mapping[str, np.ndarray],
                  written: Mapping[str, np.ndarray], poisoned: set[str]) -> None:
    """Raise `EmulationError` if a tracked output has elements no block wrote."""
    dtypes = {p.name: p.dtype for p in kernel.params if isinstance(p, TensorParam)}
    problems = []
    for name, mask in written.items():
        array = arrays[name]
        offsets = element_offsets(array, dtypes[name])
        missing = ~mask[offsets] if mask.size else np.zeros(offsets.shape, dtype=bool)
        count = int(missing.sum())
        if count:
            coords = [tuple(int(i) for i in c) for c in np.argwhere(missing)[:4]]
            state = " (left as poison)" if name in poisoned else ""
            problems.append(f"output {name!r} (shape {offsets.shape}): {count} of "
                            f"{offsets.size} elements written by no block{state}, e.g. at "
                            f"{', '.join(map(str, coords))}")
    if problems:
        raise EmulationError(
            f"kernel {kernel.name} on grid {tuple(grid)}: " + "; ".join(problems) +
            ". Is the grid too small for the output, or a tile coordinate wrong? A kernel "
            "that writes part of an output on purpose runs with check_coverage=False (or "
            "check_coverage=[names of the outputs to check]).")


__all__ = ["tensor_roles", "poison", "element_offsets", "check_written"]
