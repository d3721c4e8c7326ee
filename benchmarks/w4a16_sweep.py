"""Time fixed configurations of the W4A16 and GEMV kernels (no autotuning), to see where
their time goes: `python benchmarks/w4a16_sweep.py [--only PREFIX] [--budget SECONDS]`.

Each row: the kernel, its (M, N, K), its constexprs, the median µs (L2 flushed, as
`tegula bench quant`), the TB/s of the floor bytes (packed weights + scales + zeros for
W4A16, the weights for GEMV) and their fraction of the device copy bandwidth; torch's f16
matmul of the same shape (`a @ w.T`, cuBLAS) for comparison. Every tegula result is
checked against a float64 reference first (a wrong fast kernel is not a result).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, (M, N, K), constexprs) — the kernel is picked from the name's prefix.
CONFIGS = [
    ("gemv", (1, 4096, 4096), dict(BN=4, BK=1024)),
    ("gemv", (1, 11008, 4096), dict(BN=2, BK=1024, UNROLL=2)),
    ("w4rows", (1, 4096, 4096), dict(BN=4, S=8, R=2, UNROLL=2)),
    ("w4rows", (1, 11008, 4096), dict(BN=4, S=8, R=2, UNROLL=2)),
    ("w4rows", (4, 4096, 4096), dict(BN=4, S=8, R=4, UNROLL=1)),
    ("w4rows", (8, 4096, 4096), dict(BN=4, S=8, R=4, UNROLL=1)),
    ("w4gemm", (16, 11008, 4096), dict(BM=16, BN=32, BK=128, STAGES=3)),
    ("w4gemm", (128, 4096, 14336), dict(BM=128, BN=32, BK=128, STAGES=2, threads=256)),
]


def _case(torch, name, shape, group=128):
    """(kernel, grid, args, constexprs, floor bytes, reference, check) for one config."""
    import tegula as tg
    import tegula.kernels as tk
    from tegula.dtypes import f16
    from tegula.kernels.gemv import gemv_kernel
    from tegula.kernels import quant

    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    if name == "gemv":
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        return (gemv_kernel(f16), (a, w, out), w.numel() * 2,
                lambda: a.double() @ w.double().T, out, lambda: a @ w.T,
                lambda c: (tg.cdiv(n, c["BN"]),), dict(M=m))
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.05
    packed, scales, zeros = tk.quantize_w4(w, group)
    w_q = tk.unpack_w4(packed)
    deq = ((w_q.float() - zeros.float().repeat_interleave(group, 1))
           * scales.float().repeat_interleave(group, 1)).half()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    factory = {"w4gemm": quant.w4a16_gemm_kernel, "w4rows": quant.w4a16_rows_kernel}[name]
    rows = name == "w4rows"
    extra = dict(M=m, G=group) if rows else dict(G=group)
    grid = ((lambda c: (tg.cdiv(n, c["BN"] * c.get("R", 1)),)) if rows
            else (lambda c: (tg.cdiv(m, c["BM"]), tg.cdiv(n, c["BN"]))))
    floor = packed.numel() + 2 * scales.numel() * 2
    operands = quant.w4a16_operands("rows" if rows else "gemm", a, packed, group)
    return (factory(f16, True), (*operands, scales, zeros, out), floor,
            lambda: a.double() @ deq.double().T, out, lambda: a @ deq.T, grid, extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="names starting with this")
    parser.add_argument("--budget", type=float, default=35.0, help="seconds in all")
    args = parser.parse_args()
    import torch

    from tegula.bench.gpu import copy_bandwidth, time_ms
    from tegula.build import launch

    start = time.time()
    copy = copy_bandwidth(torch, gib=0.5)
    print(f"{torch.cuda.get_device_name()}: copy {copy / 1e12:.2f} TB/s")
    rows, torch_us = [], {}
    for name, shape, config in CONFIGS:
        if not name.startswith(args.only) or time.time() - start > args.budget:
            continue
        kernel, tensors, floor, ref, out, torch_fn, grid, extra = _case(torch, name, shape)
        constexprs = dict(config, **extra)
        g = grid(constexprs)
        try:
            run = lambda: launch(kernel, g, *tensors, **constexprs)  # noqa: E731
            run()
            torch.cuda.synchronize()
            err = ((out.double() - ref()).norm() / ref().norm()).item()
            us = time_ms(run) * 1e3
        except Exception as e:  # noqa: BLE001 — a config that fails is a row, not the end
            rows.append((name, shape, config, f"{type(e).__name__}: {str(e)[:60]}"))
            continue
        key = (name == "gemv", shape)
        if key not in torch_us:
            torch_us[key] = time_ms(torch_fn) * 1e3
        rows.append((name, shape, config, us, floor / us / 1e6, floor / us / 1e6 / (copy / 1e12),
                     torch_us[key] / us, err))
    print(f"{'kernel':7} {'MxNxK':>14} {'config':44} {'us':>7} {'TB/s':>5} {'copy':>5} "
          f"{'xtorch':>6} {'relerr':>8}")
    for r in rows:
        shape = "x".join(map(str, r[1]))
        cfg = ",".join(f"{k}={v}" for k, v in r[2].items())
        if isinstance(r[3], str):
            print(f"{r[0]:7} {shape:>14} {cfg:44} {r[3]}")
        else:
            print(f"{r[0]:7} {shape:>14} {cfg:44} {r[3]:7.1f} {r[4]:5.2f} {r[5]:5.0%} "
                  f"{r[6]:6.2f} {r[7]:8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
