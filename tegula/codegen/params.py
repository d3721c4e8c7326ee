"""The kernel's parameter list: the one description both the emitter and the launcher use.

`emit_cuda` declares exactly these parameters, in this order, with these C types, and the
runtime packs launch arguments from the same list, so the two can never disagree.

Per `TensorParam` (in signature order): the pointer, then `rank` extents (`int`, named
`{t}_shape{i}`), then `rank` strides in elements (named `{t}_stride{i}`): `long long` when the
tensor's offsets may exceed 2^31 (a stride times a coordinate is then computed in 64 bits),
`int` when the kernel was specialized on offsets that fit (`TensorParam.index_bits == 32`),
which keeps address arithmetic in single 32-bit registers; extents are always `int`. Per `ScalarParam`:
one value; float types travel as `float` (the host rounds the value to the scalar's dtype
first), integer and bool types as `int` — no 16-bit parameters, so the packing is simple.
Per `TensorMapParam` (`lower/async_ir.py`, a TMA tensor map): one 128-byte
`const __grid_constant__ tg_tensor_map` (the emitter's stand-in for `CUtensorMap`: NVRTC
has no <cuda.h>) at a 64-byte-aligned offset (`ParamSpec.align`); the runtime packs the
encoded map's 128 bytes there.
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.dtypes import DType
from tegula.lower.async_ir import TensorMapParam
from tegula.lower.thread_ir import (
    CpAsync, GlobalAtomicAdd, GlobalLoad, GlobalStore, ScalarParam, TensorParam, ThreadKernel,
    walk,
)

from tegula.codegen.expr import storage_type


@dataclass(frozen=True)
class ParamSpec:
    """One C parameter of a generated kernel.

    `kind` is "pointer", "shape", "stride", "scalar" or "tensormap"; `source` names the
    TensorParam or ScalarParam it comes from (a tensor map: the tensor it encodes) and
    `axis` the dimension (shape/stride only). `fmt` is the `struct` format of its bytes
    ("Q" pointer, "i" int, "q" long long, "f" float, "128s" tensor map) and `size` its
    byte count; `align` its alignment in the parameter buffer (0: its size).
    """

    name: str
    c_type: str
    kind: str
    source: str
    dtype: DType
    fmt: str
    size: int
    axis: int = -1
    align: int = 0

    @property
    def alignment(self) -> int:
        """Byte alignment of the parameter's offset in the kernel's parameter buffer."""
        return self.align or self.size

    @property
    def declaration(self) -> str:
        """`type name` as written in the kernel's parameter list."""
        return f"{self.c_type} {self.name}"


#: A `CUtensorMap` is 128 opaque bytes, 64-byte aligned (cuda.h's CU_TENSOR_MAP_NUM_QWORDS).
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64
#: Its C parameter type: passed by value and read in place by TMA (the kernel takes its
#: generic address), hence `__grid_constant__`, which also forbids copying it.
TENSOR_MAP_TYPE = "const __grid_constant__ tg_tensor_map"
#: The struct the generated source declares for it (no header is included).
TENSOR_MAP_STRUCT = ("struct __align__(64) tg_tensor_map { unsigned long long opaque[16]; };"
                     "  // CUtensorMap")


def tensor_pointer_type(p: TensorParam) -> str:
    """C type of a tensor's pointer parameter; read-only tensors are `const … __restrict__`
    so loads may go through the read-only data path (`ld.global.nc`)."""
    elem = storage_type(p.dtype)
    return f"{elem}*" if p.writes else f"const {elem}* __restrict__"


def param_list(kernel: ThreadKernel) -> list[ParamSpec]:
    """Every C parameter of `kernel`'s generated function, in declaration order."""
    specs: list[ParamSpec] = []
    for p in kernel.params:
        if isinstance(p, TensorParam):
            specs.append(ParamSpec(p.name, tensor_pointer_type(p), "pointer", p.name,
                                   p.dtype, "Q", 8))
            for i in range(p.rank):
                specs.append(ParamSpec(f"{p.name}_shape{i}", "int", "shape", p.name,
                                       p.dtype, "i", 4, i))
            wide = p.index_bits > 32
            for i in range(p.rank):
                specs.append(ParamSpec(f"{p.name}_stride{i}", "long long" if wide else "int",
                                       "stride", p.name, p.dtype, "q" if wide else "i",
                                       8 if wide else 4, i))
        elif isinstance(p, TensorMapParam):
            specs.append(ParamSpec(p.name, TENSOR_MAP_TYPE, "tensormap", p.tensor, p.dtype,
                                   f"{TENSOR_MAP_BYTES}s", TENSOR_MAP_BYTES,
                                   align=TENSOR_MAP_ALIGN))
        elif isinstance(p, ScalarParam):
            if p.dtype.is_float:
                specs.append(ParamSpec(p.name, "float", "scalar", p.name, p.dtype, "f", 4))
            else:
                specs.append(ParamSpec(p.name, "int", "scalar", p.name, p.dtype, "i", 4))
        else:
            raise TypeError(f"unknown kernel parameter {p!r}")
    return specs


def global_access_bytes(kernel: ThreadKernel) -> dict[str, int]:
    """Per tensor parameter, the widest single access the kernel makes to it (bytes).

    A tensor's base pointer must be aligned to at least this for the vector accesses to be
    legal (whether every access is aligned also depends on the extents and strides: those
    are the specialization facts the runtime reports)."""
    widest = {p.name: 0 for p in kernel.params if isinstance(p, TensorParam)}
    dtypes = {p.name: p.dtype for p in kernel.params if isinstance(p, TensorParam)}
    for s in walk(kernel.body):
        if isinstance(s, (GlobalLoad, GlobalStore, CpAsync)):
            count = s.count
        elif isinstance(s, GlobalAtomicAdd):
            count = 1
        else:
            continue
        if s.tensor in widest:
            nbytes = max(1, count * dtypes[s.tensor].bits // 8)
            widest[s.tensor] = max(widest[s.tensor], nbytes)
    return widest


def vectorized_tensors(kernel: ThreadKernel) -> set[str]:
    """Tensors accessed with more than one element per instruction somewhere."""
    out = set()
    for s in walk(kernel.body):
        if isinstance(s, (GlobalLoad, GlobalStore, CpAsync)) and s.count > 1:
            out.add(s.tensor)
    return out
