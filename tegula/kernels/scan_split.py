"""The selective scan with the states split over threads: each thread runs its steps in order.

The formulas and arguments are `tegula.kernels.scan`'s (Mamba's `selective_scan_ref`). That
module's kernel scans each state's recurrence h_t = a_t·h_{t-1} + b_t *across* the lanes of a
channel (a run of steps per thread, then shuffles), which costs, per (state, step), the run's
own scan (a product and a multiply-add), the lanes' fold (one more multiply-add) and the
shuffles, on top of the recurrence's work: 12.1 SASS per (state, step) in session 9, issue-
bound at 4x1536x2048.

Here a block owns BD channels; the channel's N states are split over G threads (S = N / G
states each, held in registers); every thread walks the chunk's BL steps one after the
other, so a (state, step) costs exp2(delta·A·log2 e) (one multiply, one MUFU), delta·u·B
(one multiply), the recurrence (one multiply-add) and its share of y (one multiply-add);
with FMA_CHAIN the multiply-add on the state's dependency chain is a·h + (δu·B), one FFMA a
step (see the kernel body; off by default, measured no faster). The tile is (BD, N, BL), scanned along the steps with `tg.scan` (whose layout gives each thread
whole rows: no shuffle); the product of the (a, b) pairs' first halves is never used, so the
compiler drops it.

Per chunk of BL steps (SUBS chunks a pipeline step: each step below done for all of them
before the next, so the barriers between steps come once per SUBS·BL steps), in a
`tg.pipeline` of STAGES cp.async stages:
1. u, delta, B and C (and z) are copied into shared rings a chunk or more ahead;
2. each (channel, step)'s delta (bias, softplus) and delta·u are computed once, in f32, into
   shared scratch, and B and C rows are converted to f32 once (every thread of a channel and
   every channel of the block read them: converting where they are read would repeat each
   conversion BD·G times);
3. the states scan: each thread reads its channel's delta and delta·u and its states' B and C
   as 16-byte broadcasts, and sums its S states' h·C in registers;
4. the G partial sums of a channel go through shared memory and are added by the thread that
   stores the output (up to 4 consecutive steps of one channel: 16-byte stores along the
   sequence), which also applies D·u and the silu gate once per element.

Measured on an H100 (session 10, every option on, 4x1536x2048, dstate 16): 128 / 122 µs
f32 / bf16 at the default tiles (8 threads a channel, 32 steps a chunk), 52% / 27% of the
copy bandwidth, against 158 / 151 µs for the lane scan; 7.4-8.4 SASS per (state, step), but
latency-bound (ncu: 0.59 instructions issued per cycle per scheduler; docs/performance.md).
Session 11: 3 stages (two chunks ahead) by default, 126 / 119 µs against 132 / 125 µs for 2
in one process; ncu's leading stalls were the short scoreboard (MUFU, shared loads) and the
fixed-latency chain, which FMA_CHAIN shortens, at 40 more registers a thread: no faster at
4x1536x2048 (127.0 / 122.3 µs against 125.4 / 119.2), so off by default.
"""
from __future__ import annotations

import math
from functools import lru_cache

import tegula as tg
from tegula import f32
from tegula.dtypes import DType
from tegula.kernels.scan import LN2, LOG2E, SOFTPLUS_THRESHOLD, _compose
from tegula.layout.cute import Layout

#: Threads a block by default (`split_config`'s `threads`).
THREADS = 128
#: Steps per thread of the output layout (one 16-byte f32 store, 8 bytes for 16-bit types).
OUT_RUN = 4


