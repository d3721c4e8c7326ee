"""Sweep GEMM configurations of the example kernel on the GPU (a tuning aid, not a test).

    PYTHONPATH=. python3 benchmarks/gemm_sweep.py [SIZE ...]
"""
from __future__ import annotations

import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, "examples")
import tegula as tg  # noqa: E402
from gemm import gemm  # noqa: E402

CONFIGS = [
    dict(BM=128, BN=128, BK=32, STAGES=4),
    dict(BM=128, BN=128, BK=32, STAGES=4, threads=256),
    dict(BM=128, BN=256, BK=32, STAGES=3, threads=256),
    dict(BM=256, BN=128, BK=32, STAGES=3, threads=256),
    dict(BM=128, BN=128, BK=64, STAGES=3, threads=256),
    dict(BM=128, BN=256, BK=64, STAGES=3, threads=256),
    dict(BM=128, BN=128, BK=64, STAGES=3),
    dict(BM=128, BN=128, BK=32, STAGES=6),
    dict(BM=128, BN=128, BK=32, STAGES=3),
    dict(BM=128, BN=64, BK=64, STAGES=4),
    dict(BM=256, BN=128, BK=32, STAGES=4, threads=256),
]


def main() -> None:
    sizes = [int(s) for s in sys.argv[1:]] or [4096, 8192]
    print(torch.cuda.get_device_name())
    for size in sizes:
        a = torch.randn(size, size, device="cuda", dtype=torch.float16)
        b = torch.randn(size, size, device="cuda", dtype=torch.float16)
        c = torch.empty(size, size, device="cuda", dtype=torch.float16)
        ref = torch.matmul(a, b.T)
        flops = 2 * size ** 3
        ms = do_bench(lambda: torch.matmul(a, b.T), return_mode="median")
        cublas = flops / ms / 1e9
        print(f"{size}^3 cuBLAS {cublas:.0f} TFLOP/s")
        for cfg in CONFIGS:
            grid = (tg.cdiv(size, cfg["BM"]), tg.cdiv(size, cfg["BN"]))
            try:
                c.fill_(float("nan"))
                gemm[grid](a, b, c, **cfg)
                err = float((c.float() - ref.float()).norm() / ref.float().norm())
                ms = do_bench(lambda: gemm[grid](a, b, c, **cfg), return_mode="median")
                tf = flops / ms / 1e9
                print(f"{size}^3 {cfg}: {tf:.0f} TFLOP/s ({tf / cublas:.2f}x cuBLAS) err {err:.1e}")
            except Exception as e:  # one failing config must not hide the others
                print(f"{size}^3 {cfg}: FAILED {type(e).__name__}: {str(e)[:200]}")


if __name__ == "__main__":
    main()
