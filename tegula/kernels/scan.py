"""Mamba's selective scan (forward), chunked over the sequence with `tg.scan`.

The formulas are those of Mamba's `selective_scan_ref` (mamba_ssm/ops/selective_scan_interface.py),
in its "variable B and C, no groups" form:

    delta = softplus(delta + delta_bias)        (each step optional; softplus: x > 20 → x)
    h[b, d, n] ← exp(delta[b,d,t] · A[d,n]) · h[b, d, n] + delta[b,d,t] · B[b,n,t] · u[b,d,t]
    y[b, d, t] = Σ_n C[b,n,t] · h[b, d, n]      (h after step t; h starts at 0)
    out = (y + D[d] · u) · silu(z)              (D and z optional)

with u, delta, z, out: (batch, dim, L); A: (dim, dstate); B, C: (batch, dstate, L); D,
delta_bias: (dim,). Everything is computed in f32 (u, delta, B, C, z may be f32, f16 or
bf16; A, D, delta_bias are read as f32) and `out` has u's type, as in the reference.
Not supported: complex A, B or C of shape (dim, dstate) (fixed over time), grouped B/C
(rank 4), returning the last state.

Two kernels: the entry points run the split-state kernel of
`tegula.kernels.scan_split` by default (each channel's states split over threads that walk
the steps in order; faster on an H100, see `DEFAULT_SPLIT`; 16-bit inputs with fewer blocks than SMs excepted, see
`SPLIT_MIN_BLOCKS_16BIT`), and this module's lane-scan kernel with `SPLIT=False` or any
of its options named.

The lane-scan kernel: one block per (batch, BD channels), a `tg.range` over chunks of BL
time steps.
A chunk is a (BD, BL) tile laid out for `tg.scan` along the steps (`synth/scan.py`: with
BD = 8 and BL = 256 on 128 threads, 16 lanes per channel, 16 consecutive steps per
thread, loads of 16 bytes coalesced along the sequence). The recurrence
h_t = a_t·h_{t-1} + b_t is a scan of the pairs (a, b) under the (associative, not
commutative) composition `(a1, b1) ∘ (a2, b2) = (a1·a2, a2·b1 + b2)`. For each of the
dstate states n the kernel scans
(exp2(delta·A[:, n]·log2 e), delta·u·B[n]) from the state carried in from the last chunk
(`tg.scan(..., initial=)`, whose carry is the next chunk's initial) and adds h·C[n] to y,
so the sum over states stays in each thread's registers (as in Mamba's CUDA kernel, where
a thread owns a run of steps and loops over the states; there a block scan joins the
threads, here shuffles across a channel's lanes). u and delta are read once per chunk
(optionally one chunk ahead: PREFETCH). By default (STATE_SMEM, BC_PIPE) the states are a
run-time loop over groups of two, their carries kept in shared memory, and each group's
B[n] and C[n] rows are copied into a shared ring (cp.async) one group ahead and read
without masks; `_states_unrolled` is the older scheme (every state unrolled, carried in
registers, B/C rows from L1/L2), kept as an option (STATE_SMEM=False).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, bf16, f16
from tegula.kernels.common import check_array, dtype_of_array, launch_emulated, poisoned
from tegula.layout.cute import Layout
from tegula.synth.scan import carry_layout

SELECTIVE_SCAN_DTYPES = (f32, f16, bf16)
#: Softplus's linear region, as torch.nn.functional.softplus (beta 1, threshold 20).
SOFTPLUS_THRESHOLD = 20.0
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: Whether u and delta are loaded a chunk ahead by default: no, it measured 12% slower on
#: an H100 (docs/performance.md, selective scan).
DEFAULT_PREFETCH = False


def _compose(earlier, later):
    """(a1, b1) then (a2, b2): h -> a2·(a1·h + b1) + b2."""
    return earlier[0] * later[0], later[0] * earlier[1] + later[1]


def _compose_each(count: int):
    """`_compose` on each of `count` independent (a, b) pairs, flattened in one tuple: one
    tuple scan runs several states' recurrences through the same shuffle rounds."""
    def combine(earlier, later):
        pairs = ()
        for i in range(0, 2 * count, 2):
            pairs += _compose(earlier[i:i + 2], later[i:i + 2])
        return pairs
    return combine


