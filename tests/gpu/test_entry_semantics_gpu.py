"""Hardware check (`pytest -m gpu`) of what catalogue entries compute (`convert` /
`execute`, which the emulator calls) and of the emitter's software forms that stand in
for an entry below its min_cc (`codegen.ptx.SOFTWARE_FORMS`: f8 conversions before sm_89,
16-bit arithmetic and the bf16 atomic add before sm_90).

A software form runs on targets older than the H100, so here it is forced: the kernel's
CUDA is compiled with every `__CUDA_ARCH__ >= N` guard false, and the same C code runs
on this GPU. Each result must equal the entry's, bit for bit (any NaN matches any NaN):
  * 16-bit + - * (one element and the x2 pair) on random values, ties and overflow;
  * f32 -> e4m3/e5m2 -> f32 on the values conversions get wrong (test_cvt_entries's);
  * red.global.add with one thread per element (so the order of adds cannot matter) on
    random values, subnormals, ±0, ±inf, NaN and sums that round: the entry's rounding,
    and whether the hardware flushes subnormals (the entry says it does not).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.arch.convert import half_arithmetic
from tegula.arch.memory import RED_ADD
from tegula.codegen import emit_cuda
from tegula.dtypes import bf16, dtype_from_name, f8e4m3, f8e5m2, f16, f32
from tegula.emulate import round_to, run_thread_kernel
from tegula.lower.thread_ir import (BLOCK_IDS, TID, Assign, Binary, Const, GlobalAtomicAdd,
                                    GlobalLoad, GlobalStore, Reg, RegArray, RegRead,
                                    TensorParam, ThreadKernel)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import bits_of, launch, launch_raw, poison, storage_bits, to_device, torch_dtype  # noqa: E402
from hwcheck import RawKernel  # noqa: E402
from test_cvt_entries import hard_inputs, round_trip_kernel  # noqa: E402

N = 4096
_GUARD = re.compile(r"defined\(__CUDA_ARCH__\) && __CUDA_ARCH__ >= \d+")


def run(kernel: ThreadKernel, grid: int, tensors, software: bool) -> None:
    """Launch `kernel`; with `software`, every entry guard false (the software forms)."""
    if not software:
        launch(kernel, grid, *tensors)
        return
    from tegula.runtime import default_target
    source = emit_cuda(kernel, default_target())
    forced, count = _GUARD.subn("0", source)
    assert count, "the kernel uses no guarded entry: nothing to force"
    launch_raw(RawKernel(kernel, forced), grid, *tensors)


def same_bits(got_bits: np.ndarray, want: np.ndarray, dtype, what: str, inputs=()) -> None:
    """The GPU's bit patterns equal those of the `want` storage values (NaN: any NaN)."""
    from tegula.emulate import from_bits
    want_bits, got = storage_bits(want, dtype), from_bits(got_bits, dtype)
    both_nan = (np.isnan(np.asarray(want, np.float32)) & np.isnan(np.asarray(got, np.float32))
                if dtype.is_float else np.zeros(want.shape, bool))
    bad = np.flatnonzero(~((got_bits == want_bits) | both_nan))
    if bad.size:
        rows = "; ".join(f"[{i}] {', '.join(repr(v[i]) for v in inputs)} -> got {got[i]!r} "
                         f"want {want[i]!r}" for i in bad[:6])
        raise AssertionError(f"{what}: {bad.size} of {want.size} differ: {rows}")


# ---------------------------------------------------------------- 16-bit arithmetic

def half_kernel(dtype, op: str) -> ThreadKernel:
    """c = a op b in `dtype`, two elements per thread (a 4-byte access): the emitter
    computes the pair with the x2 entry; a third, lone element with the one-element entry."""
    a, b, c = (RegArray(n, dtype, 3) for n in "abc")
    i = BLOCK_IDS[0] * 128 + TID
    r = lambda arr, k: Reg(arr, Const(k))  # noqa: E731
    body = [GlobalLoad(r(a, 0), "x", 2 * i, 2), GlobalLoad(r(b, 0), "y", 2 * i, 2),
            GlobalLoad(r(a, 2), "x2", i, 1), GlobalLoad(r(b, 2), "y2", i, 1)]
    body += [Assign(r(c, k), Binary(op, RegRead(r(a, k)), RegRead(r(b, k)), dtype))
             for k in range(3)]
    body += [GlobalStore("z", 2 * i, r(c, 0), 2), GlobalStore("z2", i, r(c, 2), 1)]
    params = [TensorParam(n, dtype, 1) for n in ("x", "y", "x2", "y2")] + [
        TensorParam(n, dtype, 1, True) for n in ("z", "z2")]
    return ThreadKernel(f"half_{dtype.name}_{op}", 128, params, [a, b, c], [], body)


