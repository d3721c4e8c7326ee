"""The moe benchmark suite without a GPU: registered, `--help` without torch, a clean
refusal without CUDA, and its case list naming what it claims to compare."""
from __future__ import annotations

import subprocess
import sys

from tegula.bench import SUITES

_NO_TORCH = """
import sys
sys.modules["torch"] = None
sys.modules["triton"] = None
from tegula.bench.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _NO_TORCH, "moe", *args],
                          capture_output=True, text=True, timeout=120)


def test_registered_and_refuses_cleanly_without_torch():
    assert SUITES["moe"] == "tegula.bench.moe"
    done = run("--quick")
    assert done.returncode == 1 and done.stdout == ""
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr
    helped = run("--help")
    assert helped.returncode == 0 and "--fp8" in helped.stdout and "dense" in helped.stdout
    assert "--w4" in helped.stdout
    both = run("--fp8", "--w4")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_w4_reference_weights_are_what_the_packed_ones_stand_for():
    """`--w4` checks the kernel against `dequantized_w4` of the packed weights: the same
    values as `quant.dequantize_w4` of the unpacked ones (torch on the CPU)."""
    import numpy as np
    import pytest
    torch = pytest.importorskip("torch")
    from tegula.bench import moe
    from tegula.kernels.moe_w4 import quantize_experts_w4
    from tegula.kernels.quant import dequantize_w4, unpack_w4
    w = torch.randn(3, 16, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for zero_point in (True, False):
        packed, scales, zeros = quantize_experts_w4(w, moe.W4_GROUP, zero_point)
        got = moe.dequantized_w4(torch, packed, scales, zeros).numpy()
        for e in range(3):
            want = dequantize_w4(unpack_w4(packed[e].numpy()), scales[e].float().numpy(),
                                 None if zeros is None else zeros[e].float().numpy(),
                                 moe.W4_GROUP)
            np.testing.assert_allclose(got[e], want, rtol=1e-6, atol=1e-6)


def test_cases_are_moe_shapes():
    from tegula.bench import moe
    for label, tokens, k, experts, kdim, n in moe.CASES:
        assert tokens * k % experts == 0, f"{label}: balanced routing needs T·k / E rows"
