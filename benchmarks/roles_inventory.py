"""Which library kernels' TMA pipelines get a producer warpgroup on sm_90a, and which the
cost model changed (`tegula/synth/cost_roles.py`; no GPU).

    PYTHONPATH=. python3 benchmarks/roles_inventory.py [--all]

Every configuration the library's entry points time (their candidate lists, at a few
shapes) is built for sm_90a with `warp_specialize` left as the kernel declares it, and
each TMA pipeline's decision printed: "specialized", or one role and why (what `tegula
explain` prints). A pipeline the model kept in one role was warp-specialized before the
model decided (the rule alone applied), so those lines, marked CHANGED, are the diff of
`tegula explain` before and after; `--all` prints the unchanged ones too.

`--grid`: each configuration is also built for its launch grid at that shape (what every
launch passes as the `grid_blocks` build option since session 14) and the pipelines whose
form the grid changes are printed GRID (one role at a full grid, the producer on a grid
giving an SM fewer blocks than one role holds): the library decisions the launch grid
moves, each to be checked by `benchmarks/roles_check.py` at its shape.
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRICED = "a producer warpgroup does not pay"
HEADS = {64: 32, 128: 16, 256: 8}  # tegula bench attention's heads per D (16k tokens)


def _m(name: str):
    return importlib.import_module(f"tegula.kernels.{name}")


def gemm_configs():
    from tegula.dtypes import f16
    api, gemm = _m("api_matmul"), _m("gemm")
    factories = {"shared": gemm.gemm_kernel, "persistent": gemm.persistent_gemm_kernel,
                 "staged": gemm.staged_gemm_kernel}
    seen = set()
    for m, n, k, fused in [(16, 4096, 4096, False), (64, 4096, 4096, False),
                           (128, 4096, 4096, False), (128, 14336, 4096, False),
                           (1024, 1024, 1024, False), (4096, 4096, 4096, False),
                           (4096, 4096, 4096, True)]:
        for c in api.gemm_candidates(m, n, k, fused=fused):
            c = {key: v for key, v in c.items() if key != "orientation"}
            which, split = c.pop("kernel"), c.pop("SPLIT", 1)
            if which == "registers":
                continue
            kernel = gemm.gemm_split_k_kernel(f16) if split > 1 else \
                factories[which](f16, "gelu" if fused else None, fused and which != "persistent")
            cx = dict(c, SPLIT=split) if split > 1 else c
            key = (kernel.name, tuple(sorted(cx.items())))
            blocks = None if which == "persistent" else \
                -(-m // c["BM"]) * -(-n // c["BN"]) * split
            if key not in seen:
                seen.add(key)
                yield (f"gemm {which} {m}x{n}x{k}{' bias+gelu' if fused else ''}", kernel, cx,
                       blocks)


def fp8_configs():
    from tegula.dtypes import bf16
    api, fp8 = _m("api_matmul"), _m("fp8")
    for blockwise in (False, True):
        for m in (64, 4096):
            for c in api.fp8_candidates(m, 4096, 4096, blockwise, True):
                c = dict(c)
                which = c.pop("kernel", "tiles")
                kernel = {("tiles", False): fp8.fp8_gemm_kernel,
                          ("persistent", False): fp8.fp8_persistent_gemm_kernel,
                          ("tiles", True): fp8.fp8_blockwise_gemm_kernel,
                          ("persistent", True): fp8.fp8_blockwise_persistent_kernel}[
                              (which, blockwise)](bf16)
                blocks = None if which == "persistent" else \
                    -(-m // c["BM"]) * -(-4096 // c["BN"])
                yield f"fp8 {'blockwise' if blockwise else 'per-tensor'} {which} m={m}", \
                    kernel, c, blocks


def attention_configs():
    from tegula.dtypes import f16
    at, ab = _m("attention"), _m("attention_backward")
    for d in (64, 128, 256):
        fixed = dict(D=d, QK_SCALE=at.qk_scale(None, d))
        for c in at.attention_candidates(d, True):
            # the benchmark's shapes at S = 1k (16k tokens: the fewest blocks) and one
            # sequence of 1k with D's heads (a small batch)
            for batch in (16, 1):
                yield (f"attention fwd D={d} {batch}x1024", at.attention_kernel(f16),
                       dict(fixed, **c), -(-1024 // c["BM"]) * HEADS[d] * batch)
        for c in ab.backward_candidates(d):
            cx = dict(c, D=d, SCALE=1 / math.sqrt(d), CAUSAL=False)
            blocks = 4096 // c["BN"] * 16 * 4  # 4x16x4096: dK/dV blocks own key blocks
            yield (f"attention bwd dK/dV D={d}", ab.attention_backward_dkdv_kernel(f16), cx,
                   blocks)
            yield (f"attention bwd dQ D={d}", ab.attention_backward_dq_kernel(f16), cx,
                   4096 // c["BM"] * 16 * 4)
        yield (f"attention bwd dK/dV+dQ atomic D={d}", ab.attention_backward_dkdvdq_kernel(f16),
               dict(ab.backward_tiles(d, 4096, 4096), D=d, SCALE=1 / math.sqrt(d),
                    CAUSAL=False), None)


def moe_configs():
    from tegula.dtypes import bf16
    moe, layer = _m("moe"), _m("moe_layer")
    for rows, experts in ((8192, 8), (8192, 64)):
        for c in moe.moe_candidates(rows, experts, False, 14336):
            c = {k: v for k, v in c.items() if k != "GROUP"}   # the schedule's, not the kernel's
            yield f"moe gemm {rows} rows {experts} experts", moe.moe_gemm_kernel(bf16), c, None
    yield "moe gate_up", layer.moe_gate_up_kernel(bf16), {}, None


def decisions(label, kernel, cx, blocks=None):
    """[(decision, changed)] of one build (on `blocks` blocks where given)."""
    from tegula.build import build
    from tegula.errors import TegulaError
    from tegula.ir.ops import ForLoop, walk_ops
    try:
        result = build(kernel, dict(cx, **({} if blocks is None else dict(grid_blocks=blocks))),
                       None, "sm_90a")
    except TegulaError as err:
        return [("refused: " + str(err).splitlines()[0][:100], False)]
    out = []
    for op in walk_ops(result.traced.body):
        if not isinstance(op, ForLoop):
            continue
        if "roles" in op.choices:
            plan = op.choices["roles"]
            out.append((f"specialized ({plan.consumer_groups} consumer group(s))", False))
        elif "roles_skipped" in op.choices:
            why = op.choices["roles_skipped"]
            out.append(("one role: " + why[:150], why.startswith(PRICED)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="print unchanged decisions too")
    parser.add_argument("--grid", action="store_true",
                        help="print the decisions each configuration's launch grid changes")
    options = parser.parse_args()
    changed = total = moved = 0
    for source in (gemm_configs, fp8_configs, attention_configs, moe_configs):
        for label, kernel, cx, blocks in source():
            full = decisions(label, kernel, cx)
            if options.grid and blocks is not None:
                for (was, _), (now, _) in zip(full, decisions(label, kernel, cx, blocks)):
                    if was != now:
                        moved += 1
                        print(f"GRID    {label} [{_config(cx)}] on {blocks} blocks: "
                              f"{now.split(' (')[0]} (full grid: {was[:60]})", flush=True)
            for decision, was_changed in full:
                total += 1
                changed += was_changed
                if was_changed or options.all:
                    print(f"{'CHANGED ' if was_changed else '        '}{label} [{_config(cx)}]: "
                          f"{decision}", flush=True)
    print(f"{changed} of {total} TMA pipelines changed by the cost model (were "
          f"warp-specialized, now one role)")
    if options.grid:
        print(f"{moved} of them change form on their launch grid")


def _config(cx: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cx.items() if k not in ("SCALE", "QK_SCALE"))


if __name__ == "__main__":
    main()
