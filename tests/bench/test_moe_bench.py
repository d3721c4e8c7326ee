"""The moe benchmark suite without a GPU: registered, `--help` without torch, a clean
refusal without CUDA, and its case list naming what it claims to compare."""
from __future__ import annotations

import subprocess
import sys

from tegula.bench import SUITES

_NO_TORCH = """
import sys
sys.modules["torch"] = None
sys.modules["triton"] = None
from tegula.bench.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _NO_TORCH, "moe", *args],
                          capture_output=True, text=True, timeout=120)


def test_registered_and_refuses_cleanly_without_torch():
    assert SUITES["moe"] == "tegula.bench.moe"
    done = run("--quick")
    assert done.returncode == 1 and done.stdout == ""
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr
    helped = run("--help")
    assert helped.returncode == 0 and "--fp8" in helped.stdout and "dense" in helped.stdout


def test_cases_are_moe_shapes():
    from tegula.bench import moe
    for label, tokens, k, experts, kdim, n in moe.CASES:
        assert tokens * k % experts == 0, f"{label}: balanced routing needs T·k / E rows"
