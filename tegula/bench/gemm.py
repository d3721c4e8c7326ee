"""GEMM: tegula against cuBLAS (torch.matmul) and Triton: `python -m tegula.bench gemm`.

Triton is two kernels in `tegula.bench.triton_kernels`: the tutorial-style tiled matmul
("Triton") and, on Hopper, a persistent TMA kernel ("Triton TMA"); the notes give tegula's
geomean against the faster of the two per shape.

Shapes: squares 1024–8192 plus 6144; LLM projections (M = 4096, N and K from {4096,
11008, 14336}); decode (M = 16, 64, 128 against the same weights). On an H100/H200 the
tuner's first candidate for large shapes is the persistent kernel, for decode shapes a
narrow wgmma tile streaming the weight through a deep ring (split-K is timed beside it;
`api_matmul.gemm_candidates`); the table's last column says which configuration each
shape bucket chose. Each computes `a @ b` with a (M, K) and b (K, N) f16/bf16; by
default b is the transpose of a K-major (N, K) weight, as `x @ w.T` in a linear layer
(`--b-major n` gives a row-major (K, N) b instead). The floor per shape: 2·M·N·K FLOPs,
(M·K + K·N + M·N)·itemsize bytes. Reported in TFLOP/s with tegula's ratio to cuBLAS and
Triton (issue 10's targets: large geomean ≥ 1.03× cuBLAS with no shape under 0.95×,
decode ≥ 1.0×, ≥ 1.15× Triton). `--rep-ms` shortens the timed runs (the full list in a
one-minute GPU slot, with `benchmarks/gemm_candidates.py --precompile-bench` first).

`--mode epilogue`: `tegula.kernels.matmul(a, b, bias, "gelu")` (one kernel) against torch's
matmul followed by the bias add and `F.gelu` (`--activation` picks relu/gelu/gelu_tanh/silu).
`--mode fp8`: `tegula.kernels.matmul_fp8` per-tensor against `torch._scaled_mm`, and the
blockwise (DeepSeek-V3) form as a third column (tegula/blockwise above 1 means blockwise
is slower than tegula's per-tensor). Both on EPILOGUE_SHAPES / FP8_SHAPES (4096³, 8192³,
4096×7168×2048 and decode M = 16, 64, 128); `--dtype` is the output type. Every mode also
prints each implementation's fraction of the H100's 989 TFLOP/s dense f16 peak (1979 for
FP8).
"""
from __future__ import annotations

import argparse
import functools
from typing import Any

from tegula.bench import gpu

SQUARES = [(s, s, s) for s in (1024, 2048, 4096, 6144, 8192)]
LLM = [(4096, n, k) for n in (4096, 11008, 14336) for k in (4096, 11008, 14336)]
#: Decode: few rows against every LLM weight shape (N, K ∈ {4096, 11008, 14336}); the
#: tuner picks split-K (deterministic, partials summed in order) where K is long.
DECODE = [(m, n, k) for m in (16, 64, 128) for n in (4096, 11008, 14336)
          for k in (4096, 11008, 14336)]
QUICK = [(4096, 4096, 4096), (4096, 14336, 4096), (64, 4096, 4096)]
EPILOGUE_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 7168, 2048)] + \
    [(m, 4096, 4096) for m in (16, 64, 128)]
FP8_SHAPES = EPILOGUE_SHAPES
#: Dense tensor-core peaks of an H100 SXM (TFLOP/s): f16/bf16, and 8-bit floats.
PEAK_TFLOPS = {"f16": 989.0, "fp8": 1979.0}
# ‖out − ref‖/‖ref‖ allowed: a few output roundings (f16: 2^-11, bf16: 2^-8 relative).
TOLERANCE = {"f16": 2e-3, "bf16": 1e-2}
LABELS = {"tegula": "tegula", "torch": "cuBLAS", "triton": "Triton", "triton_tma": "Triton TMA",
          "unfused": "torch",
          "scaled_mm": "_scaled_mm", "blockwise": "blockwise"}


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
        if torch.cuda.get_device_capability() >= (9, 0):  # TMA descriptors: Hopper on
            impls.append(gpu.Impl("triton_tma",
                                  lambda: triton_kernels.matmul_tma_persistent(a, b)))
    itemsize = a.element_size()
    return gpu.Case(label=f"{m}x{n}x{k}", dims=shape, flops=2.0 * m * n * k,
                    bytes=float((m * k + k * n + m * n) * itemsize),
                    reference=lambda: a.float() @ b.float(), tol=TOLERANCE[dtype],
                    impls=impls, tags=tags(shape))


