"""The split-state selective scan with its three steps skewed over chunks: one barrier a chunk.

`tegula.kernels.scan_split`'s kernel does, per chunk, (2) delta, delta·u and f32 B/C into
shared scratch, (3) the states' recurrence (MUFU-bound: one ex2 a (state, step), the unit
taking 8 cycles a warp instruction per scheduler against ~6 issue cycles of the rest) and
(4) the G partial sums into outputs, with a barrier between each: the ALU-heavy steps 2 and
4 and the MUFU-heavy step 3 never overlap within a block, and with 2.9 blocks an SM at
4x1536x2048 (ncu, session 11: 0.55 issued per cycle per scheduler, stalls on MUFU and
shared-load results) the SM's MUFU sits idle through them.

Here the interval between two barriers holds step 2 of chunk c, step 3 of chunk c − 1 and
step 4 of chunk c − 2, on different buffers (even and odd chunks have their own scratch and
partial sums: the pipeline step holds two chunks), so ptxas may interleave them and a block
waits at one barrier a chunk. Step 4's D·u and silu(z) are computed in step 2 (from the
ring, two chunks before the ring's stage is refilled) and carried in registers to it (the
same threads hold both: the run layout). The first two intervals' steps 3 and 4 belong to
chunks −1 and −2: their scratch is zeroed (decay 1, no input: the state stays 0) and their
stores are skipped; one more pipeline step drains the last chunks (copies past L load as 0,
stores past L are masked).

Measured slower (H100, session 12 round 1, 4x1536x2048): 170.2 / 137.0 µs f32 / bf16
against 129.9 / 113.7 for the plain form: the doubled rings and scratch (~108 KB a block in
f32) leave 2 blocks an SM where the grid needs 2.9; with STAGES=2 bf16 fits 3 and ties it
(113.7 µs). So with the barriers gone at equal occupancy nothing is gained: the MUFU and
shared-load waits are the loss, not the barriers. Kept as an option, off by default.
"""
from __future__ import annotations

from functools import lru_cache

import tegula as tg
from tegula import f32
from tegula.dtypes import DType
from tegula.kernels.scan import LOG2E
from tegula.kernels.scan_split import THREADS, _chunk_inputs, _chunk_states, _runs_layout


def _epilogue_terms(ring_of, k, by_run, d_skip, HAS_D, HAS_Z):
    """(pre, gate) of a chunk for step 4's y·gate + pre: gate = silu(z) (1 without z), pre
    = D·u·gate (0 without D); None for what the kernel does not apply."""
    gate = pre = None
    if HAS_Z:
        zt = tg.load(ring_of["z"][k], layout=by_run).to(f32)
        r = tg.rsqrt(1.0 + tg.exp2(zt * -LOG2E))  # silu's 1/(1 + e^-z), one MUFU
        gate = zt * (r * r)
    if HAS_D:
        pre = tg.load(ring_of["u"][k], layout=by_run).to(f32) * d_skip
        if HAS_Z:
            pre = pre * gate
    return pre, gate


def _outputs(partial, terms, by_output, out_tile, dtype, BD, BL) -> None:
    """Step 4: the channel's G partial sums, then y·gate + pre, stored."""
    pre, gate = terms
    y = tg.reshape(tg.sum(tg.load(partial, layout=by_output), 1), (BD, BL))
    if gate is not None:
        y = y * gate
    if pre is not None:
        y = y + pre
    tg.copy(y.to(dtype), out_tile)


