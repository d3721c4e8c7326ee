"""W4A16 GEMM and GEMV: tegula against torch and Triton: `python -m tegula.bench quant`.

Shapes: LLM projections, N and K from {4096, 11008, 14336} (square, up and down), with
M ∈ {1, 4, 16, 64, 128} rows of activations for W4A16 (`--kernel w4a16`) and M ∈ {1, 4,
16} for the f16/bf16 GEMV (`--kernel gemv`); both by default.

* W4A16: `tegula.kernels.matmul_w4a16` on weights from `quantize_w4` (group 128 with zero
  points by default; `--group`, `--symmetric`; `--prepacked`: pre-packed once more by
  `pack_fragments`, which the fragment kernel reads with 16-byte loads) against torch's f16 matmul of the
  dequantized weights (`a @ w_dequant.T`, the issue's baseline: targets ≥ 3× for M ≤ 16,
  ≥ 1.3× for M = 64-128) and a Triton W4A16 kernel written here (`_triton_w4a16`:
  unpack, dequantize and `tl.dot` per k-step, the usual way to write it in Triton).
* GEMV: `tegula.kernels.gemv` against torch (`x @ w.T`, cuBLAS) and the Triton matmul of
  `tegula.bench.triton_kernels` (16-row tiles).

The floor is the weight bytes (packed weights, scales and zeros for W4A16; N·K·itemsize
for GEMV): TB/s counts those bytes, and tegula/copy is the fraction of the device copy
bandwidth they reach (targets: ≥ 80% for W4A16 at M ≤ 16, ≥ 90% for GEMV at M = 1).
Each implementation's µs are printed as it is timed.
"""
from __future__ import annotations

import argparse
import functools
from typing import Any

from tegula.bench import gpu

PAIRS = [(4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096), (4096, 14336)]
W4A16_SHAPES = [(m, n, k) for m in (1, 4, 16, 64, 128) for n, k in PAIRS]
GEMV_SHAPES = [(m, n, k) for m in (1, 4, 16) for n, k in PAIRS]
QUICK = [(1, 4096, 4096), (16, 11008, 4096), (128, 4096, 14336)]
TOLERANCE = {"f16": 2e-3, "bf16": 1e-2}
LABELS = {"tegula": "tegula", "torch": "torch f16", "triton": "Triton"}


@functools.lru_cache(maxsize=None)
def _triton_w4a16() -> Any:
    """A Triton W4A16 kernel (our own code): (BLOCK_M, BLOCK_N) tiles of c; each k-step
    loads BLOCK_K/2 packed bytes per weight row, splits the nibbles (low nibble first),
    dequantizes with the group's scale and zero, and feeds `tl.dot` (f32 accumulation).
    BLOCK_K divides the group. Built on first use (needs triton)."""
    import torch
    import triton
    import triton.language as tl

    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
                             num_stages=s, num_warps=w)
               for bm, bn, bk, s, w in [(16, 64, 64, 4, 4), (16, 128, 64, 4, 4),
                                        (16, 32, 128, 4, 4), (16, 64, 32, 4, 4),
                                        (16, 128, 32, 4, 4), (32, 64, 64, 4, 4),
                                        (64, 64, 64, 3, 4), (64, 128, 32, 3, 4),
                                        (128, 128, 32, 3, 8)]]

    def prune(configs, named_args, **kwargs):
        m = named_args["M"]
        group = named_args.get("GROUP", kwargs.get("GROUP"))  # constexprs come as kwargs
        keep = [c for c in configs if group % c.kwargs["BLOCK_K"] == 0]
        small = [c for c in keep if c.kwargs["BLOCK_M"] <= 32]
        return small if m <= 16 and small else [c for c in keep if c.kwargs["BLOCK_M"] >= 32]

    @triton.autotune(configs=configs, key=["M", "N", "K", "GROUP"],
                     prune_configs_by={"early_config_prune": prune})
    @triton.jit
    def kernel(a_ptr, q_ptr, s_ptr, z_ptr, c_ptr, M, N, K, GROUP: tl.constexpr,
               HAS_ZEROS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rb = tl.arange(0, BLOCK_K // 2)                     # packed bytes of a k-step
        rk = tl.arange(0, BLOCK_K)
        groups = K // GROUP
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :],
                        mask=rm[:, None] < M, other=0.0)
            q = tl.load(q_ptr + rn[:, None] * (K // 2) + (k0 // 2 + rb)[None, :],
                        mask=rn[:, None] < N, other=0)
            w = tl.join(q & 15, q >> 4).reshape(BLOCK_N, BLOCK_K).to(tl.float32)
            g = k0 // GROUP
            scale = tl.load(s_ptr + rn * groups + g, mask=rn < N, other=0.0).to(tl.float32)
            if HAS_ZEROS:
                zero = tl.load(z_ptr + rn * groups + g, mask=rn < N, other=0.0).to(tl.float32)
            else:
                zero = 8.0
            w = ((w - zero[:, None]) * scale[:, None]).to(a.dtype)
            acc += tl.dot(a, tl.trans(w))
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    def w4a16(a, packed, scales, zeros, group):
        m, k = a.shape
        n = packed.shape[0]
        c = torch.empty((m, n), device=a.device, dtype=a.dtype)
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))
        kernel[grid](a, packed, scales, zeros if zeros is not None else scales, c, m, n, k,
                     GROUP=group, HAS_ZEROS=zeros is not None)
        return c

    return w4a16


