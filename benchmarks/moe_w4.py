"""The 4-bit-weight MoE grouped GEMM (`tegula.kernels.moe_w4`) in several tilings against
dense bf16 cuBLAS at equal FLOPs, in one process (session 12, issue 13):

    PYTHONPATH=. python3 benchmarks/moe_w4.py [--budget S] [--bf16] [--ksweep]
        [--profile [CASE]] [--once CASE]

`tegula bench moe`'s three balanced cases (Mixtral 8x7B's up and down projections, a
64-expert top-6 model; 4096 tokens, group 128 with zero points). Every output is written
into a NaN-poisoned tensor and checked, every element, against the torch loop over experts
on the weights the packed ones stand for (error relative to the largest |reference|),
then timed with L2 flushed (`bench.gpu.time_ms`; the schedule launch included). `--bf16`
adds the bf16 grouped GEMM as users call it (autotuned). `--profile`: where the default
call's time goes, per case: each kernel's device time a call (CUPTI, torch.profiler: the
schedule helper against the grouped GEMM) beside the whole call by CUDA events, and dense
cuBLAS the same two ways (the first case, or the one named). `--ksweep`: the default
call with and without AHEAD at the 64-expert geometry over several K (`KSWEEP`). A table last
(TFLOP/s; nothing is asserted about time).
"""
from __future__ import annotations

import sys
import time

import torch

START = time.time()
#: The fragment kernel (`moe_w4_fragment`: weights pre-packed in the MMA fragment's order,
#: paired 16-bit dequantization in registers), its default first.
CONFIGS = [("default (WG3 PAIRS KS2 S2 AHEAD)", None),
           ("AHEAD=0 (session 13's default)", dict(FRAGMENT=True, AHEAD=0))]
#: Session 14 round 1 (H100, x dense bf16, the 64-expert geometry at K = 1024 / 2048 /
#: 8192): AHEAD=1 0.55 / 0.69 / 0.73, AHEAD=0 0.55 / 0.67 / 0.71 (the default since).
#: Round 2 (an H200, Mixtral up / down / 64-expert top-6): AHEAD=1 0.80 / 0.81 / 0.71,
#: AHEAD=0 0.81 / 0.81 / 0.71.
#: Session 13 round 2 (x dense bf16, Mixtral up / down / 64-expert top-6): WG3 KS2 S2
#: 0.74 / 0.78 / 0.69 (the default since, AHEAD=0), WG2 KS2 S3 0.68 / 0.73 / 0.67, WG3
#: KS1 S4 0.72 / 0.72 / 0.63, PAIRS=0 (session 12's default) 0.58 / 0.62 / 0.56.
#: Session 13: PAIRS=1 (`moe_w4_fragment._paired_steps`: two register operands, so ptxas
#: no longer waits for each wgmma before the next, C7513). Round 1 (x dense bf16, Mixtral
#: up / down / 64-expert top-6): PAIRS KS2 S3 0.70 / 0.72 / 0.67 (the default since), KS1
#: S3 0.63 / 0.66 / 0.59, KS1 S4 0.63 / 0.65, KS2 S2 0.65 / 0.66; PAIRS=0 0.60 / 0.62 /
#: 0.55; 256-token tiles need 262 KB of shared memory with two rings (refused at launch).
#: Session 12 round 2 (x dense bf16, Mixtral up / down / 64-expert top-6): session 11's
#: shared-operand 64x64 0.32 / 0.29 / 0.32; swapped BN128 BT128 S4 0.31 / 0.32 / 0.29;
#: fragment WG4 BT128 S3 (WSMEM=1) 0.52 / 0.55 / 0.45, WSMEM=0 0.62 / 0.62 / 0.54; WG2
#: BT256 S3 WSMEM=0 0.55 / 0.58 / 0.39; WG2 BT128 KS2 S3 WSMEM=0 0.65 / 0.65 / 0.56 (the
#: default since); WG4 BT128 KS2 S2 0.60 / 0.62 / 0.50.
#: Round 1 (session 12, H100, x dense bf16 at Mixtral up / down / 64-expert top-6):
#: session 11's kernel 0.30 / 0.27 / 0.31; swapped BN128 BT128 S4 0.29 / 0.30 / 0.28
#: (scales loaded where used, AHEAD=0: 0.31 / 0.30 / 0.29); fragment WG2 BT128 S4 0.36 /
#: 0.38 / 0.36, WSMEM=0 0.46 / 0.45 / 0.40, BT256 S3 0.49 / 0.52 / 0.35, KS2 S3 0.45 /
#: 0.46 / 0.43, WG4 BT128 S3 0.49 / 0.51 / 0.42, BT192 S4 0.41 / 0.42 / 0.41.


