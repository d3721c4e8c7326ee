"""What the GPU suites (gemm, norm, softmax, copy) share: options, timing, checking, the
device-to-device copy ceiling, the ratio table, and the JSON + PNG record.

Method (docs/design.md, "Tests and benchmarks"; measurements in docs/performance.md):
* fresh random inputs per shape (never zeros), made on the GPU;
* every implementation's result is checked against a higher-precision torch reference,
  once per shape, before it is timed; its output is poisoned with NaN first where the
  implementation takes `out=`, so an unwritten element cannot pass. A wrong result is
  reported "WRONG" and not timed, an exception "ERROR" (with its message in the JSON);
* timing is do_bench's scheme with CUDA events (warm-up, L2 emptied before every run,
  median); L2 is emptied by reading a 256 MB buffer (`--flush clean`, the default) or by
  zeroing it as do_bench does (`--flush dirty`, which also charges each run for writing
  back the flush's dirty lines; see FLUSH_MODES);
* the floor is counted per shape (FLOPs, fewest bytes read + written) and the memory-bound
  kernels are also reported as a fraction of the copy bandwidth measured in the same run.

This module imports only the standard library at import time: torch and triton are loaded
by `load_torch()` once a suite knows it will run.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tegula.bench import RESULTS_DIR, format_table, machine_info


def add_common_options(parser: argparse.ArgumentParser, dtypes: Sequence[str],
                       shape_help: str) -> None:
    """The options every GPU suite takes."""
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--shapes", default=None, help=shape_help)
    parser.add_argument("--dtype", choices=list(dtypes), default=dtypes[0],
                        help=f"element type (default {dtypes[0]})")
    parser.add_argument("--out", default=None,
                        help=f"directory for the JSON and PNG (default {RESULTS_DIR})")
    parser.add_argument("--max-seconds", type=float, default=420.0,
                        help="stop adding shapes after this many seconds (default 420)")
    parser.add_argument("--no-triton", action="store_true", help="skip the Triton kernels")
    parser.add_argument("--flush", choices=FLUSH_MODES, default="clean",
                        help="how L2 is emptied before each timed run: read a 256 MB buffer "
                             "(clean, default) or zero it like triton's do_bench (dirty)")
    parser.add_argument("--no-write", action="store_true", help="print only: no JSON, no PNG")


def parse_shapes(text: str, rank: int) -> list[tuple[int, ...]]:
    """ "4096x4096x4096,16x4096x4096" -> [(4096, 4096, 4096), (16, 4096, 4096)]."""
    shapes = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        dims = tuple(int(d) for d in item.lower().split("x"))
        if len(dims) != rank or any(d <= 0 for d in dims):
            raise argparse.ArgumentTypeError(
                f"shape {item!r}: expected {rank} positive extents joined by 'x'")
        shapes.append(dims)
    return shapes


def load_torch(suite: str) -> tuple[Any, str | None]:
    """(torch, None) when a CUDA GPU is usable, else (None, a one-line reason)."""
    try:
        import torch
    except ImportError:
        return None, f"the {suite} benchmark needs a CUDA GPU and PyTorch (torch is not installed)"
    if not torch.cuda.is_available():
        return None, f"the {suite} benchmark needs a CUDA GPU (torch sees none)"
    return torch, None


def load_triton(disabled: bool) -> tuple[Any, str]:
    """(tegula.bench.triton_kernels or None, a note on why not)."""
    if disabled:
        return None, "Triton skipped (--no-triton)"
    try:
        from tegula.bench import triton_kernels
    except Exception as e:  # noqa: BLE001 — ImportError, or triton failing to initialize
        return None, f"Triton unavailable ({type(e).__name__}: {e})"
    import triton
    return triton_kernels, f"Triton {triton.__version__}"


class Budget:
    """Wall-clock budget for a suite: shapes stop being added once it is spent."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def spent(self) -> bool:
        return self.elapsed() > self.seconds


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------

