"""GEMV (M = 1) load shapes on the GPU against the copy bandwidth (a tuning aid).

    python benchmarks/gemv_sweep.py --shape 4096x4096 --variant "" --variant "BN=8,UNROLL=4"

Per shape (N x K, f16 unless --dtype): the yardsticks of the same byte count (a torch clone of
half of w: N·K/2 elements read and written; `w.sum()`: w's bytes read once), torch's
`x @ w.T` (cuBLAS), `tegula.kernels.gemv` as users call it (autotuned), then each fixed
variant of `gemv_kernel` (comma-separated NAME=INT options of `gemv_config`, "" its default;
threads=N the block size). Every tegula output is written into a NaN-poisoned buffer and
checked element by element against a float64 reference before it is timed, L2 flushed
before each run. Columns: µs, TB/s on w's bytes, the fraction of the 1 GiB copy bandwidth
(measured in this process) and of the same-size clone's.

`--breakdown` (issue 13: how much of a small GEMV is the launch) times each of the clone,
torch's `x @ w.T`, the tuned entry and the default kernel launch three ways, L2 flushed
before each run: CUDA events around the call (as above: launch latency, the block
scheduler's ramp and the kernel), the kernels' own durations as CUPTI records them
(torch.profiler: from the first block's start to the last's end, no launch), and events
around the replay of a CUDA graph holding the call (no Python or driver launch path).
"""
from __future__ import annotations

import argparse
import time

import torch

import tegula.kernels as tk
from tegula.bench import gpu
from tegula.dtypes import bf16, f16
from tegula.kernels.api import _launch
from tegula.kernels.gemv import gemv_config, gemv_kernel

TORCH = {"f16": torch.float16, "bf16": torch.bfloat16}


def parse_variant(text: str) -> dict:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, value = item.split("=")
        out[name] = bool(int(value)) if name == "PREFETCH" else int(value)
    return out


def check(y, x, w) -> float:
    """Largest error over (one output ulp of |ref| + 2^-16 Σ|x·w|); > 1 is wrong."""
    ref = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    ulp = 2.0 ** -(10 if y.dtype == torch.float16 else 7)
    bound = ulp * ref.abs() + 2.0 ** -16 * scale
    if torch.isnan(y).any():
        return float("inf")
    return ((y.double() - ref).abs() / bound).max().item()


