"""One device run: correctness of the example GEMM against torch, and a first timing.

    PYTHONPATH=. python3 benchmarks/device_check.py

Prints a short table last; never asserts timings.
"""
from __future__ import annotations

import sys
import time

import torch

sys.path.insert(0, "examples")
import tegula as tg  # noqa: E402
from gemm import gemm  # noqa: E402


def check(m: int, n: int, k: int, **cfg) -> float:
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    bm, bn = cfg.get("BM", 128), cfg.get("BN", 128)
    gemm[(tg.cdiv(m, bm), tg.cdiv(n, bn))](a, b, c, **cfg)
    torch.cuda.synchronize()
    ref = a.double() @ b.double().T
    return float((c.double() - ref).norm() / ref.norm())


def bench(fn, reps: int = 50) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=reps, return_mode="median")


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    rows = []
    for shape in [(97, 130, 72), (256, 256, 512), (1000, 1030, 520)]:
        t0 = time.time()
        err = check(*shape, BM=64, BN=64, BK=32)
        rows.append((f"gemm {shape} 64x64x32", f"rel err {err:.2e}", f"{time.time() - t0:.2f}s"))
        err = check(*shape)
        rows.append((f"gemm {shape} 128x128x32", f"rel err {err:.2e}", ""))
    size = 4096
    a = torch.randn(size, size, device="cuda", dtype=torch.float16)
    b = torch.randn(size, size, device="cuda", dtype=torch.float16)
    c = torch.empty(size, size, device="cuda", dtype=torch.float16)
    flops = 2 * size ** 3
    for cfg in [dict(), dict(BK=64), dict(STAGES=4), dict(BM=128, BN=256, BK=32)]:
        grid = (tg.cdiv(size, cfg.get("BM", 128)), tg.cdiv(size, cfg.get("BN", 128)))
        try:
            ms = bench(lambda: gemm[grid](a, b, c, **cfg))
            rows.append((f"tegula {size}^3 {cfg}", f"{flops / ms / 1e9:.0f} TFLOP/s", f"{ms:.3f} ms"))
        except Exception as e:  # report and go on: one failing config must not hide the rest
            rows.append((f"tegula {size}^3 {cfg}", f"FAILED {type(e).__name__}: {e}"[:120], ""))
    ms = bench(lambda: torch.matmul(a, b.T))
    rows.append((f"cuBLAS {size}^3", f"{flops / ms / 1e9:.0f} TFLOP/s", f"{ms:.3f} ms"))
    for r in rows:
        print(" | ".join(r))


if __name__ == "__main__":
    main()