def _activation(torch: Any, name: str) -> Any:
    f = torch.nn.functional
    return {"relu": f.relu, "gelu": f.gelu, "silu": f.silu,
            "gelu_tanh": lambda t: f.gelu(t, approximate="tanh")}[name]


def make_epilogue_case(torch: Any, shape: tuple[int, int, int], dtype: str,
                       activation: str) -> gpu.Case:
    """`activation(x @ w.T + bias)`: tegula's fused matmul against torch's three ops."""
    import tegula.kernels as tk

    m, n, k = shape
    tdtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    a = torch.randn(m, k, device="cuda", dtype=tdtype)
    b = torch.randn(n, k, device="cuda", dtype=tdtype).T
    bias = torch.randn(n, device="cuda", dtype=tdtype)
    act = _activation(torch, activation)

    def tegula_check() -> Any:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        return tk.matmul(a, b, bias, activation, out=out)

    impls = [gpu.Impl("tegula", lambda: tk.matmul(a, b, bias, activation), tegula_check,
                      gpu.tuned_note("matmul")),
             gpu.Impl("unfused", lambda: act(torch.matmul(a, b) + bias))]
    return gpu.Case(label=f"{m}x{n}x{k}+bias+{activation}", dims=shape, flops=2.0 * m * n * k,
                    bytes=float((m * k + k * n + m * n + n) * a.element_size()),
                    reference=lambda: act(a.float() @ b.float() + bias.float()),
                    tol=TOLERANCE[dtype], impls=impls, tags=tags(shape))


