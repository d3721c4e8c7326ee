"""Hardware check (`pytest -m gpu`) of the catalogue's conversion entries
(`arch.convert`: cvt f32 <-> f16 / bf16, and f32 -> e4m3/e5m2 -> f32 through the x2
forms from sm_89; before sm_89 the helpers' software path): random f32 over many binades
plus the values conversions get wrong — ties at every binade, values past each type's
largest finite, subnormals, ±0, ±inf, NaN — cast to the type and back, against the
emulator (`round_to`) bit for bit (any NaN matches any NaN)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.dtypes import bf16, f8e4m3, f8e5m2, f16, f32
from tegula.emulate import round_to, run_thread_kernel
from tegula.lower.thread_ir import (BLOCK_IDS, TID, Assign, Cast, Const, GlobalLoad, GlobalStore, Reg,
                                    RegArray, RegRead, TensorParam, ThreadKernel)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import assert_matches_emulator, launch, poison, to_device, torch_dtype  # noqa: E402

N = 4096


def round_trip_kernel(dtype, src=f32) -> ThreadKernel:
    """y = dtype(x), z = src(y) with x of type `src`: one element per thread, blocks of 128
    (grid N / 128). The float formats round-trip through f32; the integer conversions'
    test (test_int_cvt_entries_gpu.py) passes other sources."""
    a, b, c = RegArray("a", src, 1), RegArray("b", dtype, 1), RegArray("c", src, 1)
    i = BLOCK_IDS[0] * 128 + TID
    r = lambda arr: Reg(arr, Const(0))  # noqa: E731
    name = f"cvt_{dtype.name}" if src == f32 else f"cvt_{src.name}_{dtype.name}"
    return ThreadKernel(
        name, 128,
        [TensorParam("x", src, 1), TensorParam("y", dtype, 1, True),
         TensorParam("z", src, 1, True)], [a, b, c], [],
        [GlobalLoad(r(a), "x", i, 1), Assign(r(b), Cast(RegRead(r(a)), dtype)),
         GlobalStore("y", i, r(b), 1), Assign(r(c), Cast(RegRead(r(b)), src)),
         GlobalStore("z", i, r(c), 1)])


#: log2 of a little past each type's largest finite value (65504, 3.4e38, 448, 57344)
#: and a little below its smallest subnormal (2^-24, f32's 2^-149, 2^-9, 2^-16).
TOP = {"f16": 16, "bf16": 128, "f8e4m3": 9, "f8e5m2": 16}
BOTTOM = {"f16": -26, "bf16": -140, "f8e4m3": -11, "f8e5m2": -18}


def hard_inputs(dtype, rng) -> np.ndarray:
    """N f32 values: random magnitudes over the type's range, below its subnormals and
    past its largest finite; exact ties halfway between neighbours; and the edges."""
    scale = np.exp2(rng.uniform(BOTTOM[dtype.name], TOP[dtype.name] + 1, N))
    with np.errstate(over="ignore"):  # past f32's range: inf, which is wanted too
        x = (rng.standard_normal(N) * scale).astype(np.float32)
    x[x == 0] = 1.0
    # Ties: a representable g plus half its spacing (exact in f32 for these short types).
    g = round_to(x[:1024], dtype).astype(np.float64)
    ok = np.isfinite(g) & (g != 0)
    half = np.exp2(np.floor(np.log2(np.abs(np.where(ok, g, 1.0)))) - dtype.mantissa_bits - 1)
    x[:1024] = np.where(ok, g + np.sign(g) * half, x[:1024]).astype(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.0e38, -3.0e38,
                      448.0, 464.0, 480.0, 57344.0, 61440.0, 65504.0, 65520.0, 1.0, -1.0],
                     dtype=np.float32)
    x[-len(edges):] = edges
    return x


@pytest.mark.parametrize("dtype", [f16, bf16, f8e4m3, f8e5m2], ids=str)
def test_conversion_entries_round_trip_like_the_emulator(dtype):
    rng = np.random.default_rng(sum(map(ord, dtype.name)))
    x = hard_inputs(dtype, rng)
    kernel = round_trip_kernel(dtype)
    # The kernel's y is a tensor of `dtype` (a uint8 tensor is refused at launch); the
    # emulator keeps bf16 and 8-bit floats in float32 storage.
    y = poison(torch.empty(N, dtype=torch_dtype(dtype), device="cuda"))
    z = poison(torch.empty(N, dtype=torch.float32, device="cuda"))
    launch(kernel, N // 128, to_device(x, f32), y, z)
    emu_y = np.zeros(N, dtype=np.float16 if dtype == f16 else np.float32)
    emu_z = np.zeros(N, dtype=np.float32)
    run_thread_kernel(kernel, N // 128, dict(x=x, y=emu_y, z=emu_z))
    assert_matches_emulator(emu_y, y, dtype, what=f"f32 -> {dtype}")
    assert_matches_emulator(emu_z, z, f32, what=f"{dtype} -> f32")
