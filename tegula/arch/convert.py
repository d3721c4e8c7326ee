"""Conversion entries: the `cvt` instructions generated kernels print (through the
emitter's helper functions, `codegen/ptx.py`).

    entry                            d    a (, b)     from   what it does
    cvt.f32.f16                      f    h           sm_53  f16 -> f32 (exact)
    cvt.rn.f16.f32                   h    f           sm_53  f32 -> f16, nearest even
    cvt.rn.bf16.f32                  h    f           sm_80  f32 -> bf16, nearest even
    cvt.rn.f16x2.f32                 r    f, f        sm_80  two f32 -> two f16 / bf16
    cvt.rn.bf16x2.f32                r    f, f        sm_80  (a high half, b low), nearest even
    cvt.rn.satfinite.e4m3x2.f32      h    f, f        sm_89  two f32 -> two e4m3 (a high
    cvt.rn.satfinite.e5m2x2.f32      h    f, f        sm_89  byte, b low), saturating
    cvt.rn.f16x2.e4m3x2              r    h           sm_89  two e4m3/e5m2 -> two f16
    cvt.rn.f16x2.e5m2x2              r    h           sm_89  (exact)

(PTX ISA "cvt"; f8 forms from PTX 7.8 / sm_89.) Conversions are `pure`: they print as
plain `asm(...)`, so the compiler may schedule them like arithmetic. What a conversion
computes in the emulator is `tegula.emulate.values.round_to` (round to nearest even,
f8 saturating to the largest finite value), held against these instructions on hardware
by tests/gpu/test_cvt_entries.py.
"""
from __future__ import annotations

from tegula.arch.instructions import AsmOperand, Instruction
from tegula.errors import TegulaError

_SOURCE = "PTX ISA cvt; latency: ALU conversion, a few cycles (approximate)"

# PTX name -> (destination constraint, source constraints, min_cc)
_FORMS = {
    "cvt.f32.f16": ("f", ("h",), 53),
    "cvt.rn.f16.f32": ("h", ("f",), 53),
    "cvt.rn.bf16.f32": ("h", ("f",), 80),
    "cvt.rn.f16x2.f32": ("r", ("f", "f"), 80),
    "cvt.rn.bf16x2.f32": ("r", ("f", "f"), 80),
    "cvt.rn.satfinite.e4m3x2.f32": ("h", ("f", "f"), 89),
    "cvt.rn.satfinite.e5m2x2.f32": ("h", ("f", "f"), 89),
    "cvt.rn.f16x2.e4m3x2": ("r", ("h",), 89),
    "cvt.rn.f16x2.e5m2x2": ("r", ("h",), 89),
}


def _cvt(ptx: str, dst: str, srcs: tuple[str, ...], min_cc: int) -> Instruction:
    names = ("a", "b")[:len(srcs)]
    operands = (AsmOperand("d", "out", 1, dst),) + tuple(
        AsmOperand(n, "in", 1, c) for n, c in zip(names, srcs))
    template = ptx + " {d}, " + ", ".join("{" + n + "}" for n in names) + ";"
    return Instruction(name=ptx, kind="cvt", ptx=ptx, template=template, operands=operands,
                       min_cc=min_cc, issue_cycles=1.0, latency_cycles=4.0, source=_SOURCE,
                       pipe="alu", pure=True)


CONVERT_INSTRUCTIONS: tuple[Instruction, ...] = tuple(
    _cvt(ptx, *form) for ptx, form in _FORMS.items())
_BY_PTX = {i.name: i for i in CONVERT_INSTRUCTIONS}


def cvt(ptx: str) -> Instruction:
    """The conversion entry spelled `ptx` (e.g. "cvt.rn.bf16.f32")."""
    try:
        return _BY_PTX[ptx]
    except KeyError:
        raise TegulaError(f"no conversion {ptx!r} in the catalogue; it has "
                          f"{', '.join(_BY_PTX)}") from None
