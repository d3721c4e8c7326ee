"""What cuBLAS runs for `torch.matmul` (issue 10: learn its tile, cluster and stages
before tuning a shape blind). For each shape and dtype: the CUDA kernels one product
launches, from torch.profiler's trace — full name (cuBLAS spells its tile, cluster and
stages there), grid, block, registers per thread, shared memory, device time — and the
product's median time with the bench's timer (L2 emptied before each run).

    PYTHONPATH=. python3 benchmarks/gemm_cublas_probe.py --shapes 2048x2048x2048 \
        [--dtypes f16,bf16] [--launch]

`a (M, K) @ w.T` with w (N, K), as a linear layer (and as `tegula bench gemm`).
`--launch`: only run each product once (shapes, then dtypes, in order), for `ncu` to profile.
`--ncu-summary`: read `ncu --csv --page raw` on stdin and print, per kernel, its full name
and the launch and throughput metrics that tell tiles and clusters apart (`KEEP`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

DTYPES = {"f16": "float16", "bf16": "bfloat16"}
#: The trace's kernel fields worth a line (torch's Kineto names).
FIELDS = ("grid", "block", "registers per thread", "shared memory", "blocks per SM",
          "est. achieved occupancy %")


#: ncu raw metrics worth printing (prefixes), in this order.
KEEP = ("gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second", "launch__grid_size",
        "launch__block_size", "launch__cluster_dim_", "launch__registers_per_thread",
        "launch__shared_mem_per_block_dynamic", "launch__waves_per_multiprocessor",
        "sm__throughput.avg.pct", "gpu__compute_memory_throughput.avg.pct",
        "dram__throughput.avg.pct", "lts__throughput.avg.pct", "sm__pipe_tensor")


def ncu_summary(lines) -> int:
    """`ncu --csv --page raw` rows -> one block per kernel: full name, then `KEEP`'s
    metrics as name=value."""
    import csv
    rows = list(csv.reader(line for line in lines if line.startswith('"')))
    if len(rows) < 3:
        print("ncu summary: no CSV rows (ncu printed nothing to parse)")
        return 1
    head = rows[0]
    for row in rows[2:]:   # rows[1]: the units
        record = dict(zip(head, row))
        print(record.get("Kernel Name", "?"))
        kept = [f"{k}={v}" for prefix in KEEP for k, v in record.items() if k.startswith(prefix)]
        print("    " + "; ".join(kept))
    return 0


def _operands(torch, shape: tuple, dtype: str):
    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=getattr(torch, DTYPES[dtype]))
    w = torch.randn(n, k, device="cuda", dtype=getattr(torch, DTYPES[dtype]))
    return a, w


def kernels_of(torch, fn) -> list[dict]:
    """The CUDA kernel events (name, duration in µs, launch fields) of one call of `fn`,
    from a torch.profiler trace (after a warm-up call, so no one-time setup shows)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    return [dict(name=e["name"], us=e.get("dur", 0.0), **{k: e.get("args", {}).get(k)
                                                          for k in FIELDS})
            for e in events if e.get("cat") == "kernel"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2048x2048x2048")
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--launch", action="store_true")
    parser.add_argument("--rep-ms", type=float, default=20.0)
    parser.add_argument("--ncu-summary", action="store_true")
    args = parser.parse_args(argv)
    if args.ncu_summary:
        return ncu_summary(sys.stdin)
    import torch
    from tegula.bench.gpu import time_ms
    torch.backends.cuda.matmul.allow_tf32 = False
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        for dtype in args.dtypes.split(","):
            a, w = _operands(torch, shape, dtype)

            def product(a=a, w=w):
                return torch.matmul(a, w.T)
            if args.launch:
                product()
                torch.cuda.synchronize()
                continue
            ms = time_ms(product, 10, args.rep_ms)
            flops = 2.0 * shape[0] * shape[1] * shape[2]
            print(f"{text} {dtype}: {ms * 1e3:.1f} us, {flops / ms / 1e9:.0f} TFLOP/s "
                  f"(median, L2 emptied)", flush=True)
            for kernel in kernels_of(torch, product):
                fields = ", ".join(f"{k}={kernel[k]}" for k in FIELDS if kernel[k] is not None)
                print(f"  {kernel['us']:.1f} us  {kernel['name']}\n      {fields}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
