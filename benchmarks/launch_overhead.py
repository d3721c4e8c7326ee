"""Host overhead per launch of a cached kernel (the issue's bound: under 10 us).

    PYTHONPATH=. python3 benchmarks/launch_overhead.py

Times many back-to-back launches of a tiny kernel with a host clock, after a warm-up, so
the loop is bound by the host; prints microseconds per call for `kernel[grid](...)` and
for the torch entry points.
"""
from __future__ import annotations

import time

import torch

import tegula.kernels as tk
from tegula.dtypes import f16
from tegula.kernels.copy import copy_kernel


def per_call_us(fn, calls: int = 3000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    x = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    w = torch.randn(64, device="cuda", dtype=torch.float16)
    kernel = copy_kernel(f16)
    rows = [
        ("kernel[grid](x, y) (64x64 copy)", per_call_us(lambda: kernel[(2, 1)](x, y, BM=32, BN=64))),
        ("torch: y.copy_(x)", per_call_us(lambda: y.copy_(x))),
        ("tegula.kernels.copy(x)", per_call_us(lambda: tk.copy(x))),
        ("tegula.kernels.rms_norm(x, w)", per_call_us(lambda: tk.rms_norm(x, w))),
        ("torch rms_norm", per_call_us(lambda: torch.nn.functional.rms_norm(x, (64,), w))),
        ("tegula.kernels.softmax(x)", per_call_us(lambda: tk.softmax(x))),
    ]
    print(torch.cuda.get_device_name())
    for name, us in rows:
        print(f"{name:36s} {us:6.1f} us per call")


if __name__ == "__main__":
    main()