def make_fp8_case(torch: Any, shape: tuple[int, int, int], dtype: str) -> gpu.Case:
    """e4m3 a (M, K) @ w.T (w (N, K)): tegula per-tensor, torch._scaled_mm, tegula blockwise
    (unit block scales: the same product, so one reference checks all three)."""
    import tegula.kernels as tk

    m, n, k = shape
    out_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    a = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    sa, sb = torch.full((), 0.5, device="cuda"), torch.full((), 0.25, device="cuda")
    block_a = torch.full((m, k // 128), 0.5, device="cuda")
    block_b = torch.full((-(-n // 128), k // 128), 0.25, device="cuda")

    def tegula_check() -> Any:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        return tk.matmul_fp8(a, w.T, sa, sb, out_dtype, out=out)

    impls = [gpu.Impl("tegula", lambda: tk.matmul_fp8(a, w.T, sa, sb, out_dtype), tegula_check,
                      gpu.tuned_note("matmul_fp8")),
             gpu.Impl("scaled_mm", lambda: torch._scaled_mm(a, w.T, sa, sb, out_dtype=out_dtype)),
             gpu.Impl("blockwise", lambda: tk.matmul_fp8(a, w.T, block_a, block_b, out_dtype,
                                                         block_scales=True))]
    return gpu.Case(label=f"fp8 {m}x{n}x{k}", dims=shape, flops=2.0 * m * n * k,
                    bytes=float(m * k + k * n + m * n * torch.empty(0, dtype=out_dtype)
                                .element_size()),
                    reference=lambda: (a.float() @ w.float().T) * 0.125, tol=2e-2,
                    impls=impls, tags=tags(shape))


def peak_fractions(records: list[dict], impls: list[str], peak: float) -> list[str]:
    """One line per shape: each implementation's TFLOP/s as a fraction of `peak`."""
    lines = [f"fraction of the {peak:.0f} TFLOP/s dense peak:"]
    for r in records:
        cells = [f"{LABELS.get(i, i)} {gpu.rate(r, i, 'tflops') / peak:.0%}"
                 for i in impls if gpu.rate(r, i, "tflops")]
        lines.append(f"  {r['label']:>28}  " + ("  ".join(cells) or "-"))
    return lines


def best_triton_lines(records: list[dict]) -> list[str]:
    """tegula against the faster of the two Triton kernels (plain, persistent TMA) per
    shape, as geomeans per group (issue 10's target: >= 1.15x the best Triton)."""
    def best_ratio(r: dict) -> float | None:
        rates = [x for x in (gpu.rate(r, "triton", "tflops"),
                             gpu.rate(r, "triton_tma", "tflops")) if x]
        t = gpu.rate(r, "tegula", "tflops")
        return t / max(rates) if t and rates else None
    lines = []
    for group in ("large", "decode"):
        ratios = [x for r in records if group in r.get("tags", ()) if (x := best_ratio(r))]
        if ratios:
            lines.append(f"tegula / best Triton per shape, geomean ({group}, {len(ratios)} "
                         f"shapes): {gpu.geomean(ratios):.2f}x")
    return lines


def triton_picks(triton_kernels: Any) -> list[str]:
    """What the Triton kernels' autotuners chose per shape (tile, stages, warps): issue
    10 compares tegula's tiles with them where Triton comes close (long-K projections)."""
    lines = []
    for label, fn in (("Triton", "_matmul_kernel"),
                      ("Triton TMA", "_matmul_tma_persistent_kernel")):
        cache = getattr(getattr(triton_kernels, fn, None), "cache", None) or {}
        for key, config in sorted(cache.items(), key=lambda kv: str(kv[0])):
            kw = config.kwargs
            lines.append(f"{label} picked at {'x'.join(map(str, key[:3]))}: "
                         f"{kw.get('BLOCK_M')}x{kw.get('BLOCK_N')}x{kw.get('BLOCK_K')}, "
                         f"{config.num_stages} stages, {config.num_warps} warps")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tegula.bench gemm",
                                     description=__doc__.splitlines()[0])
    gpu.add_common_options(parser, ("f16", "bf16"),
                           "comma-separated MxNxK shapes, e.g. 4096x4096x4096,16x4096x4096")
    parser.add_argument("--b-major", choices=("k", "n"), default="k",
                        help="b's layout: k = transpose of an (N, K) weight (default), "
                             "n = row-major (K, N)")
    parser.add_argument("--mode", choices=("plain", "epilogue", "fp8"), default="plain",
                        help="plain GEMM (default), GEMM + bias + activation, or FP8 e4m3")
    parser.add_argument("--activation", choices=("relu", "gelu", "gelu_tanh", "silu"),
                        default="gelu", help="the epilogue's activation (--mode epilogue)")
    parser.add_argument("--rep-ms", type=float, default=100.0,
                        help="milliseconds of timed runs per implementation and shape "
                             "(default 100; less fits the full list in a short GPU slot)")
    args = parser.parse_args(argv)
    default_shapes = {"plain": SQUARES + LLM + DECODE, "epilogue": EPILOGUE_SHAPES,
                      "fp8": FP8_SHAPES}[args.mode]
    shapes = gpu.parse_shapes(args.shapes, 3) if args.shapes else \
        QUICK if args.quick else default_shapes
    torch, why = gpu.load_torch("gemm")
    if torch is None:
        return gpu.no_gpu(why)
    if args.mode != "plain":
        return _main_fused(torch, args, shapes)
    budget = gpu.Budget(args.max_seconds)
    torch.backends.cuda.matmul.allow_tf32 = False  # the f32 reference must be true f32
    triton_kernels, triton_note = gpu.load_triton(args.no_triton)
    print(f"gemm ({args.dtype}, b {args.b_major}-major) on {torch.cuda.get_device_name()}; "
          f"{triton_note}")
    cases = [(f"{m}x{n}x{k}",
              lambda s=(m, n, k): make_case(torch, s, args.dtype, args.b_major, triton_kernels))
             for m, n, k in shapes]
    records, skipped = gpu.run_cases(cases, budget,
                                     timer=functools.partial(gpu.time_ms, flush=args.flush,
                                                             rep_ms=args.rep_ms))
    impls = ["tegula", "torch"] + (["triton"] if triton_kernels is not None else []) + \
        (["triton_tma"] if any("triton_tma" in r.get("results", {}) for r in records) else [])
    peers = impls[1:]
    notes = [triton_note,
             "tegula: tegula.kernels.matmul as users call it (autotuned on its first call per "
             "shape bucket, before timing); cuBLAS: torch.matmul; median, L2 flushed before each "
             f"run ({args.flush}: {gpu.FLUSH_NOTE[args.flush]})",
             "b is " + ("the transpose of a K-major (N, K) tensor" if args.b_major == "k"
                        else "row-major (K, N)")] + gpu.autotune_notes("matmul") \
        + peak_fractions(records, impls, PEAK_TFLOPS["f16"]) + best_triton_lines(records) \
        + (triton_picks(triton_kernels) if triton_kernels is not None else [])
    groups = {"large": lambda r: "large" in r.get("tags", ()),
              "decode": lambda r: "decode" in r.get("tags", ()), "all": lambda r: True}
    return gpu.finish("gemm", torch, args, records, skipped, impls, peers, "tflops", notes,
                      {"b_major": args.b_major, "autotune": gpu.autotune_records("matmul")},
                      None, groups, lambda s: LABELS.get(s, s))


def _main_fused(torch: Any, args: argparse.Namespace, shapes: list) -> int:
    """`--mode epilogue` and `--mode fp8`: tegula against torch, with peak fractions."""
    budget = gpu.Budget(args.max_seconds)
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"gemm --mode {args.mode} ({args.dtype}) on {torch.cuda.get_device_name()}")
    if args.mode == "epilogue":
        cases = [(f"{m}x{n}x{k}", lambda s=(m, n, k): make_epilogue_case(
            torch, s, args.dtype, args.activation)) for m, n, k in shapes]
        impls, tuner, peak = ["tegula", "unfused"], "matmul", PEAK_TFLOPS["f16"]
        notes = [f"tegula: tegula.kernels.matmul(a, b, bias, {args.activation!r}), one kernel; "
                 f"torch: {args.activation}(torch.matmul(a, b) + bias), three"]
    else:
        cases = [(f"{m}x{n}x{k}", lambda s=(m, n, k): make_fp8_case(torch, s, args.dtype))
                 for m, n, k in shapes]
        impls, tuner, peak = ["tegula", "scaled_mm", "blockwise"], "matmul_fp8", \
            PEAK_TFLOPS["fp8"]
        notes = ["tegula: tegula.kernels.matmul_fp8 per-tensor; _scaled_mm: torch._scaled_mm "
                 "per-tensor (cuBLASLt); blockwise: tegula.kernels.matmul_fp8(block_scales=True)"
                 ", 1x128 / 128x128 scales, f32 promotion every 128 of K"]
    records, skipped = gpu.run_cases(cases, budget,
                                     timer=functools.partial(gpu.time_ms, flush=args.flush,
                                                             rep_ms=args.rep_ms))
    notes += gpu.autotune_notes(tuner) + peak_fractions(records, impls, PEAK_TFLOPS["f16"])
    if peak != PEAK_TFLOPS["f16"]:  # FP8: also against its own (twice as high) peak
        notes += peak_fractions(records, impls, peak)
    groups = {"large": lambda r: "large" in r.get("tags", ()),
              "decode": lambda r: "decode" in r.get("tags", ()), "all": lambda r: True}
    return gpu.finish(f"gemm-{args.mode}", torch, args, records, skipped, impls, impls[1:],
                      "tflops", notes, {"mode": args.mode,
                                        "autotune": gpu.autotune_records(tuner)},
                      None, groups, lambda s: LABELS.get(s, s))


__all__ = ["main", "make_case", "make_epilogue_case", "make_fp8_case", "peak_fractions",
           "best_triton_lines", "triton_picks",
           "tags", "SQUARES", "LLM", "DECODE", "QUICK", "EPILOGUE_SHAPES", "FP8_SHAPES"]
