"""elect.sync against the thread-number predicate it replaced, same kernels, one process.

    PYTHONPATH=. python3 benchmarks/elect_ab.py

Issue 9 §2: one lane of a warp issues the TMA boxes and arrives for its warp through the
catalogue's `elect.sync` (`tegula.lower.async_ir.Elect`). For each GEMM below (the README
GEMM and the persistent GEMM, alone and in 2-CTA clusters, all warp-specialized: the
one-role pipeline keeps thread 0 as its issuer), the generated CUDA is
compiled twice: as generated, and with every `tg_elect_one()` replaced by
`((tid & 31) == 0)` — what the same condition picked before (lane 0 of the warp). Both
are checked against torch (NaN-poisoned output) and timed interleaved (do_bench,
median of alternating runs). A table last; nothing is asserted about time.
"""
from __future__ import annotations

import importlib.util
import re
import statistics
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

from tegula.build import full_launch
from tegula.runtime.compiler import compile_cuda
from tegula.runtime.launcher import CompiledKernel

ROOT = Path(__file__).resolve().parents[1]


def _example(name: str, attr: str):
    spec = importlib.util.spec_from_file_location(f"ab_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, attr)


def variants(kernel, grid, args, cfg):
    """(elected, lane-0) CompiledKernels of one specialization."""
    elected, _ = full_launch(kernel, grid, args, dict(cfg), "sm_90a", None)
    # Every call, not the helper's own definition ("unsigned tg_elect_one() {").
    source = re.sub(r"(?<!unsigned )tg_elect_one\(\)", "((tid & 31) == 0)", elected.source)
    assert source != elected.source, "no elect.sync in this kernel"
    lane0 = CompiledKernel(elected.kernel, compile_cuda(source, elected.name, elected.target),
                           source, elected.target)
    lane0.plan = elected.plan  # the same argument checks and tensor maps
    return elected, lane0


def row(name, kernel, grid, m, n, k, cfg):
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    ref = (a.float() @ b.float().T)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    kernels = variants(kernel, grid, (a, b, c), cfg)
    errors = []
    for ck in kernels:
        c.fill_(float("nan"))
        ck.launch(grid, (a, b, c))
        torch.cuda.synchronize()
        bad = ~torch.isclose(c.float(), ref, rtol=2e-2, atol=5e-2)
        errors.append(int(bad.sum()))
    times = [[], []]
    for _ in range(3):
        for i, ck in enumerate(kernels):
            times[i].append(do_bench(lambda: ck.launch(grid, (a, b, c)), warmup=10, rep=40))
    ms = [statistics.median(t) for t in times]
    tflops = [2 * m * n * k / (t * 1e-3) / 1e12 for t in ms]
    return (f"{name:<34} {m}x{n}x{k:<6} wrong {errors[0]}/{errors[1]}  elect {ms[0]:.3f} ms "
            f"({tflops[0]:.0f} TF)  lane0 {ms[1]:.3f} ms ({tflops[1]:.0f} TF)  "
            f"ratio {ms[0] / ms[1]:.3f}")


def main() -> None:
    gemm = _example("gemm", "gemm")
    persistent = _example("persistent_gemm", "persistent_gemm")
    grid_of = _example("persistent_gemm", "persistent_grid")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    big = dict(BM=128, BN=256, BK=64, STAGES=3, threads=256)
    rows = []
    for m, n, k in ((4096, 4096, 4096), (1000, 1032, 520)):
        grid = ((m + 127) // 128, (n + 255) // 256)
        rows.append(row("README gemm 128x256 warp-specialized", gemm, grid, m, n, k, big))
        for cluster in (1, 2):
            cfg = dict(big, STAGES=4, CLUSTER=cluster)
            rows.append(row(f"persistent gemm 128x256 CLUSTER={cluster}", persistent,
                            grid_of(m, n, sms, 128, 256, cluster), m, n, k, cfg))
        print("\n".join(rows[-3:]), flush=True)
    print("=== elect.sync vs lane 0 (same process; wrong = elements off, elect/lane0)")
    print("\n".join(rows))


if __name__ == "__main__":
    sys.exit(main())
