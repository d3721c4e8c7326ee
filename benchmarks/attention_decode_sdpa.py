"""What torch SDPA does on the decode shapes, against tegula's paged and contiguous
decode in one process (issue 12's paged 1.0x SDPA target):

    python benchmarks/attention_decode_sdpa.py 1x32x8x128x131072 4x32x8x128x16384

Per shape (BxHxHkvxDxS, one query token, every sequence S keys, f16): the CUDA kernels
one SDPA call launches (torch.profiler: which backend, split-KV or not, a combine
kernel), SDPA under each backend torch offers (`sdpa_kernel`; one it refuses is named),
SDPA on a paged cache gathered first (`pool[table]` to a contiguous copy, then SDPA: what
a paged cache costs a user of SDPA, which takes no block table), and tegula's
`attention_decode` on the contiguous and on the paged cache (256-key pages, shuffled).
Every output is checked against a float32 reference (relative error <= 5e-3, no NaN)
before it is timed; times are medians of `tegula.bench.gpu.time_ms` with L2 flushed,
taken in `--repeats` interleaved rounds (the GPU's power cap moves single runs).
"""
from __future__ import annotations

import argparse

TOLERANCE = 5e-3


def sdpa_kernels(torch, run) -> str:
    """The CUDA kernels one call of `run` launches, with their µs (profiler)."""
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    names = []
    for event in prof.key_averages():
        if str(event.device_type).endswith("CUDA") and event.count:
            total = getattr(event, "device_time_total", 0.0)
            names.append(f"{event.key[:70]} x{event.count} {total:.1f}us")
    return "; ".join(names)


def backends(torch, F, q, k, v) -> dict:
    """SDPA under each backend torch has: name -> a runner (or the refusal's text)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    found = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue

        def run(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        try:
            run()
            torch.cuda.synchronize()
            found[name] = run
        except Exception as e:  # a backend that refuses the shape says why
            found[name] = f"refused: {str(e).splitlines()[0][:90]}"
    return found


def run_shape(torch, shape: tuple, repeats: int, copy_bw: float) -> None:
    import torch.nn.functional as F

    from tegula.bench import gpu
    from tegula.bench.attention_decode import PAGE, page_cache, reference
    from tegula.kernels.attention_decode import attention_decode, decode_config
    B, H, kv_heads, D, S = shape
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, kv_heads, S, D, device="cuda", dtype=torch.float16)
            for _ in range(2))
    lengths = torch.full((B,), S, dtype=torch.int32, device="cuda")
    pool_k, pool_v, table = page_cache(torch, k, v)
    want = reference(torch, q, k, v)
    label = f"{B}x{H}/{kv_heads}x{D} S={S}"
    try:
        kernels = sdpa_kernels(torch, lambda: F.scaled_dot_product_attention(
            q, k, v, enable_gqa=True))
    except Exception as e:  # the profiler is a nicety: the timings below still run
        kernels = f"(profiler failed: {type(e).__name__}: {str(e)[:80]})"
    print(f"== {label}: sdpa kernels: {kernels}", flush=True)

    rows = table.long()

    def gathered():
        pages = lambda pool: pool[rows].transpose(1, 2).reshape(B, kv_heads, S, D)  # noqa: E731
        return F.scaled_dot_product_attention(q, pages(pool_k), pages(pool_v), enable_gqa=True)

    runs = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            "tegula": lambda: attention_decode(q, k, v, lengths),
            "tegula paged": lambda: attention_decode(q, pool_k, pool_v, lengths, table),
            "gather+sdpa": gathered}
    for name, run in backends(torch, F, q, k, v).items():
        if isinstance(run, str):
            print(f"   sdpa[{name}] {run}")
        else:
            runs[f"sdpa[{name}]"] = run
    for name, run in list(runs.items()):
        out = run()
        torch.cuda.synchronize()
        err = gpu.rel_error(out.float(), want)
        if torch.isnan(out).any() or err > TOLERANCE:
            print(f"   {name} FAIL err {err:.1e}")
            del runs[name]
    kv_bytes = 2 * B * kv_heads * S * D * 2
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(gpu.time_ms(run) * 1e3)
    splits = (decode_config(B, kv_heads, S, D)["splits"],
              decode_config(B, kv_heads, S, D, PAGE)["splits"])
    base = min(times["sdpa"])
    print(f"   splits contiguous/paged {splits[0]}/{splits[1]}; copy {copy_bw:.2f} TB/s")
    for name, us in times.items():
        best = min(us)
        print(f"   {name:28s} {' '.join(f'{t:7.1f}' for t in us)} us | best "
              f"{kv_bytes / best / 1e6:.2f} TB/s {kv_bytes / best / 1e6 / copy_bw:.0%} of copy,"
              f" {base / best:.3f}x sdpa", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", help="BxHxHkvxDxS")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved timing rounds")
    args = parser.parse_args(argv)
    import torch

    from tegula.bench import gpu
    copy_bw = gpu.copy_bandwidth(torch) / 1e12
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for text in args.shapes:
        run_shape(torch, tuple(int(x) for x in text.split("x")), args.repeats, copy_bw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
