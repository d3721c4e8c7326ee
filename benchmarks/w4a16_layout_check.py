"""Does the search's pre-pack decision earn its place? (issue 11: W4A16's weight layout)

    PYTHONPATH=. python3 benchmarks/w4a16_layout_check.py 16x14336x4096 1x4096x4096 \
        [--budget-s 50] [--rep-ms 25]

For each (M, N, K) every launch plan of both stored weight layouts — plain packed bytes
and the MMA fragment's order (`tegula.kernels.prepack_search`, the plans `matmul_w4a16`
times) — is run on the GPU into a NaN-filled output, checked against torch's product with
the dequantized weights, and timed (`triton.testing.do_bench`, median, L2 not flushed),
next to the cost model's prediction. One "W4L" line per plan (shape, layout, config,
predicted µs, measured µs, max relative error), then per shape the Spearman correlation
of predicted and measured times and the decision: the model's best layout and plan
against the measured best of each layout. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def _reference(a, packed, scales, zeros, group):
    """a @ dequant(w).T in f32 from the plain packed bytes."""
    low, high = (packed & 15).int(), (packed >> 4).int()
    q = torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1).float()
    w = (q - zeros.float().repeat_interleave(group, 1)) * scales.float().repeat_interleave(group, 1)
    return a.float() @ w.T


def _spearman(x, y) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1]) if len(x) > 2 else float("nan")


def check_shape(m: int, n: int, k: int, group: int, rep_ms: float, deadline: float) -> None:
    from triton.testing import do_bench

    from tegula.dtypes import f16
    from tegula.kernels import api
    from tegula.kernels.prepack_search import recommend_w4a16_layout
    from tegula.kernels.quant import (launch_w4a16, quantize_w4, w4a16_config,
                                      w4a16_operands)
    from tegula.kernels.quant_fragment import pack_fragments

    result = recommend_w4a16_layout(m, n, k, group_size=group, top_k=1000)
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    packed, scales, zeros = quantize_w4(torch.randn(n, k, device="cuda", dtype=torch.float16),
                                        group)
    stored = {"plain": packed, "fragment": pack_fragments(packed)}
    ref = _reference(a, packed, scales, zeros, group)
    rows = []
    for cand in result.ranked + result.dropped + result.pruned:
        if time.time() > deadline:
            print(f"W4L {m}x{n}x{k} budget spent: the rest not measured", flush=True)
            break
        layout = cand.config["w_layout"]
        config = {key: v for key, v in cand.config.items() if key != "w_layout"}
        threads = config.get("threads")
        kind, grid, cx = w4a16_config(m, n, k, group, **{key: v for key, v in config.items()
                                                          if key != "threads"})
        operands = (*w4a16_operands(kind, a, stored[layout], group), scales, zeros)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        run = lambda: launch_w4a16(  # noqa: E731
            kind, grid, cx, f16, True, operands, out,
            lambda kern, g, args, x: api._launch(kern, g, args, x, threads),
            lambda shape: torch.empty(shape, dtype=torch.float32, device="cuda"))
        name = json.dumps(config).replace(" ", "")
        try:
            run()
            torch.cuda.synchronize()
            error = float(((out.float() - ref).abs() / (ref.abs() + 1.0)).max())
            us = do_bench(run, warmup=5, rep=rep_ms) * 1e3
        except Exception as err:  # one plan must not hide the rest
            print(f"W4L {m}x{n}x{k} {layout} {name} failed {err}"[:300], flush=True)
            continue
        predicted = cand.seconds * 1e6 if cand.seconds is not None else float("nan")
        print(f"W4L {m}x{n}x{k} {layout} {name} {predicted:.2f} {us:.2f} {error:.2g}"
              + (f" dropped: {cand.dropped[:80]}" if cand.dropped else ""), flush=True)
        rows.append((layout, name, predicted, us, cand.dropped is None))
    ranked = [r for r in rows if r[4]]
    if not ranked:
        return
    best = {}
    for layout, name, predicted, us, _ in sorted(rows, key=lambda r: r[3]):
        best.setdefault(layout, (name, us))
    pick = min(ranked, key=lambda r: r[2])
    print(f"W4L-SUMMARY {m}x{n}x{k} plans {len(ranked)} spearman "
          f"{_spearman([r[2] for r in ranked], [r[3] for r in ranked]):.2f} model-pick "
          f"{pick[0]} {pick[3]:.2f} us; measured best "
          + "; ".join(f"{layout} {us:.2f} us" for layout, (_, us) in sorted(best.items())),
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", metavar="MxNxK")
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--budget-s", type=float, default=float("inf"))
    parser.add_argument("--rep-ms", type=float, default=25)
    options = parser.parse_args()
    deadline = time.time() + options.budget_s
    print(torch.cuda.get_device_name(), time.strftime("%Y-%m-%d"), flush=True)
    for shape in options.shapes:
        m, n, k = (int(d) for d in shape.split("x"))
        check_shape(m, n, k, options.group, options.rep_ms, deadline)


if __name__ == "__main__":
    main()
