"""On a GPU: launches go through the C launcher where it can be built, and the ctypes
path (the fallback) gives the same, fully checked, results.

Run with `pytest -m gpu tests/runtime`."""
from __future__ import annotations

import pytest

from tegula.codegen import samples
from tegula.dtypes import f32
from tegula.runtime import DiskCache, compile_kernel, fastcall, launcher

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_c_launcher_and_ctypes_launch_the_same(tmp_path, monkeypatch):
    launcher._LOADED.clear()
    ck = compile_kernel(samples.vector_copy(f32, 4), cache=DiskCache(tmp_path))
    n = 128 * 4 * 9 + 20
    x = torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    ck[10](x, y)
    torch.cuda.synchronize()
    assert torch.equal(x, y)
    if launcher._C_LAUNCH[0] is None:
        assert fastcall.unavailable, "no C launcher and no reason given"
        pytest.skip(f"C launcher unavailable here: {fastcall.unavailable}")
    monkeypatch.setattr(launcher, "_C_LAUNCH", [None])  # the ctypes path
    y2 = torch.full_like(x, float("nan"))
    ck[10](x, y2)
    torch.cuda.synchronize()
    assert torch.equal(x, y2)
