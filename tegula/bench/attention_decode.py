"""Attention decoding: tegula's split-KV kernels against torch SDPA and the device's copy
bandwidth: `python -m tegula.bench attention_decode`.

One query token per sequence (B, H, 1, D) against a full KV cache (B, H_kv, S, D) with
S = 4k–128k, GQA (H = 32 query heads over H_kv = 8) and MHA, contiguous and paged (256-key
pages in shuffled order). Decoding is memory-bound: the floor is reading K and V once,
2·B·H_kv·S·D·itemsize bytes, reported in TB/s and as a fraction of the device-to-device
copy bandwidth measured in the same run (the issue's target: ≥ 80%, and ≥ 1.0× SDPA).
SDPA (`enable_gqa=True`, whichever backend torch picks) reads the contiguous cache; for
the paged cases it is timed on the same keys laid out contiguously.
"""
from __future__ import annotations

import argparse
import functools
from typing import Any

from tegula.bench import gpu

# (B, H, H_kv, D, S)
SHAPES = [(1, 32, 8, 128, 131072), (1, 32, 8, 128, 32768), (4, 32, 8, 128, 16384),
          (16, 32, 8, 128, 4096), (64, 32, 8, 128, 4096), (8, 32, 32, 128, 8192),
          (4, 64, 8, 64, 16384), (2, 16, 2, 256, 32768)]
QUICK = [(1, 32, 8, 128, 131072), (16, 32, 8, 128, 4096)]
PAGE = 256
TOLERANCE = {"f16": 5e-3, "bf16": 2e-2}   # ‖out − ref‖/‖ref‖ against a float32 reference


def reference(torch: Any, q, k, v):
    """o in float32 for one query token per sequence, the query heads of a kv head as
    rows (no expanded copy of the cache)."""
    B, H, _, D = q.shape
    kv_heads = k.shape[1]
    rows = q.float().view(B, kv_heads, H // kv_heads, D)
    s = (rows @ k.float().transpose(2, 3)) * D ** -0.5
    return (torch.softmax(s, -1) @ v.float()).view(B, H, 1, D)


def page_cache(torch: Any, k, v, shuffled: bool = True, page: int = PAGE):
    """(k pool, v pool, block table): the cache cut into `page`-key pages, shuffled (or in
    order: each sequence's pages side by side, as the contiguous cache)."""
    B, kv_heads, S, D = k.shape
    per_seq = S // page
    order = torch.randperm(B * per_seq, device=k.device) if shuffled else \
        torch.arange(B * per_seq, device=k.device)
    table = order.view(B, per_seq).to(torch.int32)
    pool_k = torch.empty(B * per_seq, kv_heads, page, D, dtype=k.dtype, device=k.device)
    pool_v = torch.empty_like(pool_k)
    pages = lambda t: t.view(B, kv_heads, per_seq, page, D).transpose(1, 2)  # noqa: E731
    pool_k[order] = pages(k).reshape(B * per_seq, kv_heads, page, D)
    pool_v[order] = pages(v).reshape(B * per_seq, kv_heads, page, D)
    return pool_k, pool_v, table


def make_case(torch: Any, shape: tuple[int, ...], paged: bool, dtype: str) -> gpu.Case:
    import torch.nn.functional as F

    from tegula.kernels.attention_decode import attention_decode, decode_config
    B, H, kv_heads, D, S = shape
    tdtype = getattr(torch, gpu.TORCH_DTYPES[dtype])
    q = torch.randn(B, H, 1, D, device="cuda", dtype=tdtype)
    k, v = (torch.randn(B, kv_heads, S, D, device="cuda", dtype=tdtype) for _ in range(2))
    lengths = torch.full((B,), S, dtype=torch.int32, device="cuda")
    cache_k, cache_v, table = page_cache(torch, k, v) if paged else (k, v, None)
    config = decode_config(B, kv_heads, S, D, PAGE if paged else 0)

    def tegula_run():
        return attention_decode(q, cache_k, cache_v, lengths, table)

    impls = [gpu.Impl("tegula", tegula_run, note=lambda: f"{config['splits']} splits of "
                      f"{config['chunk']}x{config['BN']} keys"),
             gpu.Impl("sdpa", lambda: F.scaled_dot_product_attention(q, k, v,
                                                                      enable_gqa=True))]
    kv_bytes = 2 * B * kv_heads * S * D * k.element_size()
    length = f"{S // 1024}k" if S % 1024 == 0 else str(S)
    return gpu.Case(label=f"{B}x{H}/{kv_heads}x{D} S={length}" + (" paged" if paged else ""),
                    dims=shape, flops=4.0 * B * H * S * D,
                    bytes=float(kv_bytes + 2 * q.numel() * q.element_size()),
                    reference=functools.partial(reference, torch, q, k, v),
                    tol=TOLERANCE[dtype], impls=impls, tags=("paged",) if paged else ())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tegula.bench attention_decode",
                                     description=__doc__.splitlines()[0])
    gpu.add_common_options(parser, ("f16", "bf16"), "comma-separated BxHxHKVxDxS shapes, "
                           "e.g. 1x32x8x128x131072")
    args = parser.parse_args(argv)
    chosen = gpu.parse_shapes(args.shapes, 5) if args.shapes else QUICK if args.quick else SHAPES
    torch, why = gpu.load_torch("attention_decode")
    if torch is None:
        return gpu.no_gpu(why)
    print(f"attention_decode ({args.dtype}) on {torch.cuda.get_device_name()}")
    copy_bw = gpu.report_copy_bandwidth(torch, args.flush)
    cases = [(f"{'x'.join(map(str, s))}{' paged' if paged else ''}",
              functools.partial(make_case, torch, s, paged, args.dtype))
             for s in chosen for paged in (False, True) if s[4] % PAGE == 0 or not paged]
    records, skipped = gpu.run_cases(cases, gpu.Budget(args.max_seconds),
                                     timer=functools.partial(gpu.time_ms, flush=args.flush))
    notes = ["tegula: tegula.kernels.attention_decode (split-KV in one launch: the last "
             "split block per (batch, kv head) merges the partials; no autotuning); "
             "sdpa: torch.nn.functional.scaled_dot_product_attention(enable_gqa=True) on the "
             "contiguous cache (for the paged rows too); median, L2 flushed before each run",
             "TB/s counts K and V read once (plus q and o); tegula/copy is the fraction of "
             "the device-to-device copy bandwidth measured in this run (target >= 0.8)"]
    return gpu.finish("attention_decode", torch, args, records, skipped, ["tegula", "sdpa"],
                      ["sdpa"], "tbps", notes, {}, copy_bw,
                      {"contiguous": lambda r: "paged" not in r.get("tags", ()),
                       "paged": lambda r: "paged" in r.get("tags", ())},
                      lambda s: {"sdpa": "SDPA"}.get(s, s))


__all__ = ["main", "make_case", "SHAPES", "QUICK"]
