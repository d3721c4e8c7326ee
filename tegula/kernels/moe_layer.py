"""A Mixtral-style MoE MLP from the grouped GEMM: route, sort by expert, gate and up
projections with SiLU(gate)·up fused into one grouped GEMM, the down projection as
another, the weighted gather back to tokens.

For token t and each of its experts e = ids[t, j], with w13 (E, 2I, H) holding each
expert's gate rows then its up rows and w2 (E, H, I):

    y[t] = Σ_j weights[t, j] · (SiLU(x[t] @ gate_e.T) · (x[t] @ up_e.T)) @ w2[e].T

`moe_gate_up_kernel` computes the first factor for every sorted row in one pass: each work
item (`tegula.kernels.moe`'s device-side schedule over the I columns) runs two
accumulators off one pipelined activation tile — its gate tile from `w13[e]` rows
`n·BN …` and its up tile from rows `I + n·BN …` — and stores SiLU(gate)·up rounded once, so
the (R, 2I) projections never reach memory. Three copies and two gemms per k-step keep the
sm_90a TMA ring from spanning items (it serves one gemm), so the kernel runs one block per
item (items past the count run no K step); the TMA boxes, wgmma and producer warpgroup
are the same as the GEMM's.

Entry points: `moe_mlp` (torch, CUDA) and `moe_mlp_emulated` (numpy, the emulator).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

import tegula as tg
from tegula import f32, i32
from tegula.dtypes import DType, bf16, f16
from tegula.kernels.common import dtype_of_array, launch_emulated, poisoned
from tegula.kernels.moe import (COLUMN_TILE, END_ROW, EXPERT, FIRST_ROW, MOE_DTYPES, Routing,
                                gather_rows, has_rows, moe_gemm, moe_gemm_emulated,
                                plan_launches, run_plan, scatter_rows, sort_by_expert)


@lru_cache(maxsize=None)
def moe_gate_up_kernel(dtype: DType) -> tg.Kernel:
    """out (R, I) = SiLU(x @ gate_e.T) · (x @ up_e.T) per expert e's rows of x_sorted (R, H),
    gate_e = w13[e][:I], up_e = w13[e][I:], accumulated in f32 and rounded once. One block
    per item of the schedule (column tiles over I)."""

    @tg.kernel(threads=128)
    def moe_gate_up(x: tg.Tensor[dtype], w13: tg.Tensor[dtype, 3],
                    schedule: tg.Tensor[i32, 2], work_count: tg.Tensor[i32, 1],
                    out: tg.Tensor[dtype], BM: tg.constexpr = 128, BN: tg.constexpr = 128,
                    BK: tg.constexpr = 64, STAGES: tg.constexpr = 4):
        t = tg.block_id(0)
        e, first, end = schedule[EXPERT, t], schedule[FIRST_ROW, t], schedule[END_ROW, t]
        n = schedule[COLUMN_TILE, t]
        inner = w13.shape[1] // 2
        ga = x[first:, :].tile((BM, BK), (0, None))
        # Gate rows past I are up rows: they only feed columns past I, never stored.
        gg = w13[e].tile((BN, BK), (n, None))
        gu = w13[e][inner:, :].tile((BN, BK), (n, None))
        gate, up = tg.zeros((BM, BN), f32), tg.zeros((BM, BN), f32)
        sa = tg.shared((BM, BK), dtype, stages=STAGES)
        sg = tg.shared((BN, BK), dtype, stages=STAGES)
        su = tg.shared((BN, BK), dtype, stages=STAGES)
        for k in tg.pipeline(ga.shape[2] * has_rows(first, end), stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gg[:, :, k], sg[k])
            tg.copy(gu[:, :, k], su[k])
            tg.gemm(gate, sa[k], sg[k])
            tg.gemm(up, sa[k], su[k])
        act = gate * tg.sigmoid(gate) * up
        tg.copy(act.to(dtype), out[first:end, :].tile((BM, BN), (0, n)))

    return moe_gate_up


def gate_up_tiles(target: str | None) -> dict:
    """128×128 tiles (two f32 accumulators: two consumer warpgroups at threads=256 on the
    GPU), BK 64, 4 stages on sm_90a (3 of 48 KB), 3 elsewhere; one block per item."""
    return dict(BM=128, BN=128, BK=64, STAGES=4 if target in (None, "sm_90a") else 3,
                GROUP=8, PERSISTENT=False)


def _gate_up_plan(rows: int, inner: int, experts: int, tiles: dict) -> tuple:
    plan = plan_launches(rows, inner, experts, tiles, 1)
    gemm = dict(plan.gemm_constexprs)
    if gemm.pop("PERSISTENT"):
        raise ValueError("tegula.kernels.moe_layer: the fused gate/up GEMM runs one block "
                         "per work item (PERSISTENT=False)")
    return plan._replace(gemm_constexprs=gemm)


def check_mlp_shapes(fn: str, x: Any, w13: Any, w2: Any, topk_ids: Any,
                     topk_weights: Any) -> tuple[int, int]:
    """(I, E) after checking x (T, H), w13 (E, 2I, H), w2 (E, H, I) and topk_ids and
    topk_weights (T, k): one token per row of x (routing ids of other tokens would make a
    result of their row count, silently). Shapes only: the ids' values are checked where
    they are sorted (`sort_by_expert`), so this also serves the torch op's fake."""
    shapes = {name: tuple(a.shape) for name, a in (("x", x), ("w13", w13), ("w2", w2),
                                                    ("topk_ids", topk_ids),
                                                    ("topk_weights", topk_weights))}
    ok = (len(shapes["x"]) == 2 and len(shapes["w13"]) == 3 and len(shapes["w2"]) == 3)
    if ok:
        (_, hidden), (experts, two_inner, h13), (e2, h2, inner) = list(shapes.values())[:3]
        ok = (two_inner == 2 * inner and h13 == hidden == h2 and e2 == experts)
    if not ok:
        raise ValueError(f"tegula.kernels.{fn}: expected x (T, H), w13 (E, 2·I, H) and w2 "
                         f"(E, H, I), got " + ", ".join(f"{n} {s}" for n, s in
                                                        list(shapes.items())[:3]))
    ids, weights = shapes["topk_ids"], shapes["topk_weights"]
    if len(ids) != 2 or ids[0] != shapes["x"][0] or weights != ids:
        raise ValueError(f"tegula.kernels.{fn}: topk_ids and topk_weights must both be (T, k) "
                         f"with T = {shapes['x'][0]} (x's rows), got topk_ids {ids} and "
                         f"topk_weights {weights}")
    return inner, experts


