"""Registers per thread: the liveness estimate (`synth/registers.py`) against ptxas, on the
library's kernels, no GPU needed (a local nvcc or NVRTC compiles the generated CUDA).

    PYTHONPATH=. python3 benchmarks/register_table.py [--targets sm_90a,sm_80] [--only NAME]
        [--fences-all]

One row per (kernel, target): ptxas's registers and spills, the registers the SASS uses
(the highest register named + 3, which is ptxas's count for a kernel of one role; with
warp roles ptxas reports the kernel-wide allocation that setmaxnreg then changes, so this
is the largest role's true use), the estimate (the largest role's) and the error
(estimate / used - 1). `--fences-all` also compiles each wgmma
kernel with every operand fence naming every accumulator (codegen before session 12), to
show what naming only a fence's own accumulators changed.
"""
from __future__ import annotations

import argparse
import re
import sys
import time

from tegula.build import build
from tegula.dtypes import bf16, f16, f32
from tegula.runtime.compiler import compile_cuda_report, disassemble
from tegula.synth.registers import estimate_registers


def cases() -> list[tuple[str, object, dict, tuple[str, ...]]]:
    """(name, kernel, constexprs, targets) for the table."""
    from tegula.kernels.attention import attention_kernel, qk_scale
    from tegula.kernels.attention_backward import (attention_backward_dkdv_kernel,
                                                   attention_backward_dq_kernel)
    from tegula.kernels.fp8 import fp8_blockwise_gemm_kernel, fp8_gemm_kernel
    from tegula.kernels.gemm import gemm_kernel, persistent_gemm_kernel
    from tegula.kernels.gemv import gemv_kernel
    from tegula.kernels.norm import rms_norm_kernel
    from tegula.kernels.quant_fragment import w4a16_fragment_kernel
    from tegula.kernels.scan import selective_scan_kernel
    from tegula.kernels.softmax import softmax_kernel

    both, hopper = ("sm_90a", "sm_80"), ("sm_90a",)
    att = attention_kernel(f16)

    def fwd(D, **kw):
        return dict(D=D, QK_SCALE=qk_scale(None, D), **kw)

    wide = dict(BM=128, threads=256)
    back = dict(D=128, SCALE=qk_scale(None, 128), CAUSAL=False)
    return [
        ("gemm 128x128x32", gemm_kernel(f16), {}, both),
        ("gemm 64x64x32", gemm_kernel(f16), dict(BM=64, BN=64), both),
        ("gemm 128x128x32 one role", gemm_kernel(f16), dict(warp_specialize=False), hopper),
        ("gemm 128x256x64 256 thr", gemm_kernel(f16),
         dict(BM=128, BN=256, BK=64, STAGES=3, threads=256), hopper),
        ("persistent 128x256x64", persistent_gemm_kernel(f16),
         dict(BM=128, BN=256, BK=64, STAGES=4, threads=256), hopper),
        ("persistent bias+gelu", persistent_gemm_kernel(f16, "gelu", True),
         dict(BM=128, BN=256, BK=64, STAGES=4, threads=256), hopper),
        ("persistent pingpong 64x256", persistent_gemm_kernel(f16),
         dict(BM=64, BN=256, BK=64, STAGES=4, threads=128, consumers="pingpong"), hopper),
        ("gemm bias+silu 128x128", gemm_kernel(f16, "silu", True), {}, both),
        ("fp8 128x128x64", fp8_gemm_kernel(bf16), {}, hopper),
        ("fp8 blockwise 128x128", fp8_blockwise_gemm_kernel(bf16), {}, hopper),
        ("attn fwd D=64 BN=128", att, fwd(64, BN=128, **wide), hopper),
        ("attn fwd D=64 64x64", att, fwd(64), both),
        ("attn fwd D=128 BN=128", att, fwd(128, BN=128, **wide), hopper),
        ("attn fwd D=128 overlap", att, fwd(128, BN=128, OVERLAP=True, **wide), hopper),
        ("attn fwd D=128 64x64", att, fwd(128), both),
        ("attn fwd D=256 overlap", att, fwd(256, BN=64, OVERLAP=True, **wide), hopper),
        ("attn fwd D=64 pingpong", att, fwd(64, BN=128, consumers="pingpong", **wide),
         hopper),
        ("attn bwd dkdv D=128", attention_backward_dkdv_kernel(f16), back, both),
        ("attn bwd dq D=128", attention_backward_dq_kernel(f16), back, both),
        ("w4a16 fragment", w4a16_fragment_kernel(f16, False), {}, hopper),
        ("scan f32 N=16", selective_scan_kernel(f32, f32), dict(N=16), both),
        ("rms_norm 4x1024", rms_norm_kernel(f16), dict(BM=4, BN=1024, N=1024), both),
        ("softmax", softmax_kernel(f16), {}, both),
        ("gemv", gemv_kernel(f16), {}, both),
    ]


