"""Selective-scan tile sweep on the GPU (a tuning aid): fixed configurations of
`tegula.kernels.selective_scan` at one shape, each checked against Mamba's reference in
float64 (every element, into a NaN-poisoned output) before it is timed with L2 flushed.

    python benchmarks/scan_sweep.py --shape 4x1536x2048 --dtype f32 \
        --variant "" --variant "G=16,BL=16" --variant "SPLIT=0"

A variant is comma-separated NAME=INT options of `selective_scan` ("" is the entry point's
default; SPLIT=0 the lane-scan kernel; LOG2F=1, not a kernel option, builds that variant with
CUDA's library `log2f` for `tg.log2` instead of the catalogue's `lg2.approx.f32`: session
11's code, for an A/B in one process); `--probe` runs each once, unchecked and untimed,
for a profiler. Prints, per variant, µs, the fraction of the copy
bandwidth (1 GiB copy measured in this process) on the bench's bytes (u, delta, z, out,
B, C, A, D, delta_bias), the ratio to the first variant and the relative error.
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch

from tegula.bench import gpu
from tegula.bench.scan import DSTATE, reference_loop
from tegula.kernels import selective_scan

TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
#: ‖out − ref‖∞ / ‖ref‖∞ allowed: the kernel computes in f32 from the same rounded inputs.
TOLERANCE = {"f32": 1e-4, "f16": 2e-3, "bf16": 1e-2}


def parse_variant(text: str) -> dict:
    """'G=16,BL=32' -> {'G': 16, 'BL': 32}; SPLIT as a bool."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, value = item.split("=")
        out[name] = bool(int(value)) if name == "SPLIT" else int(value)
    return out


@contextlib.contextmanager
def library_log2(on: bool):
    """While `on`: `tg.log2` printed as CUDA's `log2f` (session 11's emitter), with the
    scan kernels' builds and compiled launches forgotten before and after (they are cached
    on the kernel objects), so the variant and the ones after it are built afresh."""
    from tegula.codegen import expr
    from tegula.kernels import scan, scan_split

    def forget() -> None:
        for make in (scan_split.selective_scan_split_kernel, scan.selective_scan_kernel):
            make.cache_clear()

    if not on:
        yield
        return
    forget()
    saved = expr._FLOAT_UNARY["log2"]
    expr._FLOAT_UNARY["log2"] = "log2f({})"
    try:
        yield
    finally:
        expr._FLOAT_UNARY["log2"] = saved
        forget()


def inputs(shape: tuple[int, int, int], dtype: str, seed: int = 0) -> tuple:
    """The bench's Mamba-like inputs (`tegula.bench.scan.make_case`)."""
    batch, dim, length = shape
    t = TORCH[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *s, dt=t: torch.randn(*s, device="cuda", generator=g).to(dt)  # noqa: E731
    delta = (torch.rand(batch, dim, length, device="cuda", generator=g) * 0.1 - 4.0).to(t)
    return (rand(batch, dim, length), delta, -torch.exp(rand(dim, DSTATE, dt=torch.float32)),
            rand(batch, DSTATE, length), rand(batch, DSTATE, length),
            rand(dim, dt=torch.float32), rand(batch, dim, length),
            torch.rand(dim, device="cuda", generator=g) * 0.5)


def io_bytes(shape: tuple[int, int, int], dtype: str) -> int:
    batch, dim, length = shape
    size = TORCH[dtype].itemsize
    return 4 * batch * dim * length * size + 2 * batch * DSTATE * length * size + \
        (dim * DSTATE + 2 * dim) * 4


def sweep(shape, dtype: str, variants: list[str], copy_bps: float, flush: str) -> None:
    args = inputs(shape, dtype)
    want = reference_loop(torch, *args, dtype=torch.float64)
    scale = want.abs().max().item()
    nbytes = io_bytes(shape, dtype)
    first = None
    label = "x".join(map(str, shape))
    for text in variants:
        tiles = parse_variant(text)
        log2f = bool(tiles.pop("LOG2F", 0))
        with library_log2(log2f):
            row = _measure(args, tiles, want, scale, dtype, flush)
        if isinstance(row, str):
            print(f"| {label} | {dtype} | {text or 'default'} | {row} |")
            continue
        ms, err = row
        first = first or ms
        print(f"| {label} | {dtype} | {text or 'default'} | {ms * 1e3:.1f} us | "
              f"{nbytes / (ms * 1e-3) / copy_bps:.0%} copy | {first / ms:.2f}x first | "
              f"err {err:.1e} |", flush=True)
    del args, want
    torch.cuda.empty_cache()


def _measure(args, tiles: dict, want, scale: float, dtype: str, flush: str):
    """(ms, relative error) of one variant checked against the reference, or why not."""
    out = torch.full_like(args[0], float("nan"))
    try:
        selective_scan(*args, True, out=out, **tiles)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 — a refused variant is a row, not the end
        return f"refused: {type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
    err = ((out.double() - want).abs().max().item()) / scale
    finite = bool(torch.isfinite(out).all())
    if not finite or err > TOLERANCE[dtype]:
        return f"WRONG: rel err {err:.1e}, all finite {finite}"
    return gpu.time_ms(lambda: selective_scan(*args, True, out=out, **tiles), flush=flush), err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", required=True, help="BxDxL, repeatable")
    parser.add_argument("--dtype", action="append", choices=tuple(TORCH), required=True)
    parser.add_argument("--variant", action="append", default=None)
    parser.add_argument("--flush", choices=gpu.FLUSH_MODES, default="clean")
    parser.add_argument("--probe", action="store_true",
                        help="run each variant once, unchecked and untimed (for ncu)")
    args = parser.parse_args()
    t0 = time.monotonic()
    if args.probe:
        for shape in args.shape:
            for dtype in args.dtype:
                data = inputs(tuple(int(s) for s in shape.split("x")), dtype)
                for text in args.variant or [""]:
                    selective_scan(*data, True, **parse_variant(text))
        torch.cuda.synchronize()
        print(f"probe done at {time.monotonic() - t0:.0f} s")
        return
    copy_bps = gpu.copy_bandwidth(torch, flush=args.flush)
    print(f"copy {copy_bps / 1e12:.2f} TB/s (1 GiB, read + written)")
    print("| shape | dtype | variant | us | % copy | vs first | rel err |")
    for shape in args.shape:
        for dtype in args.dtype:
            sweep(tuple(int(s) for s in shape.split("x")), dtype, args.variant or [""],
                  copy_bps, args.flush)
            print(f"# {shape} {dtype} done at {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
