"""Roles meeting at a named barrier (`bar.sync id, n` across two warpgroups), outside any
mbarrier: the barrier orders one role's shared stores before the other's loads (no race
reported, the data right), and a count no set of roles reaches is a deadlock report."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.dtypes import f32
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.lower.async_ir import NamedBarrier, Role, Roles
from tegula.lower.thread_ir import (TID, Const, GlobalLoad, GlobalStore, Reg, RegArray,
                                    SharedBuffer, SharedLoad, SharedStore, TensorParam,
                                    ThreadKernel)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_kernels import run_with_deadline  # noqa: E402


def _handoff_kernel(threads_counted: int = 256, barrier: bool = True) -> ThreadKernel:
    """Warpgroup 0 ("writer") puts x[t] at shared element 127 - t; warpgroup 1 ("reader")
    reads element t - 128 into y[t - 128]: y = x reversed, through one named barrier."""
    r = RegArray("r", f32, 1)
    buf = SharedBuffer("buf", f32, 128, 0)
    meet = [NamedBarrier(1, threads_counted)] if barrier else []
    writer = [GlobalLoad(Reg(r, Const(0)), "x", TID, 1),
              SharedStore("buf", 127 - TID, Reg(r, Const(0)), 1)] + meet
    reader = meet + [SharedLoad(Reg(r, Const(0)), "buf", TID - 128, 1),
                     GlobalStore("y", TID - 128, Reg(r, Const(0)), 1)]
    roles = Roles([Role("reader", TID.ge(128), reader, loc="test: reader"),
                   Role("writer", TID.lt(128), writer, loc="test: writer")])
    return ThreadKernel("handoff", 256, [TensorParam("x", f32, 1),
                                         TensorParam("y", f32, 1, writes=True)],
                        [r], [buf], [roles])


def _run(kernel, role_order="listed"):
    x = np.random.default_rng(0).standard_normal(128).astype(np.float32)
    y = np.full(128, np.nan, dtype=np.float32)
    run_with_deadline(lambda: run_thread_kernel(kernel, 1, {"x": x, "y": y},
                                                role_order=role_order))
    return x, y


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_named_barrier_orders_two_roles(role_order):
    x, y = _run(_handoff_kernel(), role_order)
    assert np.array_equal(y, x[::-1])


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_without_the_barrier_the_race_is_reported(role_order):
    with pytest.raises(EmulationError, match="shared-memory race"):
        _run(_handoff_kernel(barrier=False), role_order)


def test_named_barrier_counting_more_threads_than_meet_is_a_deadlock():
    with pytest.raises(EmulationError) as info:
        _run(_handoff_kernel(threads_counted=384))
    msg = str(info.value)
    assert "deadlock: every role is blocked" in msg
    assert "role 'reader' (test: reader) waits at NamedBarrier 1 (384 threads)" in msg
    assert "role 'writer' (test: writer) waits at NamedBarrier 1 (384 threads)" in msg
    assert "256 of 384 threads arrived" in msg


def test_roles_must_take_whole_warpgroups():
    kernel = _handoff_kernel()
    kernel.body[0].roles[0].cond = TID.ge(96)
    with pytest.raises(EmulationError, match="takes 32 of the 128 threads of warpgroup 0"):
        _run(kernel)


def test_handoff_kernel_compiles_for_sm_90a():
    """The GPU test (tests/gpu/test_async_emulator_gpu.py) runs this kernel on hardware;
    here it must at least be valid CUDA for sm_90a (NVRTC, no GPU needed)."""
    from tegula.codegen import emit_cuda
    from tegula.runtime.compiler import available_compilers, compile_cuda
    if not available_compilers():
        pytest.skip("no CUDA compiler installed")
    kernel = _handoff_kernel()
    assert compile_cuda(emit_cuda(kernel, "sm_90a"), kernel.name, "sm_90a")
