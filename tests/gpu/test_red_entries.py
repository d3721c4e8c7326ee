"""Hardware check (`pytest -m gpu`) of the catalogue's global atomic-add entries
(`arch.memory.RED_ADD`: red.global.add.{f32,s32,noftz.f16,noftz.bf16}; bf16 below sm_90
is the emitter's compare-and-swap fallback): 64 threads add into 7 slots, so several
threads hit each slot. Small integer values keep every order of the sums exact in every
type; the result must equal numpy's and the emulator's bit for bit."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.arch.memory import RED_ADD
from tegula.dtypes import dtype_from_name
from tegula.emulate import round_to, run_thread_kernel
from tegula.lower.thread_ir import (TID, Const, GlobalAtomicAdd, GlobalLoad, Reg, RegArray,
                                    TensorParam, ThreadKernel)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import bits_of, launch, storage_bits, to_device  # noqa: E402

SLOTS = 7


def red_kernel(dtype) -> ThreadKernel:
    r = RegArray("r", dtype, 1)
    return ThreadKernel(f"red_{dtype.name}", 64,
                        [TensorParam("x", dtype, 1), TensorParam("out", dtype, 1, True)], [r],
                        [], [GlobalLoad(Reg(r, Const(0)), "x", TID, 1),
                             GlobalAtomicAdd("out", TID % SLOTS, Reg(r, Const(0)))])


@pytest.mark.parametrize("dtype_name", sorted(RED_ADD))
def test_red_add_entry_on_hardware(dtype_name):
    dtype = dtype_from_name(dtype_name)
    rng = np.random.default_rng(sum(map(ord, dtype_name)))
    storage = np.int32 if dtype_name == "i32" else np.float32
    x = rng.integers(-4, 5, size=64).astype(storage)
    x[x == 0] = 3                                   # no zeros: every add shows
    start = rng.integers(-9, 10, size=SLOTS).astype(storage)
    want = start.copy()
    np.add.at(want, np.arange(64) % SLOTS, x)
    x, start, want = (round_to(v, dtype) for v in (x, start, want))
    out = to_device(start, dtype)
    launch(red_kernel(dtype), 1, to_device(x, dtype), out)
    got = bits_of(out, dtype)
    assert np.array_equal(got, storage_bits(want, dtype))
    emu = start.copy()
    run_thread_kernel(red_kernel(dtype), 1, dict(x=x, out=emu))
    assert np.array_equal(storage_bits(emu, dtype), got)
