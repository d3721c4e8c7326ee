"""The `StMatrix` statement (`lower/async_ir.py`): the emulator's stmatrix (the entry's
`MatrixInstr.store`) writes what the hardware-checked host model of the catalogue entry
says (`tests/gpu/hwcheck.py` `expected_raw_matrix`, run against the GPU by
`tests/gpu/test_instructions.py`), for every .x{1,2,4} and .trans, with lanes addressing
rows out of order; the emitter prints the entry; bad input is refused."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.codegen import CodegenError, emit_cuda
from tegula.dtypes import f16, f32
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.lower.async_ir import StMatrix
from tegula.lower.thread_ir import (TID, Barrier, Const, GlobalLoad, GlobalStore, Reg, RegArray,
                                    SharedBuffer, SharedLoad, TensorParam, ThreadKernel)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
from hwcheck import expected_raw_matrix, row_slot  # noqa: E402


def stmatrix_kernel(num: int, trans: bool, dtype=f16) -> ThreadKernel:
    """Each lane loads its 2*num values from src[lane, :], one stmatrix with lane l
    addressing row slot `row_slot(l % 8num)` of the tile, then out[i] = tile[i]."""
    regs = RegArray("v", dtype, 2 * num)
    one = RegArray("o", f16, 1)
    rows = 8 * num
    lane = TID % 32
    address = ((lane % rows) * 5 + 3) % rows * 8       # the hwcheck kernel's row_slot
    body = [GlobalLoad(Reg(regs, Const(i)), "src", TID * (2 * num) + i, 1)
            for i in range(2 * num)]
    body += [StMatrix([Reg(regs, Const(i)) for i in range(2 * num)], num, trans, "tile",
                      address), Barrier()]
    for i in range(2 * num):
        body += [SharedLoad(Reg(one, Const(0)), "tile", TID * (2 * num) + i, 1),
                 GlobalStore("out", TID * (2 * num) + i, Reg(one, Const(0)), 1)]
    return ThreadKernel(f"st_{num}{'t' if trans else ''}", 32,
                        [TensorParam("src", dtype, 1), TensorParam("out", f16, 1, writes=True)],
                        [regs, one], [SharedBuffer("tile", f16, 64 * num, 0)], body)


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_emulated_stmatrix_matches_the_hardware_checked_model(num, trans):
    assert row_slot(3, 8 * num) == (3 * 5 + 3) % (8 * num)
    rng = np.random.default_rng(num + 10 * trans)
    bits = rng.integers(0x3C00, 0x4C00, (32, 2 * num)).astype(np.uint16)  # finite, distinct
    src = bits.view(np.float16).reshape(-1).copy()
    out = np.full(64 * num, np.nan, np.float16)
    run_thread_kernel(stmatrix_kernel(num, trans), 1, {"src": src, "out": out})
    words = bits.astype(np.uint32)
    words = (words[:, 0::2] | (words[:, 1::2] << 16)).astype(np.uint32)  # element 0 low
    expected = expected_raw_matrix("stmatrix", num, trans, words).astype(np.uint16)
    assert np.array_equal(out.view(np.uint16), expected)


def test_stmatrix_is_printed_from_its_entry_and_refused_before_sm90():
    source = emit_cuda(stmatrix_kernel(4, False), "sm_90a")
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" in source
    with pytest.raises(CodegenError, match="sm_80"):
        emit_cuda(stmatrix_kernel(4, False), "sm_80")


def test_stmatrix_of_32_bit_registers_is_refused():
    kernel = stmatrix_kernel(2, False, dtype=f32)
    with pytest.raises(EmulationError, match="16-bit elements"):
        run_thread_kernel(kernel, 1, {"src": np.zeros(128, np.float32),
                                      "out": np.zeros(128, np.float16)})
    with pytest.raises(CodegenError, match="16-bit elements"):
        emit_cuda(kernel, "sm_90a")
