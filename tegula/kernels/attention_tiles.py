"""The attention forward's autotuner candidates (`tegula.kernels.attention`): which
configurations the torch entry points time, per head dim, causal setting and key length.

On sm_90a the table is measured (H100 and H200; numbers in `_hopper_candidates`,
`_short_candidates` and docs/performance.md). Candidates holding two blocks an SM
(`TWO_BLOCKS`): a block of a 1k-token sequence runs only 8 key blocks of 128, so its
prologue (q and the first keys loaded, the pipeline filled) and epilogue (o normalized and
stored) weigh ~1.5 key blocks' time of ~9.5, and with one block an SM nothing else runs
then; a second resident block computes through them. D = 64 times one at every length (it
led up to 4k); D = 128 only up to `SHORT_KEYS`, past which three warpgroups lead (each
candidate costs the tuner a compile).
"""
from __future__ import annotations

#: Key lengths up to which `attention_candidates` adds the D = 128 two-blocks-an-SM
#: candidate (D = 64's is timed at every length).
SHORT_KEYS = 2048
#: 128 query rows on two warpgroups in one role, two blocks an SM (`_short_candidates`).
TWO_BLOCKS = dict(BM=128, threads=256, warp_specialize=False, blocks_per_sm=2)


def attention_candidates(head_dim: int, wgmma: bool, causal: bool = False,
                         keys: int | None = None) -> list[dict]:
    """Configurations worth timing for one head dim and causal setting at `keys` keys a
    sequence (None: every candidate of any length, as the GPU tests launch them): on
    sm_90a the measured table of `_hopper_candidates`; elsewhere (mma.sync) 128-row query
    blocks on two warpgroups (64 rows, and a 64-row accumulator slice, each) and 64-row
    blocks, with 64- and 128-key blocks where registers and shared memory allow."""
    if wgmma:
        short = keys is None or keys <= SHORT_KEYS
        return _hopper_candidates(head_dim, causal) + \
            (_short_candidates(head_dim) if short else [])
    rows = [dict(BM=128, threads=256), dict(BM=64)]
    # 128-key blocks: D=128 spills on mma.sync, and D=256's two stages of K and V
    # (4 x 64 KB) overflow the shared memory.
    configs = [dict(t, BN=bn, V_KMAJOR=False, P_SHARED=False)
               for t in rows for bn in ((64, 128) if head_dim == 64 else (64,))]
    if head_dim == 256:  # 128 x 256 query tiles overflow sm_80's shared memory
        configs = [t for t in configs if t["BM"] == 64]
    return [dict(c, STAGES=2) for c in configs]


