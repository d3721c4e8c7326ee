"""Hardware check (`pytest -m gpu`) of 16-bit float element ops computed in their own type
(`add/sub/mul.rn.f16/bf16`, one and two at a time, and the magic-number conversion of
narrow integers; tests/codegen/test_half_ops.py): every 16-bit pattern as an operand
(subnormals, ±0, ±inf, NaN), against the emulator bit for bit."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import bf16, f16, i4, i8, u4, u8

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import assert_matches_emulator, poison, to_device, torch_dtype  # noqa: E402

N = 1 << 16  # every 16-bit pattern once as x


def _values(dtype, bits: np.ndarray) -> np.ndarray:
    if dtype == f16:
        return bits.astype(np.uint16).view(np.float16)
    return (bits.astype(np.uint32) << 16).view(np.float32)   # bf16 values held in f32


def _kernel(dtype, narrow):
    @tg.kernel(threads=128)
    def half_ops(x: tg.Tensor[dtype], y: tg.Tensor[dtype], q: tg.Tensor[narrow],
                 out: tg.Tensor[dtype], out2: tg.Tensor[dtype]):
        b = tg.block_id(0)
        a = tg.load(x.tile((128, 8), (b, 0)))
        c = tg.load(y.tile((128, 8), (b, 0)))
        w = tg.load(q.tile((128, 8), (b, 0)))
        tg.copy((a + c) * c - a, out.tile((128, 8), (b, 0)))
        tg.copy((w.to(dtype) - c) * a, out2.tile((128, 8), (b, 0)))
    return half_ops


@pytest.mark.parametrize("narrow", [u4, i4, u8, i8], ids=str)
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_half_ops_match_the_emulator(dtype, narrow):
    rng = np.random.default_rng(5)
    x = _values(dtype, np.arange(N, dtype=np.uint32)).reshape(-1, 8)
    y = _values(dtype, rng.integers(0, 1 << 16, N, dtype=np.uint32)).reshape(-1, 8)
    lo, hi = {"u4": (0, 15), "i4": (-8, 7), "u8": (0, 255), "i8": (-128, 127)}[narrow.name]
    q_values = rng.integers(lo, hi + 1, (N // 8, 8))
    kernel = _kernel(dtype, narrow)
    emu = [np.zeros_like(x), np.zeros_like(x)]
    q_emu = (q_values & 15).astype(np.uint8) if narrow.bits == 4 else q_values.astype(
        np.uint8 if narrow == u8 else np.int8)
    if narrow.bits == 4:   # two elements a byte, low nibble first
        q_emu = (q_emu[:, 0::2] | (q_emu[:, 1::2] << 4)).astype(np.uint8)
    tg.emulate(kernel, (N // 8 // 128,), x, y, q_emu, *emu)
    outs = [poison(torch.empty(x.shape, dtype=torch_dtype(dtype), device="cuda"))
            for _ in range(2)]
    q_gpu = torch.from_numpy(q_emu).cuda()
    kernel[(N // 8 // 128,)](to_device(x, dtype), to_device(y, dtype), q_gpu, *outs)
    torch.cuda.synchronize()
    for e, g, what in zip(emu, outs, ("(a + c) * c - a", "(q - c) * a")):
        assert_matches_emulator(e, g, dtype, what=what)