def _states_unrolled(B, C, b, k, dt, dtu, y, a2: list, h: list, one, BL: int, GROUP: int,
                     BC_AHEAD: bool):
    """Every state of one chunk, unrolled at trace time: GROUP states per tuple scan (their
    recurrences share the shuffle rounds); with BC_AHEAD the next group's B and C rows load
    before this group's scan. Rebinds h[n] to each state's carry; returns y + Σ_n h_n·C_n."""
    N = len(h)
    groups = [range(n0, min(n0 + GROUP, N)) for n0 in range(0, N, GROUP)]

    def rows_of(group):
        return [(tg.load(B[b].tile((1, BL), (n, k))), tg.load(C[b].tile((1, BL), (n, k))))
                for n in group]

    ahead = rows_of(groups[0])
    for g, group in enumerate(groups):
        rows = ahead if ahead is not None else rows_of(group)
        ahead = rows_of(groups[g + 1]) if BC_AHEAD and g + 1 < len(groups) else None
        pairs, starts = (), ()
        for n, (bn, _) in zip(group, rows):
            pairs += (tg.exp2(dt * a2[n]), dtu * bn.to(f32))
            starts += (one, h[n])
        states, carries = tg.scan(pairs, 1, _compose_each(len(group)), initial=starts)
        for j, (n, (_, cn)) in enumerate(zip(group, rows)):
            h[n] = carries[2 * j + 1]
            y = y + states[2 * j + 1] * cn.to(f32)
    return y


def _states_looped(A, B, C, b, block, k, dt, dtu, y, states, one, BD: int, BL: int, N: int):
    """Every state of one chunk in a run-time loop (a loop body of one state, where the
    unrolled states are thousands of instructions; measured no faster, see
    `_DEFAULT_TILES`): the states live in `states` (BD, N), each thread holding its
    channel's row, read and written at column n by a select. Returns (y + Σ_n h_n·C_n,
    the updated states)."""
    column = tg.arange(N)[None, :]
    for n in tg.range(N):
        a2 = tg.load(A.tile((BD, 1), (block, n))) * LOG2E
        h_in = tg.sum(tg.where(column == n, states, 0.0), 1)
        bn = tg.load(B[b].tile((1, BL), (n, k))).to(f32)
        cn = tg.load(C[b].tile((1, BL), (n, k))).to(f32)
        (_, hn), (_, h_out) = tg.scan((tg.exp2(dt * a2), dtu * bn), 1, _compose,
                                      initial=(one, h_in))
        y = y + hn * cn
        states = tg.where(column == n, h_out, states)
    return y, states


def _states_shared(A, B, C, b, block, k, dt, dtu, y, hs, one, BD: int, BL: int, N: int,
                   GROUP: int, staged=None):
    """Every state of one chunk in a run-time loop over groups of GROUP states (unrolled
    inside: their recurrences share the scan's shuffle rounds; the N % GROUP states left
    over follow the loop). State n = g·GROUP + j keeps its carry in shared memory, stage g
    of `hs[j]` (one buffer per slot j, so a group's carries go to different buffers), so
    no register is indexed by the state and no per-state address stays live across the
    chunk loop. With `staged` (BC_PIPE: per slot j, a two-stage (1, BL) shared ring for B
    and one for C) the loop is a `tg.pipeline`: the next group's B and C rows are copied
    (cp.async) while this group scans, and read from shared memory without masks; else
    each iteration loads its rows from global memory and waits on them. Returns
    y + Σ_n h_n·C_n."""

    def rows_of(states):   # A[:, n], B[n] and C[n] of each state: flat lists
        return ([tg.load(A.tile((BD, 1), (block, n))) for n in states],
                [tg.load(B[b].tile((1, BL), (n, k))) for n in states],
                [tg.load(C[b].tile((1, BL), (n, k))) for n in states])

    def scan_group(stage, y, a_rows, b_rows, c_rows):
        pairs, starts = (), ()
        for j, (an, bn) in enumerate(zip(a_rows, b_rows)):
            pairs += (tg.exp2(dt * (an * LOG2E)), dtu * bn.to(f32))
            starts += (one, tg.load(hs[j][stage]))
        scanned, carries = tg.scan(pairs, 1, _compose_each(len(a_rows)), initial=starts)
        for j, cn in enumerate(c_rows):
            y = y + scanned[2 * j + 1] * cn.to(f32)
            tg.copy(carries[2 * j + 1], hs[j][stage])
        return y

    groups = N // GROUP
    if groups and staged is not None:   # B and C rows through a shared ring, a group ahead
        sb, sc = staged
        for g in tg.pipeline(groups, stages=2):
            states = [g * GROUP + j for j in range(GROUP)]
            for j, n in enumerate(states):
                tg.copy(B[b].tile((1, BL), (n, k)), sb[j][g])
                tg.copy(C[b].tile((1, BL), (n, k)), sc[j][g])
            y = scan_group(g, y, [tg.load(A.tile((BD, 1), (block, n))) for n in states],
                           [tg.load(sb[j][g]) for j in range(GROUP)],
                           [tg.load(sc[j][g]) for j in range(GROUP)])
    elif groups:   # B and C rows straight from global memory (L1/L2) each iteration
        for g in tg.range(groups):
            y = scan_group(g, y, *rows_of([g * GROUP + j for j in range(GROUP)]))
    if N % GROUP:
        y = scan_group(groups, y, *rows_of(range(groups * GROUP, N)))
    return y


