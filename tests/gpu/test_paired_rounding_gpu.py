"""Hardware check (`pytest -m gpu`) of the paired 16-bit rounding (`cvt.rn.f16x2.f32`,
`cvt.rn.bf16x2.f32`; the emitter's `_rounded_pair`, tests/codegen/test_paired_rounding.py):
the hard f32 inputs of test_cvt_entries (ties at every binade, past the largest finite,
subnormals, ±0, ±inf, NaN) rounded two per thread, bit for bit against the emulator —
and the same values through one-element roundings (the second of the pair reading the
first, which the emitter does not pair), so both paths are held to the same bits."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.dtypes import bf16, f16, f32
from tegula.emulate import run_thread_kernel
from tegula.lower.thread_ir import (BLOCK_IDS, TID, Assign, Binary, Cast, Const, GlobalLoad,
                                    GlobalStore, Literal, Reg, RegArray, RegRead,
                                    TensorParam, ThreadKernel)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import (assert_matches_emulator, launch, poison, to_device,  # noqa: E402
                         torch_dtype)
from test_cvt_entries import N, hard_inputs  # noqa: E402


def pair_kernel(dtype, paired: bool) -> ThreadKernel:
    """y[2i], y[2i+1] = dtype(x[2i]), dtype(x[2i+1]); unpaired, the second is
    dtype(x[2i+1] + f32(y[2i]) * 0): it reads the first, so each rounds alone."""
    a, b = RegArray("a", f32, 2), RegArray("b", dtype, 2)
    i = (BLOCK_IDS[0] * 128 + TID) * 2
    x1 = RegRead(Reg(a, Const(1)))
    second = x1 if paired else Binary(
        "add", x1, Binary("mul", Cast(RegRead(Reg(b, Const(0))), f32), Literal(0.0, f32), f32),
        f32)
    return ThreadKernel(
        f"pair_{dtype.name}_{'paired' if paired else 'single'}", 128,
        [TensorParam("x", f32, 1), TensorParam("y", dtype, 1, True)], [a, b], [],
        [GlobalLoad(Reg(a, Const(0)), "x", i, 2),
         Assign(Reg(b, Const(0)), Cast(RegRead(Reg(a, Const(0))), dtype)),
         Assign(Reg(b, Const(1)), Cast(second, dtype)),
         GlobalStore("y", i, Reg(b, Const(0)), 2)])


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "single"])
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_paired_rounding_matches_the_emulator(dtype, paired):
    rng = np.random.default_rng(7 + sum(map(ord, dtype.name)))
    x = hard_inputs(dtype, rng)
    if not paired:  # f32(y0) * 0 is NaN where y0 rounds to infinity: keep those finite
        x[0::2] = np.where(np.isfinite(x[0::2]) & (np.abs(x[0::2]) < 6e4), x[0::2], 1.0)
    kernel = pair_kernel(dtype, paired)
    y = poison(torch.empty(N, dtype=torch_dtype(dtype), device="cuda"))
    launch(kernel, N // 256, to_device(x, f32), y)
    emu_y = np.zeros(N, dtype=np.float16 if dtype == f16 else np.float32)
    run_thread_kernel(kernel, N // 256, dict(x=x, y=emu_y))
    assert_matches_emulator(emu_y, y, dtype, what=f"f32 pairs -> {dtype}")
