"""The three-input logic entry: what two chained bitwise ops with constants print as.

    entry      d    a, b, c, lut    from   what it does
    lop3.b32   r    r, n, n, n      sm_50  any bitwise function of a, b, c (its truth
                                           table `lut`); here b and c are constants

(PTX ISA "lop3".) The emitter prints `(x & m) | c` — two tile ops of a kernel source,
e.g. the W4A16 dequantization's mask and magic number (`kernels/quant_fragment.py`) —
as one `lop3.b32` with both constants immediate (`codegen/cuda.py`, `tg_lop3`). Left
as `and.b32` and `or.b32`, ptxas fuses them into one LOP3 too, but then moves one of the
constants into a fresh register before every use (one MOV a LOP3: 43 of the W4A16 16-token
kernel's 530 SASS a k-step); given the lop3 it keeps the constant in one register.
What it computes is `execute`, bit for bit what the two ops compute (the emulator runs
the ops themselves), held against hardware by tests/gpu/test_quant_gpu.py's fragment
kernels (every dequantized weight passes through it).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from tegula.arch.instructions import AsmOperand, Instruction

_SOURCE = "PTX ISA lop3; latency: LOP3 on the integer ALU, half rate on sm_90 (approximate)"

#: The truth-table inputs of lop3: bit i of the LUT is f(A_i, B_i, C_i) for these bytes.
LUT_A, LUT_B, LUT_C = 0xF0, 0xCC, 0xAA
#: The bitwise ops the emitter fuses, by thread IR name.
BITWISE = {"and": operator.and_, "or": operator.or_, "xor": operator.xor}


def lut_of(inner: str, outer: str) -> int:
    """The LUT of `outer(inner(a, b), c)` for bitwise op names ("and", "or", "xor")."""
    return BITWISE[outer](BITWISE[inner](LUT_A, LUT_B), LUT_C) & 0xFF


@dataclass(frozen=True)
class Lop3Instr(Instruction):
    """`lop3.b32 d, a, b, c, lut` with b, c and lut compile-time constants."""

    def execute(self, a, b: int, c: int, lut: int) -> np.ndarray:
        """What the instruction computes on uint32 arrays: for every bit, bit
        (4a + 2b + c) of `lut` — the truth table read as `lut_of` writes it."""
        a = np.asarray(a, dtype=np.uint32)
        b, c = np.uint32(b & 0xFFFFFFFF), np.uint32(c & 0xFFFFFFFF)
        out = np.zeros_like(a)
        for i in range(8):   # the minterm (A, B, C) = bits of i, set where the LUT says so
            if lut >> i & 1:
                terms = [x if i >> s & 1 else ~x for x, s in ((a, 2), (b, 1), (c, 0))]
                out |= terms[0] & terms[1] & terms[2]
        return out


LOP3 = Lop3Instr(
    name="lop3.b32", kind="logic", ptx="lop3.b32",
    template="lop3.b32 {d}, {a}, {b}, {c}, {lut};",
    operands=(AsmOperand("d", "out", 1, "r"), AsmOperand("a", "in", 1, "r"),
              AsmOperand("b", "in", 1, "n"), AsmOperand("c", "in", 1, "n"),
              AsmOperand("lut", "in", 1, "n")),
    min_cc=50, issue_cycles=2.0, latency_cycles=4.0, source=_SOURCE, pipe="alu", pure=True)

LOGIC_INSTRUCTIONS: tuple[Instruction, ...] = (LOP3,)
