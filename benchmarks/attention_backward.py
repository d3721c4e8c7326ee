"""Attention backward on the GPU, launch by launch: where the time goes against the SDPA
backward of cuDNN and flash, timed in the same process (issue 12).

    PYTHONPATH=. python3 benchmarks/attention_backward.py [--cases 128,128c,64,64c]
        [--variants det,at64,...] [--jobs 16] [--registers] [--compile-only]

Per case (B = 4, H = 16, S = 4096, D = 128 / 64, causal or not; "c" = causal) q, k, v and
dO are random f16; o and lse come from a float32 reference (per head, bottom-right causal
mask), which also gives dQ, dK, dV. Every variant (`VARIANTS`: the deterministic dK/dV +
dQ kernels, or the dK/dV kernel adding dQ into an f32 accumulator with TMA reduce-adds,
`deterministic=False`, at several tiles) is first run once into NaN-poisoned gradients and
checked element by element against the reference (largest |error| over the largest
|gradient|); a wrong or failing variant is reported and not timed. Then each of its
launches is timed apart (median of CUDA-event pairs, L2 emptied before each run:
`tegula.bench.gpu.time_ms`), and the whole sequence once more. cuDNN and flash are timed by
`torch.autograd.grad` of SDPA's output (fresh gradients, no accumulation into .grad),
their gradients checked against the same reference. The variants "entry" and
"entry-atomic" (`ENTRIES`) time `attention_backward` as users call it, tuned on its first
call (that call's seconds are printed), deterministic or not; an atomic variant's whole
includes zeroing its accumulator, as the entry point does.

TFLOP/s count the backward's five gemms (2.5x the forward's 4·B·H·S²·D, halved when
causal), whichever number of gemms a variant runs. Nothing is asserted.

Ablations (named st*): the atomic kernel with dQ's share stored, not added (dK and dV
checked; dQ is wrong by design), to price the reduce-add apart. `--compile-only` fills the
disk cache of compiled kernels and times nothing (a round script runs it beside the tests).

`--registers` (no GPU; a local nvcc or NVRTC): ptxas's registers and spill bytes of each
variant's kernels, as `benchmarks/register_table.py` measures them.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import functools
import importlib
import math
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

B, H, S = 4, 16, 4096
CASES = {"128": (128, False), "128c": (128, True), "64": (64, False), "64c": (64, True)}

#: name -> (deterministic, tiles of the dK/dV (and dQ) kernels[, the dQ kernel's]). "det" is the 64 x 64 pair
#: the tuner picks at these shapes; "at*" add dQ with TMA reduce-adds (one kernel, 5 gemms).
VARIANTS = {
    "det": (True, dict(BM=64, BN=64)),
    "det-dkdv64x128": (True, dict(BM=64, BN=128, threads=256)),
    # dK/dV on two warpgroups of 64 keys in one role (230 registers, no spill; with the
    # producer warpgroup it spills 28 B), dQ on two of 64 queries by 128 keys
    "det-wide": (True, dict(BM=64, BN=128, threads=256, warp_specialize=False),
                 dict(BM=128, BN=128, threads=256)),
    "det-wide-1role": (True, dict(BM=64, BN=128, threads=256, warp_specialize=False),
                       dict(BM=128, BN=128, threads=256, warp_specialize=False)),
    # REGS=240: the roles stated (producer 24 registers, consumers 240), so the body's
    # wgmma waits are deferred; EARLY_DP: dO Vᵀ issued with K Qᵀ, the exponentials run
    # while it computes (ptxas: dK/dV 239, dQ 218 registers, no spill at D = 128)
    "det-ws": (True, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True),
               dict(BM=128, BN=128, threads=256, REGS=240, EARLY_DP=True)),
    # the dQ kernel's exponentials behind a branch on whether its key block needs the mask
    # (MASK_BRANCH): ptxas then keeps dP's wait after them (det-ws's dQ SASS waits for dP
    # right after S's wait, before any exponential)
    "det-ws-mb": (True, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True),
                  dict(BM=128, BN=128, threads=256, REGS=240, EARLY_DP=True,
                       MASK_BRANCH=True)),
    # both kernels' masks behind the branch
    "det-ws-mb2": (True, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True,
                              MASK_BRANCH=True),
                   dict(BM=128, BN=128, threads=256, REGS=240, EARLY_DP=True,
                        MASK_BRANCH=True)),
    # the consumers' two warpgroups taking turns at the tensor cores in the loop
    # (consumers="pingpong"): dQ's (218 registers, no spill), dK/dV's too (D = 64: 214;
    # D = 128: 224 B spilled)
    "det-ws-dqpp": (True, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True),
                    dict(BM=128, BN=128, threads=256, REGS=240, EARLY_DP=True,
                         consumers="pingpong")),
    "det-pp": (True, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True,
                          consumers="pingpong"),
               dict(BM=128, BN=128, threads=256, REGS=240, EARLY_DP=True,
                    consumers="pingpong")),
    "at64x64": (False, dict(BM=64, BN=64)),
    "at64x128": (False, dict(BM=64, BN=128, threads=256)),
    "at64x128-1role": (False, dict(BM=64, BN=128, threads=256, warp_specialize=False)),
    "at64x128-1role-s3": (False, dict(BM=64, BN=128, threads=256, warp_specialize=False,
                                      STAGES=3)),
    "at32x128-1role": (False, dict(BM=32, BN=128, threads=256, warp_specialize=False)),
    # no spill at D = 128 (237 registers)
    "at32x128-ws": (False, dict(BM=32, BN=128, threads=256, REGS=240, EARLY_DP=True)),
    # no spill at D = 64 (228); 120 B spilled at D = 128
    "at64x128-ws": (False, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True)),
    # 104 B spilled at D = 128, none at D = 64
    "at64x128-1role-early": (False, dict(BM=64, BN=128, threads=256, warp_specialize=False,
                                         EARLY_DP=True)),
    # dQ added by red.global from registers (atomic_path="red"): no staging through shared
    # memory, so no barriers around it
    "red64x128-1role": (False, dict(BM=64, BN=128, threads=256, warp_specialize=False,
                                    atomic_path="red")),
    "red64x128-ws": (False, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True,
                                 atomic_path="red")),
    # STAGGER: key block n starts at its n-th query block, so the blocks running at once
    # reduce-add into different dQ rows
    "stag64x128-1role": (False, dict(BM=64, BN=128, threads=256, warp_specialize=False,
                                     STAGGER=True)),
    "stag64x128-ws": (False, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True,
                                  STAGGER=True)),
    # LATE_DELTA: delta loaded after the exponentials (16 registers fewer at their peak:
    # ptxas no longer serializes every wgmma, C7512; 104 B spilled at D = 128)
    "at64x128-ws-ld": (False, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True,
                                   LATE_DELTA=True)),
    "at64x128-ws-ld-mb": (False, dict(BM=64, BN=128, threads=256, REGS=240, EARLY_DP=True,
                                      LATE_DELTA=True, MASK_BRANCH=True)),
    "at64x128-1role-mb": (False, dict(BM=64, BN=128, threads=256, warp_specialize=False,
                                      MASK_BRANCH=True)),
    "at64x128-1role-early-ld": (False, dict(BM=64, BN=128, threads=256,
                                            warp_specialize=False, EARLY_DP=True,
                                            LATE_DELTA=True)),
}
# Ablations (`_STORE_DQ`): the atomic variant's kernel with dQ's reduce-add replaced by a
# plain store of each block's share (the same staging through shared memory and TMA, no
# add in L2; dQ is wrong, so only dK, dV are checked): the reduce-add's own cost.
VARIANTS.update({"st64x128-1role": (False, dict(VARIANTS["at64x128-1role"][1], _STORE_DQ=1)),
                 "st64x128-ws": (False, dict(VARIANTS["at64x128-ws"][1], _STORE_DQ=1))})
#: The entry point as users call it (tuned), deterministic or not.
ENTRIES = {"entry": True, "entry-atomic": False}
DEFAULT_VARIANTS = ("det,det-wide,det-ws,at64x64,at64x128-1role,at32x128-1role,at32x128-ws,"
                    "at64x128-ws,at64x128-1role-early")

_ab = importlib.import_module("tegula.kernels.attention_backward")


def launches(D: int, causal: bool, deterministic: bool, tiles: dict,
             dq_tiles: dict | None = None) -> list[tuple]:
    """`backward_launches` at the benchmark's shape (f16, Hkv = H); `dq_tiles`: other tiles
    for the dQ kernel (deterministic) than the dK/dV kernel's."""
    from tegula.dtypes import f16

    def plan(t):
        return _ab.backward_launches(f16, B, H, H, S, S, D, _ab.default_scale(None, D),
                                     causal, deterministic, **t)
    tiles = dict(tiles)
    store_dq = tiles.pop("_STORE_DQ", 0)
    out = plan(tiles)
    if dq_tiles is not None:
        out[2] = plan(dq_tiles)[2]
    if store_dq:
        out[1] = (dkdvdq_store_kernel(f16),) + out[1][1:]
    return out


