"""The C launcher (`runtime/fastcall.py`) on CPU: a ctypes callback stands in for
cuLaunchKernel, so every argument the extension passes is checked, and a whole launch
through `CompiledKernel.send` hands it the parameter buffer a full launch packs."""
from __future__ import annotations

import ctypes
import struct

import pytest

from tegula.codegen.samples import vector_copy
from tegula.dtypes import f32
from tegula.runtime import CompiledKernel, DiskCache, launcher
from tegula.runtime import fastcall

LAUNCH_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class FakeDriver:
    """A cuLaunchKernel recording its arguments (and the first parameter's 8 bytes)."""

    def __init__(self, result=0):
        self.calls, self.result = [], result
        self.function = LAUNCH_KERNEL(self.launch)  # kept alive as long as the fake
        self.address = ctypes.cast(self.function, ctypes.c_void_p).value

    def launch(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        first = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0]
        self.calls.append((f, gx, gy, gz, bx, by, bz, shared, stream, params, extra,
                           ctypes.string_at(first, 8)))
        return self.result


@pytest.fixture
def c_launch(tmp_path):
    driver = FakeDriver()
    fast = fastcall.c_launcher(driver.address, cache=DiskCache(tmp_path))
    if fast is None and fastcall.unavailable.startswith(("no C compiler", "no Python.h")):
        pytest.skip(f"C launcher cannot be built here: {fastcall.unavailable}")
    assert fast is not None, fastcall.unavailable
    return fast, driver, tmp_path


def test_every_argument_reaches_the_driver(c_launch):
    fast, driver, _ = c_launch
    buffer = (ctypes.c_uint64 * 1)(0x1122334455667788)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(buffer))
    assert fast(0x7000_0000_1234, 3, 2, 1, 256, 49152, 0x7FFF_0000_0042,
                ctypes.addressof(params)) == 0
    (f, gx, gy, gz, bx, by, bz, shared, stream, p, extra, first), = driver.calls
    assert (f, stream, p, extra) == (0x7000_0000_1234, 0x7FFF_0000_0042,
                                     ctypes.addressof(params), None)
    assert (gx, gy, gz, bx, by, bz, shared) == (3, 2, 1, 256, 1, 1, 49152)
    assert first == struct.pack("<Q", 0x1122334455667788)


def test_bad_values_are_python_errors_not_truncations(c_launch):
    fast, driver, _ = c_launch
    with pytest.raises(OverflowError, match="exceeds 2"):
        fast(1, 2**32, 1, 1, 128, 0, 0, 1)
    with pytest.raises(OverflowError):
        fast(1, -1, 1, 1, 128, 0, 0, 1)
    with pytest.raises(TypeError, match="9 ints"):
        fast(1, 1, 1, 128)
    assert driver.calls == []


def test_the_extension_is_built_once_per_cache(c_launch, monkeypatch):
    _, _, cache_dir = c_launch
    monkeypatch.setattr(fastcall, "_build", lambda cc, include: pytest.fail("rebuilt"))
    assert fastcall.c_launcher(FakeDriver().address, cache=DiskCache(cache_dir)) is not None


def test_it_can_be_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv("TEGULA_C_LAUNCHER", "0")
    assert fastcall.c_launcher(FakeDriver().address, cache=DiskCache(tmp_path)) is None
    assert "TEGULA_C_LAUNCHER=0" in fastcall.unavailable


def test_a_launch_goes_through_it(c_launch, monkeypatch):
    fast, driver, _ = c_launch
    ck = CompiledKernel(vector_copy(f32, 4), b"", "", "sm_90a")
    monkeypatch.setattr(ck, "function", lambda device: 0xF00D)
    monkeypatch.setattr(launcher, "_C_LAUNCH", [fast])
    monkeypatch.setattr(launcher, "_stream_handle", lambda stream, device: 0x5EED)

    class Array:
        def __init__(self, ptr):
            self.__cuda_array_interface__ = {"shape": (1000,), "typestr": "<f4",
                                             "data": (ptr, False), "version": 3}

    ck.launch_values(7, ck.plan.flatten([Array(0x10000), Array(0x20000)])[0], 0)
    (f, gx, gy, gz, bx, _, _, shared, stream, params, _, first), = driver.calls
    assert (f, gx, gy, gz, bx, shared, stream) == (0xF00D, 7, 1, 1, ck.threads,
                                                   ck.shared_bytes, 0x5EED)
    assert params == ck._args.address_value and first == struct.pack("<Q", 0x10000)
    driver.result = 1  # CUDA_ERROR_INVALID_VALUE: reported through drv.check
    bindings = pytest.importorskip("cuda.bindings.driver")

    def check(result, what):  # the real one asks libcuda for the error's name
        raise launcher.LaunchError(f"{what} failed: {result[0]!r}")

    monkeypatch.setattr(launcher.drv, "check", check)
    monkeypatch.setattr(launcher.drv, "cuda_driver", lambda: bindings)
    with pytest.raises(launcher.LaunchError, match=r"cuLaunchKernel\(tg_copy.*INVALID_VALUE"):
        ck.launch_values(7, ck.plan.flatten([Array(0x10000), Array(0x20000)])[0], 0)
