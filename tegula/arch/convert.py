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
    cvt.rzi.s32.f32                  r    f           all    f32 -> s32 toward zero,
                                                             saturating, NaN -> 0
    cvt.rn.f32.s32                   f    r           all    s32 -> f32, nearest even

The two integer conversions run at a quarter of the FP32 rate (16 a clock per SM on
sm_80 and sm_90: the CUDA programming guide's throughput table), on the unit of the
special functions (`pipe="sfu"`); narrower integer types convert through them (a clamp
to i8/u8 after `cvt.rzi.s32.f32`; i8/u8/i4/u4 to float by the emitter's magic-number
add instead, two ALU operations, `codegen/expr.py`).

and 16-bit float arithmetic, which narrow-integer conversions and f16/bf16 element ops
use instead of a round trip through f32 (`codegen/expr.py`):

    add.rn.f16, sub.rn.f16, mul.rn.f16       h    h, h   sm_53  one correctly rounded op
    add.rn.bf16, sub.rn.bf16, mul.rn.bf16    h    h, h   sm_90  (ptxas pairs them: HADD2)
    add.rn.f16x2, sub.rn.f16x2, mul.rn.f16x2 r    r, r   sm_53  the same on two halves of
    add.rn.bf16x2, ... mul.rn.bf16x2         r    r, r   sm_90  a 32-bit word, one HADD2

(PTX ISA "cvt", "Half Precision Floating-Point Instructions"; f8 forms from PTX 7.8 /
sm_89; the explicit `.rn` keeps ptxas from fusing a multiply and an add into one
rounding, which would differ from the emulator.) Every entry is `pure`: it prints as
plain `asm(...)`, so the compiler may schedule them like arithmetic.

Each entry also states what it computes, which the emulator calls: a conversion's
`convert(x)` (each source element to the result type: round to nearest even, f8
saturating to the largest finite value, `arch.formats`), a 16-bit operation's
`execute(a, b)` (the f32 operation rounded once to the type). `rounding_to(dtype)` is the
entry that rounds f32 to a 16- or 8-bit float (`emulate.values.round_to` rounds every
register and memory write through it) and `half_arithmetic(op, dtype)` the one for a 16-bit
+ - *. Held against hardware bit for bit by tests/gpu/test_cvt_entries.py (conversions, through
the emulator) and tests/gpu/test_entry_semantics_gpu.py (16-bit arithmetic, and the
emitter's software forms below each entry's min_cc).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tegula.arch.formats import bf16_bits, bf16_from_bits, f8_decode, f8_encode
from tegula.arch.instructions import AsmOperand, Instruction
from tegula.dtypes import DType, bf16, f8e4m3, f8e5m2, f16, f32, i32
from tegula.errors import TegulaError

_SOURCE = "PTX ISA cvt; latency: ALU conversion, a few cycles (approximate)"
_HALF_SOURCE = ("PTX ISA half precision add/sub/mul; latency: HADD2/HMUL2 on the FMA pipe, "
                "a few cycles (approximate)")

# PTX name -> (destination constraint, source constraints, min_cc, result type)
_FORMS = {
    "cvt.f32.f16": ("f", ("h",), 53, f32),
    "cvt.rn.f16.f32": ("h", ("f",), 53, f16),
    "cvt.rn.bf16.f32": ("h", ("f",), 80, bf16),
    "cvt.rn.f16x2.f32": ("r", ("f", "f"), 80, f16),
    "cvt.rn.bf16x2.f32": ("r", ("f", "f"), 80, bf16),
    "cvt.rn.satfinite.e4m3x2.f32": ("h", ("f", "f"), 89, f8e4m3),
    "cvt.rn.satfinite.e5m2x2.f32": ("h", ("f", "f"), 89, f8e5m2),
    "cvt.rn.f16x2.e4m3x2": ("r", ("h",), 89, f16),
    "cvt.rn.f16x2.e5m2x2": ("r", ("h",), 89, f16),
}


def round_f32(x, to: DType) -> np.ndarray:
    """float32 values `x` rounded to nearest even into `to` (f32, f16, bf16 or an f8,
    saturating), in `to`'s emulator storage (float16 for f16, float32 otherwise)."""
    x = np.asarray(x, dtype=np.float32)
    if to == f32:
        return x
    if to == f16:
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if to == bf16:
        return bf16_from_bits(bf16_bits(x))
    return f8_decode(f8_encode(x, to), to)


@dataclass(frozen=True)
class ConvertInstr(Instruction):
    """A `cvt` entry; `to` the type each source element becomes (an x2 form converts
    both of its sources alike)."""

    to: DType = f32

    def convert(self, x) -> np.ndarray:
        """What the instruction makes of each source element, in `to`'s emulator storage.
        Sources narrower than the result (f16 -> f32, f8 -> f16) convert exactly."""
        return round_f32(np.asarray(x, dtype=np.float32), self.to)


@dataclass(frozen=True)
class HalfArithInstr(Instruction):
    """`{add,sub,mul}.rn.{f16,bf16}[x2]`: one correctly rounded 16-bit operation (on each
    half of a 32-bit word for x2)."""

    to: DType = f16
    op: str = "add"

    def execute(self, a, b) -> np.ndarray:
        """The operation on (f32 values of) a and b, rounded once to `to`: equal to the
        instruction's correctly rounded result (double rounding is innocuous for + - *
        when 24 >= 2p + 2 bits: p = 11 for f16, 8 for bf16)."""
        a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
        with np.errstate(all="ignore"):
            exact = a + b if self.op == "add" else a - b if self.op == "sub" else a * b
        return round_f32(exact, self.to)


@dataclass(frozen=True)
class IntConvertInstr(ConvertInstr):
    """`cvt.rzi.s32.f32` (`to` i32) or `cvt.rn.f32.s32` (`to` f32): conversions between
    f32 and s32 (PTX ISA cvt: a float-to-integer conversion saturates to the destination
    range by default, NaN giving 0)."""

    def convert(self, x) -> np.ndarray:
        """f32 -> s32: toward zero, saturating, NaN -> 0 (int32); s32 -> f32: nearest even
        (float32). Float inputs are taken exactly (float64 sums too), integer ones as
        int64."""
        x = np.asarray(x)
        if self.to == i32:
            with np.errstate(invalid="ignore"):
                t = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
            return np.clip(t, -2.0**31, 2.0**31 - 1).astype(np.int32)
        return x.astype(np.int64).astype(np.float32)  # rounds to nearest even


def _int_cvt(ptx: str, dst: str, src: str, to: DType) -> IntConvertInstr:
    # 16 results a clock per SM (a warp instruction every 8 cycles on each of the four
    # sub-partitions), as the special-function unit's.
    return IntConvertInstr(
        name=ptx, kind="cvt", ptx=ptx, template=ptx + " {d}, {a};",
        operands=(AsmOperand("d", "out", 1, dst), AsmOperand("a", "in", 1, src)),
        min_cc=50, issue_cycles=8.0, latency_cycles=6.0, pipe="sfu", pure=True, to=to,
        source="PTX ISA cvt; rate: CUDA programming guide's arithmetic throughput table "
               "(conversions from and to 32-bit integers, 16/clk/SM on cc 8.x and 9.0)")


def _cvt(ptx: str, dst: str, srcs: tuple[str, ...], min_cc: int, to: DType,
         op: str = "") -> Instruction:
    names = ("a", "b")[:len(srcs)]
    operands = (AsmOperand("d", "out", 1, dst),) + tuple(
        AsmOperand(n, "in", 1, c) for n, c in zip(names, srcs))
    template = ptx + " {d}, " + ", ".join("{" + n + "}" for n in names) + ";"
    common = dict(name=ptx, ptx=ptx, template=template, operands=operands, min_cc=min_cc,
                  issue_cycles=1.0, latency_cycles=4.0, pipe="alu", pure=True, to=to)
    if op:
        return HalfArithInstr(kind="half", source=_HALF_SOURCE, op=op, **common)
    return ConvertInstr(kind="cvt", source=_SOURCE, **common)


#: 16-bit float arithmetic: PTX name -> (op, type, min_cc).
_HALF_ARITHMETIC = {f"{op}.rn.{t.name}{x2}": (op, t, cc) for t, cc in ((f16, 53), (bf16, 90))
                    for op in ("add", "sub", "mul") for x2 in ("", "x2")}

#: The conversions between f32 and s32.
FLOAT_TO_INT = _int_cvt("cvt.rzi.s32.f32", "r", "f", i32)
INT_TO_FLOAT = _int_cvt("cvt.rn.f32.s32", "f", "r", f32)

CONVERT_INSTRUCTIONS: tuple[Instruction, ...] = tuple(
    _cvt(ptx, *form) for ptx, form in _FORMS.items()) + tuple(
    _cvt(ptx, *(("r", ("r", "r")) if ptx.endswith("x2") else ("h", ("h", "h"))), cc, t, op)
    for ptx, (op, t, cc) in _HALF_ARITHMETIC.items()) + (FLOAT_TO_INT, INT_TO_FLOAT)
_BY_PTX = {i.name: i for i in CONVERT_INSTRUCTIONS}
_ROUNDING = {f16: "cvt.rn.f16.f32", bf16: "cvt.rn.bf16.f32",
             f8e4m3: "cvt.rn.satfinite.e4m3x2.f32", f8e5m2: "cvt.rn.satfinite.e5m2x2.f32"}


def rounding_to(dt: DType) -> ConvertInstr:
    """The entry that rounds f32 to the 16- or 8-bit float type `dt`."""
    try:
        return _BY_PTX[_ROUNDING[dt]]
    except KeyError:
        raise TegulaError(f"no conversion from f32 to {dt} in the catalogue; it rounds to "
                          f"{', '.join(map(str, _ROUNDING))}") from None


def half_arithmetic(op: str, dt: DType, pair: bool = False) -> HalfArithInstr:
    """The 16-bit float entry computing `op` ("add", "sub", "mul") on `dt` (f16, bf16),
    the x2 form if `pair`."""
    return cvt(f"{op}.rn.{dt.name}{'x2' if pair else ''}")


def cvt(ptx: str) -> Instruction:
    """The conversion entry spelled `ptx` (e.g. "cvt.rn.bf16.f32")."""
    try:
        return _BY_PTX[ptx]
    except KeyError:
        raise TegulaError(f"no conversion {ptx!r} in the catalogue; it has "
                          f"{', '.join(_BY_PTX)}") from None