@functools.lru_cache(maxsize=None)
def dkdvdq_store_kernel(dtype):
    """`attention_backward_dkdvdq_kernel` with each block's dS K stored into `dq_accum`,
    not added (an ablation: the reduce-add's cost; dQ comes out wrong)."""
    import tegula as tg
    from tegula import f32

    @tg.kernel(threads=128)
    def attention_backward_dkdvdq_store(q: tg.Tensor[dtype, 4], k: tg.Tensor[dtype, 4],
                                        v: tg.Tensor[dtype, 4], dout: tg.Tensor[dtype, 4],
                                        lse: tg.Tensor[f32, 3], delta: tg.Tensor[f32, 3],
                                        dk: tg.Tensor[dtype, 4], dv: tg.Tensor[dtype, 4],
                                        dq_accum: tg.Tensor[f32, 4],
                                        D: tg.constexpr, SCALE: tg.constexpr,
                                        CAUSAL: tg.constexpr, G: tg.constexpr = 1,
                                        BM: tg.constexpr = 64, BN: tg.constexpr = 64,
                                        STAGES: tg.constexpr = 2,
                                        EARLY_DP: tg.constexpr = False,
                                        REGS: tg.constexpr = 0):
        n, hk, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        dk_acc, dv_acc = _ab._key_block_gradients(
            q, k, v, dout, lse, delta, dq_accum, n, hk, b, dtype, D, SCALE, CAUSAL, G, BM,
            BN, STAGES, EARLY_DP, REGS, add_dq=tg.copy)
        tg.copy((dk_acc * SCALE).to(dtype), dk[b, hk].tile((BN, D), (n, 0)))
        tg.copy(dv_acc.to(dtype), dv[b, hk].tile((BN, D), (n, 0)))

    return attention_backward_dkdvdq_store


