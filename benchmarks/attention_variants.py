"""Attention forward variants on the GPU, each launched directly with its constexprs,
against torch SDPA's cuDNN and flash backends timed in the same process.

    python benchmarks/attention_variants.py @128:both plain:BN=128 ovl:BN=128,OVERLAP=1 \
        @64:no pp:BN=128,consumers=pingpong

`@D:CAUSAL` (CAUSAL no, yes or both) starts a group: the variants after it run at head
dim D (one process for every group: torch and the SDPA baselines load once);
`@D:CAUSAL:S` also sets the group's sequence length S (as --seq does for every group).

Each variant is `name:KEY=VALUE,...` over the defaults BM=128, threads=256, STAGES=2,
V_KMAJOR=0, P_SHARED=0, OVERLAP=0, REGS=0 (REGS: the consumer's stated registers a thread,
producer 24; PERSISTENT=1 launches one block an SM walking the tiles; `consumers`, `warp_specialize`, `load_path` are build options; `src=s10` took session 10's kernel from a copy of its module, removed after
the session-11 A/B). Shapes are the session-10 anchors
(B, H, S): D=64 4x32x4096, D=128 4x16x4096, D=256 2x8x8192, Sq = Sk, so the bottom-right
causal mask is SDPA's `is_causal`; `--seq S` keeps the 16k tokens (B = 16384 / S).

Every variant first writes into NaN-poisoned outputs and is compared with cuDNN's output
(every element: no NaN left, max |o - cuDNN o| printed as e, FAIL above 1e-2); its timing
is the minimum over 3 passes of 8 back-to-back calls (CUDA events; attention at these
sizes is compute-bound, so L2 is not flushed). TFLOP/s = 4·B·H·S²·D, halved when causal.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

SHAPES = {64: (4, 32, 4096), 128: (4, 16, 4096), 256: (2, 8, 8192)}
DEFAULTS = dict(BM=128, threads=256, STAGES=2, V_KMAJOR=False, P_SHARED=False, OVERLAP=False)
BUILD_STRINGS = ("consumers", "load_path")
TOLERANCE = 1e-2

# `noafter=1`: the turn syncs as before 45dbd68, naming no register (`lower/warp_roles.py`
# `_turn_operands` returning nothing), for an A/B in one process: ptxas then sinks the
# plain loop's softmax below the turn's BAR.SYNC.


def turn_syncs_without_operands():
    """Build with the turn syncs naming no register until the returned undo is called."""
    from tegula.lower import warp_roles
    real = warp_roles._turn_operands
    warp_roles._turn_operands = lambda stmts: ()
    return lambda: setattr(warp_roles, "_turn_operands", real)


# `ringturns=1`: ping-pong turns inside the key loop of a persistent kernel (PERSISTENT=1),
# whose ring runs across the tiles; synthesis (`synth/roles.py` `takes_turns_in_loop`)
# allows turns only for a ring of its own, and lowering balances them per tile.


def turns_across_a_nested_ring():
    """Build with in-loop turns allowed for a nested ring until the returned undo is called."""
    from tegula.ir.ops import Gemm
    from tegula.synth import roles
    real = roles.takes_turns_in_loop

    def takes_turns(kernel, loop):
        return kernel.threads == 2 * roles.WARPGROUP and \
            sum(isinstance(op, Gemm) for op in loop.body) >= 2
    roles.takes_turns_in_loop = takes_turns
    return lambda: setattr(roles, "takes_turns_in_loop", real)


def parse_variant(text: str) -> tuple[str, dict]:
    """`name:KEY=VALUE,...` -> (name, constexprs over DEFAULTS); ints and 0/1 booleans."""
    name, _, rest = text.partition(":")
    config = dict(DEFAULTS)
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key in BUILD_STRINGS or key == "src":
            config[key] = value
        elif key in ("V_KMAJOR", "P_SHARED", "warp_specialize", "noafter", "PERSISTENT",
                     "ringturns"):
            config[key] = bool(int(value))
        else:
            config[key] = int(value)
    return name, config


def best_ms(torch, fn, passes: int = 3, calls: int = 8) -> float:
    """Minimum over `passes` of the mean time of `calls` back-to-back calls."""
    fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(passes):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / calls)
    return best


def run_variant(torch, q, k, v, causal: bool, config: dict, ref):
    """(launch function, max error against `ref`, or a failure text)."""
    from tegula.dtypes import f16
    from tegula.kernels.attention import attention_kernel, forward_grid, qk_scale
    b, h, s, d = q.shape
    values = dict(config)
    threads = values.pop("threads")
    if values.pop("src", None):
        raise ValueError("src=: the session-10 copy of the kernel was removed after its A/B")
    noafter, ringturns = values.pop("noafter", False), values.pop("ringturns", False)
    patch = noafter or ringturns
    restore = turn_syncs_without_operands() if noafter else \
        turns_across_a_nested_ring() if ringturns else None
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, s), float("nan"), device="cuda")
    # a kernel object of its own: its launch cache must not serve the unpatched variant
    kernel = attention_kernel.__wrapped__(f16) if patch else attention_kernel(f16)
    grid = forward_grid(values, s, h, b, q.device)  # PERSISTENT: one block an SM

    def launch():
        kernel[grid](q, k, v, o, lse, D=d, QK_SCALE=qk_scale(None, d), CAUSAL=causal,
                     threads=threads, **values)
    try:
        launch()  # builds (the old turn syncs where asked) and caches the launch
    finally:
        if restore:
            restore()
    torch.cuda.synchronize()
    if torch.isnan(o).any() or torch.isnan(lse).any():
        return launch, "FAIL: NaN left in the poisoned outputs"
    err = (o.float() - ref).abs().max().item()
    return launch, err if err <= TOLERANCE else f"FAIL: max error {err:.2e}"


def parse_groups(tokens: list[str]) -> list[tuple[int, tuple[bool, ...], list, int | None]]:
    """`@D:CAUSAL[:S] name:... name:... @D:CAUSAL ...` -> [(D, causal settings, variants,
    S or None)]: S, where given, is the group's sequence length (B·S kept, as --seq)."""
    groups: list[tuple[int, tuple[bool, ...], list, int | None]] = []
    for token in tokens:
        if token.startswith("@"):
            d, _, rest = token[1:].partition(":")
            causal, _, seq = rest.partition(":")
            modes = {"no": (False,), "yes": (True,), "both": (False, True)}[causal or "no"]
            groups.append((int(d), modes, [], int(seq) if seq else None))
        elif not groups:
            raise SystemExit(f"{token}: a variant before any @D:CAUSAL group")
        else:
            groups[-1][2].append(parse_variant(token))
    return groups