def _hopper_candidates(head_dim: int, causal: bool) -> list[dict]:
    """The sm_90a candidates. Measured on an H100 (session 13 round 1, one process, 16k
    tokens, TFLOP/s against SDPA's cuDNN backend): at D = 64, 192-row blocks on three
    consumer warpgroups (FlashAttention-3's D = 64 tile: more rows per key block, and the
    three warpgroups' softmax and gemms interleave on their own) ran 493 / 535 at S = 4k /
    8k (1.04x / 1.09x), the two warpgroups taking turns (consumers="pingpong") 428 / 450,
    the cooperative 128-row block 405, the overlapped loop with turns 385. At D = 128 the
    turns lead (593, 0.93x; causal 514, 0.95x); 176-key blocks with FlashAttention-3's
    register split (REGS=240: consumers 240, producer 24) 600 (0.94x), the overlapped loop
    559 (0.88x); three warpgroups of 64 rows with 64-, 96- or 128-key blocks (REGS=160;
    ptxas: 125 / 148 / 157 registers, no spill) are timed too; round 2, 128-key blocks on
    three warpgroups 672 / 538 (1.021x / 0.954x), the tuner's pick at D = 128 S >= 4k. At
    D = 256 the overlapped loop: 698 / 610 at 2x8x8192 full / causal (0.985x / 1.007x),
    80-key blocks 664. Session 14 round 1 (2x8x8192): FlashAttention-3's D = 256 tile, 128 x
    80 with the overlapped loop at 240 registers, fits the shared memory with block 0's keys
    through the ring (FIRST_IN_RING: 64 + 2 x 80 KB of q, k and v): 727 / 649 (1.008x /
    1.068x; ptxas spills 44 B) against 64-key blocks' 698 / 623; without the overlap 680 /
    604, taking turns 669 / 597 and turns with the overlap 436 / 396 (not timed). At S = 1k
    (16x8x1024) the plain loop leads: 80-key blocks 506 / 357 (0.840x / 0.809x), 64-key 502
    / 363, the overlapped loop 458 / 310. Persistent blocks (PERSISTENT) measured
    0.62-0.76x and are not timed. 64x64 blocks stay for short or ragged sequences."""
    wide, turns = dict(BM=128, threads=256), dict(BM=128, threads=256, consumers="pingpong")
    three = dict(BM=192, threads=384)       # three consumer warpgroups of 64 rows
    small = dict(BM=64, BN=64)
    if head_dim == 64:  # two blocks an SM at every length (session 14, `_short_candidates`)
        configs = [dict(three, BN=128), dict(three, BN=128, REGS=160),
                   dict(three, BN=176, REGS=160), dict(turns, BN=128), small,
                   dict(TWO_BLOCKS, BN=128)]
    elif head_dim == 128:
        configs = [dict(turns, BN=128), dict(three, BN=128, REGS=160),
                   dict(three, BN=96, REGS=160), dict(three, BN=64, REGS=160),
                   dict(wide, BN=128), small]
        if not causal:  # FlashAttention-3's non-causal D = 128 tile
            configs.insert(1, dict(turns, BN=176, REGS=240))
    else:  # FlashAttention-3's 128 x 80 tile first: the long-sequence pick (session 14)
        configs = [dict(wide, BN=80, OVERLAP=True, FIRST_IN_RING=True, REGS=240),
                   dict(wide, BN=64, OVERLAP=True), dict(wide, BN=64),
                   dict(wide, BN=80, REGS=240), small]
    return [dict(c, V_KMAJOR=False, P_SHARED=False, STAGES=2) for c in configs]


def _short_candidates(head_dim: int) -> list[dict]:
    """Candidates for short key loops (module docstring): two blocks an SM, 128 query rows
    on two warpgroups in one role (no producer: `warp_specialize=False`, so that
    `blocks_per_sm=2` may cap the registers at 128 a thread; ptxas: 126 at D = 64 with
    128-key blocks and at D = 128 with 64-key blocks, no spill; 80 / 96 KB of shared
    memory). Measured (H100, session 14 round 1, 16 x H x 1024, one process, x cuDNN, full
    / causal): D = 128 484 / 350 TFLOP/s (0.866x / 0.874x) against three warpgroups' 443 /
    281 and the turns' 426 / 309; D = 64 with 128-key blocks 435 / 308 (1.030x / 0.913x)
    against 64x64 blocks' 409 / 325. Slower, not timed: 64-key blocks at D = 64 (0.887x /
    0.818x), 64 x 96 blocks at D = 128 (0.766x / 0.795x). Round 2 (H200, B·S = 16k): at
    D = 64 it also leads at S = 2k (1.034x / 0.999x) and 4k (1.048x / 1.063x, three
    warpgroups 1.027x / 0.953x), so D = 64 times it at every length; at D = 128 three
    warpgroups lead from 2k (0.968x / 0.904x against 0.889x / 0.894x). D = 256's q tile
    alone is 32-64 KB: no second block fits beside its ring."""
    configs = [dict(TWO_BLOCKS, BN=64)] if head_dim == 128 else []
    return [dict(c, V_KMAJOR=False, P_SHARED=False, STAGES=2) for c in configs]


__all__ = ["attention_candidates", "SHORT_KEYS"]
