"""Shared by the replay tests (tests/runtime/test_replay_key.py, tests/kernels/
test_api_replay.py): choosing where the replay key is built, and recording launches."""
from __future__ import annotations

import ctypes

import pytest

from tegula.runtime import fastcall, replay


def use_replay_key(monkeypatch, where: str) -> None:
    """Build replay keys in Python (`where == "python key"`) or in the C extension
    (`"C key"`: its lookup and its fused key-lookup-launch; skipped where it cannot be
    built)."""
    lookup = keywords = fused = None
    if where == "C key":
        module = fastcall.c_extension()
        if module is None:
            pytest.skip(f"C extension cannot be built here: {fastcall.unavailable}")
        lookup, keywords = module.replay_lookup, module.plain_keywords
        fused = getattr(module, "replay_launch", None)
    monkeypatch.setattr(replay, "C_LOOKUP", [lookup])
    monkeypatch.setattr(replay, "C_KEYWORDS", [keywords])
    monkeypatch.setattr(replay, "C_LAUNCH", [fused])
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
