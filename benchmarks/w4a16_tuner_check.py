"""Does the autotuner time W4A16 candidates the way they run? `python
benchmarks/w4a16_tuner_check.py [--shapes MxNxK ...] [--budget SECONDS]`.

For each shape (fragment pre-packed weights, f16, group 128 with zero points) and each
candidate of `fragment_candidates` (plus the unsplit configs session 10 dropped from the
list, `UNSPLIT`), launched as `matmul_w4a16`'s tuner launches them (its first-call path:
`w4a16_config`, `w4a16_operands`, `launch_w4a16` through `api._launch`), one row: the
host µs of one call, then the µs four timers give — the tuner's timer without the
launch cover (`cuda_event_timer(cover_launch=False)`: synchronized samples, L2 flushed),
with it (the default since session 11), and `tegula.bench.gpu.time_ms` (the bench's
timer: samples queued back to back behind a 256 MB flush), and the launches captured
in a CUDA graph timed as the bench times (no host path in the window) — and last what each timer
would pick. Every candidate's output is checked first (NaN-poisoned, relative error).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(16, 4096, 14336), (128, 4096, 4096), (16, 14336, 4096)]
GROUP = 128
#: The unsplit configs the tuner had picked (session 10, round 3) before cc0857e.
UNSPLIT = {16: dict(FRAGMENT=1, warp_specialize=False, KS=4, BT=16, STAGES=5, SPLIT=1),
           128: dict(FRAGMENT=1, warp_specialize=False, KS=2, BT=128, STAGES=2, WSMEM=0)}


def _problem(torch, m, n, k):
    import tegula.kernels as tk
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.05
    packed, scales, zeros = tk.quantize_w4(w, GROUP)
    w_q = tk.unpack_w4(packed).float()
    deq = ((w_q - zeros.float().repeat_interleave(GROUP, 1))
           * scales.float().repeat_interleave(GROUP, 1))
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    return a, tk.pack_fragments(packed), scales, zeros, (a.double() @ deq.double().T)


def _tuner_run(a, stored, scales, zeros, out, m, n, k):
    """`run(config)` as `matmul_w4a16` builds it for its tuner."""
    import torch

    from tegula.dtypes import f16
    from tegula.kernels import api
    from tegula.kernels.quant import launch_w4a16, w4a16_config, w4a16_operands

    def run(config):
        kind, grid, constexprs = w4a16_config(m, n, k, GROUP, **config.kwargs)
        operands = (*w4a16_operands(kind, a, stored, GROUP), scales, zeros)
        launch_w4a16(kind, grid, constexprs, f16, True, operands, out,
                     lambda kernel, g, args, cx: api._launch(kernel, g, args, cx,
                                                             config.threads),
                     lambda shape: torch.empty(shape, dtype=torch.float32, device="cuda"))
    return run


def _graph_seconds(torch, fn, time_ms) -> float:
    """`fn` captured in a CUDA graph and timed as the bench times (no host launch path
    in the timed window at all); NaN where the capture fails."""
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        return time_ms(graph.replay, warmup_ms=5, rep_ms=30) / 1e3
    except Exception:  # noqa: BLE001 — a launch path that cannot be captured: no column
        torch.cuda.synchronize()
        return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=None, help="MxNxK (default: SHAPES)")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds in all")
    args = parser.parse_args()
    import torch

    from tegula.bench.gpu import time_ms
    from tegula.kernels.quant import fragment_candidates, token_tile
    from tegula.runtime.autotune import Config, cuda_event_timer

    shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes
              else SHAPES)
    timers = {"old": cuda_event_timer(cover_launch=False), "tuner": cuda_event_timer(),
              "bench": lambda fn: time_ms(fn, warmup_ms=5, rep_ms=30) / 1e3,
              "graph": lambda fn: _graph_seconds(torch, fn, time_ms)}
    start = time.time()
    print(f"{'MxNxK':>14} {'config':58} {'host':>6} {'old':>6} {'tuner':>6} {'bench':>6} "
          f"{'graph':>6} {'relerr':>7}  (µs)", flush=True)
    for m, n, k in shapes:
        a, stored, scales, zeros, ref = _problem(torch, m, n, k)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        run = _tuner_run(a, stored, scales, zeros, out, m, n, k)
        specs = fragment_candidates(m, n, k) + [UNSPLIT[token_tile(m)]] * (token_tile(m) in UNSPLIT)
        picks: dict = {}
        for spec in specs:
            if time.time() - start > args.budget:
                print("# budget spent", flush=True)
                break
            config = Config.of(spec)
            label = ",".join(f"{k}={v}" for k, v in sorted(spec.items())
                             if k not in ("FRAGMENT", "warp_specialize"))
            out.fill_(float("nan"))
            run(config)
            torch.cuda.synchronize()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            began = time.perf_counter()
            for _ in range(5):
                run(config)
            host = (time.perf_counter() - began) / 5
            torch.cuda.synchronize()
            us = {name: timer(lambda: run(config)) * 1e6 for name, timer in timers.items()}
            for name, value in us.items():
                if value != value:   # NaN: no graph
                    continue
                if name not in picks or value < picks[name][0]:
                    picks[name] = (value, label)
            print(f"{'x'.join(map(str, (m, n, k))):>14} {label:58} {host * 1e6:6.1f} "
                  f"{us['old']:6.1f} {us['tuner']:6.1f} {us['bench']:6.1f} {us['graph']:6.1f} "
                  f"{err:7.1e}",
                  flush=True)
        for name, (value, label) in picks.items():
            print(f"  {m}x{n}x{k} {name:5} picks {label} ({value:.1f} µs)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