def make_w4a16_case(torch: Any, shape: tuple[int, int, int], dtype: str, group: int,
                    symmetric: bool, triton_kernels: Any, prepacked: bool = False) -> gpu.Case:
    import tegula.kernels as tk

    m, n, k = shape
    tdtype = getattr(torch, gpu.TORCH_DTYPES[dtype])
    a = torch.randn(m, k, device="cuda", dtype=tdtype)
    w = torch.randn(n, k, device="cuda", dtype=tdtype) * 0.05
    packed, scales, zeros = tk.quantize_w4(w, group, zero_point=not symmetric)
    w_q = tk.unpack_w4(packed)
    zero = 8.0 if zeros is None else zeros.float().repeat_interleave(group, dim=1)
    w_deq = ((w_q.float() - zero) * scales.float().repeat_interleave(group, dim=1)).to(tdtype)
    del w, w_q, zero
    weights = tk.pack_fragments(packed) if prepacked else packed   # the MMA fragment's order

    def tegula_check() -> Any:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        return tk.matmul_w4a16(a, weights, scales, zeros, group, out=out)

    impls = [gpu.Impl("tegula", lambda: tk.matmul_w4a16(a, weights, scales, zeros, group),
                      tegula_check, gpu.tuned_note("matmul_w4a16")),
             gpu.Impl("torch", lambda: a @ w_deq.T)]
    if triton_kernels is not None:
        triton_w4a16 = _triton_w4a16()
        impls.append(gpu.Impl("triton", lambda: triton_w4a16(a, packed, scales, zeros, group)))
    weight_bytes = packed.numel() + scales.numel() * scales.element_size() * (
        1 if zeros is None else 2)
    # the yardstick: a torch clone that reads and writes weight_bytes in all
    same_size = torch.empty(weight_bytes // 2, device="cuda", dtype=torch.uint8)
    return gpu.Case(label=f"w4a16 {m}x{n}x{k}", dims=shape, flops=2.0 * m * n * k,
                    bytes=float(weight_bytes), reference=lambda: a.double() @ w_deq.double().T,
                    tol=TOLERANCE[dtype], impls=impls,
                    tags=("w4a16", "small" if m <= 16 else "large"),
                    same_size_copy=same_size.clone)


def make_gemv_case(torch: Any, shape: tuple[int, int, int], dtype: str,
                   triton_kernels: Any) -> gpu.Case:
    import tegula.kernels as tk

    m, n, k = shape
    tdtype = getattr(torch, gpu.TORCH_DTYPES[dtype])
    x = torch.randn(m, k, device="cuda", dtype=tdtype)
    w = torch.randn(n, k, device="cuda", dtype=tdtype)

    def tegula_check() -> Any:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        return tk.gemv(x, w, out=out)

    impls = [gpu.Impl("tegula", lambda: tk.gemv(x, w), tegula_check, gpu.tuned_note("gemv")),
             gpu.Impl("torch", lambda: x @ w.T)]
    if triton_kernels is not None:
        impls.append(gpu.Impl("triton", lambda: triton_kernels.matmul(x, w.T)))
    return gpu.Case(label=f"gemv {m}x{n}x{k}", dims=shape, flops=2.0 * m * n * k,
                    bytes=float(n * k * w.element_size()),
                    reference=lambda: x.double() @ w.double().T, tol=TOLERANCE[dtype],
                    impls=impls, tags=("gemv",),
                    same_size_copy=w[: n // 2].clone)  # reads + writes N·K elements


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tegula.bench quant",
                                     description=__doc__.splitlines()[0])
    gpu.add_common_options(parser, ("f16", "bf16"),
                           "comma-separated MxNxK shapes, e.g. 1x4096x4096,16x11008x4096")
    parser.add_argument("--kernel", choices=("both", "w4a16", "gemv"), default="both")
    parser.add_argument("--group", type=int, choices=(32, 64, 128), default=128,
                        help="W4A16 group size (default 128)")
    parser.add_argument("--symmetric", action="store_true",
                        help="W4A16 without zero points (zero point 8)")
    parser.add_argument("--prepacked", action="store_true",
                        help="W4A16 weights pre-packed in the MMA fragment's order "
                             "(tegula.kernels.pack_fragments; the fragment kernel)")
    args = parser.parse_args(argv)
    custom = gpu.parse_shapes(args.shapes, 3) if args.shapes else None
    torch, why = gpu.load_torch("quant")
    if torch is None:
        return gpu.no_gpu(why)
    budget = gpu.Budget(args.max_seconds)
    triton_kernels, triton_note = gpu.load_triton(args.no_triton)
    print(f"quant ({args.dtype}, group {args.group}) on {torch.cuda.get_device_name()}; "
          f"{triton_note}")
    copy_bw = gpu.report_copy_bandwidth(torch, args.flush)
    cases = []
    if args.kernel in ("both", "w4a16"):
        shapes = custom or (QUICK if args.quick else W4A16_SHAPES)
        cases += [(f"w4a16 {m}x{n}x{k}", lambda s=(m, n, k): make_w4a16_case(
            torch, s, args.dtype, args.group, args.symmetric, triton_kernels, args.prepacked))
            for m, n, k in shapes]
    if args.kernel in ("both", "gemv"):
        shapes = [s for s in custom or (QUICK if args.quick else GEMV_SHAPES) if s[0] <= 16]
        cases += [(f"gemv {m}x{n}x{k}", lambda s=(m, n, k): make_gemv_case(
            torch, s, args.dtype, triton_kernels)) for m, n, k in shapes]
    records, skipped = gpu.run_cases(cases, budget,
                                     timer=functools.partial(gpu.time_ms, flush=args.flush))
    impls = ["tegula", "torch"] + (["triton"] if triton_kernels is not None else [])
    notes = [triton_note,
             "tegula: tegula.kernels.matmul_w4a16 / gemv as users call them (autotuned on the "
             "first call per shape bucket, before timing); torch: a @ w_dequant.T (f16/bf16 "
             "matmul of the dequantized weights) / x @ w.T; Triton: the W4A16 kernel of "
             "tegula/bench/quant.py / the matmul of tegula/bench/triton_kernels.py; median, "
             f"L2 flushed before each run ({args.flush}: {gpu.FLUSH_NOTE[args.flush]})",
             "TB/s counts the weight bytes only (packed weights + scales + zeros for W4A16); "
             "tegula/copy is their fraction of the device copy bandwidth",
             f"W4A16 group {args.group}, " + ("symmetric" if args.symmetric else
                                              "with zero points")
             + (", weights pre-packed in fragment order (pack_fragments)" if args.prepacked
                else "")]
    notes += gpu.autotune_notes("matmul_w4a16") + gpu.autotune_notes("gemv")
    groups = {"w4a16 M<=16": lambda r: "small" in r.get("tags", ()),
              "w4a16 M>16": lambda r: "large" in r.get("tags", ()),
              "gemv": lambda r: "gemv" in r.get("tags", ()), "all": lambda r: True}
    return gpu.finish("quant", torch, args, records, skipped, impls, impls[1:], "tbps", notes,
                      {"group": args.group, "symmetric": args.symmetric,
                       "prepacked": args.prepacked,
                       "autotune": {**gpu.autotune_records("matmul_w4a16"),
                                    **gpu.autotune_records("gemv")}},
                      copy_bw, groups, lambda s: LABELS.get(s, s))


__all__ = ["main", "make_w4a16_case", "make_gemv_case", "W4A16_SHAPES", "GEMV_SHAPES",
           "QUICK", "PAIRS"]