def check_mlp_args(fn: str, x: Any, w13: Any, w2: Any, topk_ids: Any,
                   topk_weights: Any) -> tuple[DType, int, int]:
    """(x's tegula dtype, I, E) after checking `moe_mlp`'s torch arguments' types and
    shapes (not the device, not the ids' values): the entry point's checks and its torch
    op's fake's."""
    from tegula.kernels.api import _check_tensor
    dtype = _check_tensor(fn, "x", x, {"float16": f16, "bfloat16": bf16}, ndim=2)
    same = {str(x.dtype)[6:]: dtype}
    _check_tensor(fn, "w13", w13, same, ndim=3)
    _check_tensor(fn, "w2", w2, same, ndim=3)
    return (dtype,) + check_mlp_shapes(fn, x, w13, w2, topk_ids, topk_weights)


def _check_mlp(fn: str, x: Any, w13: Any, w2: Any, topk_ids: Any,
               topk_weights: Any) -> tuple[int, Routing]:
    """(I, the routing) after `check_mlp_shapes`."""
    inner, experts = check_mlp_shapes(fn, x, w13, w2, topk_ids, topk_weights)
    return inner, sort_by_expert(topk_ids, experts)


def moe_mlp(x: Any, w13: Any, w2: Any, topk_ids: Any, topk_weights: Any, *,
            gate_up_config: dict | None = None) -> Any:
    """The MoE MLP on torch CUDA tensors: x (T, H) f16/bf16, w13 (E, 2I, H) (each expert's
    gate rows, then its up rows), w2 (E, H, I), topk_ids and topk_weights (T, k) (from
    `moe.route`). Returns (T, H) in x's dtype: the fused gate/up kernel, the down grouped
    GEMM (`moe.moe_gemm`, autotuned), the weighted gather. `gate_up_config`: tiles for the
    fused kernel (default `gate_up_tiles`, threads=256)."""
    import torch

    from tegula.kernels.api import _check_cuda, _launch
    fn = "moe_mlp"
    dtype, inner, experts = check_mlp_args(fn, x, w13, w2, topk_ids, topk_weights)
    routing = sort_by_expert(topk_ids, experts)
    _check_cuda(fn, {"x": x, "w13": w13, "w2": w2, "topk_ids": topk_ids})
    x_sorted = scatter_rows(x, routing)
    act = torch.empty((x_sorted.shape[0], inner), dtype=x.dtype, device=x.device)
    if act.numel():
        tiles = {**gate_up_tiles(None), "threads": 256, **(gate_up_config or {})}
        threads = tiles.pop("threads", None)
        plan = _gate_up_plan(x_sorted.shape[0], inner, w13.shape[0], tiles)

        def launch(kernel, grid, args, constexprs, block_threads, writes_all):
            return _launch(kernel, grid, args, constexprs, block_threads)

        run_plan(plan, moe_gate_up_kernel(dtype), (x_sorted, w13.contiguous()),
                 routing.expert_offsets, (), act, launch,
                 lambda shape: torch.empty(shape, dtype=torch.int32, device=x.device),
                 threads)
    y_sorted = moe_gemm(act, w2, routing.expert_offsets)
    return gather_rows(y_sorted, routing, topk_weights)


