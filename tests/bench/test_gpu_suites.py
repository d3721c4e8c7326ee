"""The GPU benchmark suites without a GPU: registration, a clean refusal without torch or
CUDA, and the check / time / summarize path driven by CPU tensors and a fake timer."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tegula.bench import SUITES
from tegula.bench import gpu
from tegula.bench.__main__ import main as bench_main

GPU_SUITES = ("gemm", "norm", "softmax", "copy")

# Runs a suite in a fresh interpreter where importing torch or triton fails.
_NO_TORCH = """
import sys
sys.modules["torch"] = None
sys.modules["triton"] = None
from tegula.bench.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_gpu_suites_are_registered():
    for name in GPU_SUITES:
        assert SUITES[name] == f"tegula.bench.{name}"


@pytest.mark.parametrize("suite", GPU_SUITES)
def test_suites_refuse_cleanly_without_torch(suite):
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, suite, "--quick"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("suite", GPU_SUITES)
def test_help_needs_no_torch(suite):
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, suite, "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert "--max-seconds" in done.stdout and "--dtype" in done.stdout


def test_suites_refuse_cleanly_without_cuda(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench_main(["gemm", "--quick"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_parse_shapes():
    assert gpu.parse_shapes("4096x4096x4096, 16x4096x4096", 3) == \
        [(4096, 4096, 4096), (16, 4096, 4096)]
    assert gpu.parse_shapes("8191X3000", 2) == [(8191, 3000)]
    for bad in ("4096x4096", "0x5", "axb"):
        with pytest.raises(Exception):
            gpu.parse_shapes(bad, 3 if bad == "4096x4096" else 2)


def _cpu_case(torch) -> gpu.Case:
    x = torch.randn(64, 32)

    def broken():
        raise RuntimeError("launch failed")

    impls = [gpu.Impl("tegula", lambda: x.clone(), note=lambda: "BM=4"),
             gpu.Impl("torch", lambda: x * 1.0),
             gpu.Impl("triton", lambda: torch.full_like(x, float("nan"))),
             gpu.Impl("other", broken)]
    return gpu.Case("64x32", (64, 32), 0.0, 2 * 64 * 32 * 4.0, lambda: x, 1e-6, impls)


def test_a_wrong_result_is_reported_and_not_timed():
    torch = pytest.importorskip("torch")
    timed = []

    def timer(fn):
        timed.append(fn)
        return 0.01  # ms

    record = gpu.measure_case(_cpu_case(torch), log=lambda line: None, timer=timer)
    results = record["results"]
    assert results["tegula"]["status"] == "ok" and results["tegula"]["config"] == "BM=4"
    assert results["tegula"]["tbps"] == pytest.approx(2 * 64 * 32 * 4 / 1e-5 / 1e12)
    assert results["triton"]["status"] == "WRONG"        # NaN never passes
    assert results["other"]["status"] == "ERROR" and "launch failed" in results["other"]["error"]
    assert len(timed) == 2                                # tegula and torch only
    json.dumps(record)                                    # JSON-ready


def test_run_cases_stops_when_the_budget_is_spent():
    made = []
    budget = gpu.Budget(0.0)
    records, skipped = gpu.run_cases([("a", lambda: made.append(1)), ("b", lambda: None)],
                                     budget, log=lambda line: None)
    assert records == [] and skipped == ["a", "b"] and made == []


def test_run_cases_reports_a_case_that_cannot_be_made():
    def oom():
        raise MemoryError("out of memory")

    records, skipped = gpu.run_cases([("big", oom)], gpu.Budget(60), log=lambda line: None)
    assert skipped == [] and "out of memory" in records[0]["error"]


def _record(label, tegula, torch_rate, triton=None, tags=("large",), metric="tflops"):
    def entry(v):
        if v is None:
            return {"status": "WRONG"}
        return {"status": "ok", metric: v, "ms": 1.0}
    results = {"tegula": entry(tegula), "torch": entry(torch_rate)}
    if triton is not None:
        results["triton"] = entry(triton)
    return {"label": label, "tags": list(tags), "results": results}


def test_summary_table_ratios_and_geomeans():
    records = [_record("4096", 400.0, 800.0, 500.0), _record("8192", 200.0, 800.0, 400.0),
               _record("16x4096", None, 100.0, 50.0, tags=("decode",))]
    groups = {"large": lambda r: "large" in r["tags"], "all": lambda r: True}
    table, geomeans = gpu.summary_table(records, ["tegula", "torch", "triton"],
                                        ["torch", "triton"], "tflops", groups=groups,
                                        label_of={"torch": "cuBLAS"}.get)
    assert geomeans["large"]["tegula/torch"] == pytest.approx((0.5 * 0.25) ** 0.5)
    assert geomeans["all"]["tegula/triton"] == pytest.approx((0.8 * 0.5) ** 0.5)
    lines = table.splitlines()
    assert "tegula/cuBLAS" in lines[0]
    assert "WRONG" in lines[4] and lines[-1].startswith("geomean (all, 2/3 ran)")


def test_summary_table_fraction_of_copy_bandwidth():
    records = [_record("16384x4096", 2.0, 2.5, metric="tbps")]
    table, geomeans = gpu.summary_table(records, ["tegula", "torch"], ["torch"], "tbps",
                                        copy_tbps=2.5)
    assert geomeans["all"]["tegula/copy"] == pytest.approx(0.8)
    assert "80%" in table and "0.80x" in table


def test_same_size_copy_is_timed_unchecked_and_reported_as_a_fraction():
    torch = pytest.importorskip("torch")
    case = _cpu_case(torch)
    case.impls = case.impls[:1]
    case.same_size_copy = copy = lambda: torch.zeros(1)  # a yardstick: timed, never checked
    record = gpu.measure_case(case, log=lambda line: None,
                              timer=lambda fn: 0.02 if fn is copy else 0.01)
    assert record["same_size_copy_tbps"] == pytest.approx(2 * 64 * 32 * 4 / 2e-5 / 1e12)
    table, geomeans = gpu.summary_table([record], ["tegula"], [], "tbps", copy_tbps=1.0)
    assert geomeans["all"]["tegula/same-size copy"] == pytest.approx(2.0)
    assert "tegula/same-size copy" in table.splitlines()[0] and "200%" in table


def test_record_file_is_named_by_suite_gpu_and_date(tmp_path):
    path = gpu.write_record("gemm", {"name": "NVIDIA H100 80GB HBM3"}, {"cases": []},
                            str(tmp_path))
    assert path.name.startswith("gemm-nvidia-h100-80gb-hbm3-") and path.suffix == ".json"
    saved = json.loads(path.read_text())
    assert saved["gpu"]["name"] == "NVIDIA H100 80GB HBM3" and "machine" in saved


def test_plot_writes_a_png_or_says_why_not(tmp_path):
    records = [_record("4096", 400.0, 800.0)]
    message = gpu.plot(tmp_path / "x.png", "t", records, ["tegula", "torch"], "tflops")
    assert message.startswith("wrote") == (tmp_path / "x.png").exists()
    assert message.startswith(("wrote", "no PNG"))


class _FakeCuda:
    """torch.cuda as a suite sees it, on a machine without a GPU."""

    def is_available(self) -> bool:
        return True

    def get_device_name(self, *args) -> str:
        return "Fake GPU"

    def get_device_properties(self, index):
        from types import SimpleNamespace
        return SimpleNamespace(name="Fake GPU", multi_processor_count=1, total_memory=2**30,
                               major=9, minor=0)

    def empty_cache(self) -> None:
        pass


class _FakeTorch:
    """The real torch with CUDA tensors made on the CPU (device= dropped)."""

    cuda = _FakeCuda()

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def _cpu(self, fn):
        return lambda *args, device=None, **kwargs: fn(*args, **kwargs)

    def randn(self, *args, **kwargs):
        return self._cpu(self._torch.randn)(*args, **kwargs)

    def rand(self, *args, **kwargs):
        return self._cpu(self._torch.rand)(*args, **kwargs)

    def full(self, *args, **kwargs):
        return self._cpu(self._torch.full)(*args, **kwargs)


@pytest.mark.parametrize("suite,shapes", [("gemm", "64x32x48,16x40x24"), ("norm", "8x96"),
                                          ("softmax", "8x96"), ("copy", "8x96")])
def test_a_suite_runs_end_to_end_on_a_fake_gpu(suite, shapes, tmp_path, monkeypatch, capsys):
    """The whole suite path: cases, checks, timing, table, JSON (tegula itself reports an
    ERROR: its entry points refuse CPU tensors)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(gpu, "load_torch", lambda name: (_FakeTorch(torch), None))
    monkeypatch.setattr(gpu, "time_ms", lambda fn, flush, **_: (fn(), 0.05)[1])
    monkeypatch.setattr(gpu, "copy_bandwidth",  # 1 GiB is slow on a CPU
                        lambda torch, flush: 3.0e12)
    assert bench_main([suite, "--shapes", shapes, "--no-triton", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "tegula/torch" in printed or "tegula/cuBLAS" in printed
    assert "ERROR" in printed and "geomean" in printed.splitlines()[-1]
    (path,) = tmp_path.glob(f"{suite}-*fake-gpu-*.json")
    record = json.loads(path.read_text())
    assert record["gpu"]["name"] == "Fake GPU" and record["flush"] == "clean"
    assert len(record["cases"]) == len(shapes.split(","))
    for case in record["cases"]:
        assert case["results"]["torch"]["status"] == "ok"
        assert "CUDA device" in case["results"]["tegula"]["error"]
    if suite != "gemm":
        assert record["copy_bandwidth_tbps"] == pytest.approx(3.0)


def test_autotune_notes_name_each_skip_reason(monkeypatch):
    from tegula.kernels import api
    from tegula.runtime.autotune import Autotuner

    tuner = Autotuner("copy", timer=lambda fn: (fn(), 1e-3)[1], persist=False)
    monkeypatch.setitem(api.TUNERS, "copy", tuner)
    assert gpu.autotune_notes("copy") == []

    def run(config):
        if config.threads == 256:
            raise RuntimeError("kernel copy has no parameter 'threads'")

    tuner.select([{"BM": 1}, {"BM": 2, "threads": 256}, {"BM": 4, "threads": 256}], (64,), run)
    (line,) = gpu.autotune_notes("copy")
    assert "2 skipped" in line and "no parameter 'threads'" in line


def test_gemm_reports_tegula_against_the_faster_triton_kernel_per_shape():
    """`bench gemm`'s note: per shape the faster of the plain and the persistent TMA
    Triton kernels, geomean per group; a shape where neither ran is left out."""
    from tegula.bench.gemm import best_triton_lines

    def record(tags, tegula, plain, tma):
        results = {"tegula": {"status": "ok", "tflops": tegula}}
        for name, value in (("triton", plain), ("triton_tma", tma)):
            if value is not None:
                results[name] = {"status": "ok", "tflops": value}
        return {"tags": [tags], "results": results}
    lines = best_triton_lines([record("large", 600, 500, 400), record("large", 600, 300, 400),
                               record("decode", 100, None, None)])
    assert lines == ["tegula / best Triton per shape, geomean (large, 2 shapes): 1.34x"]  # 1.2, 1.5
