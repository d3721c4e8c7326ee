"""The blockwise FP8 kernel two K blocks a stage (TWIN=1, session 14): both products
fresh, issued back to back, the first promoted while the second's wgmmas run. Emulated
against the float64 reference at ragged M/N, K with an odd number of 128-wide blocks (the
last stage's twin past K) and K not a multiple of 128; the sm_90a build issues both
products before any wait (the SASS, where ptxas and cuobjdump are at hand)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.dtypes import bf16, f32
from tegula.kernels.fp8 import matmul_fp8_emulated, scale_shapes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fp8 import check_close, e4m3, expanded_scales   # noqa: E402 (beside us)


@pytest.mark.parametrize("shape,tiles,sms", [
    ((130, 100, 384), dict(BM=64, BN=64, GROUP=2), 3),        # 3 K blocks: twin past K
    ((70, 129, 208), dict(BM=64, BN=128, GROUP=1), 2),        # K = 128 + 80
    ((200, 150, 384), dict(BM=64, BN=64, GROUP=2, CLUSTER=2), 4),   # b multicast
    ((150, 70, 512), dict(BM=128, BN=64, GROUP=2, threads=256, role_order="random:5"), 2)])
def test_twin_blockwise_matches_the_reference(shape, tiles, sms):
    m, n, k = shape
    rng = np.random.default_rng(m + 5 * n + k)
    a, b = e4m3(rng, (m, k)), e4m3(rng, (n, k))
    shape_a, shape_b = scale_shapes(m, n, k, True)
    scale_a = (10.0 ** rng.uniform(-2, 2, shape_a)).astype(np.float32)
    scale_b = (10.0 ** rng.uniform(-2, 2, shape_b)).astype(np.float32)
    c = matmul_fp8_emulated(a, b, scale_a, scale_b, f32, block_scales=True, persistent=sms,
                            STAGES=2, TWIN=1, **tiles)
    sa, sb = expanded_scales(scale_a, scale_b, m, n, k)
    check_close(c, (a * sa) @ (b * sb).T, np.abs(a * sa) @ np.abs(b * sb).T, k, f32)


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