def moe_gate_up_emulated(x_sorted: np.ndarray, w13: np.ndarray, expert_offsets: np.ndarray,
                         dtype: DType, target: str = "sm_90a", **tiles: int) -> np.ndarray:
    """SiLU(x @ gate_e.T) · (x @ up_e.T) per expert's rows, by the emulated fused kernel
    (rows past expert_offsets[E] left NaN)."""
    rows, inner, experts = x_sorted.shape[0], w13.shape[1] // 2, w13.shape[0]
    out = poisoned((rows, inner), dtype)
    if rows == 0 or inner == 0:
        return out
    plan = _gate_up_plan(rows, inner, experts, {**gate_up_tiles(target), **tiles})

    def launch(kernel, grid, args, constexprs, threads, writes_all):
        launch_emulated(kernel, grid, *args, target=target, check_coverage=writes_all,
                        **constexprs)

    run_plan(plan, moe_gate_up_kernel(dtype), (x_sorted, w13), expert_offsets, (), out,
             launch, lambda shape: poisoned(shape, i32), None)
    return out


def moe_mlp_emulated(x: np.ndarray, w13: np.ndarray, w2: np.ndarray, topk_ids: np.ndarray,
                     topk_weights: np.ndarray, dtype: DType | None = None,
                     target: str = "sm_90a", **tiles: int) -> np.ndarray:
    """`moe_mlp` in the emulator on numpy arrays (float32 holding bf16 values need
    dtype=bf16), the result rounded to `dtype`; `tiles` go to both grouped GEMMs."""
    from tegula.emulate.values import round_to
    fn = "moe_mlp_emulated"
    inner, routing = _check_mlp(fn, x, w13, w2, topk_ids, topk_weights)
    dtype = dtype or dtype_of_array(x, fn, "x")
    if dtype not in MOE_DTYPES:
        raise TypeError(f"tegula.kernels.{fn}: x has type {dtype}; supported: f16, bf16 "
                        f"(float32 arrays holding bf16 values need dtype=bf16)")
    offsets = routing.expert_offsets
    act = moe_gate_up_emulated(scatter_rows(x, routing), w13, offsets, dtype, target,
                               **{k: v for k, v in tiles.items() if k != "PERSISTENT"})
    y_sorted = moe_gemm_emulated(act, w2, offsets, dtype=dtype, target=target, **tiles)
    return round_to(gather_rows(y_sorted, routing, topk_weights), dtype)


__all__ = ["moe_gate_up_kernel", "moe_gate_up_emulated", "moe_mlp", "moe_mlp_emulated",
           "gate_up_tiles", "check_mlp_args", "check_mlp_shapes"]
