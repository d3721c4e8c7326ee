"""A replayed launch whose changing values are data pointers only writes them and calls
cuLaunchKernel in one C call (`fastcall.launch_pointers`, `PreparedLaunch._direct_spec`).
A ctypes callback stands in for the driver and records every parameter's bytes as the
driver reads them: each replay must hand it exactly what a fresh full flatten of the same
arguments packs, with the grid, block, shared size, function and stream of `send`."""
from __future__ import annotations

import ctypes
from functools import partial

import numpy as np
import pytest

from tegula.codegen.samples import mma_ldmatrix, shared_transpose, warp_sum_of_squares
from tegula.errors import LaunchError
from tegula.runtime import CompiledKernel, PreparedLaunch, fastcall, launcher

from .test_fastcall import LAUNCH_KERNEL
from .test_prepared_launch import BASE, arrays, expected_bytes, with_scalar


class RecordingDriver:
    """cuLaunchKernel as a ctypes callback: each launch's arguments and parameter bytes."""

    def __init__(self, ck, result=0):
        self.ck, self.result, self.launches = ck, result, []
        self.function = LAUNCH_KERNEL(self.launch)
        self.address = ctypes.cast(self.function, ctypes.c_void_p).value

    def launch(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        sent = [ctypes.string_at(slots[i], spec.size) for i, spec in enumerate(self.ck.params)]
        self.launches.append((f, (gx, gy, gz), (bx, by, bz), shared, stream, extra, sent))
        return self.result


@pytest.fixture
def direct(monkeypatch):
    module = fastcall.c_extension()
    if module is None:
        pytest.skip(f"C extension cannot be built here: {fastcall.unavailable}")
    if not hasattr(module, "launch_pointers"):
        pytest.skip("Python without a GIL: no launch_pointers")

    def install(ck, result=0):
        driver = RecordingDriver(ck, result)
        monkeypatch.setattr(launcher, "_C_LAUNCH", [partial(module.launch, driver.address)])
        monkeypatch.setattr(launcher, "_C_POINTERS", [(module.launch_pointers, driver.address)])
        monkeypatch.setattr(launcher, "_CURRENT_STREAM", [lambda device: 0x5000 + device])
        monkeypatch.setattr(ck, "function", lambda device: 0xF00D + device)
        return driver
    return install


def pointers_of(args):
    return [getattr(a, "__cuda_array_interface__", {"data": (None,)})["data"][0] for a in args]


@pytest.mark.parametrize("make", [shared_transpose, mma_ldmatrix, warp_sum_of_squares])
def test_a_direct_replay_sends_what_a_full_launch_would(make, direct):
    kernel = make()
    ck = CompiledKernel(kernel, b"", "", "sm_90a")
    driver = direct(ck)
    if make is warp_sum_of_squares:
        import dataclasses
        from .test_tensor_map import FakeCudaArray
        ck = CompiledKernel(dataclasses.replace(kernel, params=kernel.params[:1] + [
            dataclasses.replace(kernel.params[1], name="out")]), b"", "", "sm_90a")
        driver = direct(ck)
        first = [FakeCudaArray((4000,), "<f2", BASE), FakeCudaArray((1,), "<f4", BASE + 8192)]
        make_args = lambda base: [FakeCudaArray((4000,), "<f2", base),  # noqa: E731
                                  FakeCudaArray((1,), "<f4", base + 8192)]
    else:
        first = arrays(kernel, BASE)
        make_args = partial(arrays, kernel)
    prepared = PreparedLaunch(ck, ck.plan.flatten(first)[0], device=1)
    for round_, base in enumerate([BASE, BASE + 0x100000, BASE + 0x200040]):
        args = make_args(base)
        prepared((3, 2, 1), args, pointers_of(args))
        f, grid, block, shared, stream, extra, sent = driver.launches[-1]
        assert prepared.direct is not None  # the C path ran
        assert (f, grid, block, shared, stream, extra) == (
            0xF00D + 1, (3, 2, 1), (ck.threads, 1, 1), ck.shared_bytes, 0x5001, None)
        assert sent == expected_bytes(ck, ck.plan.flatten(args)[0]), round_
    prepared((1, 1, 1), args, pointers_of(args), stream=0x77)  # an explicit stream
    assert driver.launches[-1][4] == 0x77 and len(driver.launches) == 4
    prepared((1, 1, 1), args, tuple(pointers_of(args)))  # the entry points pass a tuple
    assert driver.launches[-1][6] == expected_bytes(ck, ck.plan.flatten(args)[0])


def _with_scalar_value(args, value):
    return [value if not hasattr(a, "__cuda_array_interface__") else a for a in args]


@pytest.mark.parametrize("value", [0.75, -0.0, 0.1, 1e-40, 1e-50, 3.4028235e38, -3.4e38,
                                   float("nan"), float("inf"), -float("inf")])
def test_f32_scalars_ride_the_c_launch(direct, monkeypatch, value):
    """A Python float for an f32 parameter is packed by the C call as struct's "f" packs
    it (subnormals, underflow to zero, the sign of zero, the largest finite value, NaN,
    infinities): the bytes of a full flatten, with no Python packing."""
    ck = CompiledKernel(with_scalar(), b"", "", "sm_90a")
    driver = direct(ck)
    python = []
    real = PreparedLaunch._with_scalars_and_maps
    monkeypatch.setattr(PreparedLaunch, "_with_scalars_and_maps",
                        lambda self, *a: python.append(1) or real(self, *a))
    prepared = PreparedLaunch(ck, ck.plan.flatten(arrays(with_scalar(), BASE))[0], device=0)
    for base in (BASE + 0x1000, BASE + 0x2000):
        args = _with_scalar_value(arrays(with_scalar(), base), value)
        prepared((2, 1, 1), args, pointers_of(args))
        assert driver.launches[-1][6] == expected_bytes(ck, ck.plan.flatten(args)[0])
    assert isinstance(prepared.direct, tuple) and not python


@pytest.mark.parametrize("value", [1e300, -3.5e38, 1, np.float32(0.5), np.float64(0.5), True])
def test_other_scalar_values_keep_python_s_check(direct, value):
    """Past f32's range (an error naming the argument, from the full path and the replay
    alike, nothing launched), or not a Python float (an int, numpy numbers, a bool):
    Python checks and packs; what is sent is what a full flatten packs."""
    ck = CompiledKernel(with_scalar(), b"", "", "sm_90a")
    driver = direct(ck)
    first = _with_scalar_value(arrays(with_scalar(), BASE), 0.75)
    prepared = PreparedLaunch(ck, ck.plan.flatten(first)[0], device=0)
    prepared((2, 1, 1), first, pointers_of(first))  # decides the C launch: f32 floats
    assert isinstance(prepared.direct, tuple)
    args = _with_scalar_value(arrays(with_scalar(), BASE + 0x1000), value)
    launched = len(driver.launches)
    try:
        expected = expected_bytes(ck, ck.plan.flatten(args)[0])
    except LaunchError as full_path_error:
        with pytest.raises(LaunchError) as replay_error:
            prepared((2, 1, 1), args, pointers_of(args))
        assert str(replay_error.value) == str(full_path_error)
        assert "'alpha'" in str(full_path_error)
        assert len(driver.launches) == launched
        return
    prepared((2, 1, 1), args, pointers_of(args))
    assert driver.launches[-1][6] == expected


def test_tensor_maps_ride_the_c_launch_once_encoded(direct, monkeypatch):
    """A kernel with TMA tensor maps (and an f32 scalar between them): a launch whose
    pointers have no map yet packs in Python (which encodes and remembers each map per
    pointer); a later launch with pointers seen before writes the remembered maps in the
    C call. Every launch sends a full flatten's bytes. A map of an empty tensor is never
    remembered: each launch refuses it in Python."""
    from .test_tensor_map import FakeCudaArray, RecordingEncoder, tma_kernel
    from tegula.runtime.tensor_map import TensorMapCache

    ck = CompiledKernel(tma_kernel(), b"", "", "sm_90a")
    ck.plan.map_cache = TensorMapCache(encode=RecordingEncoder())
    driver = direct(ck)
    python = []
    real = PreparedLaunch._with_scalars_and_maps
    monkeypatch.setattr(PreparedLaunch, "_with_scalars_and_maps",
                        lambda self, *a: python.append(1) or real(self, *a))

    def args_at(base, alpha=2.5, rows=100):
        return [FakeCudaArray((rows, 72), "<f2", base), alpha,
                FakeCudaArray((rows, 48), "<f4", base + 0x10000)]

    prepared = PreparedLaunch(ck, ck.plan.flatten(args_at(BASE))[0], device=0)
    for base, alpha, through_python in [(BASE, 2.5, True), (BASE + 0x100000, -1.0, True),
                                        (BASE, 0.25, False), (BASE + 0x100000, 7.0, False),
                                        (BASE + 0x200000, 2.5, True)]:
        del python[:]
        args = args_at(base, alpha)
        prepared((2, 1, 1), args, pointers_of(args))
        assert driver.launches[-1][6] == expected_bytes(ck, ck.plan.flatten(args)[0]), base
        assert bool(python) == through_python, base
        assert isinstance(prepared.direct, tuple) and len(prepared.direct) == 11  # the last: alias pairs
    empty = PreparedLaunch(ck, ck.plan.flatten(args_at(BASE, rows=0))[0], device=0)
    for _ in range(2):
        with pytest.raises(LaunchError, match="is empty"):
            empty((1, 1, 1), args_at(BASE, rows=0), pointers_of(args_at(BASE, rows=0)))


def test_a_driver_error_is_raised(direct, monkeypatch):
    ck = CompiledKernel(shared_transpose(), b"", "", "sm_90a")
    driver = direct(ck, result=700)  # kept alive: the driver is a ctypes callback
    seen = []
    monkeypatch.setattr(CompiledKernel, "check_result",
                        lambda self, code, gx, gy, gz: seen.append((code, gx, gy, gz)))
    args = arrays(shared_transpose(), BASE)
    prepared = PreparedLaunch(ck, ck.plan.flatten(args)[0], device=0)
    prepared((5, 1, 1), args, pointers_of(args))
    assert prepared.direct is not None and seen == [(700, 5, 1, 1)] and driver.launches


def test_bad_pointer_lists_are_errors_not_writes():
    module = fastcall.c_extension()
    if module is None or not hasattr(module, "launch_pointers"):
        pytest.skip("no launch_pointers here")
    buffer = (ctypes.c_uint64 * 2)(7, 7)
    spec = (1, 2, 128, 0, 0, ctypes.addressof(buffer), (0, 1))
    with pytest.raises(IndexError):
        module.launch_pointers(spec, 1, 1, 1, 0, [5])
    with pytest.raises(TypeError):
        module.launch_pointers(spec, 1, 1, 1, 0, [5, None])
    with pytest.raises(OverflowError):
        module.launch_pointers(spec, 2**32, 1, 1, 0, [5, 6])
    assert list(buffer) == [7, 7]  # nothing written before a bad value was refused