def label(kernel) -> str:
    return kernel.name.replace("attention_backward_", "")


def shapes_of(kernel, D: int) -> dict:
    rows = (B, H, S)
    return {p.name: (rows if p.name in ("lse", "delta") else rows + (D,))
            for p in kernel.params if p.kind == "tensor"}


def compile_job(case: str, spec: tuple, index: int) -> str:
    """Build and compile launch `index` of `launches(D, causal, *spec)` into the disk
    cache: "" or the error (a worker)."""
    from tegula.build import build
    from tegula.recommend import _facts
    from tegula.runtime import compile_kernel
    D, causal = CASES[case]
    kernel, _, _, constexprs = launches(D, causal, *spec)[index]
    try:
        built = build(kernel, dict(constexprs), _facts(kernel, shapes_of(kernel, D)), "sm_90a")
        compile_kernel(built.thread_kernel, built.target.sm)
    except Exception as err:  # noqa: BLE001 (reported; the launch raises it again)
        return f"{case} {spec} {label(kernel)}: {type(err).__name__}: {err}"[:300]
    return ""


def specs(D: int, variant: str) -> list[tuple]:
    """The (deterministic, tiles[, dq tiles]) launch plans a variant may run: its own, or
    for an entry point every candidate its tuner times."""
    if variant in VARIANTS:
        return [VARIANTS[variant]]
    if ENTRIES[variant]:
        return [(True, tiles) for tiles in _ab.backward_candidates(D, "dkdv")] + \
            [(True, {}, tiles) for tiles in _ab.backward_candidates(D, "dq")]
    return [(False, tiles) for tiles in _ab.atomic_dq_candidates(D)]


def reference(q, k, v, do, causal: bool) -> dict:
    """o, lse (natural log), dq, dk, dv in float32, one head at a time."""
    import torch
    scale = 1 / math.sqrt(q.shape[-1])
    out = {n: torch.empty(q.shape[:3] if n == "lse" else q.shape, device=q.device)
           for n in ("o", "lse", "dq", "dk", "dv")}
    seen = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
    if causal:
        seen = torch.tril(seen)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            qf, kf, vf, dof = (t[b, h].float() for t in (q, k, v, do))
            s = (qf @ kf.T * scale).masked_fill(~seen, float("-inf"))
            lse = torch.logsumexp(s, 1)
            p = torch.exp(s - lse[:, None])
            o = p @ vf
            delta = (dof * o.half().float()).sum(1)
            ds = p * (dof @ vf.T - delta[:, None])
            for name, value in (("o", o), ("lse", lse), ("dq", ds @ kf * scale),
                                ("dk", ds.T @ qf * scale), ("dv", p.T @ dof)):
                out[name][b, h] = value
    return out


