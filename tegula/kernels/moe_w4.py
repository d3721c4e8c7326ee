"""MoE grouped GEMM with 4-bit weights (W4A16): `out[p] = x_sorted[p] @ dequant(w[e]).T` for
every row p of expert e, with each expert's (N, K) weight quantized as `tegula.kernels.quant`
quantizes one (AWQ/GPTQ style: 4-bit values per group of `group_size` along K, a scale and
optionally a zero point per group), f16/bf16 activations, f32 accumulation.

The work list is `tegula.kernels.moe`'s (`moe_schedule_kernel`: the experts' offsets read
on the device, one item per output tile with rows); each block takes one item and runs the
W4A16 GEMM's K loop on it (each k-step's (BN, BK) weight tile is loaded packed,
dequantized in registers — `quant.dequantize`, w·s − z·s — stored to a shared tile of the
activations' type and fed with the pipelined activation tile to `tg.gemm`). One block per
item, not persistent (the dequantized tile's shared buffer is written in the loop body, so
the sm_90a TMA ring does not run across items); items past the work count run no K step.

`SWAPPED=True` (`moe_gemm_w4_swapped_kernel`, session 12) computes outᵀ tiles instead, as
`quant.w4a16_swapped_kernel` does: the dequantized weights are the MMA's register operand
and the token rows the shared one, so the loop body is one TMA copy and one gemm, the
kernel is persistent (about one block per SM walking the items) and on sm_90a one TMA ring
of token tiles runs across a block's items. The schedule's row tile (BM) is then the
token tile BT.

Entry points: `moe_gemm_w4a16_emulated` (numpy, unpacked weights, the CI one),
`moe_gemm_w4a16` (torch, packed weights), `quantize_experts_w4` (each expert through
`quant.quantize_w4`).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

import tegula as tg
from tegula import f32, i32, u4
from tegula.dtypes import DType, bf16, f16
from tegula.kernels.common import check_array, dtype_of_array, poisoned
from tegula.kernels.moe import (COLUMN_TILE, END_ROW, EXPERT, FIRST_ROW, check_offsets,
                                check_problem, has_rows, plan_launches, run_plan)
from tegula.kernels.moe_w4_fragment import (expert_words, moe_gemm_w4_fragment_kernel,
                                            pack_experts_fragments)
from tegula.kernels.quant import (GROUP_SIZES, SYMMETRIC_ZERO, dequantize, prepack,
                                  quantize_w4)
from tegula.kernels.quant_fragment import FRAGMENT_ROWS, fragment_shape, zeros_are_integers

W4_DTYPES = (f16, bf16)


@lru_cache(maxsize=None)
def moe_gemm_w4_kernel(dtype: DType, has_zeros: bool) -> tg.Kernel:
    """out (R, N) = x_sorted (R, K) @ dequant(w[e]).T per expert e's rows: w (E, N, K) u4
    (packed two a byte), scales and zeros (E, N, K / G) of `dtype` (zeros unread without
    `has_zeros`: zero point 8). BK divides the group size G. One block per schedule item."""

    @tg.kernel(threads=128)
    def moe_gemm_w4(x: tg.Tensor[dtype], w: tg.Tensor[u4, 3], scales: tg.Tensor[dtype, 3],
                    zeros: tg.Tensor[dtype, 3], schedule: tg.Tensor[i32, 2],
                    work_count: tg.Tensor[i32, 1], out: tg.Tensor[dtype],
                    G: tg.constexpr = 128, BM: tg.constexpr = 64, BN: tg.constexpr = 64,
                    BK: tg.constexpr = 64, STAGES: tg.constexpr = 3):
        t = tg.block_id(0)
        e, first, end = schedule[EXPERT, t], schedule[FIRST_ROW, t], schedule[END_ROW, t]
        n = schedule[COLUMN_TILE, t]
        ga = x[first:, :].tile((BM, BK), (0, None))
        gw = w[e].tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), f32)
        sa = tg.shared((BM, BK), dtype, stages=STAGES)
        sw = tg.shared((BN, BK), dtype)
        for k in tg.pipeline(ga.shape[2] * has_rows(first, end), stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            weights = dequantize(tg.load(gw[:, :, k]), scales[e],
                                 zeros[e] if has_zeros else None, n, k // (G // BK), (BN, 1))
            tg.copy(weights.to(dtype), sw)
            tg.gemm(acc, sa[k], sw)                  # acc += x rows @ dequant(w[e]).T
        tg.copy(acc.to(dtype), out[first:end, :].tile((BM, BN), (0, n)))

    return moe_gemm_w4


def _group_loads(scales_e: Any, zeros_e: Any, n: Any, group: Any, BN: int) -> tuple:
    """The (BN, 1) scales (and zero points, if any) of weight rows n·BN… at group `group`,
    as loaded (past K: zeros): carried to the next k-step unconverted, so that nothing
    waits for the loads in the step that issues them."""
    scale = tg.load(scales_e.tile((BN, 1), (n, group)))
    return (scale,) if zeros_e is None else (scale, tg.load(zeros_e.tile((BN, 1), (n, group))))


def _dequantize_with(packed: Any, loads: tuple, BN: int) -> Any:
    """`quant.dequantize`'s w·s − z·s in f32 from `_group_loads`' tiles."""
    scale = loads[0].to(f32)
    zero = loads[1].to(f32) if len(loads) > 1 else tg.full((BN, 1), SYMMETRIC_ZERO, f32)
    return packed.to(f32) * scale - zero * scale


def _swapped_item(x: Any, w: Any, scales: Any, zeros: Any, schedule: Any, out: Any, t: Any,
                  sa: Any, G: int, BN: int, BT: int, BK: int, STAGES: int,
                  PERSISTENT: bool, AHEAD: bool) -> None:
    """Work item t of the swapped W4A16 grouped GEMM (trace time): outᵀ's (BN, BT) tile =
    dequant(w[e]) rows n·BN… @ x rows first… .T, the dequantized weights the MMA's
    register A operand (no 16-bit weight goes through shared memory), the BT token rows
    the shared B operand in a STAGES-deep ring (TMA on sm_90a), the packed weights loaded
    one k-step ahead of their use, and with AHEAD their group's scales and zeros too (else
    loaded in the step that uses them, their latency paid every step)."""
    e, first, end = schedule[EXPERT, t], schedule[FIRST_ROW, t], schedule[END_ROW, t]
    n = schedule[COLUMN_TILE, t]
    ga = x[first:, :].tile((BT, BK), (0, None))
    gw = w[e].tile((BN, BK), (n, None))
    steps = ga.shape[2] if PERSISTENT else ga.shape[2] * has_rows(first, end)
    z_e = zeros[e] if zeros is not None else None
    acc = tg.zeros((BN, BT), f32)                       # outᵀ: weight rows x tokens
    ahead = tg.load(gw[:, :, 0])
    if AHEAD:
        loads_ahead = _group_loads(scales[e], z_e, n, 0, BN)
    for k in tg.pipeline(steps, stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        packed = ahead
        ahead = tg.load(gw[:, :, k + 1])                # past K: masked, never used
        if AHEAD:
            loads = loads_ahead
            loads_ahead = _group_loads(scales[e], z_e, n, (k + 1) // (G // BK), BN)
            weights = _dequantize_with(packed, loads, BN)
        else:
            weights = dequantize(packed, scales[e], z_e, n, k // (G // BK), (BN, 1))
        tg.gemm(acc, weights.to(x.dtype), sa[k])        # acc += w @ x rows.T
    # Rearranged through shared memory: out's rows are tokens, 16-byte stores along N.
    tg.copy(tg.rearrange(acc.to(x.dtype)), out[first:end, :].T.tile((BN, BT), (n, 0)))


@lru_cache(maxsize=None)
def moe_gemm_w4_swapped_kernel(dtype: DType, has_zeros: bool) -> tg.Kernel:
    """The W4A16 grouped GEMM the other way round (`quant.w4a16_swapped_kernel`'s
    orientation, CUTLASS's "Machete"): outᵀ tiles of BN weight rows by BT tokens, so each
    weight is dequantized once per BT tokens into the MMA's register operand. With
    PERSISTENT a block walks the work count's items (`moe.plan_launches`: about one block
    per SM), and on sm_90a one TMA ring of token tiles runs across its items. The
    schedule's row tile (its BM) is BT."""

    @tg.kernel(threads=128)
    def moe_gemm_w4_swapped(x: tg.Tensor[dtype], w: tg.Tensor[u4, 3],
                            scales: tg.Tensor[dtype, 3], zeros: tg.Tensor[dtype, 3],
                            schedule: tg.Tensor[i32, 2], work_count: tg.Tensor[i32, 1],
                            out: tg.Tensor[dtype], G: tg.constexpr = 128,
                            BN: tg.constexpr = 128, BT: tg.constexpr = 128,
                            BK: tg.constexpr = 64, STAGES: tg.constexpr = 4,
                            PERSISTENT: tg.constexpr = True, AHEAD: tg.constexpr = 1):
        sa = tg.shared((BT, BK), dtype, stages=STAGES)
        z = zeros if has_zeros else None
        if PERSISTENT:
            for t in tg.range(tg.block_id(0), work_count[0], tg.num_programs(0)):
                _swapped_item(x, w, scales, z, schedule, out, t, sa, G, BN, BT, BK, STAGES,
                              True, AHEAD)
        else:
            _swapped_item(x, w, scales, z, schedule, out, tg.block_id(0), sa, G, BN, BT, BK,
                          STAGES, False, AHEAD)

    return moe_gemm_w4_swapped


