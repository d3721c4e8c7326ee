"""Does the L2 flush itself slow small memory-bound kernels? (H200: 50 MB L2)

    PYTHONPATH=. python3 benchmarks/experiments/l2_flush.py

do_bench flushes L2 by zeroing a 256 MB buffer before each timed run, which leaves L2 full
of *dirty* lines; a kernel that then streams 32 MB in and out also pays for writing those
lines back to DRAM. This times the same kernels after three flushes — zeroing (dirty
lines, do_bench's way), reading the buffer (clean lines: L2 holds nothing useful and owes
DRAM nothing) and none (inputs may be L2-resident) — and prints TB/s per kernel and
size, counting the bytes each kernel must move.
"""
from __future__ import annotations

import statistics

import torch

import tegula.kernels as tk


def timed_ms(fn, flush) -> float:
    for _ in range(10):
        fn()
    samples = []
    for _ in range(200):
        flush()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        samples.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in samples)


def main() -> None:
    buf = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    flushes = {"zero (dirty L2)": buf.zero_,
               "read (clean L2)": buf.max,
               "none": lambda: None}
    rows = []
    for m, n in [(4096, 4096), (16384, 1024), (16384, 4096), (8192, 16384), (32768, 16384)]:
        x = torch.randn(m, n, device="cuda", dtype=torch.float16)
        w = torch.rand(n, device="cuda", dtype=torch.float16) + 0.5
        kernels = {"torch clone": x.clone, "tegula copy": lambda: tk.copy(x),
                   "tegula softmax": lambda: tk.softmax(x),
                   "tegula rms_norm": lambda: tk.rms_norm(x, w)}
        nbytes = 2 * x.numel() * x.element_size()
        for name, fn in kernels.items():
            fn()
            rates = [nbytes / timed_ms(fn, f) / 1e9 for f in flushes.values()]
            rows.append((f"{m}x{n}", name, *rates))
        del x, w
    print(torch.cuda.get_device_name(), "TB/s (bytes read + written) after each flush")
    print(f"{'shape':14s} {'kernel':16s} " + " ".join(f"{k:>16s}" for k in flushes))
    for shape, name, *rates in rows:
        print(f"{shape:14s} {name:16s} " + " ".join(f"{r:16.2f}" for r in rates))


if __name__ == "__main__":
    main()
