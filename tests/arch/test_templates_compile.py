"""Every catalogue PTX template is well formed — checked on the CPU.

The code generator prints its own PTX, but the catalogue's `format_asm` templates are what
`tests/gpu` runs on hardware; a malformed template (a single-register vector operand
without braces, say) would otherwise only show up on a GPU. Here every template's operand
groups are checked against its declared operands, and one micro-kernel per instruction
(the same builders the hardware checks use) is compiled to a cubin for sm_90a — ptxas
rejects malformed PTX.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.arch.catalogue import ALL_INSTRUCTIONS, MMA_INSTRUCTIONS
from tegula.arch.instructions import template_groups
from tegula.runtime.compiler import available_compilers, compile_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import hwcheck as hw  # noqa: E402  (micro-kernel builders shared with the GPU tests)


@pytest.mark.parametrize("instr", ALL_INSTRUCTIONS, ids=lambda i: i.name)
def test_template_names_exactly_its_operands(instr):
    assert template_groups(instr.template) == {op.name for op in instr.operands}


def _every_raw_kernel() -> list:
    kernels = [hw.raw_mma_kernel(i.name) for i in MMA_INSTRUCTIONS]
    kernels += [hw.raw_matrix_kernel(op, num, trans) for op in ("ldmatrix", "stmatrix")
                for num in (1, 2, 4) for trans in (False, True)]
    kernels += [hw.raw_cp_async_kernel(n, "ca") for n in (4, 8, 16)]
    kernels += [hw.raw_cp_async_kernel(16, "cg")]
    kernels += [hw.raw_shuffle_kernel(mode) for mode in ("bfly", "idx", "down", "up")]
    return kernels


def test_every_template_assembles_for_sm_90a():
    if not available_compilers():
        pytest.skip("no CUDA compiler (NVRTC or nvcc) installed")
    kernels = _every_raw_kernel()
    names = [k.name for k in kernels]
    assert len(set(names)) == len(names), "raw kernels need distinct names"
    source = "\n".join(k.source for k in kernels)
    cubin = compile_cuda(source, names[0], "sm_90a")  # one translation unit, one ptxas run
    assert cubin[:4] == b"\x7fELF"
