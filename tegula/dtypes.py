"""Element types of tegula tensors.

A leaf module (like `tegula.errors`): every layer — the language, the instruction catalogue,
lowering, code generation and the emulator — needs to know an element type's width and its
C spelling, and the import rules of docs/design.md forbid `arch` and `codegen` from reaching
into `ir`, so the types live here, below all of them.

Packed 4-bit types (`i4`, `u4`) are storage types: two elements share a byte, element 0 in
the low nibble. They can be copied and unpacked, not computed on directly.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    """An element type.

    `kind` is "float", "int" (signed) or "uint". `c_name` is the CUDA C++ type the code
    generator declares registers with; `numpy_name` is the numpy type the emulator stores
    values in (types numpy lacks — bf16 and the f8s — are held in float32 and rounded to
    the type on every write, which is exactly what the hardware's results look like).
    """

    name: str
    bits: int
    kind: str
    c_name: str
    numpy_name: str
    exponent_bits: int = 0
    mantissa_bits: int = 0

    @property
    def bytes(self) -> float:
        """Width in bytes (0.5 for packed 4-bit types)."""
        return self.bits / 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_signed(self) -> bool:
        return self.kind in ("int", "float")

    @property
    def is_packed(self) -> bool:
        """True for sub-byte storage types."""
        return self.bits < 8

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"tegula.{self.name}"


f32 = DType("f32", 32, "float", "float", "float32", 8, 23)
f16 = DType("f16", 16, "float", "__half", "float16", 5, 10)
bf16 = DType("bf16", 16, "float", "__nv_bfloat16", "float32", 8, 7)
f8e4m3 = DType("f8e4m3", 8, "float", "__nv_fp8_e4m3", "float32", 4, 3)
f8e5m2 = DType("f8e5m2", 8, "float", "__nv_fp8_e5m2", "float32", 5, 2)
i32 = DType("i32", 32, "int", "int", "int32")
i8 = DType("i8", 8, "int", "signed char", "int8")
u8 = DType("u8", 8, "uint", "unsigned char", "uint8")
i4 = DType("i4", 4, "int", "unsigned char", "uint8")
u4 = DType("u4", 4, "uint", "unsigned char", "uint8")
# Predicates and comparison results inside kernels.
bool_ = DType("bool", 8, "uint", "bool", "bool")

ALL_DTYPES: tuple[DType, ...] = (f32, f16, bf16, f8e4m3, f8e5m2, i32, i8, u8, i4, u4)
_BY_NAME = {d.name: d for d in ALL_DTYPES + (bool_,)}
# Names torch and numpy use for the same types, so arguments can be matched to a signature.
_ALIASES = {
    "float32": f32, "float": f32, "float16": f16, "half": f16, "bfloat16": bf16,
    "float8_e4m3fn": f8e4m3, "float8_e5m2": f8e5m2, "int32": i32, "int8": i8, "uint8": u8,
}


def dtype_from_name(name: str) -> DType:
    """The tegula type called `name` (tegula, numpy or torch spelling, e.g. 'torch.float16')."""
    key = name.rsplit(".", 1)[-1]
    found = _BY_NAME.get(key) or _ALIASES.get(key)
    if found is None:
        known = ", ".join(sorted(_BY_NAME))
        raise ValueError(f"unknown element type {name!r}; tegula knows {known}")
    return found
