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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", required=True, help="NxK, repeatable")
    parser.add_argument("--dtype", choices=tuple(TORCH), default="f16")
    parser.add_argument("--variant", action="append", default=None)
    parser.add_argument("--flush", choices=gpu.FLUSH_MODES, default="clean")
    args = parser.parse_args()
    t0 = time.monotonic()
    copy_bps = gpu.copy_bandwidth(torch, flush=args.flush)
    print(f"copy {copy_bps / 1e12:.2f} TB/s (1 GiB, read + written)")
    print("| shape | what | us | TB/s on w | % 1 GiB copy | % same-size clone | note |")
    for shape in args.shape:
        n, k = (int(s) for s in shape.split("x"))
        sweep(n, k, args.dtype, args.variant or [""], copy_bps, args.flush)
        print(f"# {shape} done at {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
