"""Subnormal f32 results of the tensor-core entries on hardware (`pytest -m gpu`): do
`mma.sync` and `wgmma` keep f32 sums below 2^-126, as the emulator does, or flush them
the way `red.global.add.f32` does (found in session 10)? bf16 operands near 2^-66 make
every product and every partial sum an f32 subnormal (f16 operands cannot: their
products are multiples of 2^-48). The README GEMM, bf16 -> f32, both paths, against the
emulator: a flushed sum would be 0 where the emulator has ~1e-39."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import bf16, f32
from tegula.emulate import round_to

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemm_fixtures import readme_gemm  # noqa: E402

GEMM = readme_gemm(bf16, f32, f32, BM=64, BN=64, BK=32, STAGES=2)


@pytest.mark.parametrize("target", ["sm_90a", "sm_90"], ids=["wgmma", "mma.sync"])
def test_subnormal_sums_as_the_emulator(target):
    m, n, k = 64, 64, 64
    rng = np.random.default_rng(9)
    scale = np.float32(2.0 ** -66)
    a = round_to(rng.standard_normal((m, k)).astype(np.float32) * scale, bf16)
    b = round_to(rng.standard_normal((n, k)).astype(np.float32) * scale, bf16)
    emulated = np.full((m, n), np.nan, np.float32)
    tg.emulate(GEMM, (1, 1), a, b, emulated, target=target)
    assert (np.abs(emulated) < np.finfo(np.float32).tiny).mean() > 0.9  # subnormal sums
    at = torch.from_numpy(a).to(torch.bfloat16).cuda()
    bt = torch.from_numpy(b).to(torch.bfloat16).cuda()
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    GEMM[(1, 1)](at, bt, c, target=target)
    torch.cuda.synchronize()
    got = c.cpu().numpy()
    flushed = int(((got == 0) & (emulated != 0)).sum())
    off = np.abs(got.astype(np.float64) - emulated) > 1e-2 * np.abs(emulated).max()
    assert not off.any(), (f"{target}: {int(off.sum())} of {off.size} sums differ from the "
                           f"emulator's, {flushed} flushed to 0; e.g. got {got[off][:3]} "
                           f"want {emulated[off][:3]}")
