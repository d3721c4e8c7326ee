"""The barrier-placement kernels (`tests/lower/sync_kernels.py`: loop-carried, after-loop,
nested-loop and branch hazards; a warp-specialized consumer loop writing and reading a
scratch tile; cumulative sums back to back through one scratch row) are right on the
GPU, element by element against numpy, and compute-sanitizer racecheck and synccheck find
no hazard in the consumer loop or the scan chain."""
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
sys.path.insert(0, str(HERE))
import sync_sanitize  # noqa: E402


def test_plain_kernels_are_right_on_the_gpu():
    sync_sanitize.run_plain()


def test_the_consumer_scratch_kernel_is_right_on_the_gpu():
    sync_sanitize.run_consumer()


def test_the_scan_chain_is_right_on_the_gpu():
    sync_sanitize.run_scan()


def test_the_stage_loops_are_right_on_the_gpu():
    sync_sanitize.run_stages()


@pytest.mark.parametrize("case", ["consumer", "scan", "stages"])
@pytest.mark.parametrize("tool", ["racecheck", "synccheck"])
def test_the_consumer_loop_and_the_scan_chain_are_clean_under_compute_sanitizer(tool, case):
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.access(sanitizer, os.X_OK):
        pytest.skip("compute-sanitizer not found")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sanitizer, "--tool", tool, sys.executable,
                           str(HERE / "sync_sanitize.py"), case],
                          capture_output=True, text=True, env=env, timeout=280, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"{case}: right" in out
    summary = re.search(r"ERROR SUMMARY: (\d+) error", out)
    hazards = re.search(r"RACECHECK SUMMARY: (\d+) hazard", out)
    # racecheck ends with a RACECHECK SUMMARY (hazards), synccheck with an ERROR SUMMARY:
    # at least one must be printed, and every one printed must say zero.
    assert summary or hazards, out[-3000:]
    assert summary is None or summary.group(1) == "0", out[-3000:]
    assert hazards is None or hazards.group(1) == "0", out[-3000:]