def sweep(n: int, k: int, dtype: str, variants: list[str], copy_bps: float,
          flush: str) -> None:
    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(1, k, device="cuda", generator=g).to(TORCH[dtype])
    w = torch.randn(n, k, device="cuda", generator=g).to(TORCH[dtype])
    nbytes = n * k * w.element_size()
    time_ms = lambda fn: gpu.time_ms(fn, flush=flush)  # noqa: E731
    half = w.view(-1)[: n * k // 2]
    same_ms = time_ms(half.clone)
    label = f"{n}x{k} {dtype}"

    def row(name: str, ms: float, note: str = "") -> None:
        print(f"| {label} | {name} | {ms * 1e3:.1f} us | {nbytes / ms / 1e9:.2f} TB/s | "
              f"{nbytes / (ms * 1e-3) / copy_bps:.0%} | {same_ms / ms:.0%} | {note} |",
              flush=True)

    row("same-size clone", same_ms, "half of w read and written")
    row("w.sum()", time_ms(lambda: w.sum(dtype=torch.float32)), "w read once")
    row("torch x @ w.T", time_ms(lambda: x @ w.T))
    out = torch.full((1, n), float("nan"), device="cuda", dtype=w.dtype)
    tk.gemv(x, w, out=out)
    row("tk.gemv (tuned)", time_ms(lambda: tk.gemv(x, w)), f"err/bound {check(out, x, w):.2f}")
    kernel = gemv_kernel(f16 if dtype == "f16" else bf16)
    for text in variants:
        tiles = parse_variant(text)
        threads = tiles.pop("threads", 128)
        grid, constexprs = gemv_config(1, n, k, threads=threads, **tiles)
        launch = lambda: _launch(kernel, grid, (x, w, out), constexprs, threads)  # noqa: E731
        out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        err = check(out, x, w)
        if err > 1:
            print(f"| {label} | {text or 'default'} | WRONG: err/bound {err:.2f} |")
            continue
        row(f"{constexprs} t{threads}", time_ms(launch), f"err/bound {err:.2f}")


def _kernel_us(torch, fn, empty_l2, runs: int = 30) -> float:
    """Median summed duration (µs) of the GPU kernels one `fn()` runs, from the CUPTI
    activity records torch.profiler keeps for `runs` calls, each after an L2 flush (whose
    kernels are told apart by name: those of a flush-only run)."""
    from torch.profiler import ProfilerActivity, profile

    def kernels(body) -> list:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            body()
            torch.cuda.synchronize()
        found = [e for e in prof.events() if e.device_type.name == "CUDA"]
        return sorted(found, key=lambda e: e.time_range.start)

    flush_names = {e.name for e in kernels(lambda: [empty_l2() for _ in range(3)])}

    def body() -> None:
        for _ in range(runs):
            empty_l2()
            fn()

    mine = [e for e in kernels(body) if e.name not in flush_names]
    per_call = len(mine) // runs
    if per_call == 0 or len(mine) % runs:
        raise RuntimeError(f"{len(mine)} kernels for {runs} calls")
    sums = sorted(sum(e.time_range.elapsed_us() for e in mine[i:i + per_call])
                  for i in range(0, len(mine), per_call))
    return sums[len(sums) // 2]


def _graph_ms(torch, fn, flush: str) -> float:
    """Median ms of replaying a CUDA graph that holds `fn()` (captured after a warm-up
    call), L2 flushed before each replay, as `gpu.time_ms` times calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return gpu.time_ms(graph.replay, flush=flush)


def breakdown(n: int, k: int, dtype: str, flush: str) -> None:
    """Per implementation: µs by events, by CUPTI's kernel durations, by graph replay."""
    from tegula.runtime.autotune import l2_emptier
    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(1, k, device="cuda", generator=g).to(TORCH[dtype])
    w = torch.randn(n, k, device="cuda", generator=g).to(TORCH[dtype])
    out = torch.full((1, n), float("nan"), device="cuda", dtype=w.dtype)
    tk.gemv(x, w, out=out)
    if check(out, x, w) > 1:
        print(f"| {n}x{k} {dtype} | tk.gemv | WRONG |")
        return
    kernel = gemv_kernel(f16 if dtype == "f16" else bf16)
    grid, constexprs = gemv_config(1, n, k)
    half = w.view(-1)[: n * k // 2]
    empty_l2 = l2_emptier(torch, flush, 256 * 1024 * 1024)
    fns = {"same-size clone": half.clone, "torch x @ w.T": lambda: x @ w.T,
           "tk.gemv (tuned)": lambda: tk.gemv(x, w, out=out),
           f"gemv_kernel {constexprs}":
               lambda: _launch(kernel, grid, (x, w, out), constexprs, 128)}
    nbytes = n * k * w.element_size()
    for name, fn in fns.items():
        event_us = gpu.time_ms(fn, flush=flush) * 1e3
        try:
            kernel_us = _kernel_us(torch, fn, empty_l2)
        except Exception as e:  # noqa: BLE001 — no CUPTI here is a cell, not the end
            kernel_us = float("nan")
            print(f"# CUPTI durations unavailable: {type(e).__name__}: {e}")
        try:
            graph_us = _graph_ms(torch, fn, flush) * 1e3
        except Exception as e:  # noqa: BLE001
            graph_us = float("nan")
            print(f"# graph capture failed for {name}: {type(e).__name__}: {e}")
        print(f"| {n}x{k} {dtype} | {name} | events {event_us:.1f} us | kernel {kernel_us:.1f} "
              f"us ({nbytes / (kernel_us * 1e-6) / 1e12:.2f} TB/s) | graph {graph_us:.1f} us "
              f"| launch+ramp {event_us - kernel_us:.1f} us |", flush=True)
    if check(out, x, w) > 1:  # the timed runs wrote out too
        print(f"| {n}x{k} {dtype} | after timing | WRONG |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", required=True, help="NxK, repeatable")
    parser.add_argument("--dtype", choices=tuple(TORCH), default="f16")
    parser.add_argument("--variant", action="append", default=None)
    parser.add_argument("--flush", choices=gpu.FLUSH_MODES, default="clean")
    parser.add_argument("--breakdown", action="store_true",
                        help="events vs CUPTI kernel durations vs CUDA-graph replay")
    args = parser.parse_args()
    t0 = time.monotonic()
    copy_bps = gpu.copy_bandwidth(torch, flush=args.flush)
    print(f"copy {copy_bps / 1e12:.2f} TB/s (1 GiB, read + written)")
    if args.breakdown:
        print("| shape | what | CUDA events | CUPTI kernel time | graph replay | events - kernel |")
        for shape in args.shape:
            n, k = (int(s) for s in shape.split("x"))
            breakdown(n, k, args.dtype, args.flush)
            print(f"# {shape} breakdown done at {time.monotonic() - t0:.0f} s", flush=True)
        return
    print("| shape | what | us | TB/s on w | % 1 GiB copy | % same-size clone | note |")
    for shape in args.shape:
        n, k = (int(s) for s in shape.split("x"))
        sweep(n, k, args.dtype, args.variant or [""], copy_bps, args.flush)
        print(f"# {shape} done at {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
