"""`tg.atomic_add` of register tiles: TMA reduce-adds staged in shared memory (the default
on sm_90, `atomic_path="bulk"`) against one `red.global.add.f32` per element
(`atomic_path="red"`), timed in one process on the same tensors.

1. `tile_adds` (tests/lower/test_bulk_add.py): every block adds a 64x64 f32 tile REPEAT
   times into a (M, N) slice; `Z` blocks add into each tile. Checked first: the result
   of each path equals numpy exactly (small integers).
2. The attention backward after its preprocess kernel: the dK/dV kernel that adds dQ
   atomically (`deterministic=False`) then dQ's conversion, on each atomic path (the
   default, `atomic_path="bulk"`, `"red"`), and the deterministic dK/dV + dQ kernels, on
   the same inputs: dQ of each checked (module `ATTENTION_VARIANTS`), then timed.

Times are medians of CUDA-event pairs (`tegula.bench.gpu.time_ms`), L2 flushed ("clean")
before each run. Usage: `python3 benchmarks/bulk_add.py [--quick]`.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "lower"))
from test_bulk_add import bulk_plan, tile_adds  # noqa: E402

PATHS = ("bulk", "red")


def _plan_note(kernel, tensors: tuple, constexprs: dict) -> str:
    """How the launch's build adds: its bulk plan, or why it stayed element-wise."""
    from tegula.build import _launch_facts, build, split_arguments
    named, _, _ = split_arguments(kernel, tensors, {})
    facts, _ = _launch_facts(kernel, named)
    plan, skipped = bulk_plan(build(kernel, dict(constexprs), facts, "sm_90a"))
    return plan.describe() if plan is not None else f"NOT bulk: {skipped}"


