"""Mixture-of-experts grouped GEMM: each expert's tokens times that expert's weight, in one
launch, with the experts' row ranges read from memory inside the kernel.

A MoE layer routes every token to `k` of `E` experts. The routing helpers (`route`,
`sort_by_expert`, `scatter_rows`, `gather_rows`; numpy arrays or torch tensors alike) turn
that into a *grouped* problem:

* `sort_by_expert(topk_ids, E)` orders the T·k token copies by expert (a stable sort, so
  within an expert the copies stay in token order: deterministic), giving `order` — sorted
  row p is copy `order[p]` of token `order[p] // k` — and `expert_offsets` (E + 1,) int32:
  expert e owns sorted rows `expert_offsets[e] … expert_offsets[e + 1] - 1`;
* `scatter_rows(x, routing)` is x's rows in that order (`x_sorted`);
* `moe_gemm(x_sorted, w, expert_offsets)` computes `out[p] = x_sorted[p] @ w[e].T` for
  every row p of expert e, with w (E, N, K) — K-major like an `nn.Linear` weight;
* `gather_rows(y_sorted, routing, topk_weights)` adds each token's k rows back, weighted by
  its routing weights, in f32, in the order j = 0 … k-1 (deterministic), rounded once.

How the kernel finds its work without a host sync (the counts per expert are known only on
the device): two launches, both reading `expert_offsets` in the kernel.

1. `moe_schedule_kernel` writes the work list: expert e has ⌈count_e / BM⌉ row tiles,
   numbered from an exclusive cumsum over the experts (`tg.cumsum`), and each (row tile,
   column tile) pair is a work item holding its expert, first row, end row and column
   tile, in grouped order (`tegula.kernels.schedule.grouped_tile`: blocks running together
   share weight tiles in L2). A row tile's expert is found by comparing it against every
   expert's first tile at once, in a register tile — no scalar loop, no host sync. The
   count of items is written to memory too; the host sizes the list for its largest value
   (each expert wastes less than one row tile: Σ ⌈count_e / BM⌉ ≤ R // BM + E).
2. The grouped GEMM is persistent: about one block per SM walks the items up to the count
   read from memory (`tg.range(tg.block_id(0), work_count[0], tg.num_programs(0))`), each
   reading its four scalars. Every item has rows, so the K loop has one trip count and on
   sm_90a one TMA ring runs across a block's items (the producer warpgroup loads the next
   item's first stages during the current one's epilogue). The rows are the view
   `x[first:, :]` (no stop: TMA fetches it at any row; rows past the expert's end belong to
   the next expert or lie past the tensor and only feed accumulator rows never stored) and
   the store goes through `out[first:end, :]`, which masks every row past the expert's end.
   `PERSISTENT=False` launches one block per possible item instead (those past the count
   run no K step). The masked store cannot be a TMA store (a view with a slice stop);
   `STAGED=True` writes the tile to a shared buffer first, so the global stores are
   16-byte vectors rather than the accumulator layout's 4-byte pairs (a (BM, BN) buffer
   more: 3 stages of 128×256 instead of 4).

Weights: bf16/f16 (`moe_gemm_kernel`), or FP8 e4m3 with per-expert scales and per-row
activation scales (`moe_gemm_fp8_kernel`: activations quantized per row by
`quantize_rows_fp8`, as vLLM's FP8 MoE); 4-bit weights are `tegula.kernels.moe_w4`.

Entry points: `moe_gemm_emulated` (numpy, the CI one) and `moe_gemm` (torch, CUDA); a whole
Mixtral-style MLP is `tegula.kernels.moe_layer`.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

import tegula as tg
from tegula import f32, i32
from tegula.dtypes import DType, bf16, f8e4m3, f16
from tegula.kernels import api as _api
from tegula.kernels.common import check_array, dtype_of_array, launch_emulated, poisoned
from tegula.kernels.schedule import grouped_tile
from tegula.runtime.autotune import Autotuner

#: Activation types (and the output's; FP8 weights take f16/bf16 activations too).
MOE_DTYPES = (f16, bf16)
# The torch entry point's autotuner, beside the library's others (winners per shape bucket).
_api.TUNERS.setdefault("moe_gemm", Autotuner("moe_gemm"))
#: e4m3's largest finite value: per-row activation scales map a row's max to it.
FP8_MAX = 448.0


# --------------------------------------------------------------------------------------
# Routing: numpy arrays or torch tensors, the same algorithm on both
# --------------------------------------------------------------------------------------

class Routing(NamedTuple):
    """Where each token copy went. `order` (T·k,): sorted row p is copy `order[p]` (copy
    t·k + j is token t's j-th choice); `inverse` (T·k,): copy c sits at sorted row
    `inverse[c]`; `expert_offsets` (E + 1,) int32; `k`: experts per token."""

    order: Any
    inverse: Any
    expert_offsets: Any
    k: int


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def route(logits: Any, k: int, renormalize: bool = True) -> tuple[Any, Any]:
    """(topk_ids (T, k) int32, topk_weights (T, k) f32) from router logits (T, E): softmax
    over the experts in f32, the k largest (numpy: ties to the lower expert id; torch:
    `torch.topk`'s order), and with
    `renormalize` the k weights divided by their sum (Mixtral) rather than kept as softmax
    probabilities."""
    fn = "route"
    if not _is_torch(logits):
        check_array(fn, "logits", logits, ndim=2)
    elif logits.dim() != 2:
        raise ValueError(f"tegula.kernels.{fn}: logits must be 2-D (tokens, experts), got "
                         f"shape {tuple(logits.shape)}")
    experts = logits.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= experts:
        raise ValueError(f"tegula.kernels.{fn}: k must be an int in 1 … {experts} (the "
                         f"experts), got {k!r}")
    if _is_torch(logits):
        import torch
        probs = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.topk(probs, k, dim=-1, sorted=True)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids.to(torch.int32), weights
    z = logits.astype(np.float32)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    probs = z / z.sum(axis=-1, keepdims=True)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if renormalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return ids.astype(np.int32), weights.astype(np.float32)


def sort_by_expert(topk_ids: Any, num_experts: int) -> Routing:
    """The token copies of `topk_ids` (T, k) ordered by expert (stable: token order within an
    expert), as a `Routing`. Ids must lie in 0 … num_experts - 1: numpy checks them; a
    torch tensor is checked on the device (`torch._assert_async`, no host sync: a bad id
    stops the stream with a device-side assert rather than leaving rows unrouted)."""
    fn = "sort_by_expert"
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"tegula.kernels.{fn}: num_experts must be a positive int, got "
                         f"{num_experts!r}")
    if _is_torch(topk_ids):
        return _sort_by_expert_torch(topk_ids, num_experts)
    check_array(fn, "topk_ids", topk_ids, ndim=2)
    if topk_ids.dtype.kind not in "iu":
        raise TypeError(f"tegula.kernels.{fn}: topk_ids must hold integers, got "
                        f"{topk_ids.dtype}")
    flat = topk_ids.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= num_experts):
        raise ValueError(f"tegula.kernels.{fn}: topk_ids must lie in 0 … {num_experts - 1}, "
                         f"got values from {flat.min()} to {flat.max()}")
    order = np.argsort(flat, kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    offsets = np.searchsorted(flat[order], np.arange(num_experts + 1)).astype(np.int32)
    return Routing(order, inverse, offsets, topk_ids.shape[1])


def _sort_by_expert_torch(topk_ids: Any, num_experts: int) -> Routing:
    import torch
    fn = "sort_by_expert"
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"tegula.kernels.{fn}: topk_ids must be a 2-D int32/int64 tensor, "
                         f"got {topk_ids.dtype} of shape {tuple(topk_ids.shape)}")
    flat = topk_ids.reshape(-1)
    if flat.numel() and flat.is_cuda:
        torch._assert_async(((flat >= 0) & (flat < num_experts)).all(),
                            f"tegula.kernels.{fn}: topk_ids outside 0 … {num_experts - 1}")
    elif flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
        raise ValueError(f"tegula.kernels.{fn}: topk_ids must lie in 0 … {num_experts - 1}")
    sorted_ids, order = torch.sort(flat, stable=True)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    bounds = torch.arange(num_experts + 1, device=flat.device, dtype=sorted_ids.dtype)
    offsets = torch.searchsorted(sorted_ids, bounds).to(torch.int32)
    return Routing(order, inverse, offsets, topk_ids.shape[1])


def scatter_rows(x: Any, routing: Routing) -> Any:
    """x's rows (T, K) in expert order: (T·k, K), row p a copy of token order[p] // k."""
    return x[routing.order // routing.k]


def gather_rows(y_sorted: Any, routing: Routing, topk_weights: Any) -> Any:
    """(T, N): token t's k expert rows `y_sorted[inverse[t·k + j]]` times its routing weights
    `topk_weights[t, j]`, added in f32 in the order j = 0 … k-1, rounded once to y's type."""
    k = routing.k
    rows = y_sorted[routing.inverse]                   # copy order: (T·k, N)
    tokens = rows.shape[0] // k
    if _is_torch(y_sorted):
        rows = rows.float().reshape(tokens, k, -1)
        weights = topk_weights.float().reshape(tokens, k, 1)
    else:
        rows = rows.astype(np.float32).reshape(tokens, k, -1)
        weights = np.asarray(topk_weights, dtype=np.float32).reshape(tokens, k, 1)
    total = rows[:, 0] * weights[:, 0]
    for j in range(1, k):                              # a fixed order: deterministic
        total = total + rows[:, j] * weights[:, j]
    if _is_torch(y_sorted):
        return total.to(y_sorted.dtype)
    return total.astype(y_sorted.dtype)


# --------------------------------------------------------------------------------------
# The kernels
# --------------------------------------------------------------------------------------

#: Work items described per block of the schedule kernel, and the most experts it takes
#: (its (BT, EP) compare tiles live in registers).
SCHEDULE_TILE = 32
MAX_EXPERTS = 255
#: The schedule's rows: for each work item (a (BM, BN) output tile), its expert, its first
#: row, the end of its expert's rows (the tile's rows are first … min(first + BM, end) - 1)
#: and its column tile. Items past the work count hold first = end = 0 (no rows).
EXPERT, FIRST_ROW, END_ROW, COLUMN_TILE = range(4)


@lru_cache(maxsize=None)
def moe_schedule_kernel() -> tg.Kernel:
    """The grouped GEMM's work list, computed on the device from the expert offsets: expert
    e has ⌈count_e / BM⌉ row tiles, numbered from `tile_start[e]` (an exclusive cumsum over
    the experts), so the W = Σ_e ⌈count_e / BM⌉ · tiles_n output tiles are dense — no tile
    without rows. Work item t is (row tile r, column tile n) of grouped order
    (`grouped_tile`, GROUP row tiles at a time, so items running together share weight
    tiles in L2); r's expert is the last expert j with `tile_start[j] ≤ r` (an expert with
    no rows shares its start with the next), found by comparing against every expert at
    once in a (BT, EP) tile (EP > E), and what r needs of it (first row, end) is the
    largest value among the experts started — offsets never decrease — so nothing needs a
    scalar loop or a gather. Block 0 writes W to `work_count`. Grid:
    cdiv(capacity, BT) blocks, capacity ≥ W (`plan_launches`)."""

    @tg.kernel(threads=128)
    def moe_schedule(expert_offsets: tg.Tensor[i32, 1], schedule: tg.Tensor[i32, 2],
                     work_count: tg.Tensor[i32, 1], tiles_n: int, BM: tg.constexpr,
                     EP: tg.constexpr, GROUP: tg.constexpr, BT: tg.constexpr = SCHEDULE_TILE):
        experts = expert_offsets.shape[0] - 1
        starts = tg.load(expert_offsets[0:experts].tile((EP,), (0,)), fill=0)
        ends = tg.load(expert_offsets[1:].tile((EP,), (0,)), fill=0)
        tiles = (ends - starts + (BM - 1)) // BM                  # 0 past the last expert
        tile_start = tg.cumsum(tiles, 0) - tiles
        row_tiles = tg.sum(tiles, 0)                              # (1,)
        t = tg.arange(BT, offset=tg.block_id(0) * BT)
        r, n = grouped_tile(t, row_tiles, tiles_n, GROUP)
        j = tg.arange(EP)
        started = (tile_start[None, :] <= r[:, None]) & (j[None, :] < experts)  # (BT, EP)
        expert = tg.sum(started.to(i32), 1) - 1
        own_start = tg.max(tg.where(started, tile_start[None, :], 0), 1)
        first = tg.max(tg.where(started, starts[None, :], 0), 1) + (r[:, None] - own_start) * BM
        end = tg.max(tg.where(started, ends[None, :], 0), 1)
        # Offsets the host did not check (torch: no sync) could claim more rows than x
        # has: the count never exceeds the list's capacity, so no GEMM block reads past it.
        count = tg.minimum(row_tiles * tiles_n, schedule.shape[1])
        work = t[:, None] < count                                 # (BT, 1)
        fields = {EXPERT: tg.maximum(expert, 0), FIRST_ROW: tg.where(work, first, 0),
                  END_ROW: tg.where(work, end, 0), COLUMN_TILE: tg.where(work, n[:, None], 0)}
        for f, value in fields.items():
            tg.copy(value[:, 0], schedule[f].tile((BT,), (tg.block_id(0),)))
        with tg.if_(tg.block_id(0) == 0):
            tg.copy(count, work_count.tile((1,), (0,)))

    return moe_schedule


def has_rows(first: Any, end: Any) -> Any:
    """1 when a work item's rows first … end - 1 hold any, else 0 (a kernel scalar)."""
    return tg.minimum(tg.maximum(end - first, 0), 1)


def expert_product(x: Any, w_e: Any, first: Any, n: Any, k_tiles: Any, sa: Any, sb: Any,
                   BM: int, BN: int, BK: int, STAGES: int) -> Any:
    """The f32 (BM, BN) tile of x[first:first + BM] @ w_e.T at column tile n through the
    shared pipeline `sa`/`sb`, over `k_tiles` K steps (trace time)."""
    ga = x[first:, :].tile((BM, BK), (0, None))      # (BM, BK, K/BK) from row `first`
    gb = w_e.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    for k in tg.pipeline(k_tiles, stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])                   # acc += x rows @ w_e.T
    return acc


def _work_item(x: Any, w: Any, schedule: Any, out: Any, t: Any, sa: Any, sb: Any,
               staging: Any, scales: tuple | None, out_t: DType, PERSISTENT: bool, BM: int,
               BN: int, BK: int, STAGES: int) -> None:
    """Work item t of the grouped GEMM (trace time), shared by the kernels below: `scales`
    is None, or the FP8 kernel's (x_scale (R, 1), w_scale (E, 1)) applied to the f32
    accumulator before the one rounding to `out_t`. A persistent block walks only the
    work count's items, all with rows, so its K loop has one trip count for every item (the
    sm_90a TMA ring then runs across items); a block per item runs none for an empty one."""
    e, first, end = schedule[EXPERT, t], schedule[FIRST_ROW, t], schedule[END_ROW, t]
    n = schedule[COLUMN_TILE, t]
    k_tiles = tg.cdiv(x.shape[1], BK)
    acc = expert_product(x, w[e], first, n, k_tiles if PERSISTENT else
                         k_tiles * has_rows(first, end), sa, sb, BM, BN, BK, STAGES)
    if scales is not None:
        x_scale, w_scale = scales
        row_scale = tg.load(x_scale[first:end, :].tile((BM, 1), (0, 0)))
        acc = acc * (row_scale * tg.load(w_scale.tile((1, 1), (e, 0))))
    result = acc.to(out_t)
    if staging is not None:                 # 16-byte stores from shared memory
        tg.copy(result, staging)
        result = staging
    tg.copy(result, out[first:end, :].tile((BM, BN), (0, n)))


def _moe_body(x: Any, w: Any, schedule: Any, work_count: Any, out: Any,
              scales: tuple | None, dtype: DType, out_t: DType, PERSISTENT: bool,
              STAGED: bool, BM: int, BN: int, BK: int, STAGES: int) -> None:
    """The grouped GEMM (trace time): one work item per block, or with PERSISTENT a
    grid-stride walk over the work count's items."""
    sa = tg.shared((BM, BK), dtype, stages=STAGES)
    sb = tg.shared((BN, BK), dtype, stages=STAGES)
    staging = tg.shared((BM, BN), out_t) if STAGED else None
    if PERSISTENT:
        for t in tg.range(tg.block_id(0), work_count[0], tg.num_programs(0)):
            _work_item(x, w, schedule, out, t, sa, sb, staging, scales, out_t, True, BM, BN,
                       BK, STAGES)
    else:
        _work_item(x, w, schedule, out, tg.block_id(0), sa, sb, staging, scales, out_t,
                   False, BM, BN, BK, STAGES)


@lru_cache(maxsize=None)
def moe_gemm_kernel(dtype: DType) -> tg.Kernel:
    """out (R, N) = x_sorted (R, K) @ w[e].T per expert e's rows, f16/bf16 with f32
    accumulation, over the work items of `schedule` (`moe_schedule_kernel`, the same BM
    and BN)."""

    @tg.kernel(threads=128)
    def moe_gemm(x: tg.Tensor[dtype], w: tg.Tensor[dtype, 3], schedule: tg.Tensor[i32, 2],
                 work_count: tg.Tensor[i32, 1], out: tg.Tensor[dtype],
                 BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 64,
                 STAGES: tg.constexpr = 4, PERSISTENT: tg.constexpr = True,
                 STAGED: tg.constexpr = False):
        _moe_body(x, w, schedule, work_count, out, None, dtype, dtype, PERSISTENT, STAGED,
                  BM, BN, BK, STAGES)

    return moe_gemm


@lru_cache(maxsize=None)
def moe_gemm_fp8_kernel(out_t: DType) -> tg.Kernel:
    """The FP8 form: e4m3 x_sorted (R, K) and w (E, N, K); out = (x @ w[e].T) · x_scale[row]
    · w_scale[e] in f32, rounded once to `out_t`."""

    @tg.kernel(threads=128)
    def moe_gemm_fp8(x: tg.Tensor[f8e4m3], w: tg.Tensor[f8e4m3, 3],
                     schedule: tg.Tensor[i32, 2], work_count: tg.Tensor[i32, 1],
                     x_scale: tg.Tensor[f32], w_scale: tg.Tensor[f32], out: tg.Tensor[out_t],
                     BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 128,
                     STAGES: tg.constexpr = 4, PERSISTENT: tg.constexpr = True,
                     STAGED: tg.constexpr = False):
        _moe_body(x, w, schedule, work_count, out, (x_scale, w_scale), f8e4m3, out_t,
                  PERSISTENT, STAGED, BM, BN, BK, STAGES)

    return moe_gemm_fp8


class LaunchPlan(NamedTuple):
    """The two launches of one grouped GEMM: the schedule kernel (grid, its int arguments,
    constexprs), the schedule's capacity (work items it can describe) and the GEMM's grid
    and constexprs."""

    schedule_grid: tuple
    schedule_scalars: tuple
    schedule_constexprs: dict
    capacity: int
    grid: tuple
    gemm_constexprs: dict


def plan_launches(rows: int, n: int, experts: int, config: dict,
                  num_sms: int) -> LaunchPlan:
    """The launches for x_sorted of `rows` rows and N = n, in `config`'s tiles (BM, BN,
    BK, STAGES, PERSISTENT; GROUP: the schedule's row tiles per group). The work count is
    known only on the device, so the schedule is sized for its largest value — each expert
    wastes less than one row tile, so Σ ⌈count_e / BM⌉ ≤ rows // BM + E — and a block per
    item launches that many blocks (those past the count run no K step), a persistent
    launch min(that, num_sms)."""
    rows, n, experts = int(rows), int(n), int(experts)
    tiles = {"PERSISTENT": True, **config}
    group = tiles.pop("GROUP", 8)
    bm, bn = tiles["BM"], tiles["BN"]
    tiles_n = tg.cdiv(n, bn)
    capacity = (rows // bm + experts) * tiles_n
    ep = max(16, 1 << (experts - 1).bit_length())
    grid = (min(capacity, num_sms),) if tiles["PERSISTENT"] else (capacity,)
    return LaunchPlan((tg.cdiv(capacity, SCHEDULE_TILE),), (tiles_n,),
                      dict(BM=bm, EP=ep, GROUP=group), capacity, grid, tiles)


def run_plan(plan: LaunchPlan, kernel: tg.Kernel, operands: tuple, expert_offsets: Any,
             scales: tuple, out: Any, launch: Any, alloc: Any, threads: int | None) -> Any:
    """The schedule launch, then the grouped GEMM's, through `launch(kernel, grid, args,
    constexprs, threads, writes_all)` (the emulator's or the GPU's); `alloc(shape)`: an
    int32 workspace. Returns what the GEMM's launch returned."""
    schedule, work_count = alloc((4, plan.capacity)), alloc((1,))
    launch(moe_schedule_kernel(), plan.schedule_grid,
           (expert_offsets, schedule, work_count, *plan.schedule_scalars),
           plan.schedule_constexprs, None, True)
    return launch(kernel, plan.grid, (*operands, schedule, work_count, *scales, out),
                  plan.gemm_constexprs, threads, False)


# --------------------------------------------------------------------------------------
# Argument checks and configuration, shared by the numpy and torch entry points
# --------------------------------------------------------------------------------------

def check_problem(fn: str, x_shape: tuple, w_shape: tuple, offsets_shape: tuple) -> tuple:
    """(rows, N, K, experts) after checking x_sorted (R, K), w (E, N, K) and
    expert_offsets (E + 1,) agree."""
    if len(x_shape) != 2:
        raise ValueError(f"tegula.kernels.{fn}: x_sorted must be 2-D (rows, K), got shape "
                         f"{tuple(x_shape)}")
    if len(w_shape) != 3:
        raise ValueError(f"tegula.kernels.{fn}: w must be 3-D (experts, N, K), got shape "
                         f"{tuple(w_shape)}")
    (rows, k), (experts, n, k2) = x_shape, w_shape
    if not 1 <= experts <= MAX_EXPERTS:
        raise ValueError(f"tegula.kernels.{fn}: w holds {experts} experts; 1 to "
                         f"{MAX_EXPERTS} are supported")
    if k != k2:
        raise ValueError(f"tegula.kernels.{fn}: x_sorted is (rows, K) and w (experts, N, K) "
                         f"with one K, got x_sorted {tuple(x_shape)} and w {tuple(w_shape)}")
    if tuple(offsets_shape) != (experts + 1,):
        raise ValueError(f"tegula.kernels.{fn}: expert_offsets must hold experts + 1 = "
                         f"{experts + 1} offsets (w has {experts} experts), got shape "
                         f"{tuple(offsets_shape)}")
    return rows, n, k, experts


def check_offsets(fn: str, offsets: np.ndarray, rows: int) -> None:
    """numpy offsets: int32, from 0, nondecreasing, ending at most at `rows`."""
    if offsets.dtype != np.int32:
        raise TypeError(f"tegula.kernels.{fn}: expert_offsets must be int32, got "
                        f"{offsets.dtype}")
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] > rows:
        raise ValueError(f"tegula.kernels.{fn}: expert_offsets = {offsets.tolist()} must "
                         f"start at 0, never decrease and end at most at {rows} (the rows "
                         f"of x_sorted)")


def default_tiles(fp8: bool, target: str) -> dict:
    """The untuned configuration: 128×128 tiles (BK 64 for 16-bit operands, 128 for e4m3:
    128 bytes a row either way, the 128-byte swizzle) in 4 stages on sm_90a, 3 on sm_80."""
    bk = 128 if fp8 else 64
    stages = 4 if target == "sm_90a" else 3
    return dict(BM=128, BN=128, BK=bk, STAGES=stages, GROUP=8)


def quantize_rows_fp8(x: Any) -> tuple[Any, Any]:
    """(x_q, x_scale): each row of x (R, K) scaled so that its largest magnitude is e4m3's
    448 and rounded to e4m3, and the (R, 1) f32 scale undoing it (x ≈ x_q · x_scale). An
    all-zero row gets scale 1. numpy: x_q holds the e4m3 values in float32."""
    if _is_torch(x):
        import torch
        amax = x.float().abs().amax(dim=1, keepdim=True)
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        return (x.float() / scale).to(torch.float8_e4m3fn), scale
    from tegula.emulate.values import round_to
    amax = np.abs(x.astype(np.float32)).max(axis=1, keepdims=True) if x.size else \
        np.zeros((x.shape[0], 1), np.float32)
    scale = np.where(amax > 0, amax / np.float32(FP8_MAX), np.float32(1)).astype(np.float32)
    return round_to(x.astype(np.float32) / scale, f8e4m3), scale


# --------------------------------------------------------------------------------------
# numpy entry point (the emulator)
# --------------------------------------------------------------------------------------

def moe_gemm_emulated(x_sorted: np.ndarray, w: np.ndarray, expert_offsets: np.ndarray,
                      w_scale: np.ndarray | None = None, dtype: DType | None = None,
                      target: str = "sm_90a", num_sms: int = 4, **tiles: int) -> np.ndarray:
    """`out[p] = x_sorted[p] @ w[e].T` for every row p of expert e (rows past
    `expert_offsets[E]` are left NaN), by the emulated kernel. x_sorted (R, K) and w
    (E, N, K) of `dtype` (f16 arrays, or float32 holding bf16 values with dtype=bf16).
    With `w_scale` (E,) f32, w holds FP8 e4m3 values (float32) dequantized as
    w[e] · w_scale[e]: x is quantized per row to e4m3 (`quantize_rows_fp8`) and the
    product of the two scales applied to the f32 accumulator; the result is in x's type.
    `num_sms`: the persistent launch's blocks (few, so each walks several work items);
    `tiles`: BM, BN, BK, STAGES, GROUP, PERSISTENT."""
    fn = "moe_gemm_emulated"
    check_array(fn, "x_sorted", x_sorted, ndim=2)
    check_array(fn, "w", w, ndim=3)
    check_array(fn, "expert_offsets", expert_offsets, ndim=1)
    rows, n, k, experts = check_problem(fn, x_sorted.shape, w.shape, expert_offsets.shape)
    check_offsets(fn, expert_offsets, rows)
    dtype = dtype or dtype_of_array(x_sorted, fn, "x_sorted")
    if dtype not in MOE_DTYPES:
        raise TypeError(f"tegula.kernels.{fn}: x_sorted has type {dtype}; supported: "
                        f"{', '.join(map(str, MOE_DTYPES))} (float32 arrays holding bf16 "
                        f"values need dtype=bf16)")
    out = poisoned((rows, n), dtype)
    if rows == 0 or n == 0:
        return out
    fp8 = w_scale is not None
    if fp8:
        w_scale = _check_w_scale(fn, w_scale, experts)
        _check_e4m3(fn, w)
    elif w.dtype != x_sorted.dtype:
        raise TypeError(f"tegula.kernels.{fn}: x_sorted ({x_sorted.dtype}) and w ({w.dtype}) "
                        f"must share one dtype (FP8 weights take w_scale)")
    plan = plan_launches(rows, n, experts, {**default_tiles(fp8, target), **tiles}, num_sms)
    if fp8:
        x_q, x_scale = quantize_rows_fp8(x_sorted)
        gemm, operands = moe_gemm_fp8_kernel(dtype), (x_q, w)
        scales = (x_scale, w_scale.reshape(experts, 1))
    else:
        gemm, operands, scales = moe_gemm_kernel(dtype), (x_sorted, w), ()

    def launch(kernel, grid, args, constexprs, threads, writes_all):
        # Rows past expert_offsets[E] are left unwritten by design: coverage is checked
        # on the schedule only.
        launch_emulated(kernel, grid, *args, target=target, num_sms=num_sms,
                        check_coverage=writes_all, **constexprs)

    run_plan(plan, gemm, operands, expert_offsets, scales, out, launch,
             lambda shape: poisoned(shape, i32), None)
    return out


def _check_w_scale(fn: str, w_scale: Any, experts: int) -> np.ndarray:
    check_array(fn, "w_scale", w_scale, ndim=1)
    if w_scale.shape != (experts,) or w_scale.dtype != np.float32:
        raise ValueError(f"tegula.kernels.{fn}: w_scale must be float32 of shape "
                         f"({experts},) (one scale per expert), got {w_scale.dtype} "
                         f"{w_scale.shape}")
    return w_scale


def _check_e4m3(fn: str, w: np.ndarray) -> None:
    from tegula.emulate.values import round_to
    if w.dtype != np.float32 or not np.array_equal(round_to(w, f8e4m3), w, equal_nan=True):
        raise ValueError(f"tegula.kernels.{fn}: with w_scale, w must be a float32 array of "
                         f"FP8 e4m3 values (quantize with quantize_experts_fp8)")


def quantize_experts_fp8(w: Any) -> tuple[Any, Any]:
    """(w_q, w_scale): each expert's weight (E, N, K) scaled so its largest magnitude is
    448, rounded to e4m3, and the (E,) f32 scales undoing it. numpy: w_q in float32."""
    if _is_torch(w):
        import torch
        amax = w.float().abs().amax(dim=(1, 2))
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        return (w.float() / scale[:, None, None]).to(torch.float8_e4m3fn), scale
    from tegula.emulate.values import round_to
    amax = np.abs(w.astype(np.float32)).max(axis=(1, 2)) if w.size else \
        np.zeros(w.shape[0], np.float32)
    scale = np.where(amax > 0, amax / np.float32(FP8_MAX), np.float32(1)).astype(np.float32)
    return round_to(w.astype(np.float32) / scale[:, None, None], f8e4m3), scale


# --------------------------------------------------------------------------------------
# torch entry point (CUDA): checks, autotuned configuration, launch
# --------------------------------------------------------------------------------------

def column_tile(n: int) -> int:
    """The widest column tile, a multiple of 16 from 256 down to 128, that divides N (else
    256): the last column tile wastes no MMA. The 64-expert model's N = 1408 gets 176,
    where 256 wasted a ninth of the last column's work."""
    return next((bn for bn in range(256, 127, -16) if n % bn == 0), 256)


def moe_candidates(rows: int, experts: int, fp8: bool, n: int = 0) -> list[dict]:
    """Configurations worth timing, the untuned default first: 128-row tiles with 256 or
    128 columns on two consumer warpgroups (threads=256 on sm_90a), the epilogue staged
    through shared memory (16-byte stores: 1.00x dense cuBLAS at Mixtral's up projection on
    an H100 where direct 4-byte stores reached 0.88x), and 64-row tiles first when the
    experts average under 128 rows (a 128-row tile would be mostly masked). Where 256 does
    not divide N, a `column_tile` wide tile comes first. The schedule's bands (GROUP) are
    an average expert's row tiles, so the items running together read one expert's weight
    tiles while they are in L2 (64 experts top-6 on an H100, session 10: 128x176 tiles
    0.73x dense in bands of 8 row tiles, 0.76x in bands of 3, one expert's); where that
    column tile is at most 176 wide, 192-row tiles on three consumer warpgroups too."""
    bk = 128 if fp8 else 64

    def group(bm: int) -> int:
        return max(1, round(rows / max(experts, 1) / bm))

    options = [dict(BM=128, BN=256, BK=bk, STAGES=3, GROUP=group(128), threads=256,
                    STAGED=True),
               dict(BM=128, BN=128, BK=bk, STAGES=4, GROUP=group(128), threads=256,
                    STAGED=True),
               dict(BM=128, BN=256, BK=bk, STAGES=4, GROUP=group(128), threads=256),
               dict(BM=128, BN=128, BK=bk, STAGES=4, GROUP=group(128))]
    if column_tile(n) != 256:
        options.insert(0, dict(BM=128, BN=column_tile(n), BK=bk, STAGES=4, GROUP=group(128),
                               threads=256, STAGED=True))
    if column_tile(n) <= 176:   # 192 rows on three consumer warpgroups (fits 3 stages)
        options.insert(1, dict(BM=192, BN=column_tile(n), BK=bk, STAGES=3, GROUP=group(192),
                               threads=384, STAGED=True))
    if rows < 128 * experts:
        options = [dict(BM=64, BN=128, BK=bk, STAGES=4, GROUP=group(64), STAGED=True),
                   dict(BM=64, BN=256, BK=bk, STAGES=3, GROUP=group(64), STAGED=True)] + \
            options[:2]
    return options


def check_moe_gemm(fn: str, x_sorted: Any, w: Any, expert_offsets: Any,
                   w_scale: Any = None) -> tuple[DType, tuple[int, int, int, int]]:
    """The torch entry point's argument checks but the device (also the custom op's fake
    implementation's): (x's tegula dtype, (rows, N, K, experts))."""
    from tegula.kernels.api import _check_tensor
    dtype = _check_tensor(fn, "x_sorted", x_sorted, {"float16": f16, "bfloat16": bf16},
                          ndim=2)
    fp8 = w_scale is not None
    w_dtypes = {"float8_e4m3fn": f8e4m3} if fp8 else {str(x_sorted.dtype)[6:]: dtype}
    _check_tensor(fn, "w", w, w_dtypes, ndim=3)
    _check_tensor(fn, "expert_offsets", expert_offsets, {"int32": i32}, ndim=1)
    problem = check_problem(fn, tuple(x_sorted.shape), tuple(w.shape),
                            tuple(expert_offsets.shape))
    if fp8:
        _check_tensor(fn, "w_scale", w_scale, {"float32": f32}, ndim=1)
        if tuple(w_scale.shape) != (problem[3],):
            raise ValueError(f"tegula.kernels.{fn}: w_scale must have one scale per expert, "
                             f"shape ({problem[3]},), got {tuple(w_scale.shape)}")
    return dtype, problem


def moe_gemm(x_sorted: Any, w: Any, expert_offsets: Any, w_scale: Any = None, *,
             out: Any = None, config: dict | None = None) -> Any:
    """`out[p] = x_sorted[p] @ w[e].T` for every row p of expert e: x_sorted (R, K) f16/bf16
    (rows sorted by expert: `scatter_rows`), w (E, N, K) of the same dtype, or FP8
    (`torch.float8_e4m3fn`) with `w_scale` (E,) f32 (then x is quantized per row to e4m3
    first and the product rescaled), `expert_offsets` (E + 1,) int32 on the same device
    (from 0, nondecreasing, at most R: not checked, as that would read them back to the
    host). Returns (R, N) in x's dtype; rows past `expert_offsets[E]` are left unwritten.
    `config`: one configuration (as `moe_candidates` gives) instead of the autotuner's."""
    import torch

    from tegula.kernels.api import _check_cuda, _check_out, _launch, _tune_and_run
    from tegula.runtime.autotune import Config
    fn = "moe_gemm"
    dtype, (rows, n, k, experts) = check_moe_gemm(fn, x_sorted, w, expert_offsets, w_scale)
    fp8 = w_scale is not None
    tensors = {"x_sorted": x_sorted, "w": w, "expert_offsets": expert_offsets}
    _check_cuda(fn, dict(tensors, w_scale=w_scale) if fp8 else tensors)
    if out is None:
        out = torch.empty((rows, n), dtype=x_sorted.dtype, device=x_sorted.device)
    else:
        _check_out(fn, out, (rows, n), x_sorted)
    if rows == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    x, w, offsets = x_sorted.contiguous(), w.contiguous(), expert_offsets.contiguous()
    if fp8:
        x, x_scale = quantize_rows_fp8(x)
        scales = (x_scale, w_scale.contiguous().view(experts, 1))
        kernel = moe_gemm_fp8_kernel(dtype)
    else:
        scales, kernel = (), moe_gemm_kernel(dtype)
    # CPU tensors reach here only through the test suite's emulated launches.
    sms = (torch.cuda.get_device_properties(x.device).multi_processor_count
           if x.device.type == "cuda" else 4)

    def launch(which, grid, args, constexprs, threads, writes_all):
        return _launch(which, grid, args, constexprs, threads)

    def run(chosen: Config) -> Any:
        plan = plan_launches(rows, n, experts, chosen.kwargs, sms)
        return run_plan(plan, kernel, (x, w), offsets, scales, out, launch,
                        lambda shape: torch.empty(shape, dtype=torch.int32, device=x.device),
                        chosen.threads)

    if config is not None:
        run(Config.of(config))
        return out
    configs = tuple(Config.of(c) for c in moe_candidates(rows, experts, fp8, n))
    _tune_and_run(fn, x.device.index, configs, (rows, n, k, experts),
                  f"{dtype}/{'fp8' if fp8 else 'same'}", run)
    return out



__all__ = ["Routing", "route", "sort_by_expert", "scatter_rows", "gather_rows",
           "moe_schedule_kernel", "moe_gemm_kernel", "moe_gemm_fp8_kernel", "plan_launches",
           "run_plan", "moe_gemm_emulated", "moe_gemm", "check_moe_gemm", "moe_candidates",
           "column_tile",
           "quantize_rows_fp8", "quantize_experts_fp8", "MOE_DTYPES", "MAX_EXPERTS"]