def worst_error(got, want) -> float:
    """Largest |got - want| over the largest |want|; NaN where an element is not finite."""
    import torch
    got = got.float()
    if not torch.isfinite(got).all():
        return float("nan")
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


def run_variant(values: dict, ref: dict, D: int, causal: bool, variant: str, log) -> dict:
    """Check, then time each launch of one variant and the whole; {launch: ms}."""
    import torch

    from tegula.bench.gpu import time_ms
    from tegula.build import launch
    deterministic = VARIANTS[variant][0]
    plan = launches(D, causal, *VARIANTS[variant])
    for name in ("dq", "dk", "dv", "delta"):
        values[name].fill_(float("nan"))
    values["dq_accum"].zero_()
    calls = [(lambda kernel=kernel, grid=grid, names=names, cx=cx:
              launch(kernel, grid, *(values[n] for n in names), **cx))
             for kernel, grid, names, cx in plan]
    try:
        for call in calls:
            call()
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001
        log(f"  {variant}: ERROR {type(err).__name__}: {str(err)[:200]}")
        return {}
    checked = ("dk", "dv") if VARIANTS[variant][1].get("_STORE_DQ") else ("dq", "dk", "dv")
    errors = {n: worst_error(values[n], ref[n]) for n in checked}
    if not all(e < 1e-2 for e in errors.values()):
        log(f"  {variant}: WRONG {errors}")
        return {}
    times = {label(kernel): time_ms(call) for (kernel, *_), call in zip(plan, calls)}
    if not deterministic:  # the whole includes zeroing the accumulator, as the entry does
        calls.insert(0, values["dq_accum"].zero_)
    times["all"] = time_ms(lambda: [call() for call in calls])
    times["err"] = max(errors.values())
    return times


def run_entry(values: dict, ref: dict, causal: bool, deterministic: bool, log) -> dict:
    """`attention_backward` as users call it (tuned on this first call), checked, timed."""
    from tegula.bench.gpu import time_ms
    from tegula.kernels.attention_backward import attention_backward
    args = [values[n] for n in ("q", "k", "v", "o", "lse", "do")]
    call = lambda: attention_backward(*args, causal, deterministic=deterministic)  # noqa: E731
    start = time.time()
    try:
        got = call()
    except Exception as err:  # noqa: BLE001
        log(f"  entry: ERROR {type(err).__name__}: {str(err)[:200]}")
        return {}
    errors = {n: worst_error(g, ref[n]) for n, g in zip(("dq", "dk", "dv"), got)}
    if not all(e < 1e-2 for e in errors.values()):
        log(f"  entry: WRONG {errors}")
        return {}
    return {"first call (tuning) s": time.time() - start, "all": time_ms(call),
            "err": max(errors.values())}