@lru_cache(maxsize=None)
def selective_scan_skewed_kernel(dtype: DType, bc_dtype: DType,
                                 threads: int = THREADS) -> tg.Kernel:
    """The skewed forward kernel: the arguments and constexprs of
    `scan_split.selective_scan_split_kernel` but SUBS (a pipeline step is a pair of chunks);
    `split_config(..., SKEW=True)` picks it."""

    @tg.kernel(threads=threads)
    def selective_scan_skewed(u: tg.Tensor[dtype, 3], delta: tg.Tensor[dtype, 3],
                              A: tg.Tensor[f32], B: tg.Tensor[bc_dtype, 3],
                              C: tg.Tensor[bc_dtype, 3], D: tg.Tensor[f32],
                              z: tg.Tensor[dtype, 3], delta_bias: tg.Tensor[f32],
                              out: tg.Tensor[dtype, 3], N: tg.constexpr, BD: tg.constexpr = 32,
                              BL: tg.constexpr = 16, G: tg.constexpr = 4,
                              STAGES: tg.constexpr = 2, HAS_D: tg.constexpr = False,
                              HAS_Z: tg.constexpr = False, HAS_BIAS: tg.constexpr = False,
                              SOFTPLUS: tg.constexpr = False, FMA_CHAIN: tg.constexpr = False):
        b, block = tg.block_id(0), tg.block_id(1)
        a2 = tg.reshape(tg.load(A.tile((BD, N), (block, 0))) * LOG2E, (BD, N, 1))
        h = tg.zeros((BD, N, 1), f32)           # the states, carried from chunk to chunk
        one = tg.full((BD, N, 1), 1.0, f32)
        names = (("u", (BD, BL), dtype), ("delta", (BD, BL), dtype), ("B", (N, BL), bc_dtype),
                 ("C", (N, BL), bc_dtype)) + ((("z", (BD, BL), dtype),) if HAS_Z else ())
        rings = [{name: tg.shared(shape, t, stages=STAGES) for name, shape, t in names}
                 for _ in range(2)]             # even and odd chunks of a pipeline step
        s_dt = [tg.shared((BD, BL), f32) for _ in range(2)]
        s_dtu = [tg.shared((BD, BL), f32) for _ in range(2)]
        s_bc = [(tg.shared((N, BL), f32), tg.shared((N, BL), f32)) for _ in range(2)]
        partial = [tg.shared((BD, G, BL), f32) for _ in range(2)]
        by_state = _runs_layout(threads, N, BL)           # (N, BL): B and C
        by_run = _runs_layout(threads, BD, BL)            # (BD, BL): u, delta, z, out
        by_output = _runs_layout(threads, BD, BL, G)      # (BD, G, BL): the partial sums
        channels = (block, 0)
        bias = tg.load(delta_bias.transpose(1, 0).tile((BD, 1), channels)) if HAS_BIAS else None
        d_skip = tg.load(D.transpose(1, 0).tile((BD, 1), channels)) if HAS_D else None
        # Chunk -1's scratch: decay exp2(0) = 1 and no input, so step 3 keeps h = 0.
        for buffer in (s_dt[1], s_dtu[1]) + s_bc[1]:
            tg.copy(tg.zeros(tuple(buffer.shape), f32), buffer)
        # (pre, gate) of the chunks two back (even, odd), each its own tile (carried)
        held = [tuple(tg.zeros((BD, BL), f32) if used else None for used in (HAS_D, HAS_Z))
                for _ in range(2)]
        sources = {"u": u, "delta": delta, "z": z, "B": B, "C": C}
        for k in tg.pipeline(tg.cdiv(u.shape[2], 2 * BL) + 1, stages=STAGES):
            for j in range(2):
                for name, ring in rings[j].items():
                    rows = (0, 2 * k + j) if name in ("B", "C") else (block, 2 * k + j)
                    tg.copy(sources[name][b].tile(tuple(ring.shape), rows), ring[k])
            for j in range(2):  # chunk c = 2k + j; its parity j, the previous one's 1 - j
                _chunk_inputs(rings[j], k, s_dt[j], s_dtu[j], s_bc[j], by_run, by_state,
                              bias, HAS_BIAS, SOFTPLUS)
                h = _chunk_states(h, one, a2, s_dt[1 - j], s_dtu[1 - j], s_bc[1 - j],
                                  partial[1 - j], (BD, N, G, BL), FMA_CHAIN)
                with tg.if_(2 * k + j >= 2):    # chunk c - 2 (parity j) exists
                    _outputs(partial[j], held[j], by_output,
                             out[b].tile((BD, BL), (block, 2 * k + j - 2)), dtype, BD, BL)
                held[j] = _epilogue_terms(rings[j], k, by_run, d_skip, HAS_D, HAS_Z)

    return selective_scan_skewed


__all__ = ["selective_scan_skewed_kernel"]
