"""Mamba's selective scan forward: tegula against the torch reference loop: `python -m
tegula.bench scan`.

Shapes are batch × dim × L with dstate 16 (Mamba's default), all options on (D, z,
delta_bias, softplus). Memory-bound in Mamba's own kernel: the floor is the bytes of u,
delta, z and out (batch·dim·L each), B and C (batch·dstate·L each) and A, D, delta_bias;
reported in TB/s, as a fraction of the device-to-device copy bandwidth measured in the
same run (issue 13's target: ≥ 80%), and as a ratio to Mamba's `selective_scan_ref`
transcribed in torch (a Python loop over L; target ≥ 10×). The correctness reference is
that loop in float64.
"""
from __future__ import annotations

import argparse
import functools
from typing import Any

from tegula.bench import gpu

DSTATE = 16
SHAPES = [(1, 2048, 2048), (4, 1536, 2048), (8, 2048, 1024), (2, 2560, 4096), (3, 1000, 777)]
QUICK = [(4, 1536, 2048), (3, 1000, 777)]


def reference_loop(torch: Any, u, delta, A, B, C, D, z, delta_bias, dtype=None):
    """Mamba's selective_scan_ref (variable B/C, delta_softplus=True) in `dtype` (default
    float32, as Mamba's)."""
    F = torch.nn.functional
    dtype = dtype or torch.float32
    u, delta = u.to(dtype), delta.to(dtype)
    delta = F.softplus(delta + delta_bias[..., None].to(dtype))
    A, B, C = A.to(dtype), B.to(dtype), C.to(dtype)
    x = A.new_zeros((u.shape[0], A.shape[0], A.shape[1]))
    delta_a = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    delta_b_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    ys = []
    for i in range(u.shape[2]):
        x = delta_a[:, :, i] * x + delta_b_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", x, C[:, :, i]))
    out = torch.stack(ys, dim=2) + u * D.to(dtype)[:, None]
    return out * F.silu(z.to(dtype))


def make_case(torch: Any, shape: tuple[int, int, int], dtype: str) -> gpu.Case:
    """Fresh Mamba-like inputs and the implementations for one (batch, dim, L)."""
    from tegula.kernels import selective_scan

    batch, dim, length = shape
    t = getattr(torch, gpu.TORCH_DTYPES[dtype])
    u = torch.randn(batch, dim, length, device="cuda", dtype=t)
    delta = (torch.rand(batch, dim, length, device="cuda") * 0.1 - 4.0).to(t)  # softplus → ~0.02
    A = -torch.exp(torch.randn(dim, DSTATE, device="cuda"))
    B = torch.randn(batch, DSTATE, length, device="cuda", dtype=t)
    C = torch.randn(batch, DSTATE, length, device="cuda", dtype=t)
    D = torch.randn(dim, device="cuda")
    z = torch.randn(batch, dim, length, device="cuda", dtype=t)
    bias = torch.rand(dim, device="cuda") * 0.5
    args = (u, delta, A, B, C, D, z, bias)

    def tegula_check() -> Any:
        out = torch.full_like(u, float("nan"))
        return selective_scan(*args, True, out=out)

    impls = [gpu.Impl("tegula", lambda: selective_scan(*args, True), tegula_check),
             gpu.Impl("torch", lambda: reference_loop(torch, *args))]
    io = 4 * batch * dim * length * u.element_size() + 2 * batch * DSTATE * length * \
        B.element_size() + (dim * DSTATE + 2 * dim) * 4
    return gpu.Case(label=f"{batch}x{dim}x{length}", dims=shape, flops=0.0, bytes=float(io),
                    reference=lambda: reference_loop(torch, *args, dtype=torch.float64),
                    tol=gpu.FLOAT_TOLERANCE[dtype], impls=impls,
                    same_size_copy=torch.empty(io // 2, device="cuda", dtype=torch.uint8).clone)


def _default_tiles(dtype: str, shape: tuple[int, int, int] = (4, 1536, 2048)) -> str:
    """The entry point's default kernel and constexprs for `dtype` at `shape`, as the notes
    print them."""
    from tegula.dtypes import bf16, f16, f32
    from tegula.kernels.scan import selective_scan_launch_config

    batch, dim, _ = shape
    split, tiles = selective_scan_launch_config(
        dim, DSTATE, {"f32": f32, "f16": f16, "bf16": bf16}[dtype], batch)
    kernel = "split-state kernel (scan_split.py)" if split else \
        "lane-scan kernel (selective_scan_config), 128 threads"
    return f"{kernel}: " + ", ".join(f"{k}={v}" for k, v in tiles.items() if k != "N")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tegula.bench scan",
                                     description=__doc__.splitlines()[0])
    gpu.add_common_options(parser, ("f32", "f16", "bf16"),
                           "comma-separated batch x dim x L shapes, e.g. 4x1536x2048")
    args = parser.parse_args(argv)
    chosen = gpu.parse_shapes(args.shapes, 3) if args.shapes else \
        QUICK if args.quick else SHAPES
    torch, why = gpu.load_torch("scan")
    if torch is None:
        return gpu.no_gpu(why)
    budget = gpu.Budget(args.max_seconds)
    print(f"scan ({args.dtype}) on {torch.cuda.get_device_name()}")
    copy_bw = gpu.report_copy_bandwidth(torch, args.flush)
    cases = [("x".join(map(str, s)), lambda s=s: make_case(torch, s, args.dtype))
             for s in chosen]
    records, skipped = gpu.run_cases(cases, budget,
                                     timer=functools.partial(gpu.time_ms, flush=args.flush))
    notes = [f"tegula: tegula.kernels.selective_scan (its default at "
             f"{'x'.join(map(str, chosen[0]))}: {_default_tiles(args.dtype, chosen[0])}), "
             f"dstate {DSTATE}, every option on; torch: "
             f"Mamba's selective_scan_ref in torch (float32, a Python loop over L); median, "
             f"L2 flushed before each run ({args.flush}: {gpu.FLUSH_NOTE[args.flush]})",
             "TB/s counts u, delta, z, out, B, C, A, D and delta_bias once; tegula/copy is "
             "the fraction of the device-to-device copy bandwidth measured in this run"]
    return gpu.finish("scan", torch, args, records, skipped, ["tegula", "torch"], ["torch"],
                      "tbps", notes, {}, copy_bw)


__all__ = ["main", "make_case", "reference_loop", "SHAPES", "QUICK"]