def sdpa_backward(torch, q, k, v, do, causal: bool, backend, ref: dict) -> tuple:
    """(ms, worst error, whether a second run gives the same bits) of SDPA's backward on
    `backend`, or (None, reason, None)."""
    from torch.nn.attention import sdpa_kernel

    from tegula.bench.gpu import time_ms
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    try:
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
            grads = torch.autograd.grad(out, leaves, do, retain_graph=True)
            err = max(worst_error(g, ref[n]) for g, n in zip(grads, ("dq", "dk", "dv")))
            again = torch.autograd.grad(out, leaves, do, retain_graph=True)
            same = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                       for a, b in zip(grads, again))
            ms = time_ms(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
    except RuntimeError as err:
        return None, str(err)[:80], None
    return ms, err, same


def measure_case(case: str, variants: list[str], log) -> list[str]:
    """The rows of one case: SDPA backends, then each variant launch by launch."""
    import torch
    from torch.nn.attention import SDPBackend
    D, causal = CASES[case]
    gen = torch.Generator(device="cuda").manual_seed(D + causal)
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", generator=gen,
                               dtype=torch.float16) for _ in range(4))
    ref = reference(q, k, v, do, causal)
    values = dict(q=q, k=k, v=v, do=do, o=ref["o"].half(), lse=ref["lse"].contiguous(),
                  **{n: torch.empty_like(q) for n in ("dq", "dk", "dv")},
                  delta=torch.empty(B, H, S, device="cuda"),
                  dq_accum=torch.zeros(B, H, S, D, device="cuda"))
    flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
    tag = f"D={D} {'causal' if causal else 'full'} {B}x{H}x{S}"
    base = {}
    for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)):
        ms, err, same = sdpa_backward(torch, q, k, v, do, causal, backend, ref)
        if ms is None:
            log(f"{tag} {name}: unavailable ({err})")
            continue
        base[name] = ms
        log(f"{tag} {name:5} {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s  err {err:.1e}  "
            f"{'same bits on a second run' if same else 'NOT deterministic (second run differs)'}")
    best = min(base.values()) if base else None
    rows = []
    for variant in variants:
        if variant in ENTRIES:
            t = run_entry(values, ref, causal, ENTRIES[variant], log)
        else:
            t = run_variant(values, ref, D, causal, variant, log)
        if not t:
            continue
        parts = " | ".join(f"{n} {ms:.3f}" for n, ms in t.items() if n not in ("all", "err"))
        ratio = "".join(f" {base[n] / t['all']:.3f}x {n}" for n in base)
        line = (f"{tag} {variant:15} {t['all']:7.3f} ms {flops / t['all'] / 1e9:6.1f} TFLOP/s"
                f"{ratio}  err {t['err']:.1e}  [{parts}]")
        log(line)
        rows.append(f"{tag:22} {variant:15} {t['all']:7.3f} {flops / t['all'] / 1e9:6.1f}"
                    + (f" {best / t['all']:6.3f}x" if best else ""))
    return rows


def registers(cases: list[str], variants: list[str]) -> None:
    """ptxas's registers / spills of every launch (no GPU)."""
    from benchmarks.register_table import measure
    for case in cases:
        D, causal = CASES[case]
        for variant in (v for v in variants if v in VARIANTS):
            for kernel, _, _, cx in launches(D, causal, *VARIANTS[variant]):
                try:
                    m = measure(kernel, cx, "sm_90a")
                    note = (f"ptxas {m['ptxas']:3d} used {m['used']:3d} spill {m['spill']:4d} B"
                            f" (estimate {m['estimate']})")
                except Exception as err:  # noqa: BLE001
                    note = f"failed: {type(err).__name__}: {str(err)[:120]}"
                print(f"D={D} {'causal' if causal else 'full':6} {variant:15} "
                      f"{label(kernel):16} {note}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="128,128c,64,64c")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--registers", action="store_true")
    parser.add_argument("--compile-only", action="store_true",
                        help="fill the disk cache of compiled kernels, time nothing")
    options = parser.parse_args()
    cases, variants = options.cases.split(","), options.variants.split(",")
    for name in variants:
        if name not in VARIANTS and name not in ENTRIES:
            raise SystemExit(f"unknown variant {name!r}; known: "
                             f"{', '.join([*VARIANTS, *ENTRIES])}")
    if options.registers:
        registers(cases, variants)
        return

    def log(text: str) -> None:
        print(text, flush=True)

    start = time.time()
    jobs, seen = [], set()
    for c in cases:
        for spec in (spec for v in variants for spec in specs(CASES[c][0], v)):
            for i, (kernel, _, _, cx) in enumerate(launches(*CASES[c], *spec)):
                key = (kernel.name, tuple(sorted(cx.items())))
                if key not in seen:  # the preprocess and convert recur across variants
                    seen.add(key)
                    jobs.append((c, spec, i))
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(options.jobs, mp_context=context) as pool:
        problems = [p for p in pool.map(compile_job, *zip(*jobs)) if p]
    log(f"compiled {len(jobs)} launches in {time.time() - start:.1f} s"
        + "".join(f"\n  {p}" for p in problems))
    if options.compile_only:
        return
    table = []
    for case in cases:
        table += measure_case(case, variants, log)
        log(f"  ({time.time() - start:.0f} s)")
    log(f"\n{'case':22} {'variant':15} {'ms':>7} {'TFLOP/s':>6}  x the faster SDPA")
    for row in table:
        log(row)


if __name__ == "__main__":
    main()
