"""GEMM: tegula against cuBLAS (torch.matmul) and Triton: `python -m tegula.bench gemm`.

Shapes: squares 1024–8192; LLM projections (M = 4096, N and K from {4096, 11008, 14336});
decode (M = 16, 64, 128 against 4096/14336-wide weights). Each computes `a @ b` with a
(M, K) and b (K, N) f16/bf16; by default b is the transpose of a K-major (N, K) weight,
as `x @ w.T` in a linear layer (`--b-major n` gives a row-major (K, N) b instead).
The floor per shape: 2·M·N·K FLOPs, (M·K + K·N + M·N)·itemsize bytes. Reported in TFLOP/s
with tegula's ratio to cuBLAS and Triton; the target is ≥ 0.5× cuBLAS (geomean, large).
"""
from __future__ import annotations

import argparse
import functools
from typing import Any

from tegula.bench import gpu

SQUARES = [(s, s, s) for s in (1024, 2048, 4096, 8192)]
LLM = [(4096, n, k) for n in (4096, 11008, 14336) for k in (4096, 11008, 14336)]
DECODE = [(m, n, k) for m in (16, 64, 128) for n, k in ((4096, 4096), (14336, 4096),
                                                          (4096, 14336))]
QUICK = [(4096, 4096, 4096), (4096, 14336, 4096), (64, 4096, 4096)]
# ‖out − ref‖/‖ref‖ allowed: a few output roundings (f16: 2^-11, bf16: 2^-8 relative).
TOLERANCE = {"f16": 2e-3, "bf16": 1e-2}
LABELS = {"tegula": "tegula", "torch": "cuBLAS", "triton": "Triton"}


def tags(shape: tuple[int, int, int]) -> tuple[str, ...]:
    """"decode" for few rows, "large" for shapes that fill the GPU with big tiles."""
    m, n, k = shape
    if m <= 128:
        return ("decode",)
    return ("large",) if min(m, n) >= 2048 else ("small",)


def make_case(torch: Any, shape: tuple[int, int, int], dtype: str, b_major: str,
              triton_kernels: Any) -> gpu.Case:
    """Fresh random operands and the three implementations for one shape."""
    import tegula.kernels as tk

    m, n, k = shape
    tdtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    a = torch.randn(m, k, device="cuda", dtype=tdtype)
    if b_major == "k":
        b = torch.randn(n, k, device="cuda", dtype=tdtype).T  # (K, N) view of a weight
    else:
        b = torch.randn(k, n, device="cuda", dtype=tdtype)

    def tegula_check() -> Any:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        return tk.matmul(a, b, out=out)

    impls = [gpu.Impl("tegula", lambda: tk.matmul(a, b), tegula_check, gpu.tuned_note("matmul")),
             gpu.Impl("torch", lambda: torch.matmul(a, b))]
    if triton_kernels is not None:
        impls.append(gpu.Impl("triton", lambda: triton_kernels.matmul(a, b)))
    itemsize = a.element_size()
    return gpu.Case(label=f"{m}x{n}x{k}", dims=shape, flops=2.0 * m * n * k,
                    bytes=float((m * k + k * n + m * n) * itemsize),
                    reference=lambda: a.float() @ b.float(), tol=TOLERANCE[dtype],
                    impls=impls, tags=tags(shape))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tegula.bench gemm",
                                     description=__doc__.splitlines()[0])
    gpu.add_common_options(parser, ("f16", "bf16"),
                           "comma-separated MxNxK shapes, e.g. 4096x4096x4096,16x4096x4096")
    parser.add_argument("--b-major", choices=("k", "n"), default="k",
                        help="b's layout: k = transpose of an (N, K) weight (default), "
                             "n = row-major (K, N)")
    args = parser.parse_args(argv)
    shapes = gpu.parse_shapes(args.shapes, 3) if args.shapes else \
        QUICK if args.quick else SQUARES + LLM + DECODE
    torch, why = gpu.load_torch("gemm")
    if torch is None:
        return gpu.no_gpu(why)
    budget = gpu.Budget(args.max_seconds)
    torch.backends.cuda.matmul.allow_tf32 = False  # the f32 reference must be true f32
    triton_kernels, triton_note = gpu.load_triton(args.no_triton)
    print(f"gemm ({args.dtype}, b {args.b_major}-major) on {torch.cuda.get_device_name()}; "
          f"{triton_note}")
    cases = [(f"{m}x{n}x{k}",
              lambda s=(m, n, k): make_case(torch, s, args.dtype, args.b_major, triton_kernels))
             for m, n, k in shapes]
    records, skipped = gpu.run_cases(cases, budget,
                                     timer=functools.partial(gpu.time_ms, flush=args.flush))
    impls = ["tegula", "torch"] + (["triton"] if triton_kernels is not None else [])
    peers = impls[1:]
    notes = [triton_note,
             "tegula: tegula.kernels.matmul as users call it (autotuned on its first call per "
             "shape bucket, before timing); cuBLAS: torch.matmul; median, L2 flushed before each "
             f"run ({args.flush}: {gpu.FLUSH_NOTE[args.flush]})",
             "b is " + ("the transpose of a K-major (N, K) tensor" if args.b_major == "k"
                        else "row-major (K, N)")] + gpu.autotune_notes("matmul")
    groups = {"large": lambda r: "large" in r.get("tags", ()),
              "decode": lambda r: "decode" in r.get("tags", ()), "all": lambda r: True}
    return gpu.finish("gemm", torch, args, records, skipped, impls, peers, "tflops", notes,
                      {"b_major": args.b_major, "autotune": gpu.autotune_records("matmul")},
                      None, groups, lambda s: LABELS.get(s, s))


__all__ = ["main", "make_case", "tags", "SQUARES", "LLM", "DECODE", "QUICK"]
