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

and 16-bit float arithmetic, which narrow-integer conversions and f16/bf16 element ops
use instead of a round trip through f32 (`codegen/expr.py`):

    add.rn.f16, sub.rn.f16, mul.rn.f16       h    h, h   sm_53  one correctly rounded op
    add.rn.bf16, sub.rn.bf16, mul.rn.bf16    h    h, h   sm_90  (ptxas pairs them: HADD2)
    add.rn.f16x2, sub.rn.f16x2, mul.rn.f16x2 r    r, r   sm_53  the same on two halves of
    add.rn.bf16x2, ... mul.rn.bf16x2         r    r, r   sm_90  a 32-bit word, one HADD2

(PTX ISA "cvt", "Half Precision Floating-Point Instructions"; f8 forms from PTX 7.8 /
sm_89; the explicit `.rn` keeps ptxas from fusing a multiply and an add into one
rounding, which would differ from the emulator.) Every entry is `pure`: it prints as
plain `asm(...)`, so the compiler may schedule them like arithmetic. What a conversion
computes in the emulator is `tegula.emulate.values.round_to` (round to nearest even,
f8 saturating to the largest finite value), held against these instructions on hardware
by tests/gpu/test_cvt_entries.py.
"""
from __future__ import annotations

from tegula.arch.instructions import AsmOperand, Instruction
from tegula.errors import TegulaError

_SOURCE = "PTX ISA cvt; latency: ALU conversion, a few cycles (approximate)"
_HALF_SOURCE = ("PTX ISA half precision add/sub/mul; latency: HADD2/HMUL2 on the FMA pipe, "
                "a few cycles (approximate)")

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


def _cvt(ptx: str, dst: str, srcs: tuple[str, ...], min_cc: int,
         kind: str = "cvt", source: str = _SOURCE) -> Instruction:
    names = ("a", "b")[:len(srcs)]
    operands = (AsmOperand("d", "out", 1, dst),) + tuple(
        AsmOperand(n, "in", 1, c) for n, c in zip(names, srcs))
    template = ptx + " {d}, " + ", ".join("{" + n + "}" for n in names) + ";"
    return Instruction(name=ptx, kind=kind, ptx=ptx, template=template, operands=operands,
                       min_cc=min_cc, issue_cycles=1.0, latency_cycles=4.0, source=source,
                       pipe="alu", pure=True)


#: 16-bit float arithmetic: PTX name -> min_cc. One correctly rounded operation equals
#: the emulator's f32 operation rounded once (double rounding is innocuous for + - * when
#: 24 >= 2p + 2 bits: p = 11 for f16, 8 for bf16).
_HALF_ARITHMETIC = {f"{op}.rn.{t}{x2}": cc for t, cc in (("f16", 53), ("bf16", 90))
                    for op in ("add", "sub", "mul") for x2 in ("", "x2")}

CONVERT_INSTRUCTIONS: tuple[Instruction, ...] = tuple(
    _cvt(ptx, *form) for ptx, form in _FORMS.items()) + tuple(
    _cvt(ptx, *(("r", ("r", "r")) if ptx.endswith("x2") else ("h", ("h", "h"))), cc,
         kind="half", source=_HALF_SOURCE) for ptx, cc in _HALF_ARITHMETIC.items())
_BY_PTX = {i.name: i for i in CONVERT_INSTRUCTIONS}


def cvt(ptx: str) -> Instruction:
    """The conversion entry spelled `ptx` (e.g. "cvt.rn.bf16.f32")."""
    try:
        return _BY_PTX[ptx]
    except KeyError:
        raise TegulaError(f"no conversion {ptx!r} in the catalogue; it has "
                          f"{', '.join(_BY_PTX)}") from None