def _states_layout(BD: int, BL: int, N: int, threads: int) -> Layout:
    """The (BD, N) states tile's layout for `_states_looped`: the threads of the scan's
    carry (each thread its channel's row), all N states of the row in its registers."""
    carry = carry_layout((BD, BL), 1, threads)
    (thread_shape, value_shape), (thread_stride, value_stride) = carry.shape, carry.stride
    return Layout((thread_shape, tuple(value_shape) + (N,)),
                  (thread_stride, tuple(value_stride) + (BD,)))


@lru_cache(maxsize=None)
def selective_scan_kernel(dtype: DType, bc_dtype: DType) -> tg.Kernel:
    """The forward kernel for u/delta/z/out of `dtype` and B/C of `bc_dtype`."""

    @tg.kernel(threads=128)
    def selective_scan_fwd(u: tg.Tensor[dtype, 3], delta: tg.Tensor[dtype, 3], A: tg.Tensor[f32],
                           B: tg.Tensor[bc_dtype, 3], C: tg.Tensor[bc_dtype, 3],
                           D: tg.Tensor[f32], z: tg.Tensor[dtype, 3],
                           delta_bias: tg.Tensor[f32], out: tg.Tensor[dtype, 3],
                           N: tg.constexpr, BD: tg.constexpr = 8, BL: tg.constexpr = 256,
                           HAS_D: tg.constexpr = False, HAS_Z: tg.constexpr = False,
                           HAS_BIAS: tg.constexpr = False, SOFTPLUS: tg.constexpr = False,
                           PREFETCH: tg.constexpr = False, GROUP: tg.constexpr = 1,
                           BC_AHEAD: tg.constexpr = False, STATE_LOOP: tg.constexpr = False,
                           STATE_SMEM: tg.constexpr = False, BC_PIPE: tg.constexpr = False):
        b = tg.block_id(0)
        block = tg.block_id(1)
        channels = (block, 0)

        def chunk_of(x, k):
            return tg.load(x[b].tile((BD, BL), (block, k)))

        # Per state n: A[:, n] times log2(e), so that exp(delta·A) is one exp2; the state
        # h[n] (BD, 1) is carried from chunk to chunk by the scan itself.
        if STATE_SMEM:   # slot j, stage g: state g·GROUP + j (`_states_shared`)
            hs = [tg.shared((BD, 1), f32, stages=tg.cdiv(N, GROUP)) for _ in range(GROUP)]
            for g in tg.range(tg.cdiv(N, GROUP)):
                for slot in hs:
                    tg.copy(tg.zeros((BD, 1), f32), slot[g])
            staged = ([tg.shared((1, BL), bc_dtype, stages=2) for _ in range(GROUP)],
                      [tg.shared((1, BL), bc_dtype, stages=2) for _ in range(GROUP)]) \
                if BC_PIPE else None
        elif STATE_LOOP:
            states = tg.zeros((BD, N), f32, layout=_states_layout(BD, BL, N, 128))
        else:
            a2 = [tg.load(A.tile((BD, 1), (block, n))) * LOG2E for n in range(N)]
            h = [tg.zeros((BD, 1), f32) for _ in range(N)]
        one = tg.full((BD, 1), 1.0, f32)
        if HAS_D:
            d_skip = tg.load(D.transpose(1, 0).tile((BD, 1), channels))
        if HAS_BIAS:
            bias = tg.load(delta_bias.transpose(1, 0).tile((BD, 1), channels))
        if PREFETCH:  # u and delta one chunk ahead, in registers
            u_next, delta_next = chunk_of(u, 0), chunk_of(delta, 0)
        for k in tg.range(tg.cdiv(u.shape[2], BL)):
            if PREFETCH:
                ut, dt = u_next.to(f32), delta_next.to(f32)
                u_next, delta_next = chunk_of(u, k + 1), chunk_of(delta, k + 1)
            else:
                ut, dt = chunk_of(u, k).to(f32), chunk_of(delta, k).to(f32)
            if HAS_Z and PREFETCH:
                zt = chunk_of(z, k).to(f32)
            if HAS_BIAS:
                dt = dt + bias
            if SOFTPLUS:  # log(1 + e^x) as ln 2 · log2(1 + 2^(x·log2 e)): one ex2, one lg2
                dt = tg.where(dt > SOFTPLUS_THRESHOLD, dt,
                              LN2 * tg.log2(1.0 + tg.exp2(dt * LOG2E)))
            dtu = dt * ut
            y = ut * d_skip if HAS_D else tg.zeros((BD, BL), f32)
            # Past the sequence's end u and delta load as 0, so each step there adds 0
            # (its decay may differ from 1 with a bias); those steps come last and are
            # never stored.
            if STATE_SMEM:
                y = _states_shared(A, B, C, b, block, k, dt, dtu, y, hs, one, BD, BL, N, GROUP,
                                   staged)
            elif STATE_LOOP:
                y, states = _states_looped(A, B, C, b, block, k, dt, dtu, y, states, one,
                                           BD, BL, N)
            else:
                y = _states_unrolled(B, C, b, k, dt, dtu, y, a2, h, one, BL, GROUP, BC_AHEAD)
            if HAS_Z:
                if not PREFETCH:
                    zt = chunk_of(z, k).to(f32)
                # y · silu(z) = y·z / (1 + e^-z), the reciprocal as rsqrt(·)² (one MUFU
                # where an IEEE division is a Newton sequence and a slow-path branch;
                # 1 + e^-z ≥ 1, so the square stays a normal float down to 2^-126)
                r = tg.rsqrt(1.0 + tg.exp2(zt * -LOG2E))
                y = y * zt * (r * r)
            tg.copy(y.to(dtype), out[b].tile((BD, BL), (block, k)))

    return selective_scan_fwd


