"""Launch arguments: reading tensors (torch or `__cuda_array_interface__`), checking them
against the kernel's signature, flattening them into the parameter values of
`tegula.codegen.param_list`, and their divisibility facts for specialization.

The checks run on every launch, so they are written as a precomputed plan of small
per-argument steps, with a fast path for `torch.Tensor` (attribute reads only).
"""
from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tegula.dtypes import DType
from tegula.errors import LaunchError
from tegula.lower.async_ir import TensorMapParam
from tegula.lower.thread_ir import ScalarParam, TensorParam, ThreadKernel

from tegula.codegen import element_value, global_access_bytes, vectorized_tensors
from tegula.runtime.aliasing import alias_rules, check_views
from tegula.runtime.tensor_map import TENSOR_MAPS, TensorMapCache

_INT32_MAX = 2**31 - 1

#: tegula dtype name -> (torch dtype name, numpy typestr of __cuda_array_interface__).
_TORCH_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
                "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "i32": "int32",
                "i8": "int8", "u8": "uint8", "bool": "bool", "i4": "uint8", "u4": "uint8"}
_TYPESTR = {"f32": "<f4", "f16": "<f2", "i32": "<i4", "i8": "|i1", "u8": "|u1", "bool": "|b1",
            "i4": "|u1", "u4": "|u1"}


@dataclass(frozen=True)
class TensorRequirement:
    """What a launch needs of one tensor argument.

    `align`: bytes the data pointer must be a multiple of (default: the widest access the
    kernel makes to the tensor). `unit_stride_dim`: a dimension whose stride must be 1
    (default: the last one for tensors the kernel accesses with vectors, else none).
    """

    align: int = 1
    unit_stride_dim: int | None = None


def default_requirements(kernel: ThreadKernel) -> dict[str, TensorRequirement]:
    widest = global_access_bytes(kernel)
    vectored = vectorized_tensors(kernel)
    return {p.name: TensorRequirement(max(1, widest.get(p.name, 1)),
                                      p.rank - 1 if p.name in vectored and p.rank else None)
            for p in kernel.params if isinstance(p, TensorParam)}


