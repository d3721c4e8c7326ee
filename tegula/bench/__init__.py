"""Benchmarks: `python -m tegula.bench SUITE` measures one suite, prints a table, writes JSON.

Benchmarks are not tests (docs/design.md, "Tests and benchmarks"). Each suite is a module
with a `main(argv: list[str]) -> int`; `SUITES` maps a suite name to that module, so adding
a suite is one line here. The helpers below are shared by all suites: machine information
for the JSON record, a fixed-width table printer, and the result writer
(`<out>/<suite>-<date>.json`: the GPU suites default to `benchmarks/results/`, the project's
record; the CPU layout suite to `user_results_dir()`, outside any checkout).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

# Suite name -> module defining `main(argv) -> int`.
SUITES: dict[str, str] = {
    "layout": "tegula.bench.layout",
    "gemm": "tegula.bench.gemm",        # GPU suites: tegula vs torch and Triton
    "norm": "tegula.bench.norm",
    "softmax": "tegula.bench.softmax",
    "copy": "tegula.bench.copy",
    "quant": "tegula.bench.quant",      # W4A16 GEMM and GEMV
    "scan": "tegula.bench.scan",        # Mamba's selective scan
    "attention": "tegula.bench.attention",  # FlashAttention forward vs SDPA and Triton
    "attention_decode": "tegula.bench.attention_decode",  # split-KV decoding vs SDPA, copy
    "moe": "tegula.bench.moe",          # MoE grouped GEMM vs Triton and dense cuBLAS
}

RESULTS_DIR = Path("benchmarks") / "results"


def _cpu_name() -> str:
    """The CPU model: /proc/cpuinfo on Linux (platform.processor() is often empty there)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    """The tegula commit measured, when run from a git checkout (None otherwise)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    """Where the numbers come from, recorded with every result file."""
    import numpy

    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "numpy": numpy.__version__,
        "tegula_commit": _git_commit(),
    }


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table: text columns left-aligned, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(r, widths, numeric)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if v >= 100 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def user_results_dir() -> Path:
    """Where a CPU suite run by a user writes its JSON unless `--out` says otherwise:
    `$TEGULA_RESULTS_DIR`, else `$XDG_DATA_HOME/tegula/results` (default
    `~/.local/share/tegula/results`) -- never into the current directory, which is often
    a checkout of tegula itself."""
    env = os.environ.get("TEGULA_RESULTS_DIR")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return Path(data) / "tegula" / "results"


def write_result(suite: str, payload: dict[str, Any], out_dir: Path | str | None = None,
                 date: str | None = None) -> Path:
    """Write `payload` (plus suite, date, machine) to `<out_dir>/<suite>-<date>.json`."""
    day = date or _dt.date.today().isoformat()
    directory = Path(out_dir) if out_dir is not None else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    record = {"suite": suite, "date": day, "machine": machine_info(), **payload}
    path = directory / f"{suite}-{day}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


__all__ = ["SUITES", "RESULTS_DIR", "machine_info", "format_table", "write_result",
           "user_results_dir"]
