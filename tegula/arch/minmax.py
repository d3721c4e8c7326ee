"""NaN-propagating float max/min entries: what `tg.maximum` / `tg.minimum` (and max/min
reductions) are on f32.

    entry          d    a, b    from   what it does
    max.NaN.f32    f    f, f    sm_80  the larger operand; NaN if either operand is NaN
    min.NaN.f32    f    f, f    sm_80  the smaller operand; NaN if either operand is NaN

(PTX ISA "max", "min": the `.NaN` form; C's fmaxf/fminf return the other operand instead,
which is not torch.maximum.) One entry holds all three things the compiler needs: the PTX
the emitter prints (`format_asm`, through the `tg_max_nan` / `tg_min_nan` helpers of
`codegen/ptx.py`), what it computes (`execute`, which the emulator calls), and its cost
(one ALU instruction, `timing` / `pipe`). Held against hardware, NaN operands included,
by tests/gpu/test_issue8_regressions.py::test_nan_propagates_through_max_and_min.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tegula.arch.instructions import AsmOperand, Instruction
from tegula.errors import TegulaError

_SOURCE = "PTX ISA max/min (.NaN, sm_80); latency: FMNMX on the ALU, a few cycles (approximate)"


@dataclass(frozen=True)
class NanMinMaxInstr(Instruction):
    """`max.NaN.f32` / `min.NaN.f32`; `op` is "max" or "min"."""

    op: str = "max"

    def execute(self, a, b) -> np.ndarray:
        """What the instruction computes, on f32 arrays: numpy's maximum/minimum, which
        give NaN where either operand is NaN (as the `.NaN` form and torch do)."""
        fn = np.maximum if self.op == "max" else np.minimum
        with np.errstate(invalid="ignore"):
            return fn(np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32))


def _entry(op: str) -> NanMinMaxInstr:
    ptx = f"{op}.NaN.f32"
    return NanMinMaxInstr(
        name=ptx, kind="minmax", ptx=ptx, template=ptx + " {d}, {a}, {b};",
        operands=(AsmOperand("d", "out", 1, "f"), AsmOperand("a", "in", 1, "f"),
                  AsmOperand("b", "in", 1, "f")),
        min_cc=80, issue_cycles=1.0, latency_cycles=4.0, source=_SOURCE, pipe="alu",
        pure=True, op=op)


MINMAX_INSTRUCTIONS: tuple[NanMinMaxInstr, ...] = (_entry("max"), _entry("min"))
_BY_OP = {i.op: i for i in MINMAX_INSTRUCTIONS}


def nan_minmax(op: str) -> NanMinMaxInstr:
    """The NaN-propagating f32 entry for `op` ("max" or "min")."""
    try:
        return _BY_OP[op]
    except KeyError:
        raise TegulaError(f"no NaN-propagating f32 {op!r} in the catalogue; it has "
                          f"{', '.join(_BY_OP)}") from None