def sdpa_baselines(torch, q, k, v, causal: bool, profile: bool = False):
    """(cuDNN's output in f32, cuDNN ms, flash ms); with `profile` one cuDNN call and no
    timing (NaN ms)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def backend(which):
        def run():
            with sdpa_kernel(which):
                return sdpa(q, k, v, is_causal=causal)
        return run
    cudnn = backend(SDPBackend.CUDNN_ATTENTION)
    if profile:
        return cudnn().float(), math.nan, math.nan
    return (cudnn().float(), best_ms(torch, cudnn),
            best_ms(torch, backend(SDPBackend.FLASH_ATTENTION)))


def run_group(torch, d: int, causal: bool, variants: list, profile: bool = False,
              seq: int | None = None) -> None:
    """Prints the SDPA baselines, then each variant's TFLOP/s and ratio to cuDNN as soon as
    it is measured (`profile`: one cuDNN call and one checked launch of each, for ncu);
    `seq`: S instead of SHAPES', with B·S kept."""
    b, h, s = SHAPES[d]
    if seq:
        b, s = max(1, b * s // seq), seq
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    ref, cudnn_ms, flash_ms = sdpa_baselines(torch, q, k, v, causal, profile)
    base = flops / cudnn_ms / 1e9
    label = f"D{d} {'causal' if causal else 'full  '} {b}x{h}x{s}"
    print(f"{label}: cuDNN {base:6.1f} flash {flops / flash_ms / 1e9:6.1f} TFLOP/s", flush=True)
    for name, config in variants:
        t0 = time.time()
        try:
            launch, err = run_variant(torch, q, k, v, causal, config, ref)
        except Exception as e:  # a variant that does not build is reported, not fatal
            print(f"  {label} {name:10s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        if isinstance(err, str) or profile:
            print(f"  {label} {name:10s} {err if isinstance(err, str) else f'e{err:.0e}'}",
                  flush=True)
            continue
        rate = flops / best_ms(torch, launch) / 1e9
        print(f"  {label} {name:10s} {rate:6.1f} {rate / base:.3f}x cuDNN e{err:.0e} "
              f"({time.time() - t0:.0f}s)", flush=True)


def candidate_tokens(d: int, causal: bool, keys: int | None = None) -> list[str]:
    """The tuner's sm_90a candidates at head dim `d` (and `keys` keys a sequence: None, all
    of them) as variant tokens (`tuned0:...`), for a round that compiles them ahead of
    `tegula bench attention`."""
    from tegula.kernels.attention import attention_candidates
    tokens = []
    for i, config in enumerate(attention_candidates(d, True, causal, keys)):
        config = dict(config, threads=config.get("threads", 128))  # the kernel's default
        items = [f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in config.items()]
        tokens.append(f"tuned{i}:" + ",".join(items))
    return tokens


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--candidates"]:  # --candidates D no|yes [KEYS]
        keys = int(sys.argv[4]) if len(sys.argv) > 4 else None
        print(" ".join(candidate_tokens(int(sys.argv[2]), sys.argv[3] == "yes", keys)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokens", nargs="+", help="@D:CAUSAL, then name:KEY=VALUE,...")
    parser.add_argument("--profile", action="store_true",
                        help="no timing: one cuDNN call and one launch per variant (for ncu)")
    parser.add_argument("--seq", type=int, default=None,
                        help="sequence length S (B·S kept at the default shapes' 16k tokens)")
    args = parser.parse_args(argv)
    import torch
    for d, modes, variants, seq in parse_groups(args.tokens):
        for causal in modes:
            run_group(torch, d, causal, variants, args.profile, seq or args.seq)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
