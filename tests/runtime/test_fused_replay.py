"""`kernel[grid](...)`'s replay in one C call (`fastcall.replay_launch`): the replay key,
the table lookup and, for a prepared launch that writes data pointers only, the grid, the
current stream of the launch's device and cuLaunchKernel. On the CPU, with the compiler
stubbed and a ctypes callback standing in for cuLaunchKernel (it records every parameter's
bytes as the driver reads them), each launch made with earlier launches' replays cached is
compared with the same launch through the full path: the same function, grid, block,
shared size, stream and parameter bytes, or the same error. Which launches the C call
finished is checked too (no Python `PreparedLaunch.__call__`)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
import tegula.runtime as runtime
from tegula import f16
from tegula.errors import TegulaError
from tegula.runtime import CompiledKernel, PreparedLaunch, args as runtime_args, fastcall
from tegula.runtime import launcher, replay

from .test_replay_key import FakeCudaTensor, _view

sys.path.insert(0, os.path.dirname(__file__))
from replay_stubs import RecordingDriver, use_replay_key  # noqa: E402

BASE = 0x7F0000100000


def make_kernel():
    @tg.kernel(threads=64)
    def scaled(x: tg.Tensor[f16], y: tg.Tensor[f16], BM: tg.constexpr = 16,
               SCALE: tg.constexpr = 1.0):
        m = tg.block_id(0)
        tg.copy(tg.load(x.tile((BM, 32), (m, 0))) * SCALE, y.tile((BM, 32), (m, 0)))
    return scaled


@pytest.fixture
def driver(monkeypatch):
    """The recording cuLaunchKernel behind the C launcher; yields (driver, python_calls):
    the launches the driver saw, and one entry per launch Python made (a replay through
    `PreparedLaunch.__call__` or a full path)."""
    module = fastcall.c_extension()
    if module is None or not hasattr(module, "replay_launch"):
        pytest.skip(f"no replay_launch here: {fastcall.unavailable or 'Python without a GIL'}")
    use_replay_key(monkeypatch, "C key")
    monkeypatch.setattr(runtime, "compile_kernel",
                        lambda kernel, target=None, options=(), requirements=None:
                        CompiledKernel(kernel, b"", "", target, requirements))
    monkeypatch.setattr(runtime, "default_target", lambda: "sm_90a")
    monkeypatch.setattr(runtime_args, "tensor_view", _view)
    monkeypatch.setattr(launcher.drv, "current_device", lambda: 0)
    recording = RecordingDriver()
    recording.install(monkeypatch, module)
    python_calls = []  # replays through Python and full-path launches
    real_call = PreparedLaunch.__call__

    def counted(self, *a, **k):
        python_calls.append(1)
        return real_call(self, *a, **k)
    monkeypatch.setattr(PreparedLaunch, "__call__", counted)
    from tegula.build import full_launch

    def counted_full(*a, **k):
        python_calls.append(1)
        return full_launch(*a, **k)
    monkeypatch.setattr(replay, "_FULL", [counted_full])
    yield recording, python_calls


def outcome(kernel, recording, grid, args, kwargs):
    """("sent", function, grid, block, shared, stream, extra, parameter bytes), or the
    error, or ("nothing",) for an empty grid."""
    before = len(recording.launches)
    try:
        ck = kernel[grid](*args, **kwargs)
    except TegulaError as e:
        return ("error", type(e).__name__, str(e).split("\n")[0])
    if len(recording.launches) == before:
        return ("nothing",)
    assert len(recording.launches) == before + 1
    assert recording.launches[-1][0] is ck
    return ("sent",) + recording.launches[-1]


def x_y(shift=0, device=0, rows=40):
    return (FakeCudaTensor((rows, 32), ptr=BASE + shift, device=device),
            FakeCudaTensor((rows, 32), ptr=BASE + 0x100000 + shift, device=device))


CALLS = {  # name -> (grid, args, kwargs)
    "base": ((3,), x_y(), {}),
    "new pointers": ((3,), x_y(0x1000), {}),
    "int grid": (3, x_y(), {}),
    "2-D grid": ((3, 2), x_y(), {}),
    "3-D grid": ((3, 1, 2), x_y(), {}),
    "numpy grid": ((np.int64(3),), x_y(), {}),
    "callable grid": (lambda meta: (tg.cdiv(40, meta["BM"]),), x_y(), {}),
    "list grid": ([3], x_y(), {}),
    "float grid": ((3.0,), x_y(), {}),
    "bool grid": ((True,), x_y(), {}),
    "zero grid": ((0,), x_y(), {}),
    "y too large": ((3, 65536), x_y(), {}),
    "x at the limit": ((2**31 - 1,), x_y(), {}),
    "x too large": ((2**31,), x_y(), {}),
    "constexpr": ((3,), x_y(), {"BM": 8}),
    "float constexpr": ((3,), x_y(), {"SCALE": 2.0}),
    "device 1": ((3,), x_y(device=1), {}),
    "4-byte aligned": ((3,), x_y(4), {}),
    "other shape": ((3,), x_y(rows=41), {}),
}


def test_fused_replays_send_what_the_full_path_sends(driver):
    recording, python_calls = driver
    kernel = make_kernel()
    fused = {}
    for name, (grid, args, kwargs) in CALLS.items():
        results = []
        for _ in range(3):  # full path, Python replay (decides `direct`), then C
            del python_calls[:]
            results.append(outcome(kernel, recording, grid, args, kwargs))
            fused[name] = not python_calls and results[-1][0] == "sent"
        saved = dict(kernel._fast_launch)
        kernel._fast_launch.clear()
        fresh = outcome(kernel, recording, grid, args, kwargs)
        kernel._fast_launch.update(saved)
        for i, warm in enumerate(results):
            assert warm == fresh, f"{name}, launch {i}"
    assert {n for n, f in fused.items() if f} == {
        "base", "new pointers", "int grid", "2-D grid", "3-D grid", "x at the limit",
        "constexpr", "float constexpr", "device 1", "4-byte aligned", "other shape"}
    assert recording.launches[-1][5] == 0x5000  # the current stream of the launch's device


def test_an_explicit_stream_and_a_driver_error(driver, monkeypatch):
    recording, python_calls = driver
    kernel = make_kernel()
    for _ in range(2):  # the full path, then the Python replay that decides `direct`
        kernel[(3,)](*x_y(device=1))
    del python_calls[:]
    kernel[(3,)](*x_y(device=1))
    assert recording.launches[-1][5] == 0x5001 and not python_calls
    kernel[(3,)](*x_y(device=1), stream=0x77)  # an explicit stream: the Python path
    assert recording.launches[-1][5] == 0x77 and python_calls
    seen = []
    monkeypatch.setattr(CompiledKernel, "check_result",
                        lambda self, code, gx, gy, gz: seen.append((code, gx, gy, gz)))
    recording.result = 700
    kernel[(3, 2)](*x_y(device=1))
    assert seen == [(700, 3, 2, 1)]
    monkeypatch.setattr(CompiledKernel, "check_result",
                        lambda self, code, gx, gy, gz: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # what check_result raises reaches the caller
        kernel[(3, 2)](*x_y(device=1))


def test_constexprs_named_kernel_and_grid_reach_the_kernel(driver):
    """`kernel[grid]` binds the kernel and grid positionally only, so keywords with their
    names are constexprs like any other (and key the replay like any other)."""
    recording, _ = driver

    @tg.kernel(threads=64)
    def named(x: tg.Tensor[f16], y: tg.Tensor[f16], kernel: tg.constexpr = 1,
              grid: tg.constexpr = 16):
        m = tg.block_id(0)
        tg.copy(tg.load(x.tile((grid, 32), (m, 0))) * kernel, y.tile((grid, 32), (m, 0)))

    variants = []  # the compiled kernel each launch ran: one per constexpr values
    for kernel_value, grid_value in [(1, 16), (2, 16), (2, 8), (2, 8), (1, 16)]:
        named[(5,)](*x_y(), kernel=kernel_value, grid=grid_value)
        variants.append(recording.launches[-1][0])
    assert len({id(v) for v in variants[:3]}) == 3
    assert variants[3] is variants[2] and variants[4] is variants[0]


def make_kernel_with_int():
    @tg.kernel(threads=64)
    def pick(x: tg.Tensor[f16], y: tg.Tensor[f16], k: int, j: int, BM: tg.constexpr = 16):
        m = tg.block_id(0)
        tg.copy(tg.load(x.tile((BM, 32), (m, k))), y.tile((BM, 32), (m, j)))
    return pick


INT_CALLS = {  # name -> the two int arguments
    "base": (1, 0),
    "new values": (3, 2),
    "zero and negative": (0, -7),
    "int32 limits": (2**31 - 1, -2**31),
    "too large": (2**31, 0),
    "too small": (0, -2**31 - 1),
    "bool": (True, 0),
    "numpy int": (np.int32(2), 1),
    "float": (2.0, 1),
}


def test_int_scalars_ride_the_c_launch_and_refusals_stay_python_s(driver):
    """Python ints are written by the C call (as 32-bit ints, after the pointers); a value
    out of 32-bit range falls back to Python's check and its error; numpy ints keep the
    Python path (their own replay key); bools and floats are refused as before. Every
    launch sends what its full path sends."""
    recording, python_calls = driver
    kernel = make_kernel_with_int()
    fused = {}
    for name, (k, j) in INT_CALLS.items():
        results = []
        for call in range(3):
            del python_calls[:]
            results.append(outcome(kernel, recording, (3,), x_y(0x1000 * call) + (k, j), {}))
            fused[name] = not python_calls and results[-1][0] == "sent"
        saved = dict(kernel._fast_launch)
        kernel._fast_launch.clear()
        fresh = outcome(kernel, recording, (3,), x_y(0x2000) + (k, j), {})
        kernel._fast_launch.update(saved)
        for i, warm in enumerate(results):
            if warm[0] == "sent":  # pointers differ by design: compare the rest
                assert warm[:-1] == fresh[:-1], f"{name}, launch {i}"
                ck = warm[1]
                values = [b for b, spec in zip(warm[-1], ck.params) if spec.kind != "pointer"]
                expect = [b for b, spec in zip(fresh[-1], ck.params) if spec.kind != "pointer"]
                assert values == expect, f"{name}, launch {i}"
            else:
                assert warm == fresh, f"{name}, launch {i}"
    assert {n for n, f in fused.items() if f} == {"base", "new values", "zero and negative",
                                                  "int32 limits"}
    assert results[0][0] == "error"  # float
