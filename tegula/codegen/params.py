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
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.dtypes import DType
from tegula.lower.thread_ir import (
    CpAsync, GlobalAtomicAdd, GlobalLoad, GlobalStore, ScalarParam, TensorParam, ThreadKernel,
    walk,
)

from tegula.codegen.expr import storage_type


@dataclass(frozen=True)
class ParamSpec:
    """One C parameter of a generated kernel.

    `kind` is "pointer", "shape", "stride" or "scalar"; `source` names the TensorParam or
    ScalarParam it comes from and `axis` the dimension (shape/stride only). `fmt` is the
    `struct` format character of its bytes ("Q" pointer, "i" int, "q" long long,
    "f" float) and `size` its byte count.
    """

    name: str
    c_type: str
    kind: str
    source: str
    dtype: DType
    fmt: str
    size: int
    axis: int = -1

    @property
    def declaration(self) -> str:
        """`type name` as written in the kernel's parameter list."""
        return f"{self.c_type} {self.name}"


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