# How L2 is emptied before each timed run. "clean" reads a 256 MB buffer: L2 then holds
# only clean lines of it, so the timed kernel starts cold and owes DRAM nothing. "dirty"
# zeroes the buffer, as triton.testing.do_bench does: L2 is left full of dirty lines that
# the timed kernel's own traffic must write back first — about 50 MB on an H200, which
# costs a 32 MB-in, 32 MB-out kernel 13-15% of its bandwidth, whoever wrote it
# (benchmarks/experiments/l2_flush.py), and large problems nothing measurable.
FLUSH_MODES = ("clean", "dirty")
FLUSH_NOTE = {"clean": "a 256 MB buffer read", "dirty": "a 256 MB buffer zeroed, as do_bench"}
_FLUSH_BYTES = 256 * 1024 * 1024


def time_ms(fn: Callable[[], Any], warmup_ms: float = 25.0, rep_ms: float = 100.0,
            flush: str = "clean") -> float:
    """Median milliseconds of `fn`, with L2 flushed (`flush`, see FLUSH_MODES) before each
    run: do_bench's scheme (estimate, warm up, then one CUDA-event pair per run)."""
    import torch

    from tegula.runtime.autotune import l2_emptier

    if flush not in FLUSH_MODES:
        raise ValueError(f"flush must be one of {FLUSH_MODES}, got {flush!r}")
    empty_l2 = l2_emptier(torch, flush, _FLUSH_BYTES)
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        empty_l2()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    samples = []
    for _ in range(max(5, int(rep_ms / estimate))):
        empty_l2()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        samples.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in samples)


def copy_bandwidth(torch: Any, gib: float = 1.0, flush: str = "clean") -> float:
    """Device-to-device copy bandwidth in bytes/s: a `gib` GiB tensor copied by torch,
    counting bytes read plus bytes written (the ceiling memory-bound kernels aim at)."""
    n = int(gib * 2**30) // 4
    src = torch.randn(n, device="cuda", dtype=torch.float32)
    copy_once = functools.partial(torch.empty_like(src).copy_, src)
    del src
    ms = time_ms(copy_once, flush=flush)
    del copy_once  # frees both buffers before the suite's shapes
    torch.cuda.empty_cache()
    return 2 * n * 4 / (ms * 1e-3)


# --------------------------------------------------------------------------------------
# Cases and their measurement
# --------------------------------------------------------------------------------------

@dataclass
class Impl:
    """One implementation of a case: `run()` returns the result (what is timed); `check()`
    (default `run`) returns the result for the correctness check, into a poisoned output
    where the implementation takes one; `note()` says which configuration ran."""

    name: str
    run: Callable[[], Any]
    check: Callable[[], Any] | None = None
    note: Callable[[], str] | None = None


@dataclass
class Case:
    """One shape: its label, the floor (FLOPs, fewest bytes moved), the reference result,
    the tolerance on ‖out − ref‖ / ‖ref‖, and the implementations to measure."""

    label: str
    dims: tuple[int, ...]
    flops: float
    bytes: float
    reference: Callable[[], Any]
    tol: float
    impls: list[Impl] = field(default_factory=list)
    tags: tuple[str, ...] = ()
    # A device-to-device copy of the same bytes (torch's clone of the input), timed with
    # the implementations: the bandwidth a memory-bound kernel of this size can reach.
    same_size_copy: Callable[[], Any] | None = None


def report_copy_bandwidth(torch: Any, flush: str) -> float | None:
    """The device copy bandwidth (`copy_bandwidth`), printed; None, with the reason
    printed, where it cannot be measured — a suite reports its kernels without the
    ceiling rather than not at all."""
    try:
        copy_bw = copy_bandwidth(torch, flush=flush)
    except Exception as e:  # noqa: BLE001 — report the kernels even without the ceiling
        print(f"copy bandwidth not measured: {type(e).__name__}: {e}")
        return None
    print(f"device-to-device copy (torch, 1 GiB, read + write): {copy_bw / 1e12:.2f} TB/s")
    return copy_bw