@pytest.mark.parametrize("software", [False, True], ids=["entry", "software"])
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_half_arithmetic(dtype, op, software):
    rng = np.random.default_rng(sum(map(ord, dtype.name + op)))
    x, y, x2, y2 = (round_to(np.resize(hard_inputs(dtype, rng), n), dtype)
                    for n in (2 * N, 2 * N, N, N))
    kernel = half_kernel(dtype, op)
    source = emit_cuda(kernel, "sm_90a")
    assert f"tg_{dtype.name}x2_{op}(" in source and f"tg_{dtype.name}_{op}(" in source
    z, z2 = (poison(torch.empty(n, dtype=torch_dtype(dtype), device="cuda")) for n in (2 * N, N))
    run(kernel, N // 128, [to_device(v, dtype) for v in (x, y, x2, y2)] + [z, z2], software)
    entry = half_arithmetic(op, dtype)
    same_bits(bits_of(z, dtype), entry.execute(x, y), dtype, f"{op}.rn.{dtype.name}x2", (x, y))
    same_bits(bits_of(z2, dtype), entry.execute(x2, y2), dtype, f"{op}.rn.{dtype.name}",
              (x2, y2))


# ---------------------------------------------------------------- f8 conversions

@pytest.mark.parametrize("dtype", [f8e4m3, f8e5m2], ids=str)
def test_f8_software_conversions(dtype):
    rng = np.random.default_rng(sum(map(ord, dtype.name)) + 1)
    x = hard_inputs(dtype, rng)
    kernel = round_trip_kernel(dtype)
    y = poison(torch.empty(N, dtype=torch_dtype(dtype), device="cuda"))
    z = poison(torch.empty(N, dtype=torch.float32, device="cuda"))
    run(kernel, N // 128, [to_device(x, f32), y, z], software=True)
    emu_y, emu_z = np.zeros(N, np.float32), np.zeros(N, np.float32)
    run_thread_kernel(kernel, N // 128, dict(x=x, y=emu_y, z=emu_z))
    same_bits(bits_of(y, dtype), emu_y, dtype, f"f32 -> {dtype} (software)", (x,))
    same_bits(bits_of(z, f32), emu_z, f32, f"{dtype} -> f32 (software)", (x,))


# ---------------------------------------------------------------- atomic adds

def red_kernel(dtype) -> ThreadKernel:
    r = RegArray("r", dtype, 1)
    i = BLOCK_IDS[0] * 128 + TID
    return ThreadKernel(f"red1_{dtype.name}", 128,
                        [TensorParam("x", dtype, 1), TensorParam("out", dtype, 1, True)], [r],
                        [], [GlobalLoad(Reg(r, Const(0)), "x", i, 1),
                             GlobalAtomicAdd("out", i, Reg(r, Const(0)))])


def atomic_operands(dtype, rng):
    if dtype.name == "i32":
        return (rng.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32) for _ in "xy")
    tiny = {"f32": 1e-38, "f16": 6e-5, "bf16": 1e-38}[dtype.name]
    start, x = (round_to(hard_inputs(dtype if dtype != f32 else bf16, rng), dtype)
                for _ in "xy")
    # Subnormal operands and sums, and sums that cancel to a subnormal.
    start[:256] = round_to(rng.standard_normal(256) * tiny, dtype)
    x[:256] = round_to(rng.standard_normal(256) * tiny, dtype)
    x[256:512] = round_to(-start[256:512] * (1 + rng.standard_normal(256) * 1e-6), dtype)
    return start, x


@pytest.mark.parametrize("software", [False, True], ids=["entry", "software"])
@pytest.mark.parametrize("name", sorted(RED_ADD))
def test_atomic_add_values(name, software):
    dtype = dtype_from_name(name)
    if software and name != "bf16":
        pytest.skip("only bf16's atomic add has a software form")
    start, x = atomic_operands(dtype, np.random.default_rng(sum(map(ord, name))))
    out = to_device(start, dtype)
    run(red_kernel(dtype), N // 128, [to_device(x, dtype), out], software)
    want = RED_ADD[name].execute(start, x)
    same_bits(bits_of(out, dtype), want, dtype, f"{RED_ADD[name].name}"
              + (" (compare-and-swap form)" if software else ""), (start, x))
    emu = start.copy()
    run_thread_kernel(red_kernel(dtype), N // 128, dict(x=x, out=emu))
    assert np.array_equal(storage_bits(emu, dtype), storage_bits(want, dtype))


# ---------------------------------------------------------------- elect.sync

def test_elect_picks_the_lane_the_emulator_picks():
    """`Elect()` (elect.sync, full mask) in every warp of 4 blocks of 128 threads, and in
    the second half of a block only (the first warps skip it): the lanes that store are
    the emulator's (lane 0 of each warp that elects)."""
    from tegula.lower.async_ir import Elect
    from tegula.lower.thread_ir import If, TID, all_of
    r = RegArray("r", f32, 1)
    i = BLOCK_IDS[0] * 128 + TID
    kernel = ThreadKernel(
        "elected_lanes", 128, [TensorParam("x", f32, 1), TensorParam("out", f32, 1, True)],
        [r], [], [GlobalLoad(Reg(r, Const(0)), "x", i, 1),
                  If(Elect(), [GlobalStore("out", i, Reg(r, Const(0)), 1)]),
                  If(all_of([TID.ge(64), Elect()]),
                     [GlobalStore("out", i + 1, Reg(r, Const(0)), 1)])])
    x = np.arange(1, 4 * 128 + 1, dtype=np.float32)
    out = poison(torch.empty(4 * 128 + 1, dtype=torch.float32, device="cuda"))
    launch(kernel, 4, to_device(x, f32), out)
    emu = np.full(4 * 128 + 1, np.nan, np.float32)
    run_thread_kernel(kernel, 4, dict(x=x, out=emu))
    got = out.cpu().numpy()
    assert np.array_equal(np.isnan(got), np.isnan(emu)), (
        f"elected on the GPU: {np.flatnonzero(~np.isnan(got)).tolist()}, in the emulator: "
        f"{np.flatnonzero(~np.isnan(emu)).tolist()}")
    assert np.array_equal(got[~np.isnan(got)], emu[~np.isnan(emu)])
