"""Entries of `tg.last_arrival`: a block arrives on a global counter; the last one learns it.

    entry                              what it does
    atom.acq_rel.gpu.global.inc.u32    d = old = [addr]; [addr] = old >= b ? 0 : old + 1,
                                       atomically; acquire and release at GPU scope
    bar.red.or.pred                    a block barrier (barrier 0, every thread) that ORs
                                       one predicate over the block: every thread gets it

(PTX ISA "atom" — `.inc` wraps to 0 past its operand `b`, `.acq_rel` orders the thread's
earlier accesses before it and its later ones after it, at the `.gpu` scope — and "bar.red".)

How `tg.last_arrival` uses them (`codegen/arrivals.py`, emulated by `emulate/arrivals.py`):
a `bar.sync` so that the stores of every thread of the block precede thread 0's atomic;
thread 0's `atom.inc` with b = count − 1 (the `count`-th arrival reads count − 1 and leaves
0, ready for the next launch); `bar.red.or.pred` of "thread 0 read count − 1", which both
broadcasts the answer and orders thread 0's acquire before every thread's later loads. The
release half makes the block's stores visible to whoever acquires the counter later; the
acquire half makes every earlier arriver's stores visible to this block (the atomics on one
address form one release sequence).

`execute` is what the emulator computes; the cost is a global round trip (the atomic) and
two block barriers (the cost model charges them like `bar.sync`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tegula.arch.instructions import AsmOperand, Instruction

_SOURCE = "PTX ISA atom (.inc, .acq_rel, .gpu) and bar.red; latency as a global atomic " \
          "round trip (approximate)"


@dataclass(frozen=True)
class AtomIncInstr(Instruction):
    """`atom.acq_rel.gpu.global.inc.u32`: returns the old value, stores old + 1, or 0
    where old >= the bound operand."""

    def execute(self, old, bound) -> tuple[np.ndarray, np.ndarray]:
        """(value returned, new memory value) from the old u32 value(s) and the bound."""
        old = np.asarray(old, dtype=np.uint32)
        bound = np.asarray(bound, dtype=np.uint32)
        new = np.where(old >= bound, np.uint32(0), old + np.uint32(1)).astype(np.uint32)
        return old, new


@dataclass(frozen=True)
class BarrierReduceInstr(Instruction):
    """`bar.red.or.pred` on barrier 0 with every thread of the block: each thread gets the
    OR of every thread's predicate."""

    def execute(self, predicates) -> bool:
        """The result every thread gets from the block's predicates."""
        return bool(np.any(np.asarray(predicates)))


#: The counter's atomic increment (sm_70+: `.acq_rel` needs PTX ISA 6.0 and sm_70).
ATOM_INC_ACQ_REL = AtomIncInstr(
    name="atom.acq_rel.gpu.global.inc.u32", kind="atom.inc",
    ptx="atom.acq_rel.gpu.global.inc.u32",
    template="atom.acq_rel.gpu.global.inc.u32 {d}, [{addr}], {b};",
    operands=(AsmOperand("d", "out", 1, "r"), AsmOperand("addr", "in", 1, "l"),
              AsmOperand("b", "in", 1, "r")),
    min_cc=70, issue_cycles=1.0, latency_cycles=700.0, align_bytes=4, clobbers_memory=True,
    source=_SOURCE, pipe="global")

#: The block-wide OR that broadcasts thread 0's answer (CUDA's `__syncthreads_or`).
BAR_RED_OR = BarrierReduceInstr(
    name="bar.red.or.pred", kind="bar.red", ptx="bar.red.or.pred",
    template="{{ .reg .pred p, q; setp.ne.u32 p, {a}, 0; bar.red.or.pred q, 0, p; "
             "selp.u32 {d}, 1, 0, q; }}",
    operands=(AsmOperand("d", "out", 1, "r"), AsmOperand("a", "in", 1, "r")),
    min_cc=20, issue_cycles=1.0, latency_cycles=30.0, clobbers_memory=True,
    source=_SOURCE, pipe="sync")

ARRIVAL_INSTRUCTIONS: tuple[Instruction, ...] = (ATOM_INC_ACQ_REL, BAR_RED_OR)

__all__ = ["AtomIncInstr", "BarrierReduceInstr", "ATOM_INC_ACQ_REL", "BAR_RED_OR",
           "ARRIVAL_INSTRUCTIONS"]
