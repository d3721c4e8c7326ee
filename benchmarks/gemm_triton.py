"""The bench's two Triton GEMMs (`tegula.bench.triton_kernels`: the tutorial-style tiled
kernel and the persistent TMA one) against cuBLAS on a few shapes, each result checked
against an f32 reference first (NaN-free, relative error), then timed with the bench's
timer (median, L2 flushed). A quick check that the Triton columns of `tegula bench gemm`
run, and what they measure, without tegula's tuning:

    PYTHONPATH=. python3 benchmarks/gemm_triton.py --shapes 4096x4096x4096,64x4096x4096
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4096x4096x4096,64x4096x4096")
    parser.add_argument("--rep-ms", type=float, default=10.0)
    args = parser.parse_args(argv)
    import torch
    from tegula.bench import triton_kernels
    from tegula.bench.gpu import time_ms
    torch.backends.cuda.matmul.allow_tf32 = False
    kernels = {"Triton": triton_kernels.matmul, "Triton TMA": triton_kernels.matmul_tma_persistent}
    print(f"{'shape':18} {'kernel':11} {'us':>8} {'TFLOP/s':>8} {'x cuBLAS':>8}  check")
    for text in args.shapes.split(","):
        m, n, k = (int(x) for x in text.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16).T   # w.T, as a linear layer
        ref = a.float() @ b.float()
        cublas = time_ms(lambda: torch.matmul(a, b), 10, args.rep_ms)
        print(f"{text:18} {'cuBLAS':11} {cublas * 1e3:8.1f} {2 * m * n * k / cublas / 1e9:8.0f}")
        for name, fn in kernels.items():
            try:
                out = fn(a, b)
                torch.cuda.synchronize()
                err = float((out.float() - ref).norm() / ref.norm())
                bad = int((~torch.isfinite(out)).sum())
                ms = time_ms(lambda f=fn: f(a, b), 10, args.rep_ms)
                print(f"{text:18} {name:11} {ms * 1e3:8.1f} {2 * m * n * k / ms / 1e9:8.0f} "
                      f"{cublas / ms:8.2f}  err {err:.1e} nan {bad}", flush=True)
            except Exception as e:  # noqa: BLE001 — report and go on
                print(f"{text:18} {name:11} FAILED {type(e).__name__}: {str(e)[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
