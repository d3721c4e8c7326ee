"""`tegula bench attention` without a GPU: registered, refuses cleanly without torch, and the
whole suite path (cases, checks, table, JSON) on CPU tensors with a fake timer, where SDPA's
math backend gives the reference and tegula reports its clear device error."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tegula.bench import SUITES, gpu
from tegula.bench.__main__ import main as bench_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from test_gpu_suites import _NO_TORCH, _FakeTorch  # noqa: E402


def test_the_suite_is_registered_and_refuses_cleanly_without_torch():
    assert SUITES["attention"] == "tegula.bench.attention"
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, "attention", "--quick"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr


def test_the_suite_runs_end_to_end_on_a_fake_gpu(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(gpu, "load_torch", lambda name: (_FakeTorch(torch), None))
    monkeypatch.setattr(gpu, "time_ms", lambda fn, flush: (fn(), 0.05)[1])
    assert bench_main(["attention", "--shapes", "1x2x64x64", "--no-triton", "--causal", "yes",
                       "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "tegula/SDPA cuDNN" in printed and "geomean" in printed.splitlines()[-1]
    (path,) = tmp_path.glob("attention-*fake-gpu-*.json")
    (case,) = json.loads(path.read_text())["cases"]
    assert case["label"] == "1x2x64x64 causal" and case["flops"] == 4 * 2 * 64 * 64 * 64 / 2
    assert "CUDA device" in case["results"]["tegula"]["error"]
