"""A mixture-of-experts MLP: every token goes to its top-k experts, each expert's tokens are
multiplied by that expert's weights in one grouped GEMM launch, and the results come back
weighted by the router.

    python examples/moe.py

The grouped GEMM below is the library's (`tegula.kernels.moe`) written out: the rows of
x are sorted by expert, `expert_offsets` (E + 1,) says where each expert's rows start, and
the experts' row counts are known only on the device. A first kernel
(`tegula.kernels.moe.moe_schedule_kernel`) turns the offsets into a work list — one item
per (BM, BN) output tile that has rows: its expert, first row, the end of its expert's
rows and its column tile — and the count of items. The GEMM is persistent: each block
walks the items up to that count, read from memory (`work_count[0]`), so there is no host
sync and no per-expert launch. An item's rows are the view `x[first:, :]` and its stores
go through `out[first:end, :]`, which masks the rows of the next expert. On sm_90a the K
loop is TMA + wgmma from a producer warpgroup, one mbarrier ring across the block's items.

The library adds FP8 and 4-bit weights (`moe`, `moe_w4`), the MLP with the gate and up
projections fused (`moe_layer.moe_mlp`), the torch entry point (`moe.moe_gemm`, autotuned)
and the routing helpers used here:

    ids, weights = moe.route(logits, k)              # softmax, top-k, renormalized
    routing = moe.sort_by_expert(ids, E)             # order, inverse, expert_offsets
    y = moe.gather_rows(moe_gemm(moe.scatter_rows(x, routing), w, ...), routing, weights)
"""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula import bf16, f32, i32
from tegula.kernels import moe


@tg.kernel(threads=128)
def moe_gemm(x: tg.Tensor[bf16], w: tg.Tensor[bf16, 3], schedule: tg.Tensor[i32, 2],
             work_count: tg.Tensor[i32, 1], out: tg.Tensor[bf16], BM: tg.constexpr = 128,
             BN: tg.constexpr = 128, BK: tg.constexpr = 64, STAGES: tg.constexpr = 4):
    sa = tg.shared((BM, BK), bf16, stages=STAGES)
    sb = tg.shared((BN, BK), bf16, stages=STAGES)
    for t in tg.range(tg.block_id(0), work_count[0], tg.num_programs(0)):
        e, first, end, n = schedule[0, t], schedule[1, t], schedule[2, t], schedule[3, t]
        ga = x[first:, :].tile((BM, BK), (0, None))     # this item's rows, K-steps
        gb = w[e].tile((BN, BK), (n, None))             # expert e's (N, K) weight
        acc = tg.zeros((BM, BN), f32)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])                  # acc += x rows @ w[e].T
        tg.copy(acc.to(bf16), out[first:end, :].tile((BM, BN), (0, n)))


def grouped(x_sorted, w, offsets, num_sms: int, **tiles):
    """out = x_sorted @ w[e].T per expert's rows: the schedule, then the GEMM above."""
    from tegula.build import emulate
    from tegula.kernels.common import poisoned
    plan = moe.plan_launches(x_sorted.shape[0], w.shape[1], w.shape[0], tiles, num_sms)
    schedule, count = poisoned((4, plan.capacity), i32), poisoned((1,), i32)
    emulate(moe.moe_schedule_kernel(), plan.schedule_grid, offsets, schedule, count,
            *plan.schedule_scalars, **plan.schedule_constexprs)
    out = poisoned((x_sorted.shape[0], w.shape[1]), bf16)
    gemm_tiles = {k: v for k, v in plan.gemm_constexprs.items() if k != "PERSISTENT"}
    emulate(moe_gemm, plan.grid, x_sorted, w, schedule, count, out, num_sms=num_sms,
            **gemm_tiles)
    return out


def main(tokens: int = 37, experts: int = 6, top_k: int = 2, hidden: int = 48,
         inner: int = 40, num_sms: int = 4) -> None:
    """A MoE MLP (gate and up projections as one grouped GEMM, SiLU(gate)·up, the down
    projection, the weighted gather) in the emulator, against numpy token by token."""
    from tegula.emulate.values import round_to
    from tegula.kernels.common import random_input
    rng = np.random.default_rng(0)
    x = random_input(rng, (tokens, hidden), bf16)
    w13 = random_input(rng, (experts, 2 * inner, hidden), bf16, 0.2)   # gate rows, up rows
    w2 = random_input(rng, (experts, hidden, inner), bf16, 0.2)
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    ids, weights = moe.route(logits, top_k)
    routing = moe.sort_by_expert(ids, experts)
    tiles = dict(BM=16, BN=32, BK=16, STAGES=2, GROUP=2)
    h = grouped(moe.scatter_rows(x, routing), w13, routing.expert_offsets, num_sms, **tiles)
    gate, up = h[:, :inner], h[:, inner:]
    act = round_to(gate / (1 + np.exp(-gate)) * up, bf16)
    y = moe.gather_rows(grouped(act, w2, routing.expert_offsets, num_sms, **tiles),
                        routing, weights)
    # numpy, token by token, with the same roundings to bf16 between the steps
    ref = np.zeros((tokens, hidden))
    for t in range(tokens):
        for j in range(top_k):
            e = ids[t, j]
            h_t = round_to((x[t].astype(np.float64) @ w13[e].T.astype(np.float64))
                           .astype(np.float32), bf16)
            a_t = round_to(h_t[:inner] / (1 + np.exp(-h_t[:inner])) * h_t[inner:], bf16)
            ref[t] += weights[t, j] * round_to((a_t.astype(np.float64) @ w2[e].T)
                                               .astype(np.float32), bf16)
    err = np.abs(y - ref).max()
    # f32 sums may round a value to the neighbouring bf16 before the next step: a few ulps
    assert err <= 2.0 ** -5 * np.abs(ref).max(), err
    print(f"MoE MLP: {tokens} tokens, top-{top_k} of {experts} experts, "
          f"expert rows {np.diff(routing.expert_offsets).tolist()}: max error {err:.3g} ok")


if __name__ == "__main__":
    main()
