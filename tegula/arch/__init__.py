"""tegula.arch: compilation targets and the instruction catalogue as data.

* `get_target(name)` -> `Target` ("sm_80", "sm_89", "sm_90a", "h200"; aliases "a100", "h100").
* `catalogue(target)` -> entries available on a target; `get_instruction(name)`,
  `get_mma(name)`, `mma_for(a, b, acc, target)` (best first), `mma_accumulators(a, b)`
  (what `tg.gemm` may accumulate in), `vector_access(op, space,
  nbytes)`, `cp_async(nbytes)`, `cp_async_sizes(target)`, `ldmatrix(num, trans)`, `stmatrix(num, trans)`,
  `shuffle(mode)`.
* Hopper: `get_wgmma(name)`, `wgmma_for(a, b, acc, n)` (`tegula.arch.wgmma`); TMA boxes,
  mbarriers, bulk groups, fences, named barriers, setmaxnreg (`tegula.arch.tma`:
  `tma_box_addresses`, `tma_box_copy`, `get_async`, `bulk_wait`, `wgmma_wait`,
  `setmaxnreg`); shared-memory swizzle and wgmma descriptors, one definition for all
  (`tegula.arch.smem_matrix`: `swizzle_bytes_address`, `encode_descriptor`,
  `descriptor_element_addresses`, `canonical_smem_layout`, `operand_descriptor`).
* Entries are frozen dataclasses (`MmaInstr`, `MemInstr`, `MatrixInstr`, `ShuffleInstr`,
  `WgmmaInstr`, `AsyncInstr`)
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
from tegula.arch.smem_matrix import (MatrixDescriptor, canonical_smem_layout,
                                     decode_descriptor, descriptor_element_addresses,
                                     encode_descriptor, operand_descriptor,
                                     swizzle_bytes_address)
from tegula.arch.targets import SM80, SM89, SM90, SM90A, TARGETS, Target, get_target, target_for_cc
from tegula.arch.tma import (ASYNC_INSTRUCTIONS, AsyncInstr, bulk_wait, get_async, setmaxnreg,
                             tma_box_addresses, tma_box_copy, tma_load, tma_reduce_add, tma_store,
                             wgmma_wait)
from tegula.arch.wgmma import WGMMA_INSTRUCTIONS, WgmmaInstr, get_wgmma, wgmma_for

__all__ = [
    "ALL_INSTRUCTIONS", "catalogue", "cp_async", "cp_async_sizes", "get_instruction", "get_mma", "ldmatrix",
    "mma_accumulators", "mma_for", "shuffle", "stmatrix", "vector_access", "AsmOperand", "Instruction",
    "MatrixInstr", "MemInstr", "MmaInstr", "ShuffleInstr", "ptx_type", "tv_table",
    "CP_ASYNC_COMMIT", "cp_async_asm", "cp_async_wait", "matrix_tv", "MMA_INSTRUCTIONS",
    "SM80", "SM89", "SM90", "SM90A", "TARGETS", "Target", "get_target", "target_for_cc",
    "describe_mma", "MatrixDescriptor", "canonical_smem_layout", "decode_descriptor",
    "descriptor_element_addresses", "encode_descriptor", "operand_descriptor",
    "swizzle_bytes_address", "ASYNC_INSTRUCTIONS", "AsyncInstr", "bulk_wait", "get_async",
    "setmaxnreg", "tma_box_addresses", "tma_box_copy", "tma_load", "tma_reduce_add", "tma_store",
    "wgmma_wait",
    "WGMMA_INSTRUCTIONS", "WgmmaInstr", "get_wgmma", "wgmma_for",
]


def describe_mma(name: str, title: str | None = None) -> str:
    """An SVG picture of an MMA atom's A, B and C fragments (cells coloured by lane)."""
    from tegula.layout.render import svg_mma_atom

    instr = get_mma(name)
    return svg_mma_atom(instr.a_tv, instr.b_tv, instr.c_tv, instr.shape_mnk,
                        title=title or instr.ptx)
