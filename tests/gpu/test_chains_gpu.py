"""Chained gemms on the GPU (synth/chains.py): attention's P kept in registers — a register
renaming between two mma.sync gemms on sm_90 (the Ampere path on Hopper), the register A
operand of the second wgmma on sm_90a — against torch and against the emulator, outputs
poisoned with NaN first."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "synth"))
from chain_kernels import attention_block  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
@pytest.mark.parametrize("keys", [1, 63, 64, 200, 1000])
def test_chained_attention_block_matches_torch_and_the_emulator(target, keys):
    import torch

    import tegula as tg
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU for sm_90 / sm_90a")
    rng = np.random.default_rng(keys)
    q = rng.standard_normal((128, 64)).astype(np.float16)
    k = rng.standard_normal((keys, 64)).astype(np.float16)
    v = rng.standard_normal((keys, 64)).astype(np.float16)
    qt, kt, vt = (torch.from_numpy(x).cuda() for x in (q, k, v))
    o = torch.full((128, 64), float("nan"), device="cuda", dtype=torch.float16)
    attention_block[(2,)](qt, kt, vt, o, target=target)
    torch.cuda.synchronize()
    ref = torch.softmax(qt.double() @ kt.double().T, dim=1) @ vt.double()
    assert not torch.isnan(o).any()
    assert (o.double() - ref).abs().max().item() < 4e-3
    emulated = np.full((128, 64), np.nan, np.float16)
    tg.emulate(attention_block, (2,), q, k, v, emulated, target=target)
    # the same operations in the same order, but exp/accumulation rounding may differ by
    # an ulp between the emulator's numpy and the GPU's SFU: compare to an f16 ulp or two
    np.testing.assert_allclose(o.cpu().numpy().astype(np.float64),
                               emulated.astype(np.float64), atol=2e-3, rtol=0)