#: The default tiles by element type of u: the states in a run-time loop of two per scan,
#: their carries in shared memory, B/C rows through a cp.async ring a group ahead
#: (STATE_SMEM, BC_PIPE), 3 blocks per SM (`blocks_per_sm`: ptxas holds 168 registers).
#: Measured on an H100 (2026-11-24, session 9, one process, every option on, dstate 16;
#: docs/performance.md): f32 16 channels x 128 steps 158 us at 4x1536x2048 against 254 us
#: for session 7's unrolled states (`_UNROLLED_TILES`), but 84 against 71 us at 3x1000x777,
#: where 16 channels a block leave 189 blocks for 132 SMs: there 8 x 128 (69 us; 219 us at
#: the large shape), chosen by `_FEW_BLOCKS`. 16-bit at 8 x 256: 151 / 79 us against
#: 192 / 108 us unrolled.
_DEFAULT_TILES = {"f32": dict(BD=16, BL=128, GROUP=2, STATE_SMEM=True, BC_PIPE=True,
                              blocks_per_sm=3),
                  "16-bit": dict(BD=8, BL=256, GROUP=2, STATE_SMEM=True, BC_PIPE=True,
                                 blocks_per_sm=3)}
#: Below this many blocks (two per SM of an H100) the f32 tile takes 8 channels, not 16.
_FEW_BLOCKS = 264
#: Session 7's defaults (every state unrolled, carried in registers; B/C from global
#: memory): f32 8 x 128 with two states per scan and B/C a group ahead, 16-bit 8 x 256.
_UNROLLED_TILES = {"f32": dict(BD=8, BL=128, GROUP=2, BC_AHEAD=True, blocks_per_sm=3),
                   "16-bit": dict(BD=8, BL=256, GROUP=1, blocks_per_sm=3)}


