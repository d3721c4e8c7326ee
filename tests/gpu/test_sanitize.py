"""compute-sanitizer memcheck, racecheck and synccheck report no errors on the GEMM (sm_90a:
TMA + wgmma, warp-specialized by synthesis and in one role; sm_90: the Ampere path), the
persistent GEMM (its TMA ring across tiles, both role forms), the warp-specialized
producer/consumer sample and the softmax (one small launch each, through `tests/gpu/sanitize.py` in a subprocess)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

HERE = Path(__file__).resolve().parent


def _sanitizer() -> str:
    found = shutil.which("compute-sanitizer")
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        candidate = os.path.join(root or "", "bin", "compute-sanitizer")
        if not found and root and os.access(candidate, os.X_OK):
            found = candidate
    if not found:
        pytest.skip("compute-sanitizer not found")
    return found


TOOL_OPTIONS = {
    # API errors are not memory errors: cuda-bindings probes driver entry points with
    # cuGetProcAddress, which fails benignly and would count as "errors".
    "memcheck": ["--tool", "memcheck", "--report-api-errors", "no"],
    "racecheck": ["--tool", "racecheck"],
    "synccheck": ["--tool", "synccheck"],
}


def _sanitize(tool: str, case: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [_sanitizer(), *TOOL_OPTIONS[tool], sys.executable, str(HERE / "sanitize.py"), case],
        capture_output=True, text=True, env=env, timeout=280, check=False)
    out = proc.stdout + proc.stderr
    if "Device not supported" in out:  # e.g. under gVisor: the tool cannot run here at all
        pytest.skip("compute-sanitizer does not support this device/runtime")
    return out


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
@pytest.mark.parametrize("case", ["gemm", "gemm_one_role", "gemm_ampere", "warp_specialized",
                                  "softmax", "persistent_gemm", "persistent_gemm_one_role"])
def test_sanitizer_reports_zero_errors(case, tool):
    out = _sanitize(tool, case)
    assert f"{case}: ok" in out, out[-4000:]
    assert_clean(tool, out)


def assert_clean(tool: str, out: str) -> None:
    """The sanitizer's own summary line says no errors (each tool words it its own way)."""
    if tool in ("memcheck", "synccheck"):
        assert "ERROR SUMMARY: 0 errors" in out, out[-4000:]
    else:  # racecheck: "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
        assert re.search(r"RACECHECK SUMMARY: \d+ hazards displayed \(0 errors", out), out[-4000:]


def test_memcheck_reports_a_planted_out_of_bounds_write():
    out = _sanitize("memcheck", "planted_oob")
    assert "Invalid __global__ write" in out, out[-4000:]
    assert "ERROR SUMMARY: 0 errors" not in out
