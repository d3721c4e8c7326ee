"""Attention forward: tegula against torch SDPA (cuDNN and flash backends) and a Triton
fused attention: `python -m tegula.bench attention`.

Shapes (B, H, S, D) with B·S = 16k tokens, S = 1k–16k, D = 64 (H = 32), 128 (H = 16) and
256 (H = 8), each causal and not; Sq = Sk, so the bottom-right causal mask of
`tegula.kernels.attention` is SDPA's `is_causal`. The floor per shape: 4·B·H·S²·D FLOPs
(half of them when causal). Reported in TFLOP/s with tegula's ratio to each; the issue's
target is ≥ 1.0× the faster SDPA backend (geomean per D and causal setting).

The Triton kernel is the tutorial's formulation (FlashAttention-2: one program per query
block, an online softmax in base 2 over key blocks, causal programs stopping at the
diagonal), written here.
"""
from __future__ import annotations

import argparse
import functools
from typing import Any

from tegula.bench import gpu

HEADS = {64: 32, 128: 16, 256: 8}
TOKENS = 16384
SHAPES = [(TOKENS // s, HEADS[d], s, d) for d in (64, 128, 256)
          for s in (1024, 2048, 4096, 8192, 16384)]
QUICK = [(4, 16, 4096, 128), (16, 32, 1024, 64), (2, 8, 8192, 256)]
# ‖out − ref‖/‖ref‖ allowed against SDPA's output: p and o rounded to the type.
TOLERANCE = {"f16": 5e-3, "bf16": 2e-2}
LABELS = {"tegula": "tegula", "cudnn": "SDPA cuDNN", "flash": "SDPA flash", "triton": "Triton"}


def triton_attention(torch: Any):
    """The Triton fused attention forward (`attn(q, k, v, causal, scale) -> o`) on
    contiguous (B, H, S, D) tensors with Sq = Sk, or None without Triton."""
    import triton
    import triton.language as tl

    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
               for bm, bn, w, s in ((128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4),
                                    (64, 64, 4, 3))]

    @triton.autotune(configs=configs, key=["N_CTX", "HEAD_DIM", "CAUSAL"])
    @triton.jit
    def _attn_fwd(Q, K, V, O, qk_scale, N_CTX, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        start_m, off_hz = tl.program_id(0), tl.program_id(1)
        base = off_hz.to(tl.int64) * N_CTX * HEAD_DIM
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, HEAD_DIM)
        q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=offs_m[:, None] < N_CTX, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX) if CAUSAL else N_CTX
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            k = tl.load(K + base + cols[None, :] * HEAD_DIM + offs_d[:, None],
                        mask=cols[None, :] < N_CTX, other=0.0)
            qk = tl.dot(q, k) * qk_scale
            keep = cols[None, :] < N_CTX
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            qk = tl.where(keep, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + base + cols[:, None] * HEAD_DIM + offs_d[None, :],
                        mask=cols[:, None] < N_CTX, other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=offs_m[:, None] < N_CTX)

    def attn(q, k, v, causal: bool, scale: float):
        b, h, s, d = q.shape
        o = torch.empty_like(q)
        grid = lambda meta: (triton.cdiv(s, meta["BLOCK_M"]), b * h)  # noqa: E731
        _attn_fwd[grid](q, k, v, o, scale * 1.4426950408889634, s, HEAD_DIM=d, CAUSAL=causal)
        return o

    return attn


def make_case(torch: Any, shape: tuple[int, int, int, int], causal: bool, dtype: str,
              triton_attn: Any) -> gpu.Case:
    """Fresh random q, k, v and the implementations for one (B, H, S, D)."""
    import tegula.kernels as tk
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d = shape
    tdtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=tdtype) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def backend(which):
        def run():
            with sdpa_kernel(which):
                return sdpa(q, k, v, is_causal=causal)
        return run

    impls = [gpu.Impl("tegula", lambda: tk.attention(q, k, v, causal),
                      note=gpu.tuned_note("attention")),
             gpu.Impl("cudnn", backend(SDPBackend.CUDNN_ATTENTION)),
             gpu.Impl("flash", backend(SDPBackend.FLASH_ATTENTION))]
    if triton_attn is not None:
        impls.append(gpu.Impl("triton", lambda: triton_attn(q, k, v, causal, d ** -0.5)))
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return gpu.Case(label=f"{b}x{h}x{s}x{d}{' causal' if causal else ''}", dims=shape,
                    flops=flops, bytes=float(4 * b * h * s * d * q.element_size()),
                    reference=lambda: sdpa(q, k, v, is_causal=causal).float(),  # any backend
                    tol=TOLERANCE[dtype], impls=impls,
                    tags=(f"D{d}", "causal" if causal else "full"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tegula.bench attention",
                                     description=__doc__.splitlines()[0])
    gpu.add_common_options(parser, ("f16", "bf16"),
                           "comma-separated BxHxSxD shapes, e.g. 4x16x4096x128")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both",
                        help="causal masks, full attention or both (default)")
    args = parser.parse_args(argv)
    shapes = gpu.parse_shapes(args.shapes, 4) if args.shapes else QUICK if args.quick \
        else SHAPES
    torch, why = gpu.load_torch("attention")
    if torch is None:
        return gpu.no_gpu(why)
    from tegula.kernels.attention import _tuner_name
    _tuner_name()  # the tuner exists before the first call (its notes are read at the end)
    budget = gpu.Budget(args.max_seconds)
    triton_module, triton_note = gpu.load_triton(args.no_triton)
    triton_attn = triton_attention(torch) if triton_module is not None else None
    print(f"attention forward ({args.dtype}) on {torch.cuda.get_device_name()}; {triton_note}")
    modes = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    cases = [(f"{'x'.join(map(str, s))}{' causal' if c else ''}",
              lambda s=s, c=c: make_case(torch, s, c, args.dtype, triton_attn))
             for s in shapes for c in modes]
    records, skipped = gpu.run_cases(cases, budget,
                                     timer=functools.partial(gpu.time_ms, flush=args.flush))
    impls = ["tegula", "cudnn", "flash"] + (["triton"] if triton_attn is not None else [])
    notes = [triton_note,
             "tegula: tegula.kernels.attention as users call it (autotuned on its first call "
             "per shape bucket, before timing); SDPA: torch.nn.functional."
             "scaled_dot_product_attention under sdpa_kernel(CUDNN_ATTENTION / "
             f"FLASH_ATTENTION); median, L2 flushed before each run ({args.flush}: "
             f"{gpu.FLUSH_NOTE[args.flush]})"] + gpu.autotune_notes("attention")
    groups = {f"D{d}{' causal' if c else ''}":
              (lambda r, d=d, c=c: f"D{d}" in r.get("tags", ()) and
               ("causal" if c else "full") in r.get("tags", ()))
              for d in sorted({s[3] for s in shapes}) for c in modes}
    groups["all"] = lambda r: True
    return gpu.finish("attention", torch, args, records, skipped, impls, impls[1:], "tflops",
                      notes, {"autotune": gpu.autotune_records("attention")}, None, groups,
                      lambda s: LABELS.get(s, s))


__all__ = ["main", "make_case", "triton_attention", "SHAPES", "QUICK"]
