"""Lowering `tg.gemm`: operand fragments into registers, then the warp's MMAs.

Synthesis planned the MMA atom, the warp grid and the tile-level fragment layouts; in
those layouts register `va + Va * (rp + RP * rq)` is value `va` of the atom instance at
repeat (rp, rq) — (m, k) for A, (n, k) for B, (m, n) for C. Operands already in registers
are read where their own layout holds those elements (`match_values`); shared operands
are loaded one k-step at a time with the planned instruction (ldmatrix or vector loads).
A gemm planned on wgmma (sm_90a) lowers in `lower/hopper.py` instead.
"""
from __future__ import annotations

import numpy as np

from tegula.errors import SynthesisError
from tegula.ir.ops import Gemm
from tegula.ir.values import RegisterTile, SharedTile, describe
from tegula.layout.tv import match_values, tv_table
from tegula.lower.context import LoweringContext, reg
from tegula.lower.copy import load_shared_to_registers
from tegula.lower.hopper import is_wgmma, lower_wgmma_gemm
from tegula.lower.thread_ir import Comment, Mma


def _registers_for(ctx: LoweringContext, tile, plan_tv, name: str, op: Gemm):
    """(register array, index map plan value -> array register) for one gemm operand."""
    if isinstance(tile, RegisterTile):
        found = match_values(tile.layout, tv_table(plan_tv))
        if found is None:
            raise SynthesisError(f"internal: gemm operand {describe(tile)} is not in the MMA's "
                                 f"fragment layout", loc=op.loc)
        return ctx.regs_of(tile), found
    if isinstance(tile, SharedTile):
        array = ctx.temp_regs(f"{name}_frag", tile.dtype, plan_tv[1].size)
        return array, np.arange(plan_tv[1].size)
    raise SynthesisError(f"gemm operand {describe(tile)} must be in shared memory or registers",
                         loc=op.loc)


def lower_gemm(ctx: LoweringContext, op: Gemm) -> list:
    if is_wgmma(op):
        return lower_wgmma_gemm(ctx, op)
    plan = op.choices["plan"]
    atom = plan.atom
    rm_count, rn_count, rk_count = plan.repeats
    va, vb, vc = atom.a_tv[1].size, atom.b_tv[1].size, atom.c_tv[1].size
    c_regs, c_map = _registers_for(ctx, op.c, plan.c_tv, "c", op)
    a_regs, a_map = _registers_for(ctx, op.a, plan.a_tv, "a", op)
    b_regs, b_map = _registers_for(ctx, op.b, plan.b_tv, "b", op)
    stmts: list = [Comment(f"gemm {describe(op.c)} += {describe(op.a)} @ {describe(op.b)}^T: "
                           f"{plan.describe()}")]
    for rk in range(rk_count):
        a_values = [x + va * (rm + rm_count * rk) for rm in range(rm_count) for x in range(va)]
        b_values = [x + vb * (rn + rn_count * rk) for rn in range(rn_count) for x in range(vb)]
        if isinstance(op.a, SharedTile):
            stmts += load_shared_to_registers(ctx, op.a, plan.a_tv, a_regs, op.choices["a_shared"],
                                              a_values)
        if isinstance(op.b, SharedTile):
            stmts += load_shared_to_registers(ctx, op.b, plan.b_tv, b_regs, op.choices["b_shared"],
                                              b_values)
        for rm in range(rm_count):
            for rn in range(rn_count):
                c = [reg(c_regs, c_map[x + vc * (rm + rm_count * rn)]) for x in range(vc)]
                a = [reg(a_regs, a_map[x + va * (rm + rm_count * rk)]) for x in range(va)]
                b = [reg(b_regs, b_map[x + vb * (rn + rn_count * rk)]) for x in range(vb)]
                stmts.append(Mma(atom.name, d=c, a=a, b=b, c=c))
    return stmts