def split_config(dstate: int, BD: int | None = None, BL: int | None = None,
                 G: int | None = None, STAGES: int = 3, threads: int = THREADS,
                 blocks_per_sm: int | None = None, FMA_CHAIN: bool = False,
                 SUBS: int = 1) -> dict:
    """The split kernel's constexprs for `dstate` states: G threads per channel (8 where it
    divides dstate, else the largest power of two that does), BD = threads / G channels a
    block, BL steps a chunk (32, or the power of two that keeps a thread's (state, step)
    values at 64 or fewer), STAGES chunks in the cp.async ring (3: two chunks ahead),
    FMA_CHAIN (the recurrence as one FFMA a step, see the kernel; off by default: 1-3%
    slower at 4x1536x2048 in session 11 round 2, its 168 registers against 128 leave 3
    blocks an SM, 3% at 8x2048x1024 f32), SUBS (sub-chunks of BL steps a pipeline step,
    each step of the body done for all of them: fewer barriers a step; 0.81 / 0.83x at
    4x1536x2048 f32 / bf16 in session 12 round 1), and `threads` and
    `blocks_per_sm` (build options: the register cap of `__launch_bounds__`) where given.
    Raises ValueError for tiles the kernel cannot run. The defaults measured best on an
    H100 at 4x1536x2048, dstate 16 (session 10, `benchmarks/results/h100-2026-11-24-
    session10-scan.txt`): G=8, BL=32 128 / 122 µs (f32 / bf16) against 150-178 µs for G=4
    at 16 or 32 steps — more warps (2 states a thread) outweigh the per-chunk work they
    repeat; session 11: 3 stages 126 / 119 µs against 132 / 125 µs for 2 (4: 127 / 125),
    where 64-thread blocks (150 / 140) and G=16 (196-210 / 191-204) lost."""
    if G is None:
        G = next(g for g in (8, 4, 2, 1) if dstate % g == 0)
    if BD is None:
        BD = threads // G
    if BL is None:   # a power of two: the output's threads along the steps are lanes
        BL = max(OUT_RUN, min(32, 1 << (64 // (dstate // G)).bit_length() - 1))
    if dstate % G or BD * G != threads or BL < OUT_RUN or BL & (BL - 1) or SUBS < 1:
        raise ValueError(f"tegula.kernels.selective_scan: the split-state kernel needs G "
                         f"dividing dstate, BD·G = {threads} threads and BL a power of two "
                         f"from {OUT_RUN} (SUBS >= 1 sub-chunks a step); got dstate={dstate}, "
                         f"BD={BD}, G={G}, BL={BL}, SUBS={SUBS}")
    caps = {} if blocks_per_sm is None else {"blocks_per_sm": blocks_per_sm}
    return dict(N=dstate, BD=BD, BL=BL, G=G, STAGES=STAGES, threads=threads,
                FMA_CHAIN=bool(FMA_CHAIN), SUBS=SUBS, **caps)


def _run_length(threads: int, rows: int, BL: int) -> int:
    """Consecutive steps a thread holds of a (rows, BL) tile: OUT_RUN, halved while the
    tile has fewer runs than threads (the threads beyond would compute copies of the same
    outputs: G=16 at BL=32 has 8 channels of 8 runs for 128 threads)."""
    run = OUT_RUN
    while run > 1 and rows * BL // run < threads:
        run //= 2
    return run


def _runs_layout(threads: int, rows: int, BL: int, *more: int) -> Layout:
    """A (rows, *more, BL) tile with each thread holding `_run_length` consecutive steps of
    one row and all of `more` (summed or used in registers): threads along the steps first,
    then the rows (as many threads as divide both); the other rows go to registers, threads
    beyond the rows hold copies. Tiles are indexed column-major (row + rows·m + rows·M·step)."""
    run = _run_length(threads, rows, BL)
    lanes = BL // run
    on_rows = math.gcd(rows, threads // lanes)
    inner = 1
    for m in more:
        inner *= m
    copies = threads // (lanes * on_rows)
    value_shape = (run,) + tuple(more) + (rows // on_rows,)
    value_stride = [rows * inner]
    running = rows
    for m in more:
        value_stride.append(running)
        running *= m
    value_stride.append(on_rows)
    return Layout(((lanes, on_rows, copies), value_shape),
                  ((run * rows * inner, 1, 0), tuple(value_stride)))


def _chunk_inputs(ring_of, k, s_dt, s_dtu, s_bc, by_run, by_state, bias, HAS_BIAS, SOFTPLUS):
    """Step 2 for one sub-chunk: delta (bias, softplus) and delta·u of each (channel, step)
    into shared scratch, B and C rows in f32 (traced inline)."""
    dt = tg.load(ring_of["delta"][k], layout=by_run).to(f32)
    if HAS_BIAS:
        dt = dt + bias
    if SOFTPLUS:  # log(1 + e^x) as ln 2 · log2(1 + 2^(x·log2 e)); x > 20: x. One ex2 and
        # one lg2.approx (|error| <= 2^-22 near 1: delta within ~2e-7 absolute)
        dt = tg.where(dt > SOFTPLUS_THRESHOLD, dt,
                      LN2 * tg.log2(1.0 + tg.exp2(dt * LOG2E)))
    tg.copy(dt, s_dt)
    tg.copy(dt * tg.load(ring_of["u"][k], layout=by_run).to(f32), s_dtu)
    # (f32 B and C are copied too: read straight from the ring, ptxas hoists all of a
    # thread's B and C reads above the loop's barrier, 216 registers against 96.)
    for ring, converted in zip((ring_of["B"], ring_of["C"]), s_bc):
        tg.copy(tg.load(ring[k], layout=by_state).to(f32), converted)


def _chunk_states(h, one, a2, s_dt, s_dtu, s_bc, partial, shape, FMA_CHAIN):
    """Step 3 for one sub-chunk: each thread its S states' steps in order from the carried
    h; their h·C summed in registers into the channel's G partial sums. Returns the new h."""
    BD, N, G, BL = shape
    bt, ct = tg.load(s_bc[0]), tg.load(s_bc[1])
    decay = tg.exp2(tg.reshape(tg.load(s_dt), (BD, 1, BL)) * a2)
    inject = tg.reshape(tg.load(s_dtu), (BD, 1, BL)) * tg.reshape(bt, (1, N, BL))
    if FMA_CHAIN:  # + 0.0 (not folded: -0.0 + 0.0 is +0.0) makes δu·B an FFMA, so the
        # compiler cannot fuse it into the recurrence's add and fuses a·h instead: one
        # FFMA (4 cycles) a step on the state's chain, not FMUL + FFMA
        inject = inject + 0.0
    (_, hs), (_, h) = tg.scan((decay, inject), 2, _compose, initial=(one, h))
    # Each thread's S states, summed in its registers (the SASS has one FFMA per (state,
    # step) here and no shuffle), then the G threads' partial sums.
    mine = tg.sum(tg.reshape(hs * tg.reshape(ct, (1, N, BL)), (BD, N // G, G, BL)), 1)
    tg.copy(tg.reshape(mine, (BD, G, BL)), partial)
    return h


@lru_cache(maxsize=None)
def selective_scan_split_kernel(dtype: DType, bc_dtype: DType,
                                threads: int = THREADS) -> tg.Kernel:
    """The forward kernel for u/delta/z/out of `dtype` and B/C of `bc_dtype` on `threads`
    threads a block (the arguments of `scan.selective_scan_kernel`, so the entry points
    launch either). With SUBS > 1 a pipeline step holds SUBS sub-chunks of BL steps, each
    step of the body done for all of them before the next (one barrier per step per
    SUBS·BL steps, not per BL)."""

    @tg.kernel(threads=threads)
    def selective_scan_split(u: tg.Tensor[dtype, 3], delta: tg.Tensor[dtype, 3],
                             A: tg.Tensor[f32], B: tg.Tensor[bc_dtype, 3],
                             C: tg.Tensor[bc_dtype, 3], D: tg.Tensor[f32],
                             z: tg.Tensor[dtype, 3], delta_bias: tg.Tensor[f32],
                             out: tg.Tensor[dtype, 3], N: tg.constexpr, BD: tg.constexpr = 32,
                             BL: tg.constexpr = 16, G: tg.constexpr = 4,
                             STAGES: tg.constexpr = 2, HAS_D: tg.constexpr = False,
                             HAS_Z: tg.constexpr = False, HAS_BIAS: tg.constexpr = False,
                             SOFTPLUS: tg.constexpr = False, FMA_CHAIN: tg.constexpr = False,
                             SUBS: tg.constexpr = 1):
        b, block = tg.block_id(0), tg.block_id(1)
        a2 = tg.reshape(tg.load(A.tile((BD, N), (block, 0))) * LOG2E, (BD, N, 1))
        h = tg.zeros((BD, N, 1), f32)           # the states, carried from chunk to chunk
        one = tg.full((BD, N, 1), 1.0, f32)
        names = (("u", (BD, BL), dtype), ("delta", (BD, BL), dtype), ("B", (N, BL), bc_dtype),
                 ("C", (N, BL), bc_dtype)) + ((("z", (BD, BL), dtype),) if HAS_Z else ())
        rings = [{name: tg.shared(shape, t, stages=STAGES) for name, shape, t in names}
                 for _ in range(SUBS)]
        s_dt = [tg.shared((BD, BL), f32) for _ in range(SUBS)]
        s_dtu = [tg.shared((BD, BL), f32) for _ in range(SUBS)]
        s_bc = [(tg.shared((N, BL), f32), tg.shared((N, BL), f32)) for _ in range(SUBS)]
        partial = [tg.shared((BD, G, BL), f32) for _ in range(SUBS)]
        by_state = _runs_layout(threads, N, BL)           # (N, BL): B and C
        by_run = _runs_layout(threads, BD, BL)            # (BD, BL): u, delta, z, out
        by_output = _runs_layout(threads, BD, BL, G)      # (BD, G, BL): the partial sums
        channels = (block, 0)
        bias = tg.load(delta_bias.transpose(1, 0).tile((BD, 1), channels)) if HAS_BIAS else None
        if HAS_D:
            d_skip = tg.load(D.transpose(1, 0).tile((BD, 1), channels))
        sources = {"u": u, "delta": delta, "z": z, "B": B, "C": C}
        for k in tg.pipeline(tg.cdiv(u.shape[2], BL * SUBS), stages=STAGES):
            for j in range(SUBS):  # 1. this step's sub-chunks into the rings
                for name, ring in rings[j].items():
                    rows = (0, k * SUBS + j) if name in ("B", "C") else (block, k * SUBS + j)
                    tg.copy(sources[name][b].tile(tuple(ring.shape), rows), ring[k])
            for j in range(SUBS):  # 2. once per (channel, step): delta, delta·u; B, C in f32
                _chunk_inputs(rings[j], k, s_dt[j], s_dtu[j], s_bc[j], by_run, by_state, bias,
                              HAS_BIAS, SOFTPLUS)
            for j in range(SUBS):  # 3. the states, each thread its S states' steps in order
                h = _chunk_states(h, one, a2, s_dt[j], s_dtu[j], s_bc[j], partial[j],
                                  (BD, N, G, BL), FMA_CHAIN)
            for j in range(SUBS):  # 4. the G partial sums, D·u and the gate, once an output
                y = tg.reshape(tg.sum(tg.load(partial[j], layout=by_output), 1), (BD, BL))
                if HAS_D:
                    y = y + tg.load(rings[j]["u"][k], layout=by_run).to(f32) * d_skip
                if HAS_Z:
                    zt = tg.load(rings[j]["z"][k], layout=by_run).to(f32)
                    r = tg.rsqrt(1.0 + tg.exp2(zt * -LOG2E))  # silu's 1/(1 + e^-z), one MUFU
                    y = y * zt * (r * r)
                tg.copy(y.to(dtype), out[b].tile((BD, BL), (block, k * SUBS + j)))

    return selective_scan_split


__all__ = ["selective_scan_split_kernel", "split_config"]