def tile_adds_rows(torch, quick: bool) -> list[tuple]:
    from tegula.bench.gpu import time_ms
    cases = [(4096, 128, 32, 4)] if quick else [(4096, 128, 32, 4), (8192, 256, 8, 1),
                                                (1000, 200, 64, 2)]
    rows = []
    for M, N, Z, R in cases:
        rng = np.random.default_rng(M + N)
        x = rng.integers(-8, 9, (M, N)).astype(np.float32)
        start = rng.integers(-8, 9, (2, 3, M, N)).astype(np.float32)
        want = start.copy()
        want[1, 0] += x * (Z * R)
        grid = ((M + 63) // 64, (N + 63) // 64, Z)
        tx = torch.from_numpy(x).cuda()
        ms = {}
        for path in PATHS:
            out = torch.from_numpy(start.copy()).cuda()
            tile_adds[grid](tx, out, REPEAT=R, atomic_path=path)
            torch.cuda.synchronize()
            ok = np.array_equal(out.cpu().numpy(), want)
            print(f"tile_adds {M}x{N} Z={Z} R={R} {path}: exact={ok}")
            if not ok:
                raise SystemExit(f"tile_adds {path} gave a wrong sum")
            ms[path] = time_ms(lambda: tile_adds[grid](tx, out, REPEAT=R, atomic_path=path))
        print("  plan:", _plan_note(tile_adds, (tx, out), dict(REPEAT=R)))
        added = M * N * 4 * Z * R
        rows.append((f"tile_adds {M}x{N} Z={Z} R={R}", ms["bulk"], ms["red"],
                     added / ms["bulk"] / 1e6, added / ms["red"] / 1e6))
    return rows


#: The attention variants: the dK/dV/dQ kernel (then dQ's conversion) on each atomic path
#: (None: the default, bulk where the staging keeps the blocks per SM; "bulk": one round
#: of every box whatever it costs; "red"), and the deterministic dK/dV + dQ kernels.
ATTENTION_VARIANTS = (("atomic default", None), ("atomic bulk", "bulk"), ("atomic red", "red"),
                      ("deterministic", "det"))


def attention_rows(torch, quick: bool) -> list[tuple]:
    """(label, ms, TFLOP/s) of each variant of the backward after the preprocess kernel,
    dQ of every atomic variant checked against red's (f32, relative 1e-4) and the final
    dq of each against the deterministic one (f16, relative 1e-2)."""
    from tegula.bench.gpu import time_ms
    from tegula.build import launch
    from tegula.dtypes import f16
    from tegula.kernels.attention import attention_forward
    from tegula.kernels.attention_backward import backward_launches
    shapes = [(4, 16, 4096, 128, False)] if quick else [
        (4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (4, 16, 4096, 64, False)]
    rows = []
    for B, H, S, D, causal in shapes:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16)
                       for _ in range(4))
        o, lse = attention_forward(q, k, v, causal=causal)
        values = dict(q=q, k=k, v=v, o=o, do=do, lse=lse,
                      delta=torch.empty(B, H, S, device="cuda", dtype=torch.float32),
                      dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v),
                      dq_accum=torch.zeros(B, H, S, D, device="cuda", dtype=torch.float32))
        label = f"{B}x{H}x{S}x{D}{' causal' if causal else ''}"
        accums, dqs = {}, {}
        for name, path in ATTENTION_VARIANTS:
            launches = backward_launches(f16, B, H, H, S, S, D, D ** -0.5, causal,
                                         path == "det")
            pre, grid, names, constexprs = launches[0]
            launch(pre, grid, *(values[n] for n in names), **constexprs)
            steps = [(kernel, grid, [values[n] for n in names],
                      dict(constexprs, **({"atomic_path": path} if path != "det" and
                                          kernel.name.endswith("dkdvdq") else {})))
                     for kernel, grid, names, constexprs in launches[1:]]

            def run():
                for kernel, grid, args, constexprs in steps:
                    launch(kernel, grid, *args, **constexprs)
            values["dq_accum"].zero_()
            run()
            torch.cuda.synchronize()
            dqs[name] = values["dq"].clone()
            if path != "det":
                accums[name] = values["dq_accum"].clone()
                kernel, _, args, constexprs = steps[0]
                print(f"  {label} {name}:", _plan_note(kernel, tuple(args), constexprs))
            ms = time_ms(run)
            flops = 10 * B * H * S * S * D * (0.5 if causal else 1.0)  # 5 gemms' worth
            rows.append((f"attn bwd {label} {name}", ms, flops / ms / 1e9))
        ref = accums["atomic red"].double()
        for name in accums:
            err = ((accums[name].double() - ref).abs().max() / ref.abs().max()).item()
            dq_err = ((dqs[name].double() - dqs["deterministic"].double()).abs().max()
                      / dqs["deterministic"].double().abs().max()).item()
            print(f"  {label} {name}: dQ accum vs red {err:.1e}, dq vs deterministic "
                  f"{dq_err:.1e}")
            if not torch.isfinite(accums[name]).all() or err > 1e-4 or dq_err > 1e-2:
                raise SystemExit(f"{label} {name}: dQ differs")
    return rows


def main() -> None:
    import torch
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-attention", action="store_true")
    parser.add_argument("--skip-tiles", action="store_true")
    args = parser.parse_args()
    rows = [] if args.skip_tiles else tile_adds_rows(torch, args.quick)
    attention = [] if args.skip_attention else attention_rows(torch, args.quick)
    if rows:
        print(f"\n{'case':40s} {'bulk ms':>9s} {'red ms':>9s} {'red/bulk':>9s}  GB/s added "
              f"bulk / red")
    for label, bulk, red, rate_bulk, rate_red in rows:
        print(f"{label:40s} {bulk:9.4f} {red:9.4f} {red / bulk:9.2f}x  "
              f"{rate_bulk:.1f} / {rate_red:.1f}")
    if attention:
        print(f"\n{'backward after the preprocess':44s} {'ms':>8s} {'TFLOP/s':>8s}  (10 B H S^2 D "
              f"flops, halved if causal)")
    for label, ms, tflops in attention:
        print(f"{label:44s} {ms:8.3f} {tflops:8.1f}")


if __name__ == "__main__":
    main()
