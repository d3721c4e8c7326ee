"""Shared by the replay tests (tests/runtime/test_replay_key.py, test_fused_replay.py,
tests/kernels/test_api_replay.py): choosing where the replay key is built, and recording
launches (through `send`, or as the driver sees them)."""
from __future__ import annotations

import ctypes

import pytest

from tegula.runtime import CompiledKernel, fastcall, launcher, replay

#: cuLaunchKernel's C signature, for ctypes callbacks standing in for the driver.
LAUNCH_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def use_replay_key(monkeypatch, where: str) -> None:
    """Build replay keys in Python (`where == "python key"`) or in the C extension
    (`"C key"`: its lookup and its fused key-lookup-launch; skipped where it cannot be
    built)."""
    lookup = keywords = fused = module = None
    if where == "C key":
        module = fastcall.c_extension()
        if module is None:
            pytest.skip(f"C extension cannot be built here: {fastcall.unavailable}")
        lookup, keywords = module.replay_lookup, module.plain_keywords
        fused = getattr(module, "replay_launch", None)
    monkeypatch.setattr(replay, "C_LOOKUP", [lookup])
    monkeypatch.setattr(replay, "C_KEYWORDS", [keywords])
    monkeypatch.setattr(replay, "C_LAUNCH", [fused])
    monkeypatch.setattr(replay, "C_ENTRY",
                        [getattr(module, "entry_launch", None) if fused else None])
    monkeypatch.setattr(replay, "_C_TRIED", [True])


def recording_send(launches: list, with_pointers: bool = True):
    """A `CompiledKernel.send` that appends (kernel, grid, device, stream, the bytes of
    every parameter slot — pointers left out unless `with_pointers`) to `launches`."""
    def send(self, gx, gy, gz, device, handle, params):
        pointers = (ctypes.c_void_p * len(self.params)).from_address(params.address_value)
        launches.append((self, (gx, gy, gz), device, handle,
                         [ctypes.string_at(pointers[slot], spec.size)
                          for slot, spec in enumerate(self.params)
                          if with_pointers or spec.kind != "pointer"]))
    return send


class RecordingDriver:
    """cuLaunchKernel as a ctypes callback behind the C launcher: per launch the compiled
    kernel (known from its function handle), device, grid, block, shared size, stream,
    extra and every parameter's bytes as the driver reads them. `install` puts it in place
    of the driver, the function handles and torch's current stream (0x5000 + device)."""

    #: handle -> (compiled kernel, device), for every driver of the process: compiled
    #: kernels outlive a test (the library's kernels are cached) and keep their handles.
    kernels: dict = {}

    def __init__(self):
        self.result, self.launches = 0, []
        self.function = LAUNCH_KERNEL(self.launch)  # kept alive as long as this object
        self.address = ctypes.cast(self.function, ctypes.c_void_p).value

    def handle(self, ck, device):
        """A function handle naming the kernel object and the device."""
        h = id(ck) * 16 + device
        self.kernels[h] = (ck, device)
        return h

    def launch(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        ck, device = self.kernels[f]
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        sent = [ctypes.string_at(slots[i], spec.size) for i, spec in enumerate(ck.params)]
        self.launches.append((ck, device, (gx, gy, gz), (bx, by, bz), shared, stream, extra,
                              sent))
        return self.result

    def install(self, monkeypatch, module) -> None:
        from functools import partial
        monkeypatch.setattr(CompiledKernel, "function",
                            lambda ck, device: self.handle(ck, device))
        monkeypatch.setattr(launcher, "_C_LAUNCH", [partial(module.launch, self.address)])
        monkeypatch.setattr(launcher, "_C_POINTERS", [(module.launch_pointers, self.address)])
        monkeypatch.setattr(launcher, "_CURRENT_STREAM", [lambda device: 0x5000 + device])