@dataclass(frozen=True)
class TensorView:
    """The facts of a tensor argument the launcher needs."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype_name: str           # torch-style name ("float16") or typestr ("<f2")
    device: int               # CUDA device index, or -1 when not on a CUDA device


def tensor_view(arg: Any) -> TensorView | None:
    """Read a tensor argument (torch.Tensor, `__cuda_array_interface__`, or DLPack through
    torch), or None when `arg` is not a tensor."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(arg, torch.Tensor):
        dev = arg.device
        return TensorView(arg.data_ptr(), tuple(arg.shape), tuple(arg.stride()),
                          str(arg.dtype)[6:], dev.index if dev.type == "cuda" else -1)
    cai = getattr(arg, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        itemsize = int(cai["typestr"][2:])
        strides = cai.get("strides")
        if strides is None:  # C-contiguous
            strides, acc = [], 1
            for extent in reversed(shape):
                strides.insert(0, acc)
                acc *= extent
        else:
            strides = [s // itemsize for s in strides]
        return TensorView(int(cai["data"][0]), shape, tuple(strides), cai["typestr"], -2)
    if hasattr(arg, "__dlpack__") and torch is not None:
        return tensor_view(torch.from_dlpack(arg))
    return None


def _expected_dtype_names(dtype: DType) -> tuple[str, ...]:
    names = [_TORCH_NAMES.get(dtype.name, dtype.name)]
    if dtype.name in _TYPESTR:
        names.append(_TYPESTR[dtype.name])
    if dtype.bits == 4:
        names.append("int8")
    return tuple(names)


#: The parameter value of a tensor map whose tensor is empty (TMA cannot describe a zero
#: extent). Harmless for the empty grid such a launch usually has; the launcher refuses to
#: run a non-empty grid with it (`CompiledKernel.launch_raw`).
EMPTY_TENSOR_MAP = bytes(128)


class ArgumentPlan:
    """Checks one kernel's launch arguments and flattens them to parameter values.

    The arguments are the kernel's `TensorParam`s and `ScalarParam`s in order (`params`).
    A `TensorMapParam` is not an argument: its value (the encoded `CUtensorMap`) is derived
    from its tensor's pointer, extents and strides and inserted at its slot."""

    def __init__(self, kernel: ThreadKernel,
                 requirements: dict[str, TensorRequirement] | None = None,
                 tensor_maps: TensorMapCache = TENSOR_MAPS):
        self.kernel_name = kernel.name
        self.params = [p for p in kernel.params if not isinstance(p, TensorMapParam)]
        self.map_cache = tensor_maps
        self.map_slots = _map_slots(kernel)
        reqs = default_requirements(kernel)
        reqs.update(requirements or {})
        self.requirements = reqs
        self.expected = {p.name: _expected_dtype_names(p.dtype)
                         for p in self.params if isinstance(p, TensorParam)}
        self._torch_dtypes: dict[str, tuple] = {}  # resolved on first torch argument
        # Written tensors against the others: their memory must not overlap (aliasing.py).
        self.alias_rules = alias_rules(kernel)
        self.bits = {p.name: p.dtype.bits for p in self.params if isinstance(p, TensorParam)}

    def flatten(self, args: Sequence[Any]) -> tuple[list, int]:
        """(parameter values in `param_list` order, the tensors' CUDA device)."""
        if len(args) != len(self.params):
            names = ", ".join(p.name for p in self.params)
            raise LaunchError(f"{self.kernel_name} takes {len(self.params)} arguments "
                              f"({names}), got {len(args)}")
        values: list = []
        device = None
        for p, arg in zip(self.params, args):
            if isinstance(p, TensorParam):
                dev = self._tensor(p, arg, values)
                if dev >= 0:
                    if device is not None and dev != device:
                        raise LaunchError(f"argument {p.name!r} is on cuda:{dev}, earlier "
                                          f"tensors on cuda:{device}")
                    device = dev
            else:
                values.append(self.check_scalar(p, arg))
        if self.alias_rules:
            self.check_aliasing(values)
        if self.map_slots:
            self._insert_tensor_maps(values)
        return values, (device if device is not None else -1)

    def tensor_views(self, values: Sequence) -> dict[str, tuple]:
        """Per tensor parameter, (pointer, extents, strides) read from flattened `values`
        (before tensor maps are inserted)."""
        views, at = {}, 0
        for p in self.params:
            if isinstance(p, TensorParam):
                r = p.rank
                views[p.name] = (values[at], tuple(values[at + 1:at + 1 + r]),
                                 tuple(values[at + 1 + r:at + 1 + 2 * r]))
                at += 1 + 2 * r
            else:
                at += 1
        return views

    def check_aliasing(self, values: Sequence) -> None:
        """Raise `LaunchError` where a tensor the kernel writes shares memory with another
        argument (`tegula.runtime.aliasing`)."""
        check_views(self.kernel_name, self.alias_rules, self.tensor_views(values), self.bits)

    def _insert_tensor_maps(self, values: list) -> None:
        """Insert each tensor map's value at its slot, read from its tensor's flattened
        pointer, extents and strides (read from `values` before any insertion moves them)."""
        maps = []
        for slot, tmap, start, rank in self.map_slots:
            shape = tuple(values[start + 1:start + 1 + rank])
            strides = tuple(values[start + 1 + rank:start + 1 + 2 * rank])
            maps.append((slot, self.tensor_map(tmap, values[start], shape, strides)))
        for slot, value in maps:  # ascending slots: each lands where param_list has it
            values.insert(slot, value)

    def tensor_map(self, tmap: TensorMapParam, ptr: int, shape: tuple, strides: tuple):
        """The 128-byte value of `tmap` for its tensor at `ptr` (cached encoding)."""
        if 0 in shape:
            return EMPTY_TENSOR_MAP
        return self.map_cache.get(ptr, tmap.dtype, shape, strides, tmap.dims, tmap.box,
                                  tmap.swizzle, name=f"{tmap.tensor} ({tmap.name})")

    def _tensor(self, p: TensorParam, arg: Any, values: list) -> int:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(arg, torch.Tensor):
            # Fast path: attribute reads only, dtype compared by identity.
            dtypes = self._torch_dtypes.get(p.name)
            if dtypes is None:
                dtypes = self._torch_dtypes[p.name] = tuple(
                    getattr(torch, n) for n in self.expected[p.name] if hasattr(torch, n))
            if not arg.is_cuda:
                raise LaunchError(f"argument {p.name!r} is on {arg.device}, not a CUDA device")
            if arg.dtype not in dtypes:
                raise LaunchError(f"argument {p.name!r} has dtype {arg.dtype}, the kernel "
                                  f"takes {p.dtype} (torch.{self.expected[p.name][0]})")
            self._append(p, arg.data_ptr(), arg.shape, arg.stride(), values)
            return arg.get_device()
        view = tensor_view(arg)
        if view is None:
            raise LaunchError(f"argument {p.name!r} must be a tensor ({p.dtype}, rank "
                              f"{p.rank}), got {type(arg).__name__}")
        if view.device == -1:
            raise LaunchError(f"argument {p.name!r} is not on a CUDA device")
        if view.dtype_name not in self.expected[p.name]:
            raise LaunchError(f"argument {p.name!r} has dtype {view.dtype_name}, the kernel "
                              f"takes {p.dtype} ({self.expected[p.name][0]})")
        self._append(p, view.ptr, view.shape, view.strides, values)
        return view.device

    def _append(self, p: TensorParam, ptr: int, shape: Sequence[int], strides: Sequence[int],
                values: list) -> None:
        """Check rank, alignment, unit stride and extents; append pointer, extents, strides."""
        if len(shape) != p.rank:
            raise LaunchError(f"argument {p.name!r} has rank {len(shape)}, the kernel takes "
                              f"rank {p.rank}")
        if p.dtype.bits == 4 and shape:  # bytes hold two elements: count elements
            shape = tuple(shape[:-1]) + (shape[-1] * 2,)
            strides = tuple(s * 2 for s in strides[:-1]) + tuple(strides[-1:])
        req = self.requirements[p.name]
        if ptr % req.align:
            raise LaunchError(f"argument {p.name!r}: data pointer 0x{ptr:x} is not "
                              f"{req.align}-byte aligned, which the kernel's vector accesses need")
        d = req.unit_stride_dim
        if d is not None and shape[d] > 1 and strides[d] != 1:
            raise LaunchError(f"argument {p.name!r}: dimension {d} must have stride 1 (the "
                              f"kernel reads it with vectors), got strides {tuple(strides)}; "
                              f"pass .contiguous()")
        for e in shape:
            if e > _INT32_MAX:
                raise LaunchError(f"argument {p.name!r}: extents {tuple(shape)} exceed 2^31-1")
        values.append(ptr)
        values.extend(shape)
        values.extend(strides)

    def check_scalar(self, p: ScalarParam, arg: Any):
        """The parameter value of scalar `p` for `arg` (float rounded to p's dtype), checked."""
        return scalar_value(p, arg)


def _map_slots(kernel: ThreadKernel) -> list[tuple[int, TensorMapParam, int, int]]:
    """Per tensor map, in slot order: (its slot in `param_list` order, the map, the slot of
    its tensor's pointer among the argument values without maps, the tensor's rank)."""
    tensors = {p.name: p for p in kernel.params if isinstance(p, TensorParam)}
    starts, out, position, maps_before = {}, [], 0, 0
    for p in kernel.params:
        if isinstance(p, TensorParam):
            starts[p.name] = position - maps_before
            position += 1 + 2 * p.rank
        elif isinstance(p, ScalarParam):
            position += 1
        elif isinstance(p, TensorMapParam):
            tensor = tensors.get(p.tensor)
            if tensor is None or p.tensor not in starts:
                raise LaunchError(f"{kernel.name}: tensor map {p.name!r} encodes {p.tensor!r}, "
                                  f"which is not a tensor parameter listed before it")
            if tensor.dtype != p.dtype:
                raise LaunchError(f"{kernel.name}: tensor map {p.name!r} is {p.dtype}, its "
                                  f"tensor {p.tensor!r} is {tensor.dtype}")
            out.append((position, p, starts[p.tensor], tensor.rank))
            position += 1
            maps_before += 1
    return out


#: The smallest magnitude an f32 parameter rounds to infinity from (FLT_MAX + half an ulp).
_F32_OVERFLOW = 2.0**128 - 2.0**103


def scalar_value(p: ScalarParam, arg: Any):
    """The value of scalar parameter `p` for `arg`: a float rounded to p's dtype, or an
    int (numpy integers too) in 32-bit range — never a float truncated to an int."""
    if p.dtype.is_float:
        if not isinstance(arg, numbers.Real) or isinstance(arg, (bool, np.bool_)):
            raise LaunchError(f"argument {p.name!r} must be a number ({p.dtype}), got "
                              f"{type(arg).__name__}")
        value = float(arg)
        if p.dtype.bits < 32:
            return element_value(value, p.dtype)
        if _F32_OVERFLOW <= abs(value) < math.inf:  # would round to inf: struct refuses it
            raise LaunchError(f"argument {p.name!r} = {arg!r} is out of {p.dtype}'s range")
        return value
    if type(arg) is not int and (isinstance(arg, bool) and p.dtype.name != "bool" or
                                 not isinstance(arg, numbers.Integral)):
        raise LaunchError(f"argument {p.name!r} must be an int ({p.dtype}), got "
                          f"{type(arg).__name__} {arg!r}")
    if not -2**31 <= int(arg) <= _INT32_MAX:
        raise LaunchError(f"argument {p.name!r} = {arg} does not fit in 32 bits")
    return int(arg)


# --------------------------------------------------------------------------------------
# Specialization facts
# --------------------------------------------------------------------------------------

def divisibility(x: int, cap: int = 16) -> int:
    """The largest power of two ≤ `cap` dividing `x` (0 counts as divisible by `cap`)."""
    d = cap
    while d > 1 and x % d:
        d //= 2
    return d


def specialization_key(args: Sequence[Any]) -> tuple:
    """Divisibility facts of launch arguments, for compiling a specialized variant.

    Per tensor: ("tensor", pointer alignment in bytes (≤16), per-dimension extent
    divisibility (≤16 elements), per-dimension stride divisibility, which dimensions have
    stride 1). Per int: ("int", divisibility (≤16), whether it equals 1). Per float:
    ("float",). Equal keys mean a kernel specialized for one argument list is valid for
    the other (as far as alignment and vector widths go).
    """
    key = []
    for arg in args:
        view = tensor_view(arg)
        if view is not None:
            key.append(("tensor", divisibility(view.ptr),
                        tuple(divisibility(e) for e in view.shape),
                        tuple(divisibility(s) for s in view.strides),
                        tuple(i for i, s in enumerate(view.strides) if s == 1)))
        elif isinstance(arg, bool) or not isinstance(arg, int):
            key.append(("float",) if isinstance(arg, float) else (type(arg).__name__,))
        else:
            key.append(("int", divisibility(arg), arg == 1))
    return tuple(key)
