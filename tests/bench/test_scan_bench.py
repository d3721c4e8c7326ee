"""The selective-scan benchmark suite without a GPU: registered, refuses cleanly without
torch, runs end to end on CPU tensors with a fake timer (tegula reports an ERROR there:
its entry point refuses CPU tensors), and its torch reference loop agrees with the numpy
reference the emulator tests use (two transcriptions of Mamba's selective_scan_ref)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tegula.bench import SUITES, gpu
from tegula.bench.__main__ import main as bench_main

_NO_TORCH = """
import sys
sys.modules["torch"] = None
from tegula.bench.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_registered_and_refuses_cleanly_without_torch():
    assert SUITES["scan"] == "tegula.bench.scan"
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, "scan", "--quick"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "needs a CUDA GPU" in done.stderr
    assert "Traceback" not in done.stderr


class _CpuTorch:
    """torch with `device=` dropped, so the suite's "cuda" tensors are made on the CPU."""

    class cuda:  # noqa: N801 — stands in for torch.cuda
        @staticmethod
        def get_device_name(*_):
            return "Fake GPU"

        @staticmethod
        def synchronize():
            pass

        @staticmethod
        def empty_cache():
            pass

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        made = getattr(self._torch, name)
        if name in ("randn", "rand", "empty", "full", "zeros"):
            return lambda *args, device=None, **kwargs: made(*args, **kwargs)
        return made


def test_suite_runs_end_to_end_on_a_fake_gpu(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(gpu, "load_torch", lambda name: (_CpuTorch(torch), None))
    monkeypatch.setattr(gpu, "time_ms", lambda fn, flush: (fn(), 0.05)[1])
    monkeypatch.setattr(gpu, "copy_bandwidth", lambda torch, flush: 3.0e12)
    monkeypatch.setattr(gpu, "gpu_info", lambda torch: {"name": "Fake GPU"})
    assert bench_main(["scan", "--shapes", "2x24x40", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "ERROR" in printed and "tegula/torch" in printed
    (path,) = tmp_path.glob("scan-*.json")
    (case,) = json.loads(path.read_text())["cases"]
    assert case["results"]["torch"]["status"] == "ok"     # the f32 loop vs float64
    assert "CUDA device" in case["results"]["tegula"]["error"]


def test_torch_reference_loop_equals_numpy_reference():
    torch = pytest.importorskip("torch")
    from tegula.bench.scan import reference_loop
    from tegula.kernels.scan import selective_scan_reference
    rng = np.random.default_rng(0)
    b, d, n, L = 2, 5, 16, 23
    u, delta, z = (rng.standard_normal((b, d, L)) for _ in range(3))
    A = -np.exp(rng.standard_normal((d, n)))
    B, C = (rng.standard_normal((b, n, L)) for _ in range(2))
    D, bias = rng.standard_normal(d), rng.uniform(0, 0.5, d)
    want = selective_scan_reference(u, delta, A, B, C, D, z, bias, delta_softplus=True)
    got = reference_loop(torch, *(torch.from_numpy(x) for x in (u, delta, A, B, C, D, z, bias)),
                         dtype=torch.float64)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
