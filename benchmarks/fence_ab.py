"""Operand fences A/B on the GPU: the attention forward with each fence naming only its own
wgmma accumulators (codegen since session 12, `codegen/wgmma_fences.py`) against every
fence naming every accumulator (before), in one process, beside torch SDPA's cuDNN.

    python benchmarks/fence_ab.py [--warm] 128:BN=128,OVERLAP=1 128:BN=128 256:BN=64,OVERLAP=1

Each case is `D:KEY=VALUE,...` over `attention_variants.DEFAULTS` (BM=128 on 256 threads);
shapes are `attention_variants.SHAPES`. Both builds write into NaN-poisoned outputs and are
checked against cuDNN's output element by element (max |error| printed, FAIL above 1e-2)
before they are timed (minimum of 3 passes of 8 calls, CUDA events, no L2 flush:
compute-bound). The ratio is after / before. `--warm` compiles and checks both builds
without timing (the disk cache then serves a timing run: warm cases in parallel processes).
"""
from __future__ import annotations

import sys
import time

from attention_variants import SHAPES, TOLERANCE, best_ms, parse_variant, sdpa_baselines


def launcher(torch, q, k, v, config: dict, every_accumulator: bool):
    """(launch function, o, lse) after one checked-for-nothing-yet launch into poisoned
    outputs; with `every_accumulator` the kernel is compiled from the source whose
    fences name every accumulator."""
    from tegula.codegen import async_stmts
    from tegula.dtypes import f16
    from tegula.kernels.attention import attention_kernel, qk_scale
    b, h, s, d = q.shape
    values = dict(config)
    threads = values.pop("threads")
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, s), float("nan"), device="cuda")
    kernel = attention_kernel.__wrapped__(f16)    # its own launch cache per build
    grid = (-(-s // values["BM"]), h, b)

    def launch():
        kernel[grid](q, k, v, o, lse, D=d, QK_SCALE=qk_scale(None, d), CAUSAL=False,
                     threads=threads, **values)
    saved = async_stmts.fenced_accumulators
    if every_accumulator:
        async_stmts.fenced_accumulators = lambda body: {}   # every fence falls back to all
    try:
        launch()
    finally:
        async_stmts.fenced_accumulators = saved
    torch.cuda.synchronize()
    return launch, o, lse


def check(torch, o, lse, ref) -> float | str:
    if torch.isnan(o).any() or torch.isnan(lse).any():
        return "FAIL: NaN left in the poisoned outputs"
    err = (o.float() - ref).abs().max().item()
    return err if err <= TOLERANCE else f"FAIL: max error {err:.2e}"


def run_case(torch, text: str, warm: bool = False) -> None:
    d_text, _, rest = text.partition(":")
    d = int(d_text)
    _, config = parse_variant(f"x:{rest}")
    b, h, s = SHAPES[d]
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    flops = 4.0 * b * h * s * s * d
    ref, cudnn_ms, _ = sdpa_baselines(torch, q, k, v, False, profile=warm)
    base = flops / cudnn_ms / 1e9
    rates = {}
    for name, every in (("before", True), ("after", False)):
        t0 = time.time()
        try:
            launch, o, lse = launcher(torch, q, k, v, config, every)
        except Exception as e:  # reported, the other cases go on
            print(f"D{d} {rest:24s} {name:6s} ERROR {type(e).__name__}: {str(e)[:160]}",
                  flush=True)
            return
        err = check(torch, o, lse, ref)
        if isinstance(err, str):
            print(f"D{d} {rest:24s} {name:6s} {err}", flush=True)
            return
        if warm:
            print(f"D{d} {rest:24s} {name:6s} checked e{err:.0e} ({time.time() - t0:.0f}s)",
                  flush=True)
            continue
        rates[name] = flops / best_ms(torch, launch) / 1e9
        print(f"D{d} {b}x{h}x{s} {rest:24s} {name:6s} {rates[name]:6.1f} TFLOP/s "
              f"{rates[name] / base:.3f}x cuDNN ({base:.1f}) e{err:.0e} "
              f"({time.time() - t0:.0f}s)", flush=True)
    if rates:
        print(f"D{d} {rest:24s} after/before {rates['after'] / rates['before']:.3f}",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    import torch
    args = list(argv if argv is not None else sys.argv[1:])
    warm = "--warm" in args
    for text in (a for a in args if a != "--warm"):
        run_case(torch, text, warm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