def default_tiles(group_size: int) -> dict:
    """64×64 tiles, BK 64 (it must divide the group), 3 activation stages; one block per
    item (PERSISTENT=False: the schedule's plan then launches its capacity)."""
    return dict(BM=64, BN=64, BK=min(64, group_size), STAGES=3, GROUP=8, PERSISTENT=False)


def _check_w4(fn: str, x_shape: tuple, w_shape: tuple, scales: Any, zeros: Any,
              offsets_shape: tuple, group_size: int) -> tuple:
    """(rows, N, K, experts) after checking the W4A16 operands agree (w_shape unpacked)."""
    if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise ValueError(f"tegula.kernels.{fn}: group_size must be one of {GROUP_SIZES}, "
                         f"got {group_size!r}")
    rows, n, k, experts = check_problem(fn, x_shape, w_shape, offsets_shape)
    if k % group_size:
        raise ValueError(f"tegula.kernels.{fn}: K = {k} is not a multiple of group_size = "
                         f"{group_size}")
    want = (experts, n, k // group_size)
    for name, t in (("scales", scales), ("zeros", zeros)):
        if t is not None and tuple(t.shape) != want:
            raise ValueError(f"tegula.kernels.{fn}: {name} must be (experts, N, K / "
                             f"group_size) = {want}, got {tuple(t.shape)}")
    return rows, n, k, experts


def moe_gemm_w4a16_emulated(x_sorted: np.ndarray, w_q: np.ndarray, scales: np.ndarray,
                            zeros: np.ndarray | None, group_size: int,
                            expert_offsets: np.ndarray, dtype: DType | None = None,
                            target: str = "sm_90a", num_sms: int = 4,
                            **tiles: int) -> np.ndarray:
    """The W4A16 grouped GEMM in the emulator with UNPACKED weights, as
    `w4a16_gemm_emulated`: x_sorted (R, K) f16 (or float32 holding bf16 values with
    dtype=bf16), w_q (E, N, K) uint8 values 0..15, scales and zeros (E, N, K / group_size)
    (zeros None: zero point 8), expert_offsets (E + 1,) int32. Rows past
    expert_offsets[E] are left NaN."""
    fn = "moe_gemm_w4a16_emulated"
    check_array(fn, "x_sorted", x_sorted, ndim=2)
    check_array(fn, "w_q", w_q, ndim=3)
    check_array(fn, "scales", scales, ndim=3)
    check_array(fn, "expert_offsets", expert_offsets, ndim=1)
    if zeros is not None:
        check_array(fn, "zeros", zeros, ndim=3)
    rows, n, k, experts = _check_w4(fn, x_sorted.shape, w_q.shape, scales, zeros,
                                    expert_offsets.shape, group_size)
    check_offsets(fn, expert_offsets, rows)
    dtype = dtype or dtype_of_array(x_sorted, fn, "x_sorted")
    if dtype not in W4_DTYPES:
        raise TypeError(f"tegula.kernels.{fn}: x_sorted must be f16 or bf16 (float32 arrays "
                        f"with dtype=bf16), got {dtype}")
    if w_q.dtype != np.uint8 or (w_q.size and int(w_q.max()) > 15):
        raise ValueError(f"tegula.kernels.{fn}: w_q must be uint8 values 0..15 (unpacked)")
    out = poisoned((rows, n), dtype)
    if rows == 0 or n == 0:
        return out
    storage = x_sorted.dtype
    zeros_arg = (np.ascontiguousarray(zeros, dtype=storage) if zeros is not None
                 else np.zeros((1, 1, 1), dtype=storage))  # unread: the kernel uses 8
    full_tiles = _w4_tiles(fn, group_size, tiles, bool(tiles.get("FRAGMENT")))
    plan = plan_launches(rows, n, experts, full_tiles, num_sms)

    def launch(kernel, grid, args, constexprs, threads, writes_all):
        from tegula.kernels.common import launch_emulated
        extra = {} if threads is None else {"threads": threads}
        launch_emulated(kernel, grid, *args, target=target, check_coverage=writes_all,
                        num_sms=num_sms, **constexprs, **extra)

    weights = prepack(w_q)
    if full_tiles.get("FRAGMENT"):
        weights = expert_words(pack_experts_fragments(weights))
    operands = (np.ascontiguousarray(x_sorted), weights,
                np.ascontiguousarray(scales, dtype=storage), zeros_arg)
    plan, kernel, threads = _w4_plan(plan, dtype, zeros is not None, group_size)
    run_plan(plan, kernel, operands, expert_offsets, (), out, launch,
             lambda shape: poisoned(shape, i32), threads)
    return out


def _check_chunk(fn: str, bk: int, group_size: int) -> None:
    if group_size % bk:
        raise ValueError(f"tegula.kernels.{fn}: BK = {bk} must divide group_size = "
                         f"{group_size} (a k-step reads one scale per row)")


def _w4_tiles(fn: str, group_size: int, config: dict, fragment: bool) -> dict:
    """The tiles of a launch: `config` over the defaults. FRAGMENT (fragment-ordered
    weights, `moe_w4_fragment`): 128-token tiles (BM), WG=3 warpgroups of 64 weight rows
    (BN = 64·WG, threads = 128·WG), KS=2 stored blocks a step, 2 stages, the words into
    registers (WSMEM=0), two steps an iteration with two register operands (PAIRS=1: two
    token rings, so 256-token tiles or 4 stages no longer fit shared memory; ask for
    PAIRS=0 there), persistent (H100, session 13 round 2, balanced Mixtral up / down /
    64-expert top-6, x dense bf16 in one process: 0.74 / 0.78 / 0.69x; two warpgroups and
    3 stages 0.68 / 0.73 / 0.67x; PAIRS=0, session 12's default, 0.58 / 0.62 / 0.56x),
    each item's first weights loaded during the previous item's epilogue (AHEAD=1;
    session 14 round 1, H100, the 64-expert geometry at K = 1024 / 2048 / 8192: 0.55 /
    0.69 / 0.73x against 0.55 / 0.67 / 0.71x without, one process; round 2, H200, the
    three cases: level, 0.80 / 0.81 / 0.71x either way)."""
    if not fragment:
        tiles = {**default_tiles(group_size), **config}
        _check_chunk(fn, tiles["BK"], group_size)
        return tiles
    tiles = {**dict(BM=128, WG=3, KS=2, STAGES=2, WSMEM=0, PAIRS=1, GROUP=8,
                    PERSISTENT=True, AHEAD=1),
             **config,
             "FRAGMENT": True}
    tiles["BN"] = FRAGMENT_ROWS * tiles["WG"]
    tiles.setdefault("threads", 128 * tiles["WG"])
    return tiles


def _w4_plan(plan, dtype: DType, has_zeros: bool, group_size: int) -> tuple:
    """(the plan with the W4A16 kernel's constexprs — G added, `threads` taken out —, the
    kernel, its threads or None). FRAGMENT: `moe_w4_fragment`'s kernel; SWAPPED:
    `moe_gemm_w4_swapped_kernel`; both take the schedule's BM as their token tile BT.
    Else `moe_gemm_w4_kernel`, which must have PERSISTENT=False."""
    tiles = dict(plan.gemm_constexprs)
    threads = tiles.pop("threads", None)
    if tiles.pop("FRAGMENT", False):
        tiles["BT"] = tiles.pop("BM")
        del tiles["BN"]
        return plan._replace(gemm_constexprs=dict(tiles, G=group_size)), \
            moe_gemm_w4_fragment_kernel(dtype, has_zeros), threads
    if tiles.pop("SWAPPED", False):
        tiles["BT"] = tiles.pop("BM")
        return plan._replace(gemm_constexprs=dict(tiles, G=group_size)), \
            moe_gemm_w4_swapped_kernel(dtype, has_zeros), threads
    if tiles.pop("PERSISTENT"):
        raise ValueError("tegula.kernels.moe_w4: the W4A16 grouped GEMM with the weights as "
                         "the MMA's shared operand runs one block per work item "
                         "(PERSISTENT=False; SWAPPED=True walks the items persistently)")
    return plan._replace(gemm_constexprs=dict(tiles, G=group_size)), \
        moe_gemm_w4_kernel(dtype, has_zeros), threads


def quantize_experts_w4(w: Any, group_size: int = 128, zero_point: bool = True
                        ) -> tuple[Any, Any, Any]:
    """`quant.quantize_w4` on each expert of w (E, N, K) (numpy or torch): (packed
    (E, N, K/2) uint8, scales (E, N, K/G), zeros (E, N, K/G) or None)."""
    parts = [quantize_w4(w[e], group_size, zero_point) for e in range(w.shape[0])]
    stack = np.stack if isinstance(w, np.ndarray) else __import__("torch").stack
    packed, scales = stack([p[0] for p in parts]), stack([p[1] for p in parts])
    zeros = stack([p[2] for p in parts]) if zero_point else None
    return packed, scales, zeros


def check_w4_args(fn: str, x_sorted: Any, packed: Any, scales: Any, zeros: Any,
                  group_size: int, expert_offsets: Any) -> tuple[DType, tuple]:
    """(x's tegula dtype, (rows, N, K, experts)) after checking `moe_gemm_w4a16`'s torch
    arguments (types, ranks, dtypes, shapes; not the device): the entry point's checks and
    its torch op's fake's."""
    from tegula.kernels.api import _check_tensor
    dtype = _check_tensor(fn, "x_sorted", x_sorted, {"float16": f16, "bfloat16": bf16},
                          ndim=2)
    fragment = getattr(packed, "dim", lambda: 3)() == 7    # `pack_experts_fragments`
    _check_tensor(fn, "packed", packed, {"uint8": u4}, ndim=7 if fragment else 3)
    same = {str(x_sorted.dtype)[6:]: dtype}
    _check_tensor(fn, "scales", scales, same, ndim=3)
    if zeros is not None:
        _check_tensor(fn, "zeros", zeros, same, ndim=3)
    _check_tensor(fn, "expert_offsets", expert_offsets, {"int32": i32}, ndim=1)
    unpacked = tuple(packed.shape[:-1]) + (2 * packed.shape[-1],)
    if fragment:    # N from the scales, K from x; the blocks must be theirs
        unpacked = (packed.shape[0], scales.shape[1], x_sorted.shape[1])
        want = (unpacked[0],) + fragment_shape(*unpacked[1:])[:2] + (4, 8, 4, 16)
        if tuple(packed.shape) != want:
            raise ValueError(f"tegula.kernels.{fn}: fragment-ordered packed must be (experts, "
                             f"⌈N/64⌉, ⌈K/64⌉, 4, 8, 4, 16) = {want} for N = {unpacked[1]} "
                             f"(scales) and K = {unpacked[2]} (x_sorted), got "
                             f"{tuple(packed.shape)}")
    return dtype, _check_w4(fn, tuple(x_sorted.shape), unpacked, scales, zeros,
                            tuple(expert_offsets.shape), group_size)


def moe_gemm_w4a16(x_sorted: Any, packed: Any, scales: Any, zeros: Any, group_size: int,
                   expert_offsets: Any, *, config: dict | None = None,
                   out: Any = None) -> Any:
    """The W4A16 grouped GEMM on torch CUDA tensors: x_sorted (R, K) f16/bf16, packed
    (E, N, K/2) uint8 (`quantize_experts_w4`), scales and zeros (E, N, K/G) of x's dtype
    (zeros None: zero point 8), expert_offsets (E + 1,) int32 on the device (not checked:
    no host sync). Returns (R, N) (`out` when given); rows past expert_offsets[E] are left
    unwritten. `packed` may be fragment-ordered instead, (E, ⌈N/64⌉, ⌈K/64⌉, 4, 8, 4, 16)
    (`moe_w4_fragment.pack_experts_fragments`, once per weight): the fragment kernel,
    16-byte weight loads and paired 16-bit dequantization. `config`: tiles (BM, BN, BK,
    STAGES, GROUP, PERSISTENT, SWAPPED, threads; FRAGMENT with WG, KS) instead of the
    defaults."""
    import torch

    from tegula.kernels.api import _check_cuda, _check_out, _launch
    fn = "moe_gemm_w4a16"
    dtype, (rows, n, k, experts) = check_w4_args(fn, x_sorted, packed, scales, zeros,
                                                 group_size, expert_offsets)
    tensors = {"x_sorted": x_sorted, "packed": packed, "scales": scales,
               "expert_offsets": expert_offsets, **({} if zeros is None else {"zeros": zeros})}
    _check_cuda(fn, tensors)
    if out is None:
        out = torch.empty((rows, n), dtype=x_sorted.dtype, device=x_sorted.device)
    else:
        _check_out(fn, out, (rows, n), x_sorted)
    if rows == 0 or n == 0:
        return out
    # CPU tensors reach here only through the test suite's emulated launches.
    sms = (torch.cuda.get_device_properties(x_sorted.device).multi_processor_count
           if x_sorted.device.type == "cuda" else 4)
    fragment = packed.dim() == 7 or bool((config or {}).get("FRAGMENT"))
    tiles = _w4_tiles(fn, group_size, config or {}, fragment)
    if fragment and zeros is not None and zeros_are_integers(zeros):
        tiles.setdefault("INTEGER_ZEROS", 1)        # no residue step (`dequantize_in`)
    plan = plan_launches(rows, n, experts, tiles, sms)
    zeros_arg = zeros.contiguous() if zeros is not None else scales.new_zeros((1, 1, 1))
    weights = packed.contiguous()
    if fragment:    # pre-packed (7-D) or, a copy each call, packed here
        weights = expert_words(weights if weights.dim() == 7 else
                               pack_experts_fragments(weights))
    operands = (x_sorted.contiguous(), weights, scales.contiguous(), zeros_arg)

    def launch(kernel, grid, args, constexprs, threads, writes_all):
        return _launch(kernel, grid, args, constexprs, threads)

    plan, kernel, threads = _w4_plan(plan, dtype, zeros is not None, group_size)
    run_plan(plan, kernel, operands, expert_offsets.contiguous(), (), out, launch,
             lambda shape: torch.empty(shape, dtype=torch.int32, device=x_sorted.device),
             threads)
    return out


__all__ = ["moe_gemm_w4_kernel", "moe_gemm_w4a16_emulated", "moe_gemm_w4a16",
           "check_w4_args", "quantize_experts_w4", "W4_DTYPES"]
