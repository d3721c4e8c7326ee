"""A/B of session 14's wgmma wait lowering in one process (issue 10's core; a tuning aid,
not a test): each case is built twice from fresh kernel objects — as lowering now does it
("new") and with the change undone ("old", a monkeypatch while it builds) — checked into
NaN-poisoned outputs against the other build's result and a float reference, then both are
timed in interleaved rounds (CUDA events, best of each round's back-to-back calls), the
median over rounds kept, so the GPU's clock drift (700 W cap) hits both alike.

    PYTHONPATH=. python3 benchmarks/wgmma_waits_ab.py --rounds 5 fwd128 fwd64 bwd1

Cases: `fwd128` / `fwd64` — the attention forward with stated roles (REGS=240, D = 128 /
64, 4x16x4096 / 4x32x4096), old = p @ v not carried into the next key block
(`carry_wgmma_groups` off); `pp64` — ping-pong turns at D = 64; `bwd1` — the atomic-dQ
dK/dV kernel in one role with EARLY_DP (64 x 128, two warpgroups), old = one-role bodies
wait right after each gemm (`defer_wgmma_waits` off in `lower/pipeline.py`).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys

from attention_variants import best_ms   # the best of 3 passes of 8 calls, after one


def _undo(change: str):
    """Patches that undo one change while a kernel is built."""
    from tegula.lower import hopper, wgmma_waits
    if change == "carry":
        return [(hopper, "carry_wgmma_groups", lambda *a, **k: None),
                (wgmma_waits, "carry_wgmma_groups", lambda *a, **k: None)]
    if change == "one_role_defer":   # lower/pipeline.py imports these at each build
        return [(wgmma_waits, "carry_wgmma_groups", lambda *a, **k: None),
                (wgmma_waits, "defer_wgmma_waits", lambda s, **k: s),
                (wgmma_waits, "split_reused_products", lambda s, w: s)]
    raise ValueError(change)


@contextlib.contextmanager
def patched(pairs):
    saved = [(m, a, getattr(m, a)) for m, a, _ in pairs]
    for m, a, v in pairs:
        setattr(m, a, v)
    try:
        yield
    finally:
        for m, a, v in reversed(saved):
            setattr(m, a, v)


def forward_case(torch, d: int, tiles: dict, causal: bool = False):
    """(flops, make(change or None) -> (launch, output)) for the attention forward."""
    from tegula.dtypes import f16
    from tegula.kernels.attention import attention_kernel, default_tiles, qk_scale
    b, h, s = {64: (4, 32, 4096), 128: (4, 16, 4096)}[d]
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    values = {**default_tiles(d, "sm_90a"), **tiles}
    threads = values.pop("threads")

    def make(change):
        kernel = attention_kernel.__wrapped__(f16)   # its own builds and launch cache
        o = torch.full_like(q, float("nan"))
        lse = torch.full((b, h, s), float("nan"), device="cuda")

        def launch():
            kernel[(-(-s // values["BM"]), h, b)](q, k, v, o, lse, D=d,
                                                  QK_SCALE=qk_scale(None, d), CAUSAL=causal,
                                                  threads=threads, **values)
        with patched(_undo(change) if change else []):
            launch()
        return launch, o
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
    return 4.0 * b * h * s * s * d * (0.5 if causal else 1.0), make, ref


def backward_case(torch, tiles: dict):
    """The deterministic=False backward's launches (dK/dV adding dQ by atomics)."""
    from tegula.build import launch as tg_launch
    from tegula.dtypes import f16
    import importlib
    ab = importlib.import_module("tegula.kernels.attention_backward")
    b, h, s, d = 4, 16, 4096, 128
    torch.manual_seed(1)
    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16)
                   for _ in range(4))
    scale = d ** -0.5
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    lse = torch.cat([torch.logsumexp(q[i:i + 1].float() @ k[i:i + 1].float().transpose(2, 3)
                                     * scale, -1) for i in range(b)])

    def make(change):
        factories = ("attention_backward_dkdv_kernel", "attention_backward_dkdvdq_kernel",
                     "attention_backward_preprocess_kernel",
                     "attention_backward_dq_convert_kernel", "attention_backward_dq_kernel")
        fresh = [(ab, f, getattr(ab, f).__wrapped__) for f in factories]
        out = dict(q=q, k=k, v=v, do=do, o=o, lse=lse,
                   delta=torch.empty(b, h, s, device="cuda"),
                   dq=torch.full_like(q, float("nan")), dk=torch.full_like(k, float("nan")),
                   dv=torch.full_like(v, float("nan")),
                   dq_accum=torch.zeros(q.shape, dtype=torch.float32, device="cuda"))
        with patched(fresh):
            launches = ab.backward_launches(f16, b, h, h, s, s, d, scale, False,
                                            deterministic=False, **tiles)

        def launch():
            out["dq_accum"].zero_()
            for kernel, grid, names, constexprs in launches:
                tg_launch(kernel, grid, *(out[n] for n in names), **constexprs)
        with patched(_undo(change) if change else []):
            launch()
        return launch, torch.cat([out["dq"], out["dk"], out["dv"]])
    return 2.5 * 4.0 * b * h * s * s * d, make, None   # five gemms to the forward's two


CASES = {
    "fwd128": lambda torch: ("carry", forward_case(torch, 128, dict(BM=128, BN=128,
                                                                    threads=256, REGS=240))),
    "fwd64": lambda torch: ("carry", forward_case(torch, 64, dict(BM=128, BN=128, threads=256,
                                                                  REGS=240))),
    "pp64": lambda torch: ("carry", forward_case(torch, 64, dict(BM=128, BN=128, threads=256,
                                                                 consumers="pingpong"))),
    "bwd1": lambda torch: ("one_role_defer", backward_case(torch, dict(
        BM=64, BN=128, EARLY_DP=True, threads=256, warp_specialize=False))),
}


def run(torch, name: str, rounds: int) -> None:
    change, (flops, make, ref) = CASES[name](torch)
    new, new_out = make(None)
    old, old_out = make(change)
    torch.cuda.synchronize()
    nan = int(torch.isnan(new_out).sum()) + int(torch.isnan(old_out).sum())
    diff = (new_out.float() - old_out.float()).abs().max().item()
    err = (new_out.float() - ref).abs().max().item() if ref is not None else float("nan")
    times = {"new": [], "old": []}
    for _ in range(rounds):
        for label, fn in (("new", new), ("old", old)):
            times[label].append(best_ms(torch, fn))
    t_new, t_old = (statistics.median(times[x]) for x in ("new", "old"))
    print(f"{name:7s} [{change}] new {t_new:8.3f} ms {flops / t_new / 1e9:6.1f} TFLOP/s | old "
          f"{t_old:8.3f} ms | old/new {t_old / t_new:.3f} | nan {nan} |new-old| {diff:.1e} "
          f"|new-ref| {err:.1e} | rounds new {min(times['new']):.3f}-{max(times['new']):.3f}",
          flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", choices=sorted(CASES))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    import torch
    for name in args.cases:
        try:
            run(torch, name, args.rounds)
        except Exception as e:  # a case that fails is reported, the others still run
            print(f"{name}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