def measure(kernel, constexprs: dict, target: str) -> dict:
    """The estimate and ptxas's report of one build."""
    built = build(kernel, dict(constexprs), target=target)
    tk = built.thread_kernel
    est = estimate_registers(tk)
    cubin, report = compile_cuda_report(built.cuda_source(), tk.name, target)
    consumer = max(est.roles, key=lambda e: e.registers) if est.roles else est
    return dict(estimate=est.registers, budget=consumer.budget, ptxas=report.registers,
                used=sass_registers(cubin) or report.registers, spill=report.spill_stores,
                peak=", ".join(est.peak_arrays[:4]))


def sass_registers(cubin: bytes) -> int | None:
    """The registers a thread uses by the SASS: the highest Rn named + 1, + 2 that ptxas
    reserves (equal to ptxas's own count on every one-role kernel of the table), or None
    without a disassembler."""
    sass = disassemble(cubin)
    numbers = [int(n) for n in re.findall(r"\bR(\d+)\b", sass or "")]
    return max(numbers) + 3 if numbers else None


def fences_all(kernel, constexprs: dict, target: str) -> tuple[int, int]:
    """ptxas's (registers, spill bytes) with every operand fence naming every accumulator."""
    from tegula.codegen import async_stmts
    built = build(kernel, dict(constexprs), target=target)
    saved = async_stmts.fenced_accumulators
    async_stmts.fenced_accumulators = lambda body: {}
    try:
        from tegula.codegen.cuda import emit_cuda
        source = emit_cuda(built.thread_kernel, built.target.sm)
    finally:
        async_stmts.fenced_accumulators = saved
    _, report = compile_cuda_report(source, built.thread_kernel.name, target)
    return report.registers, report.spill_stores


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", default="sm_90a,sm_80")
    p.add_argument("--only", default=None, help="rows whose name contains this")
    p.add_argument("--fences-all", action="store_true")
    args = p.parse_args(argv)
    targets = args.targets.split(",")
    print(f"{'kernel':30} {'target':7} {'ptxas':>5} {'spill':>5} {'used':>5} {'est':>5} "
          f"{'budget':>6} {'error':>7}" + ("  fences-all ptxas/spill" if args.fences_all else ""))
    errors = []
    for name, kernel, constexprs, kinds in cases():
        if args.only and args.only not in name:
            continue
        for target in (t for t in targets if t in kinds):
            t0 = time.time()
            try:
                m = measure(kernel, constexprs, target)
            except Exception as e:   # a row that does not build says why, the rest go on
                print(f"{name:30} {target:7} failed: {type(e).__name__}: {str(e)[:90]}")
                continue
            error = m["estimate"] / m["used"] - 1
            errors.append(abs(error))
            budget = "" if m["budget"] is None else str(m["budget"])
            line = (f"{name:30} {target:7} {m['ptxas']:5d} {m['spill']:5d} {m['used']:5d} "
                    f"{m['estimate']:5d} {budget:>6} {error:+7.0%}")
            if args.fences_all and "sm_90" in target:
                regs, spill = fences_all(kernel, constexprs, target)
                line += f"  {regs}/{spill}"
            print(line + f"  ({time.time() - t0:.1f} s)  peak: {m['peak']}", flush=True)
    if errors:
        inside = sum(e <= 0.15 for e in errors)
        print(f"{inside} of {len(errors)} rows within 15% of the SASS; median |error| "
              f"{sorted(errors)[len(errors) // 2]:.0%}")


if __name__ == "__main__":
    sys.exit(main())