def selective_scan_config(dim: int, dstate: int, BD: int | None = None,
                          BL: int | None = None, prefetch: bool | None = None,
                          dtype: DType = f32, batch: int = 1) -> dict:
    """The constexprs: BD channels per block and BL steps per chunk (16 x 128 on 128 threads:
    8 lanes of 16 consecutive steps per channel), GROUP states per tuple scan, BC_AHEAD
    (B/C rows a group ahead), PREFETCH (u and delta a chunk ahead), STATE_LOOP (states in a
    run-time loop, not unrolled), STATE_SMEM (a run-time loop over groups of GROUP states,
    each state's carry in shared memory), BC_PIPE (with STATE_SMEM: the B/C rows through a
    cp.async ring a group ahead), and the `blocks_per_sm` build option; the defaults by
    `dtype` (`_DEFAULT_TILES`; f32 takes 8 channels a block where 16 would leave fewer
    than `_FEW_BLOCKS` blocks for `batch` x `dim`)."""
    tiles = dict(_DEFAULT_TILES["f32" if dtype == f32 else "16-bit"])
    if dtype == f32 and batch * -(-dim // tiles["BD"]) < _FEW_BLOCKS:
        tiles["BD"] = 8
    tiles.update({k: v for k, v in (("BD", BD), ("BL", BL)) if v is not None})
    return dict(N=dstate, **tiles,
                PREFETCH=DEFAULT_PREFETCH if prefetch is None else bool(prefetch))


def _merged_tiles(fn: str, defaults: dict, tiles: dict) -> dict:
    """The defaults with the caller's `tiles` over them, refusing a mix of the state
    schemes (unrolled in registers; STATE_LOOP; STATE_SMEM, optionally BC_PIPE) whose
    options the chosen scheme would silently ignore. Naming STATE_LOOP alone (or BC_AHEAD)
    leaves the default STATE_SMEM for it."""
    merged = dict(defaults, **tiles)
    if tiles.get("STATE_LOOP") or tiles.get("BC_AHEAD") or tiles.get("STATE_SMEM") is False:
        if "STATE_SMEM" not in tiles:
            merged["STATE_SMEM"] = False
        if "BC_PIPE" not in tiles:
            merged["BC_PIPE"] = False
    if merged.get("STATE_SMEM") and (merged.get("STATE_LOOP") or merged.get("BC_AHEAD")):
        raise ValueError(f"tegula.kernels.{fn}: STATE_SMEM (the states' carries in shared "
                         f"memory) does not combine with STATE_LOOP or BC_AHEAD, got {tiles}")
    if merged.get("BC_PIPE") and not merged.get("STATE_SMEM"):
        raise ValueError(f"tegula.kernels.{fn}: BC_PIPE (B/C rows through a shared ring) "
                         f"needs STATE_SMEM=True, got {tiles}")
    return merged


#: Options only the lane-scan kernel above takes, and options only the split-state kernel
#: (`tegula.kernels.scan_split`) takes: naming one picks its kernel (`SPLIT=` says it).
_LANE_OPTIONS = ("GROUP", "BC_AHEAD", "STATE_LOOP", "STATE_SMEM", "BC_PIPE", "PREFETCH")
_SPLIT_OPTIONS = ("G", "STAGES", "threads", "FMA_CHAIN", "SUBS")  # and blocks_per_sm (both take it)
#: Whether the split-state kernel runs when no option names a kernel: yes, measured on an
#: H100 (session 10, every option on, 4x1536x2048): 128 / 122 µs f32 / bf16 against 158 /
#: 151 µs for the lane-scan kernel's defaults (docs/performance.md, selective scan).
DEFAULT_SPLIT = True


#: Below this many blocks of the split kernel's default tile (one per SM of an H100), 16-bit
#: inputs run the lane-scan kernel by default: at 1x2048x2048 bf16 (128 blocks of 16
#: channels, one warp a scheduler) the lane scan measured 1.33x the split kernel (68 against
#: 91 µs, session 11 round 1); at 3x1000x777 (189 blocks) the split kernel 1.03x (session
#: 10). f32 keeps the split kernel (1.24x the lane scan at 1x2048x2048, session 10), whose
#: lane-scan tiles are another shape.
SPLIT_MIN_BLOCKS_16BIT = 132


def _split_by_default(dim: int, dstate: int, dtype: DType, batch: int) -> bool:
    """The kernel the entry points run where no option names one: the split-state kernel
    (`DEFAULT_SPLIT`), but the lane scan for 16-bit inputs with fewer than
    `SPLIT_MIN_BLOCKS_16BIT` blocks of the split kernel's default tile."""
    from tegula.kernels.scan_split import split_config

    if not DEFAULT_SPLIT:
        return False
    if dtype == f32:
        return True
    return batch * -(-dim // split_config(dstate)["BD"]) >= SPLIT_MIN_BLOCKS_16BIT


def selective_scan_launch_config(dim: int, dstate: int, dtype: DType = f32, batch: int = 1,
                                 BD: int | None = None, BL: int | None = None,
                                 prefetch: bool | None = None, fn: str = "selective_scan",
                                 **tiles: Any) -> tuple[bool, dict]:
    """(whether the split-state kernel runs, its constexprs but the HAS_*/SOFTPLUS flags)
    as the entry points choose them: the split-state kernel (`SPLIT=True`, its options
    named, or `_split_by_default` where no lane-scan option is named; its constexprs
    include `threads`, the block's) or the lane-scan kernel, refusing options of the
    other kernel."""
    from tegula.kernels.scan_split import split_config

    split = tiles.pop("SPLIT", None)
    lane_named = [k for k in tiles if k in _LANE_OPTIONS] + \
        (["prefetch"] if prefetch is not None else [])
    split_named = [k for k in tiles if k in _SPLIT_OPTIONS]
    if split is None:
        split = bool(split_named) or (not lane_named and
                                      _split_by_default(dim, dstate, dtype, batch))
    if split and lane_named:
        raise ValueError(f"tegula.kernels.{fn}: {', '.join(lane_named)} are options of the "
                         f"lane-scan kernel; the split-state kernel (SPLIT=True) does not "
                         f"take them")
    if not split and split_named:
        raise ValueError(f"tegula.kernels.{fn}: {', '.join(split_named)} are options of the "
                         f"split-state kernel; they need SPLIT=True")
    if split:
        return True, split_config(dstate, BD, BL, **tiles)
    return False, _merged_tiles(fn, selective_scan_config(dim, dstate, BD, BL, prefetch,
                                                          dtype, batch), tiles)


def _launch_plan(fn: str, dim: int, dstate: int, dtype: DType, bc_dtype: DType, batch: int,
                 BD: int | None, BL: int | None, prefetch: bool | None,
                 tiles: dict) -> tuple[tg.Kernel, tuple, dict]:
    """(kernel, grid, constexprs but the HAS_*/SOFTPLUS flags) for the entry points
    (`selective_scan_launch_config`)."""
    from tegula.kernels.scan_split import selective_scan_split_kernel

    split, constexprs = selective_scan_launch_config(dim, dstate, dtype, batch, BD, BL,
                                                     prefetch, fn, **tiles)
    if split:
        kernel = selective_scan_split_kernel(dtype, bc_dtype, constexprs.pop("threads"))
    else:
        kernel = selective_scan_kernel(dtype, bc_dtype)
    return kernel, (batch, -(-dim // constexprs["BD"])), constexprs


# --------------------------------------------------------------------------------------
# Reference (numpy, the loop of Mamba's selective_scan_ref) and the emulated entry point
# --------------------------------------------------------------------------------------

def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))


def selective_scan_reference(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                             delta_softplus=False, dtype=np.float64) -> np.ndarray:
    """Mamba's `selective_scan_ref` in numpy (a Python loop over time, in `dtype`)."""
    u, delta = u.astype(dtype), delta.astype(dtype)
    if delta_bias is not None:
        delta = delta + delta_bias.astype(dtype)[:, None]
    if delta_softplus:
        delta = _softplus(delta)
    A, B, C = A.astype(dtype), B.astype(dtype), C.astype(dtype)
    decay = np.exp(delta[:, :, :, None] * A[None, :, None, :])                # b d l n
    inject = delta[:, :, :, None] * B.transpose(0, 2, 1)[:, None] * u[:, :, :, None]
    h = np.zeros((u.shape[0], u.shape[1], A.shape[1]), dtype)
    ys = []
    for t in range(u.shape[2]):
        h = decay[:, :, t] * h + inject[:, :, t]
        ys.append(np.einsum("bdn,bn->bd", h, C[:, :, t]))
    y = np.stack(ys, axis=2) if ys else np.zeros_like(u)
    if D is not None:
        y = y + u * D.astype(dtype)[:, None]
    if z is not None:
        zf = z.astype(dtype)
        y = y * (zf / (1 + np.exp(-zf)))
    return y


def _check_shapes(fn: str, u, delta, A, B, C, D, z, delta_bias) -> None:
    """Mamba's shapes, named in the message when they disagree."""
    batch, dim, length = u.shape
    dstate = A.shape[1] if len(A.shape) == 2 else None
    want = {"delta": (batch, dim, length), "A": (dim, dstate),
            "B": (batch, dstate, length), "C": (batch, dstate, length),
            "D": (dim,), "z": (batch, dim, length), "delta_bias": (dim,)}
    given = {"delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z, "delta_bias": delta_bias}
    for name, x in given.items():
        if x is not None and tuple(x.shape) != want[name]:
            extra = " (B and C fixed over time, (dim, dstate), and grouped B/C are not " \
                    "supported)" if name in ("B", "C") else ""
            raise ValueError(f"tegula.kernels.{fn}: {name} must have shape {want[name]} "
                             f"for u of shape {tuple(u.shape)} and A of shape "
                             f"{tuple(A.shape)}, got {tuple(x.shape)}{extra}")


def selective_scan_emulated(u: np.ndarray, delta: np.ndarray, A: np.ndarray, B: np.ndarray,
                            C: np.ndarray, D: np.ndarray | None = None,
                            z: np.ndarray | None = None, delta_bias: np.ndarray | None = None,
                            delta_softplus: bool = False, dtype: DType | None = None,
                            bc_dtype: DType | None = None, **tiles: int) -> np.ndarray:
    """The selective scan on the CPU emulator (numpy arrays; f32 or f16, or `dtype=bf16`
    for bf16 data held in float32 arrays; `bc_dtype` likewise for B and C, by default u's
    type where their arrays' types agree). Returns `out` (batch, dim, L) of u's type.
    `tiles`: BD, BL and either kernel's options, as `selective_scan` takes them."""
    fn = "selective_scan_emulated"
    for name, x in (("u", u), ("delta", delta), ("B", B), ("C", C)):
        check_array(fn, name, x, ndim=3)
    check_array(fn, "A", A, ndim=2)
    for name, x in (("D", D), ("delta_bias", delta_bias)):
        if x is not None:
            check_array(fn, name, x, ndim=1)
    if z is not None:
        check_array(fn, "z", z, ndim=3)
    _check_shapes(fn, u, delta, A, B, C, D, z, delta_bias)
    dtype = dtype or dtype_of_array(u, fn, "u")
    bc_dtype = bc_dtype or (dtype if B.dtype == u.dtype else dtype_of_array(B, fn, "B"))
    for name, x, want in (("delta", delta, u.dtype), ("z", z, u.dtype), ("C", C, B.dtype)):
        if x is not None and x.dtype != want:
            raise TypeError(f"tegula.kernels.{fn}: {name} must have dtype {want}, got {x.dtype}")
    batch, dim, length = u.shape
    out = poisoned(u.shape, dtype)
    if out.size == 0:
        return out
    as32 = lambda x: np.ascontiguousarray(x, np.float32)  # noqa: E731
    tiles = dict(tiles)
    kernel, grid, constexprs = _launch_plan(fn, dim, A.shape[1], dtype, bc_dtype, batch,
                                            tiles.pop("BD", None), tiles.pop("BL", None),
                                            None, tiles)
    launch_emulated(kernel, grid,
                    np.ascontiguousarray(u), np.ascontiguousarray(delta), as32(A),
                    np.ascontiguousarray(B), np.ascontiguousarray(C),
                    as32(D if D is not None else np.zeros(dim))[None, :],
                    np.ascontiguousarray(z if z is not None else u),
                    as32(delta_bias if delta_bias is not None else np.zeros(dim))[None, :],
                    out, HAS_D=D is not None, HAS_Z=z is not None,
                    HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus),
                    **constexprs)
    return out


# --------------------------------------------------------------------------------------
# Torch entry point
# --------------------------------------------------------------------------------------

_TORCH_DTYPES = {"float32": f32, "float16": f16, "bfloat16": bf16}


def check_selective_scan(fn: str, u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any = None,
                         z: Any = None, delta_bias: Any = None) -> tuple[DType, DType]:
    """(u's tegula type, B's) after checking torch tensors' types, ranks and shapes as the
    entry point does (not their device): shared with `torch.ops.tegula.selective_scan`'s
    fake and CPU implementations."""
    from tegula.kernels.api import _check_tensor

    dtype = _check_tensor(fn, "u", u, _TORCH_DTYPES, ndim=3)
    _check_tensor(fn, "delta", delta, _TORCH_DTYPES, ndim=3)
    _check_tensor(fn, "A", A, _TORCH_DTYPES, ndim=2)
    bc_dtype = _check_tensor(fn, "B", B, _TORCH_DTYPES, ndim=3)
    _check_tensor(fn, "C", C, _TORCH_DTYPES, ndim=3)
    for name, x in (("D", D), ("delta_bias", delta_bias), ("z", z)):
        if x is not None:
            _check_tensor(fn, name, x, _TORCH_DTYPES, ndim=3 if name == "z" else 1)
    _check_shapes(fn, u, delta, A, B, C, D, z, delta_bias)
    for name, x, like in (("delta", delta, u), ("z", z, u), ("C", C, B)):
        if x is not None and x.dtype != like.dtype:
            raise TypeError(f"tegula.kernels.{fn}: {name} must have dtype {like.dtype}, got "
                            f"{x.dtype}")
    return dtype, bc_dtype


def selective_scan(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None,
                   delta_bias: Any = None, delta_softplus: bool = False, *,
                   out: Any = None, BD: int | None = None, BL: int | None = None,
                   prefetch: bool | None = None, **tiles: Any) -> Any:
    """Mamba's selective scan forward on CUDA tensors (see the module docstring for the
    shapes and formulas); returns `out` (batch, dim, L) of u's dtype (written into `out=`
    when given: contiguous, u's shape, dtype and device). BD, BL, prefetch and `tiles`:
    SPLIT (the split-state kernel of `tegula.kernels.scan_split`, with G, STAGES and
    threads: `split_config`) or the lane-scan kernel's GROUP, BC_AHEAD, STATE_LOOP,
    STATE_SMEM, BC_PIPE (`selective_scan_config`); naming one kernel's options picks it."""
    import torch

    from tegula.kernels.api import _check_cuda, _check_out, _launch

    fn = "selective_scan"
    dtype, bc_dtype = check_selective_scan(fn, u, delta, A, B, C, D, z, delta_bias)
    optional = {"D": D, "delta_bias": delta_bias, "z": z}
    tensors = {"u": u, "delta": delta, "A": A, "B": B, "C": C,
               **{k: v for k, v in optional.items() if v is not None}}
    _check_cuda(fn, tensors)
    batch, dim, length = u.shape
    if out is None:
        out = torch.empty_like(u, memory_format=torch.contiguous_format)
    else:
        _check_out(fn, out, tuple(u.shape), u)
    if out.numel() == 0:
        return out
    kernel, grid, constexprs = _launch_plan(fn, dim, A.shape[1], dtype, bc_dtype, batch, BD,
                                            BL, prefetch, tiles)
    zeros = torch.zeros(1, dim, device=u.device, dtype=torch.float32)
    args = (u.contiguous(), delta.contiguous(), A.float().contiguous(), B.contiguous(),
            C.contiguous(), D.float()[None, :].contiguous() if D is not None else zeros,
            z.contiguous() if z is not None else u.contiguous(),
            delta_bias.float()[None, :].contiguous() if delta_bias is not None else zeros, out)
    _launch(kernel, grid, args,
            dict(constexprs, HAS_D=D is not None, HAS_Z=z is not None,
                 HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus)), None)
    return out


__all__ = ["selective_scan", "selective_scan_emulated", "selective_scan_reference",
           "selective_scan_kernel", "selective_scan_config", "selective_scan_launch_config",
           "check_selective_scan",
           "SELECTIVE_SCAN_DTYPES"]
