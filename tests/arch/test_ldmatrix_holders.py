"""ldmatrix's inverse questions, answered by the entry (issue 9 §1): which lane and
register receive an element (`holder`, synthesis's bank/vector planning) and which hold
the start of the row an address lane supplies (`row_holder`, lowering's row addresses).
Both are read off the entry's TV layout; here they are held against the PTX ISA's
fragment formulas, written out independently, and the symbolic form lowering prints is
held against the integer one on every lane."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.arch.catalogue import ldmatrix
from tegula.emulate.exprs import compile_expr
from tegula.errors import TegulaError
from tegula.lower.thread_ir import TID

ENTRIES = [(num, trans) for num in (1, 2, 4) for trans in (False, True)]


def _ptx_holder(matrix: int, row: int, col: int, trans: bool) -> tuple[int, int]:
    """PTX ISA, "Matrix fragments for ldmatrix": without .trans lane 4r + c/2 holds
    (row r, cols c, c+1) of each matrix; with .trans the matrix is transposed on the way,
    so lane 4c + r/2 holds (rows r, r+1, col c). Register j is matrix j."""
    if trans:
        return 4 * col + row // 2, 2 * matrix + row % 2
    return 4 * row + col // 2, 2 * matrix + col % 2


@pytest.mark.parametrize("num,trans", ENTRIES)
def test_holder_is_the_ptx_fragment_table(num, trans):
    instr = ldmatrix(num, trans)
    for j in range(num):
        for r in range(8):
            for c in range(8):
                assert instr.holder(j, r, c) == _ptx_holder(j, r, c, trans), (j, r, c)
    with pytest.raises(TegulaError, match=f"ldmatrix.x{num}.*matrix {num}"):
        instr.holder(num, 0, 0)


@pytest.mark.parametrize("num,trans", ENTRIES)
def test_row_holder_names_the_holder_of_each_rows_first_element(num, trans):
    instr = ldmatrix(num, trans)
    lanes = np.arange(instr.address_lanes)
    for lane in lanes:
        assert instr.row_holder(int(lane)) == instr.holder(lane // 8, lane % 8, 0)
    vector_lane, vector_value = instr.row_holder(lanes)        # numpy lanes, one call
    expected = [instr.holder(t // 8, t % 8, 0) for t in lanes]
    assert list(zip(vector_lane.tolist(), vector_value.tolist())) == expected


@pytest.mark.parametrize("trans", [False, True])
def test_row_holder_of_the_thread_index_evaluates_per_lane(trans):
    """Lowering calls row_holder on the thread-IR lane `tid % 32`: evaluated for two warps'
    threads, it gives each lane's integer answer (address lanes past 8*num included:
    their addresses are ignored, but the expression must still be defined)."""
    instr = ldmatrix(4, trans)
    holder_lane, holder_value = instr.row_holder(TID % 32)
    tid = np.arange(64)
    env = {"tid": tid}
    got_lane = np.broadcast_to(compile_expr(holder_lane)(env), tid.shape)
    got_value = np.broadcast_to(compile_expr(holder_value)(env), tid.shape)
    for t in tid:
        assert (got_lane[t], got_value[t]) == instr.row_holder(int(t) % 32)
