"""The load path as a build option on the GPU (recommend searches it): the README GEMM on
sm_90a with its pipelined operand copies on TMA and forced onto cp.async, against torch
and the emulator, shapes that do not divide the tiles, outputs poisoned with NaN first."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from gemm import gemm  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("load_path", ["tma", "cp.async"])
@pytest.mark.parametrize("mnk", [(100, 72, 200), (512, 384, 1000)])
def test_gemm_on_either_load_path_matches_torch_and_the_emulator(load_path, mnk):
    import torch

    import tegula as tg
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU for sm_90a")
    m, n, k = mnk
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    at, bt = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    grid = (tg.cdiv(m, 64), tg.cdiv(n, 64))
    gemm[grid](at, bt, c, BM=64, BN=64, BK=64, load_path=load_path, target="sm_90a")
    torch.cuda.synchronize()
    ref = at.double() @ bt.double().T
    assert not torch.isnan(c).any()
    assert ((c.double() - ref).abs() <= 2e-3 * ref.abs() + 3e-2).all()
    if m * n * k <= 2_000_000:  # the emulator is slow: the small shape only
        emulated = np.full((m, n), np.nan, np.float16)
        tg.emulate(gemm, grid, a, b, emulated, BM=64, BN=64, BK=64, load_path=load_path,
                   target="sm_90a")
        # the tensor cores may round partial sums in another order: an f16 ulp or two
        np.testing.assert_allclose(c.cpu().numpy().astype(np.float64),
                                   emulated.astype(np.float64), rtol=2e-3, atol=2e-2)