def rel_error(out: Any, ref: Any) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN anywhere in `out` gives NaN, which fails)."""
    import torch

    o, r = out.double(), ref.double()
    den = float(torch.linalg.vector_norm(r))
    num = float(torch.linalg.vector_norm(o - r))
    if den == 0.0:
        return num
    return num / den


def _sync() -> None:
    """Wait for the GPU (a no-op where torch has no CUDA: the CPU tests of this module)."""
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure_case(case: Case, log: Callable[[str], None] = print,
                 timer: Callable[[Callable[[], Any]], float] | None = None) -> dict[str, Any]:
    """Check, then time (`timer`: milliseconds, default `time_ms`), every implementation
    of `case`; one JSON-ready dict."""
    import torch

    timer = timer or time_ms

    record: dict[str, Any] = {"label": case.label, "dims": list(case.dims),
                              "flops": case.flops, "bytes": case.bytes, "tags": list(case.tags),
                              "tol": case.tol, "results": {}}
    try:
        ref = case.reference()
    except Exception as e:  # noqa: BLE001 — without a reference nothing can be checked
        record["error"] = f"reference failed: {type(e).__name__}: {e}"
        log(f"  {case.label}: reference failed ({type(e).__name__}: {e})")
        return record
    for impl in case.impls:
        record["results"][impl.name] = entry = _measure_impl(case, impl, ref, timer)
        log(f"  {case.label:>22} {impl.name:<8} {_describe(entry)}")
    del ref
    if case.same_size_copy is not None:
        try:
            ms = timer(case.same_size_copy)
            record["same_size_copy_tbps"] = case.bytes / (ms * 1e-3) / 1e12
            log(f"  {case.label:>22} {'copy':<8} {ms * 1e3:10.1f} us  "
                f"{record['same_size_copy_tbps']:.2f} TB/s  (same bytes, torch clone)")
        except Exception as e:  # noqa: BLE001 — the yardstick is optional
            log(f"  {case.label}: same-size copy failed ({type(e).__name__}: {e})")
    torch.cuda.empty_cache()
    return record


def _measure_impl(case: Case, impl: Impl, ref: Any,
                  timer: Callable[[Callable[[], Any]], float]) -> dict[str, Any]:
    entry: dict[str, Any] = {"status": "ERROR"}
    try:
        out = (impl.check or impl.run)()
        _sync()
        err = rel_error(out, ref)
        del out
        entry["rel_err"] = err if math.isfinite(err) else str(err)
        if impl.note is not None:
            entry["config"] = impl.note()
        if not err <= case.tol:  # NaN fails too
            entry["status"] = "WRONG"
            return entry
        ms = timer(impl.run)
        entry.update(status="ok", ms=ms,
                     tflops=case.flops / (ms * 1e-3) / 1e12 if case.flops else None,
                     tbps=case.bytes / (ms * 1e-3) / 1e12)
    except Exception as e:  # noqa: BLE001 — one failure must not stop the suite
        entry["error"] = f"{type(e).__name__}: {str(e).strip()[:2000]}"
    return entry


def _describe(entry: dict[str, Any]) -> str:
    if entry["status"] == "ok":
        rate = f"{entry['tflops']:.1f} TFLOP/s" if entry.get("tflops") else \
            f"{entry['tbps']:.2f} TB/s"
        return f"{entry['ms'] * 1e3:10.1f} us  {rate}  err {entry['rel_err']:.1e}" + \
            (f"  [{entry['config']}]" if entry.get("config") else "")
    if entry["status"] == "WRONG":
        return f"WRONG (rel err {entry.get('rel_err')} > tolerance)"
    return f"ERROR {entry.get('error', '')[:300]}"


def run_cases(make_cases: Sequence[tuple[str, Callable[[], Case]]], budget: Budget,
              log: Callable[[str], None] = print,
              timer: Callable[[Callable[[], Any]], float] | None = None,
              ) -> tuple[list[dict], list[str]]:
    """Measure each case in turn (built lazily, so only one shape's tensors live at a
    time) until the budget is spent; (records, labels skipped for lack of time)."""
    records, skipped = [], []
    for i, (label, make) in enumerate(make_cases):
        if budget.spent():
            skipped = [lbl for lbl, _ in make_cases[i:]]
            log(f"time budget of {budget.seconds:.0f} s spent: skipping {len(skipped)} "
                f"shape(s): {', '.join(skipped)}")
            break
        log(f"[{i + 1}/{len(make_cases)}] {label} ({budget.elapsed():.0f} s elapsed)")
        try:
            case = make()
        except Exception as e:  # noqa: BLE001 — e.g. out of memory making the inputs
            log(f"  {label}: could not make inputs ({type(e).__name__}: {e})")
            records.append({"label": label, "error": f"{type(e).__name__}: {e}", "results": {}})
            continue
        records.append(measure_case(case, log, timer))
        del case
    return records, skipped


# --------------------------------------------------------------------------------------
# Summary: ratios, table, record, plot
# --------------------------------------------------------------------------------------

def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def rate(record: dict, impl: str, metric: str) -> float | None:
    """`metric` ("tflops" or "tbps") of `impl` in one case record, when it ran correctly."""
    entry = record.get("results", {}).get(impl)
    return entry.get(metric) if entry and entry.get("status") == "ok" else None


def status_cell(record: dict, impl: str, metric: str) -> str:
    entry = record.get("results", {}).get(impl)
    if entry is None:
        return "-"
    if entry.get("status") != "ok":
        return entry.get("status", "ERROR")
    return f"{entry[metric]:.1f}" if metric == "tflops" else f"{entry[metric]:.2f}"


def ratio(record: dict, a: str, b: str, metric: str) -> float | None:
    ra, rb = rate(record, a, metric), rate(record, b, metric)
    return ra / rb if ra and rb else None


def summary_table(records: list[dict], impls: Sequence[str], peers: Sequence[str],
                  metric: str, copy_tbps: float | None = None,
                  groups: dict[str, Callable[[dict], bool]] | None = None,
                  label_of: Callable[[str], str] = lambda s: s) -> tuple[str, dict]:
    """The printed table (a rate per implementation, tegula's ratio to each peer and, for
    memory-bound suites, to the copy bandwidth; geomeans last) and the geomeans."""
    unit = "TFLOP/s" if metric == "tflops" else "TB/s"
    headers = ["shape"] + [f"{label_of(i)} {unit}" for i in impls]
    same_size = any("same_size_copy_tbps" in r for r in records)
    if copy_tbps:
        headers.append("tegula/copy")
    if same_size:
        headers.append("tegula/same-size copy")
    headers += [f"tegula/{label_of(p)}" for p in peers] + ["tegula config"]
    rows = []
    for r in records:
        row = [r["label"]] + [status_cell(r, i, metric) for i in impls]
        if copy_tbps:
            t = rate(r, "tegula", "tbps")
            row.append(f"{t / copy_tbps:.0%}" if t else "-")
        if same_size:
            row.append(f"{_same_size_fraction(r):.0%}" if _same_size_fraction(r) else "-")
        row += [_fmt_ratio(ratio(r, "tegula", p, metric)) for p in peers]
        row.append(r.get("results", {}).get("tegula", {}).get("config", ""))
        rows.append(row)
    geomeans: dict[str, dict[str, float | None]] = {}
    for name, keep in (groups or {"all": lambda r: True}).items():
        chosen = [r for r in records if keep(r)]
        g = {f"tegula/{p}": geomean([ratio(r, "tegula", p, metric) for r in chosen])
             for p in peers}
        if copy_tbps:
            g["tegula/copy"] = geomean([(rate(r, "tegula", "tbps") or 0) / copy_tbps
                                        for r in chosen])
        if same_size:
            g["tegula/same-size copy"] = geomean([_same_size_fraction(r) for r in chosen])
        geomeans[name] = g
        ran = sum(1 for r in chosen if rate(r, "tegula", metric))
        row = [f"geomean ({name}, {ran}/{len(chosen)} ran)"] + [""] * len(impls)
        if copy_tbps:
            row.append(f"{g['tegula/copy']:.0%}" if g["tegula/copy"] else "-")
        if same_size:
            same = g["tegula/same-size copy"]
            row.append(f"{same:.0%}" if same else "-")
        row += [_fmt_ratio(g[f"tegula/{p}"]) for p in peers] + [""]
        rows.append(row)
    return format_table(headers, rows), geomeans


def _same_size_fraction(record: dict) -> float | None:
    """tegula's bandwidth over the same-size copy's, for one case (None if either is missing)."""
    t, c = rate(record, "tegula", "tbps"), record.get("same_size_copy_tbps")
    return t / c if t and c else None


def _fmt_ratio(x: float | None) -> str:
    return f"{x:.2f}x" if x else "-"


def gpu_info(torch: Any) -> dict[str, Any]:
    """The GPU and the software measured (recorded with every result)."""
    props = torch.cuda.get_device_properties(0)
    info = {"name": props.name, "sm_count": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
            "cuda": torch.version.cuda}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def slug(text: str) -> str:
    """A file-name-safe lower-case form: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def write_record(suite: str, gpu: dict[str, Any], payload: dict[str, Any],
                 out_dir: str | None) -> Path:
    """`<out>/<suite>-<dtype>-<gpu>-<date>.json` with the machine, GPU and payload (the
    dtype is in the name so runs of one suite in several dtypes do not overwrite)."""
    day = _dt.date.today().isoformat()
    directory = Path(out_dir) if out_dir is not None else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    dtype = payload.get("dtype")
    label = f"{suite}-{dtype}" if dtype else suite
    path = directory / f"{label}-{slug(gpu['name'])}-{day}.json"
    record = {"suite": suite, "date": day, "gpu": gpu, "machine": machine_info(), **payload}
    path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def plot(path: Path, title: str, records: list[dict], impls: Sequence[str], metric: str,
         ceiling: float | None = None, label_of: Callable[[str], str] = lambda s: s) -> str:
    """Grouped bars (one group per shape, one bar per implementation) saved to `path`;
    returns a line saying what happened (matplotlib may be missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no PNG: matplotlib is not installed"
    labels = [r["label"] for r in records]
    width = 0.8 / max(1, len(impls))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.35 * len(labels) * len(impls) + 2), 5))
    for j, impl in enumerate(impls):
        values = [rate(r, impl, metric) or 0.0 for r in records]
        xs = [i + j * width for i in range(len(labels))]
        ax.bar(xs, values, width, label=label_of(impl))
        for x, r in zip(xs, records):  # name what has no bar: WRONG, ERROR
            status = r.get("results", {}).get(impl, {}).get("status", "ok")
            if status != "ok":
                ax.text(x, 0, status, rotation=90, ha="center", va="bottom", fontsize=7)
    if ceiling:
        ax.axhline(ceiling, color="black", linestyle="--", linewidth=1,
                   label=f"device copy {ceiling:.2f} TB/s")
    ax.set_xticks([i + width * (len(impls) - 1) / 2 for i in range(len(labels))])
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s" if metric == "tflops" else "TB/s (read + write)")
    # Legend in a row above the bars: memory-bound bars reach the ceiling line, so a
    # legend inside the axes would hide the last shapes.
    ax.legend(fontsize=8, ncol=len(impls) + 1, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    ax.set_title(title, pad=22)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def finish(suite: str, torch: Any, args: argparse.Namespace, records: list[dict],
           skipped: list[str], impls: Sequence[str], peers: Sequence[str], metric: str,
           notes: list[str], extra: dict[str, Any], copy_bytes_per_s: float | None,
           groups: dict[str, Callable[[dict], bool]] | None = None,
           label_of: Callable[[str], str] = lambda s: s) -> int:
    """Print the table (last, so the end of the output carries it), write JSON and PNG."""
    copy_tbps = copy_bytes_per_s / 1e12 if copy_bytes_per_s else None
    table, geomeans = summary_table(records, impls, peers, metric,
                                    copy_tbps if metric == "tbps" else None, groups, label_of)
    gpu = gpu_info(torch)
    lines = []
    if not args.no_write:
        payload = {"dtype": args.dtype, "quick": args.quick, "flush": args.flush,
                   "impls": list(impls),
                   "copy_bandwidth_tbps": copy_tbps, "geomeans": geomeans,
                   "skipped_for_time": skipped, "notes": notes, "cases": records, **extra}
        path = write_record(suite, gpu, payload, args.out)
        lines.append(f"wrote {path}")
        lines.append(plot(path.with_suffix(".png"), f"{suite} ({args.dtype}) on {gpu['name']}",
                          records, impls, metric, copy_tbps if metric == "tbps" else None,
                          label_of))
    header = f"{suite} ({args.dtype}) on {gpu['name']}"
    if copy_tbps:
        header += f"; device copy {copy_tbps:.2f} TB/s"
    print()
    for line in notes + lines:
        print(line)
    if skipped:
        print(f"skipped for time: {', '.join(skipped)}")
    print(header)
    print(table)
    return 0


def no_gpu(message: str) -> int:
    """Say why a GPU suite cannot run; exit status 1."""
    print(message, file=sys.stderr)
    return 1


# --------------------------------------------------------------------------------------
# The memory-bound suites (norm, softmax, copy) share one driver
# --------------------------------------------------------------------------------------

FLOAT_TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def tuned_note(name: str) -> Callable[[], str]:
    """A note naming the configuration tegula's autotuner chose for the latest call."""
    def note() -> str:
        from tegula.kernels.api import TUNERS
        last = TUNERS[name].last
        return f"{last.best} ({last.source})" if last is not None else ""
    return note


