"""The blockwise FP8 kernel two K blocks a stage (TWIN=1, session 14): both products
fresh, issued back to back, the first promoted while the second's wgmmas run. The sm_90a
build issues both products before any wait (the SASS, where ptxas and cuobjdump are at
hand); a BN spanning two b scale blocks is refused. (Emulated against the reference in
`test_fp8.py::test_blockwise_persistent`.)"""
from __future__ import annotations

import re

import numpy as np
import pytest

from tegula.dtypes import bf16
from tegula.kernels.fp8 import matmul_fp8_emulated


def test_twin_needs_one_b_scale_a_tile():
    a = np.zeros((64, 128), np.float32)
    with pytest.raises(ValueError, match="TWIN=1 needs a BN dividing 128"):
        matmul_fp8_emulated(a, np.zeros((192, 128), np.float32), np.ones((64, 1)),
                            np.ones((2, 1)), bf16, block_scales=True, persistent=2, BN=192,
                            TWIN=1)


def test_twin_issues_both_products_before_waiting():
    """ptxas keeps the two products in flight together: the second product's QGMMAs
    follow the first's with no `WARPGROUP.DEPBAR` between, and the first wait leaves one
    group pending (without `lower/fresh_accumulators.py` ptxas waited for all)."""
    from tegula.build import build
    from tegula.kernels.fp8 import fp8_blockwise_persistent_kernel
    from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble
    if not available_compilers():
        pytest.skip("neither NVRTC nor nvcc found")
    result = build(fp8_blockwise_persistent_kernel(bf16), dict(
        BM=128, BN=128, STAGES=2, GROUP=8, TWIN=1, threads=256), None, "sm_90a")
    sass = disassemble(compile_cuda(result.cuda_source(), result.thread_kernel.name,
                                    "sm_90a"))
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    ops = re.findall(r"(QGMMA\S*|WARPGROUP\.DEPBAR\.LE gsb0, 0x\d)", sass)
    first_wait = next(i for i, op in enumerate(ops) if op.startswith("WARPGROUP"))
    assert ops[:first_wait] == ["QGMMA.64x128x32.F32.E4M3.E4M3"] * 8, ops[:first_wait + 1]
    assert ops[first_wait] == "WARPGROUP.DEPBAR.LE gsb0, 0x1"
    assert not re.search(r"\b(LDL|STL)\b", sass), "spills"
