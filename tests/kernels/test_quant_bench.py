"""The `quant` benchmark suite (W4A16 and GEMV) without a GPU: registered, refuses
cleanly without CUDA, and its whole path (cases, checks, table, JSON) on CPU tensors with
a fake timer, where tegula's entry points report an ERROR (they refuse CPU tensors) and
torch's baselines are checked against the float64 reference."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tegula.bench import SUITES, gpu
from tegula.bench.__main__ import main as bench_main

torch = pytest.importorskip("torch")

_spec = importlib.util.spec_from_file_location(
    "tegula_test_gpu_suites", Path(__file__).resolve().parents[1] / "bench" / "test_gpu_suites.py")
_suites = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suites)


class _FakeTorch(_suites._FakeTorch):
    def empty(self, *args, **kwargs):
        return self._cpu(self._torch.empty)(*args, **kwargs)


def test_quant_suite_is_registered():
    assert SUITES["quant"] == "tegula.bench.quant"


def test_quant_suite_refuses_cleanly_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench_main(["quant", "--quick"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_quant_suite_runs_end_to_end_on_a_fake_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu, "load_torch", lambda name: (_FakeTorch(torch), None))
    monkeypatch.setattr(gpu, "time_ms", lambda fn, flush: (fn(), 0.05)[1])
    monkeypatch.setattr(gpu, "copy_bandwidth", lambda torch, flush: 3.0e12)
    shapes = "1x64x256,20x32x128"
    assert bench_main(["quant", "--shapes", shapes, "--no-triton", "--group", "64",
                       "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "tegula/torch f16" in printed and "geomean" in printed.splitlines()[-1]
    (path,) = tmp_path.glob("quant-*fake-gpu-*.json")
    record = json.loads(path.read_text())
    labels = [c["label"] for c in record["cases"]]
    assert labels == ["w4a16 1x64x256", "w4a16 20x32x128", "gemv 1x64x256"]  # gemv: M ≤ 16
    for case in record["cases"]:
        assert case["results"]["torch"]["status"] == "ok"
        assert "CUDA device" in case["results"]["tegula"]["error"]
    # the floor: packed weights (N·K/2) + f16 scales and zeros (2·2·N·K/64) for W4A16
    assert record["cases"][0]["bytes"] == 64 * 256 // 2 + 2 * 2 * 64 * 256 // 64
    assert record["cases"][2]["bytes"] == 64 * 256 * 2
