"""tegula.arch: compilation targets and the instruction catalogue as data.

* `get_target(name)` -> `Target` ("sm_80", "sm_89", "sm_90a", "h200"; aliases "a100", "h100").
* `catalogue(target)` -> entries available on a target; `get_instruction(name)`,
  `get_mma(name)`, `mma_for(a, b, acc, target)` (best first), `mma_accumulators(a, b)`
  (what `tg.gemm` may accumulate in), `vector_access(op, space,
  nbytes)`, `cp_async(nbytes)`, `cp_async_sizes(target)`, `ldmatrix(num, trans)`, `stmatrix(num, trans)`,
  `shuffle(mode)`.
* Entries are frozen dataclasses (`MmaInstr`, `MemInstr`, `MatrixInstr`, `ShuffleInstr`)
  carrying operand TV layouts (`tegula.layout.Layout`), alignment, timing, and the PTX
  text through `format_asm(...)` (see `tegula.arch.instructions`).

Imports only `tegula.layout`, `tegula.dtypes` and `tegula.errors`.
"""
from __future__ import annotations

from tegula.arch.catalogue import (ALL_INSTRUCTIONS, catalogue, cp_async, cp_async_sizes,
                                   get_instruction,
                                   get_mma, ldmatrix, mma_accumulators, mma_for, shuffle,
                                   stmatrix, vector_access)
from tegula.arch.instructions import (AsmOperand, Instruction, MatrixInstr, MemInstr, MmaInstr,
                                      ShuffleInstr, ptx_type, tv_table)
from tegula.arch.memory import CP_ASYNC_COMMIT, cp_async_asm, cp_async_wait, matrix_tv
from tegula.arch.mma import MMA_INSTRUCTIONS
from tegula.arch.targets import SM80, SM89, SM90A, TARGETS, Target, get_target, target_for_cc

__all__ = [
    "ALL_INSTRUCTIONS", "catalogue", "cp_async", "cp_async_sizes", "get_instruction", "get_mma", "ldmatrix",
    "mma_accumulators", "mma_for", "shuffle", "stmatrix", "vector_access", "AsmOperand", "Instruction",
    "MatrixInstr", "MemInstr", "MmaInstr", "ShuffleInstr", "ptx_type", "tv_table",
    "CP_ASYNC_COMMIT", "cp_async_asm", "cp_async_wait", "matrix_tv", "MMA_INSTRUCTIONS",
    "SM80", "SM89", "SM90A", "TARGETS", "Target", "get_target", "target_for_cc",
    "describe_mma",
]


def describe_mma(name: str, title: str | None = None) -> str:
    """An SVG picture of an MMA atom's A, B and C fragments (cells coloured by lane)."""
    from tegula.layout.render import svg_mma_atom

    instr = get_mma(name)
    return svg_mma_atom(instr.a_tv, instr.b_tv, instr.c_tv, instr.shape_mnk,
                        title=title or instr.ptx)
