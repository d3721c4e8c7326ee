"""wgmma operands on the GPU (issue 9 §2): MN-major (transposed) f16/bf16 operands and K
rows over several swizzle spans, over every swizzle mode (128, 64, 32 B and none) x
major-ness x dtype, against a float64 reference on random data with the output poisoned
(NaN) first, and against the emulator, which reads the same descriptors
(tests/synth/test_gemm_wgmma_operands.py has the kernel and the CPU checks)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "synth"))
from gpu_helpers import to_device  # noqa: E402
from test_gemm_wgmma_operands import KERNELS, plan_of, random_operands, reference  # noqa: E402

from tegula.dtypes import bf16, f16  # noqa: E402

pytestmark = pytest.mark.gpu

# (id, TA, TB, tiles, the buffers' swizzles (A, B)): each swizzle mode appears K-major and
# MN-major; the contiguous dims of several spans both ways.
CASES = [
    ("K-K-bk128", False, False, dict(BK=128), (128, 128)),
    ("K-K-bk32", False, False, dict(BK=32), (64, 64)),
    ("K-K-bk48", False, False, dict(BK=48), (32, 32)),
    ("MN-MN-2wg", True, True, dict(BM=128, BN=128, BK=64, threads=256), (128, 128)),
    ("K-MN-n32", False, True, dict(BN=32, BK=32), (64, 64)),
    ("MN-MN-n16-bk16", True, True, dict(BN=16, BK=16), (128, 32)),
    ("K-MN-n24-interleave", False, True, dict(BN=24, BK=32), (64, 0)),
    ("MN-K-bk256", True, False, dict(BK=256, BN=128), (128, 128)),
]


@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("name,ta,tb,tiles,swizzles", CASES, ids=[c[0] for c in CASES])
def test_wgmma_operand_forms_match_the_reference_and_the_emulator(dtype, name, ta, tb, tiles,
                                                                  swizzles):
    import torch

    import tegula as tg
    from tegula.build import build
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU for sm_90a")
    kernel = KERNELS[dtype]
    plan = plan_of(build(kernel, dict(tiles, TA=ta, TB=tb), None, "sm_90a"))
    assert plan.kind == "wgmma" and (plan.swizzle_a, plan.swizzle_b) == swizzles, plan.describe()
    assert (plan.trans_a, plan.trans_b) == (int(ta), int(tb))
    m, n, k = 200, 136, 3 * tiles.get("BK", 64) + 40
    rng = np.random.default_rng(hash(name) % 1000)
    a, b = random_operands(rng, dtype, m, n, k, ta, tb)
    at, bt = to_device(a, dtype), to_device(b, dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    grid = (tg.cdiv(m, tiles.get("BM", 64)), tg.cdiv(n, tiles.get("BN", 64)))
    kernel[grid](at, bt, c, TA=ta, TB=tb, target="sm_90a", **tiles)
    torch.cuda.synchronize()
    got = c.cpu().numpy()
    ref = reference(a, b, ta, tb)
    scale = (np.abs(a).T if ta else np.abs(a)).astype(np.float64) @ \
        (np.abs(b) if tb else np.abs(b).T)
    assert not np.isnan(got).any()
    assert np.all(np.abs(got - ref) <= 2.0 ** -20 * scale + 1e-6), np.abs(got - ref).max()
    if dtype == f16:  # the emulator reads the same descriptors (once per form is enough)
        emulated = np.full((m, n), np.nan, np.float32)
        tg.emulate(kernel, grid, a, b, emulated, TA=ta, TB=tb, target="sm_90a", **tiles)
        assert np.all(np.abs(got - emulated) <= 2.0 ** -20 * scale + 1e-6)


@pytest.mark.parametrize("dtype,bk,rel", [("f8e4m3", 256, 2.0 ** -11), ("f32", 64, 2.0 ** -20)],
                         ids=["e4m3-bk256", "tf32-bk64"])
def test_k_major_8_bit_and_tf32_rows_of_two_spans(dtype, bk, rel):
    """8-bit and tf32 (f32 data) operands stay K-major; their 256-byte K rows are two
    128-byte swizzle blocks, two TMA boxes and descriptors started per block. FP8 wgmma
    keeps ~14 bits of its running sum per k32 instruction (arch/wgmma.py), hence its
    looser bound; tf32 is compared with the operands truncated as the tensor cores read
    them."""
    import torch

    import tegula as tg
    from tegula.arch.wgmma import truncate_to_tf32
    from tegula.build import build
    from tegula.dtypes import f8e4m3, f32
    from tegula.kernels.common import random_input
    from test_gemm_wgmma_operands import gemm_kernel
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU for sm_90a")
    dt = {"f8e4m3": f8e4m3, "f32": f32}[dtype]
    kernel = gemm_kernel(dt)
    plan = plan_of(build(kernel, dict(BK=bk), None, "sm_90a"))
    assert plan.kind == "wgmma" and plan.swizzle_b == 128, plan.describe()
    m, n, k = 150, 130, 3 * bk + 40
    rng = np.random.default_rng(21)
    a, b = random_input(rng, (m, k), dt), random_input(rng, (n, k), dt)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    kernel[(3, 3)](to_device(a, dt), to_device(b, dt), c, BK=bk, target="sm_90a")
    torch.cuda.synchronize()
    got = c.cpu().numpy()
    if dt == f32:
        a, b = truncate_to_tf32(a), truncate_to_tf32(b)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T
    assert not np.isnan(got).any()
    assert np.all(np.abs(got - ref) <= rel * scale + 1e-6), np.abs(got - ref).max()