def case_rows(label: str, dims: tuple, budget: float, with_bf16: bool,
              configs: list | None = None) -> list:
    from tegula.bench.gpu import time_ms
    from tegula.bench.moe import W4_GROUP, dequantized_w4, make_problem, reference
    from tegula.kernels import moe, moe_w4
    from tegula.kernels.moe_w4_fragment import pack_experts_fragments
    tokens, k, experts, kdim, n = dims
    p = make_problem(torch, tokens, k, experts, kdim, n, True)
    xs, w, offsets = p["x_sorted"], p["w"], p["routing"].expert_offsets
    rows, flops = xs.shape[0], 2.0 * xs.shape[0] * n * kdim
    packed, scales, zeros = moe_w4.quantize_experts_w4(w, W4_GROUP)
    stored = pack_experts_fragments(packed)          # once per weight, as a model would
    ref = reference(torch, xs, dequantized_w4(torch, packed, scales, zeros), offsets.tolist())
    a = torch.randn(rows, kdim, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(kdim, n, device="cuda", dtype=torch.bfloat16)
    dense = flops / time_ms(lambda: a @ b) / 1e9
    out = [(f"{label} dense bf16 cuBLAS", f"{dense:.0f} TFLOP/s")]
    print(out[-1], f"t={time.time() - START:.0f}s (problem, packing, reference)", flush=True)
    runs = [(name, lambda c=cfg, o=None: moe_w4.moe_gemm_w4a16(   # None: as users call it
        xs, stored if c is None or c.get("FRAGMENT") else packed, scales, zeros, W4_GROUP,
        offsets, config=c, out=o)) for name, cfg in (configs or CONFIGS)]
    if with_bf16:
        bf16_ref = reference(torch, xs, w, offsets.tolist())
        runs.append(("bf16 moe_gemm (autotuned)", lambda o=None: moe.moe_gemm(xs, w, offsets,
                                                                            out=o)))
    for name, run in runs:
        row = f"{label} {name}"
        if time.time() - START > budget:
            out.append((row, "skipped (time)"))
            continue
        try:
            c = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            run(o=c)
            torch.cuda.synchronize()
            want = bf16_ref if name.startswith("bf16") else ref
            err = float((c.float() - want).abs().max() / want.abs().max())
            nans = int(torch.isnan(c).sum())
            status = "" if err < 1e-2 and nans == 0 else " WRONG"
            tf = flops / time_ms(lambda: run(o=c)) / 1e9
            out.append((row, f"{tf:.0f} TFLOP/s = {tf / dense:.2f}x dense, max err "
                             f"{err:.1e}, {nans} NaN{status}"))
        except Exception as e:  # report and go on
            out.append((row, f"FAILED {type(e).__name__}: {e}"[:200]))
        print(out[-1], f"t={time.time() - START:.0f}s", flush=True)
    return out


def kernel_times(fn, calls: int = 10) -> dict[str, float]:
    """Microseconds a call of each CUDA kernel `fn` launches (CUPTI device time, summed
    over `calls` calls after a warm-up, divided by `calls`)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times[e.name[:60]] = times.get(e.name[:60], 0.0) + e.device_time / calls
    return times


def profile_rows(label: str, dims: tuple) -> list:
    """`--profile` for one case: the default fragment call and dense bf16, per kernel."""
    from tegula.bench.gpu import time_ms
    from tegula.bench.moe import W4_GROUP, make_problem
    from tegula.kernels import moe_w4
    from tegula.kernels.moe_w4_fragment import pack_experts_fragments
    tokens, k, experts, kdim, n = dims
    p = make_problem(torch, tokens, k, experts, kdim, n, True)
    xs, w, offsets = p["x_sorted"], p["w"], p["routing"].expert_offsets
    packed, scales, zeros = moe_w4.quantize_experts_w4(w, W4_GROUP)
    stored = pack_experts_fragments(packed)
    a = torch.randn(xs.shape[0], kdim, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(kdim, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(xs.shape[0], n, device="cuda", dtype=torch.bfloat16)
    rows = []
    for name, fn in (("w4 fragment default", lambda: moe_w4.moe_gemm_w4a16(
            xs, stored, scales, zeros, W4_GROUP, offsets, out=c)),
            ("dense bf16", lambda: torch.matmul(a, b, out=c))):
        whole = time_ms(fn) * 1e3
        parts = ", ".join(f"{k_} {v:.1f}" for k_, v in sorted(kernel_times(fn).items(),
                                                              key=lambda kv: -kv[1]))
        rows.append((f"{label} {name}", f"call {whole:.1f} us (events, L2 flushed); "
                                        f"kernels us a call: {parts}"))
        print(rows[-1], f"t={time.time() - START:.0f}s", flush=True)
    return rows


#: Session 14, `--ksweep`: the 64-expert top-6 case's geometry (4096 tokens, N = 1408)
#: at several K. A work item's fixed cost (its words' first loads and dequantization, the
#: token ring's refill, the epilogue through shared memory) weighs more the shorter K is:
#: if time = items x (K-proportional part + fixed part), the ratio to dense bf16 climbs
#: with K towards the kernel's steady-state ceiling.
KSWEEP = (1024, 2048, 8192)
#: The sweep's configurations: the default (AHEAD=1: each item's first weights loaded
#: during the previous item's epilogue, session 14) and without.
KSWEEP_CONFIGS = CONFIGS[:2]


def ksweep_rows(budget: float) -> list:
    from tegula.bench.moe import CASES
    label, tokens, k, experts, _, n = CASES[2]
    rows = []
    for kdim in KSWEEP:
        if time.time() - START > budget:
            rows.append((f"{label} K={kdim}", "skipped (time)"))
            continue
        part = case_rows(f"{label} K={kdim}", (tokens, k, experts, kdim, n), budget, False,
                         KSWEEP_CONFIGS)
        rows += part
    return rows


def run_once(case: str) -> None:
    """`--once CASE`: the default call twice on CASE's problem, for a profiler to catch the
    second launch (`ncu --launch-skip 1 --launch-count 1 --kernel-name
    regex:moe_gemm_w4`)."""
    from tegula.bench.moe import CASES, W4_GROUP, make_problem
    from tegula.kernels import moe_w4
    from tegula.kernels.moe_w4_fragment import pack_experts_fragments
    tokens, k, experts, kdim, n = next(c[1:] for c in CASES if c[0] == case)
    p = make_problem(torch, tokens, k, experts, kdim, n, True)
    packed, scales, zeros = moe_w4.quantize_experts_w4(p["w"], W4_GROUP)
    stored = pack_experts_fragments(packed)
    for _ in range(2):
        moe_w4.moe_gemm_w4a16(p["x_sorted"], stored, scales, zeros, W4_GROUP,
                              p["routing"].expert_offsets)
    torch.cuda.synchronize()


def main() -> None:
    if "--once" in sys.argv:
        return run_once(sys.argv[sys.argv.index("--once") + 1])
    from tegula.bench.moe import CASES
    from fp8_blockwise import print_table   # benchmarks/ runs as the script's folder
    print(torch.cuda.get_device_name(), torch.__version__, time.strftime("%Y-%m-%d %H:%M"))
    budget = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 600
    rows = []
    if "--ksweep" in sys.argv:
        rows += ksweep_rows(budget)
    for label, *dims in ([] if "--ksweep" in sys.argv else CASES):
        if "--profile" in sys.argv:
            wanted = sys.argv[sys.argv.index("--profile") + 1:][:1]
            if wanted and not wanted[0].startswith("-") and wanted[0] != label:
                continue
            rows += profile_rows(label, tuple(dims))
            break                                   # one case: where the time goes
        else:
            rows += case_rows(label, tuple(dims), budget, "--bf16" in sys.argv)
    print_table(rows)


if __name__ == "__main__":
    main()