def autotune_records(name: str) -> dict[str, Any]:
    """Every record an entry point's tuner holds (winners, timings, skip reasons)."""
    from tegula.kernels.api import TUNERS
    return {key: dict(r.as_json(), source=r.source) for key, r in TUNERS[name].records.items()}


def autotune_notes(name: str) -> list[str]:
    """One line per distinct reason tegula's tuner skipped candidates (the JSON has all)."""
    from tegula.kernels.api import TUNERS
    reasons: dict[str, list[str]] = {}
    total = 0
    for record in TUNERS[name].records.values():
        total += len(record.trials)
        for trial in record.trials:
            if trial.error:
                reasons.setdefault(trial.error[:200], []).append(str(trial.config))
    lines = [f"autotune {name}: {len(v)} skipped like [{v[0]}]: {k}" for k, v in reasons.items()]
    return lines or ([f"autotune {name}: all {total} candidates ran"] if total else [])


def memory_suite_main(suite: str, doc: str, argv: list[str] | None,
                      shapes: list[tuple[int, int]], quick: list[tuple[int, int]],
                      make_case: Callable[..., Case], tuner: str, torch_label: str) -> int:
    """Options, the copy ceiling, every shape, the table: one memory-bound suite.
    `make_case(torch, (M, N), dtype, triton_kernels)` builds one shape's case."""
    parser = argparse.ArgumentParser(prog=f"python -m tegula.bench {suite}",
                                     description=doc.splitlines()[0])
    add_common_options(parser, ("f16", "bf16", "f32"), "comma-separated MxN shapes, e.g. "
                       "16384x4096,8191x3000")
    args = parser.parse_args(argv)
    chosen = parse_shapes(args.shapes, 2) if args.shapes else quick if args.quick else shapes
    torch, why = load_torch(suite)
    if torch is None:
        return no_gpu(why)
    budget = Budget(args.max_seconds)
    triton_kernels, triton_note = load_triton(args.no_triton)
    print(f"{suite} ({args.dtype}) on {torch.cuda.get_device_name()}; {triton_note}")
    copy_bw = report_copy_bandwidth(torch, args.flush)
    cases = [(f"{m}x{n}", lambda s=(m, n): make_case(torch, s, args.dtype, triton_kernels))
             for m, n in chosen]
    records, skipped = run_cases(cases, budget, timer=functools.partial(time_ms, flush=args.flush))
    impls = ["tegula", "torch"] + (["triton"] if triton_kernels is not None else [])
    notes = [triton_note,
             f"tegula: tegula.kernels.{tuner} as users call it (autotuned on its first call "
             f"per shape bucket, before timing); torch: {torch_label}; median, L2 flushed "
             f"before each run ({args.flush}: {FLUSH_NOTE[args.flush]})",
             "TB/s counts the fewest bytes read + written; tegula/copy is the fraction of the "
             "device-to-device copy bandwidth measured in this run (1 GiB); tegula/same-size "
             "copy the fraction of a torch clone of the same input, timed alongside"] + autotune_notes(tuner)
    labels = {"torch": "torch", "tegula": "tegula", "triton": "Triton"}
    return finish(suite, torch, args, records, skipped, impls, impls[1:], "tbps", notes,
                  {"autotune": autotune_records(tuner)}, copy_bw, None,
                  lambda s: labels.get(s, s))


__all__ = ["add_common_options", "parse_shapes", "load_torch", "load_triton", "Budget",
           "time_ms", "copy_bandwidth", "FLUSH_MODES", "FLUSH_NOTE", "Impl", "Case", "rel_error", "measure_case",
           "run_cases", "geomean", "summary_table", "gpu_info", "slug", "write_record", "plot",
           "finish", "no_gpu", "memory_suite_main", "tuned_note", "autotune_records",
           "autotune_notes",
           "FLOAT_TOLERANCE", "TORCH_DTYPES"]
