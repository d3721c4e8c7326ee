"""Time fixed configurations of the W4A16 and GEMV kernels (no autotuning), to see where
their time goes: `python benchmarks/w4a16_sweep.py [--set session6|swapped|refined|fragment|session9|session10|session11|session12|session12b|session13|session13b|session14] [--only PREFIX]
[--budget SECONDS] [--index ROW ...] [--profile]` (`--profile`: each selected row launched once more,
untimed, for ncu).

`--set swapped` times the swapped-orientation W4A16 kernel (the weights as the MMA's A
operand) against the session-6 GEMM kernel at M = 16, 64, 128 on N=K=4096 and N=14336,
K=4096; `--set refined` times the variants around round 1's winners; `--set fragment`
the fragment-ordered weights (`quant_fragment`) beside session 7's winners. Each row (printed
as it is measured): the kernel, its (M, N, K), its constexprs, the median µs (L2 flushed, as
`tegula bench quant`), the TB/s of the floor bytes (packed weights + scales + zeros for
W4A16, the weights for GEMV) and their fraction of the device copy bandwidth; torch's f16
matmul of the same shape (`a @ w.T`, cuBLAS) for comparison. Every tegula result is
checked against a float64 reference first, into a NaN-poisoned output (a wrong fast
kernel is not a result; relerr NaN means outputs were left unwritten). Last column: the
host µs of one launch (the timer queues samples behind a 256 MB flush of ~85 µs; a
launch path slower than that would be timed too).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, (M, N, K), constexprs) — the kernel is picked from the name's prefix.
SESSION6 = [
    ("gemv", (1, 4096, 4096), dict(BN=4, BK=1024)),
    ("gemv", (1, 11008, 4096), dict(BN=2, BK=1024, UNROLL=2)),
    ("w4rows", (1, 4096, 4096), dict(BN=4, S=8, R=2, UNROLL=2)),
    ("w4rows", (1, 11008, 4096), dict(BN=4, S=8, R=2, UNROLL=2)),
    ("w4rows", (4, 4096, 4096), dict(BN=4, S=8, R=4, UNROLL=1)),
    ("w4rows", (8, 4096, 4096), dict(BN=4, S=8, R=4, UNROLL=1)),
    ("w4gemm", (16, 11008, 4096), dict(BM=16, BN=32, BK=128, STAGES=3)),
    ("w4gemm", (128, 4096, 14336), dict(BM=128, BN=32, BK=128, STAGES=2, threads=256)),
]
# The swapped kernel (weights as the MMA's register A operand) against the session-6
# GEMM's best configs, at M = 16, 64, 128 on the two shapes.
_SWAPPED_BY_M = {
    16: [dict(BT=16, BK=128, STAGES=4), dict(BT=16, BK=128, STAGES=8, WSMEM=1),
         dict(BT=16, BK=128, STAGES=4, ASMEM=1), dict(BT=16, BK=128, STAGES=4, ASMEM=1, SPLIT=2),
         dict(BT=16, BK=128, STAGES=4, ASMEM=1, SPLIT=4)],
    64: [dict(BT=64, BK=128, STAGES=3), dict(BT=64, BK=128, STAGES=3, ASMEM=1),
         dict(BT=64, BK=64, STAGES=3, ASMEM=1, SPLIT=2)],
    128: [dict(BT=128, BK=64, STAGES=3), dict(BT=128, BK=64, STAGES=4, WSMEM=1),
          dict(BT=128, BK=128, STAGES=3, ASMEM=1), dict(BT=128, BK=64, STAGES=3, ASMEM=1),
          dict(BT=128, BK=64, STAGES=3, ASMEM=1, SPLIT=2), dict(BT=128, BK=64, STAGES=3, SPLIT=2),
          dict(BT=128, BN=128, BK=64, STAGES=3, ASMEM=1, SPLIT=2, threads=256),
          dict(BT=128, BK=64, STAGES=3, ASMEM=1, warp_specialize=True)],
}
_GEMM_BY_M = {16: dict(BM=16, BN=32, BK=128, STAGES=3), 64: dict(BM=64, BN=64, BK=128, STAGES=3),
              128: dict(BM=128, BN=64, BK=128, STAGES=3)}
SWAPPED = [(name, (m, n, 4096), dict(config, **({} if name == "w4gemm" or "warp_specialize"
                                               in config else {"warp_specialize": False})))
           for n in (4096, 14336) for m in (16, 64, 128)
           for name, config in [("w4gemm", _GEMM_BY_M[m])]
           + [("w4swap", c) for c in _SWAPPED_BY_M[m]]]
# Round 2: around round 1's winners (WSMEM and split K at 16 tokens, the shared A operand
# beyond), more blocks per SM (split 4-8, 2 stages, 64-token tiles).
_REFINED_BY_M = {
    16: [dict(BT=16, BK=128, STAGES=8, WSMEM=1), dict(BT=16, BK=128, STAGES=8, WSMEM=1, SPLIT=2),
         dict(BT=16, BK=128, STAGES=6, WSMEM=1, SPLIT=4),
         dict(BT=16, BK=128, STAGES=4, ASMEM=1, SPLIT=4), dict(BT=16, BK=128, STAGES=3, ASMEM=1, SPLIT=8)],
    64: [dict(BT=64, BK=128, STAGES=3, ASMEM=1), dict(BT=64, BK=128, STAGES=2, ASMEM=1),
         dict(BT=64, BK=128, STAGES=3, ASMEM=1, SPLIT=2), dict(BT=64, BK=128, STAGES=3, ASMEM=1, SPLIT=4),
         dict(BT=32, BK=128, STAGES=3, ASMEM=1)],
    128: [dict(BT=128, BK=128, STAGES=3, ASMEM=1), dict(BT=128, BK=128, STAGES=2, ASMEM=1),
          dict(BT=128, BK=128, STAGES=3, ASMEM=1, SPLIT=2), dict(BT=128, BK=128, STAGES=2, ASMEM=1, SPLIT=4),
          dict(BT=64, BK=128, STAGES=3, ASMEM=1), dict(BT=64, BK=128, STAGES=3, ASMEM=1, SPLIT=2)],
}
REFINED = [(name, (m, n, 4096), dict(config, **({} if name == "w4gemm" else
                                                {"warp_specialize": False})))
           for n in (4096, 14336) for m in (16, 64, 128)
           for name, config in [("w4gemm", _GEMM_BY_M[m])]
           + [("w4swap", c) for c in _REFINED_BY_M[m]]]
# Session 8: the weights in the MMA fragment's order (16-byte loads, `quant_fragment`)
# beside session 7's entry-point winners of the swapped kernel.
_FRAGMENT_BY_M = {   # round 2: more blocks (split K), 64-k blocks a step (KS), register path
    16: [dict(BT=16, STAGES=4, SPLIT=8), dict(BT=16, STAGES=4, KS=2, SPLIT=4),
         dict(BT=16, STAGES=4, KS=2, SPLIT=8), dict(BT=16, STAGES=4, KS=4, SPLIT=8),
         dict(BT=16, STAGES=3, KS=2, SPLIT=8, WSMEM=0)],
    64: [dict(BT=64, STAGES=3, KS=2, SPLIT=2), dict(BT=64, STAGES=3, KS=2, SPLIT=4),
         dict(BT=64, STAGES=3, KS=4, SPLIT=4)],
    128: [dict(BT=128, STAGES=3, KS=2, SPLIT=2), dict(BT=128, STAGES=3, KS=2, SPLIT=4),
          dict(BT=64, STAGES=3, KS=2, SPLIT=4)],
}
_SESSION7_BEST = {16: dict(BT=16, BK=128, STAGES=3, ASMEM=1, SPLIT=8),
                  64: dict(BT=64, BK=128, STAGES=3, ASMEM=1, SPLIT=2),
                  128: dict(BT=64, BK=128, STAGES=3, ASMEM=1, SPLIT=2)}
_FRAGMENT_BY_M[1] = [dict(BT=16, STAGES=4, KS=2, SPLIT=8), dict(BT=16, STAGES=4, SPLIT=16)]
FRAGMENT = [(name, (m, n, 4096), dict(config, warp_specialize=False) if name != "w4rows"
             else config)
            for m in (16, 1, 64, 128) for n in (4096, 14336)
            for name, config in ([("w4rows", dict(BN=4, S=8, R=2, UNROLL=2))] if m == 1 else
                                 [("w4swap", _SESSION7_BEST[m])])
            + [("w4frag", c) for c in _FRAGMENT_BY_M[m]]]
# Session 9: small M on the three N (4096, 11008, 14336 at K = 4096): fewer, longer
# blocks (KS=4, less split K: the pipeline's prologue and the split sum amortized) against
# session 8's winner (KS=2, SPLIT=4) and SPLIT 3/6 (whole waves of ~6 blocks an SM at
# N = 14336?); at 64 and 128 tokens the weights straight into
# registers (WSMEM=0: the activations then come by TMA, ~70 fewer SASS a k-step at BT=128),
# and 2-4 warpgroups of weight rows a block (WG) sharing each activation tile.
_SESSION9_BY_M = {
    16: [dict(BT=16, STAGES=4, KS=2, SPLIT=4), dict(BT=16, STAGES=4, KS=2, SPLIT=3),
         dict(BT=16, STAGES=4, KS=2, SPLIT=6), dict(BT=16, STAGES=3, KS=4, SPLIT=4),
         dict(BT=16, STAGES=3, KS=2, SPLIT=4, blocks_per_sm=7)],   # 72 registers, 7 blocks
    128: [dict(BT=128, STAGES=2, KS=2, WSMEM=0), dict(BT=128, STAGES=3, KS=2, SPLIT=2, WSMEM=0),
          dict(BT=128, STAGES=3, KS=2, WG=2), dict(BT=128, STAGES=2, KS=2, WG=2, WSMEM=0)],
    64: [dict(BT=64, STAGES=3, KS=2, SPLIT=2, WSMEM=0), dict(BT=64, STAGES=3, KS=2, WG=2),
         dict(BT=64, STAGES=3, KS=2, WG=2, SPLIT=2), dict(BT=64, STAGES=3, KS=2, WG=4, WSMEM=0)],
}
SESSION9 = [("w4frag", (m, n, 4096), dict(c, warp_specialize=False))
            for n in (14336, 4096, 11008) for m in (16, 128, 64) for c in _SESSION9_BY_M[m]]
# Session 10: the k-step's dequantization in fewer SASS (mask and magic number as one lop3;
# f16's odd pair slots read in place: one shift a word) and both copies as TMA boxes (the
# weight words' pinned row-major stage too; load_path="cp.async" is the old path, side by
# side) — at 16 tokens fewer, longer blocks (the prologue amortized); at 64/128 session
# 9's winners, to see what the cheaper k-step moves there.
_SESSION10_BY_M = {
    16: [dict(BT=16, STAGES=3, KS=4, SPLIT=4), dict(BT=16, STAGES=3, KS=4, SPLIT=4,
                                                     load_path="cp.async"),
         dict(BT=16, STAGES=3, KS=4, SPLIT=3), dict(BT=16, STAGES=3, KS=4, SPLIT=2),
         dict(BT=16, STAGES=4, KS=2, SPLIT=3), dict(BT=16, STAGES=4, KS=2, SPLIT=3,
                                                    load_path="cp.async"),
         # no split sum at all: with TMA one warp issues the block's loads, and a deeper
         # ring keeps a block's bytes in flight where the grid is ~1.7 blocks an SM
         dict(BT=16, STAGES=4, KS=4, SPLIT=1), dict(BT=16, STAGES=5, KS=4, SPLIT=1)],
    # 64-128 tokens: one 64-k block a step (KS=1) halves the stage and the A registers,
    # so more blocks fit an SM (the MMA of one block overlaps another's dequantization)
    64: [dict(BT=64, STAGES=3, KS=2, SPLIT=2, WSMEM=0), dict(BT=64, STAGES=3, KS=2, SPLIT=2),
         dict(BT=64, STAGES=4, KS=1, SPLIT=2)],
    128: [dict(BT=128, STAGES=3, KS=2, SPLIT=2, WSMEM=0), dict(BT=128, STAGES=2, KS=2, SPLIT=2),
          dict(BT=128, STAGES=4, KS=1, SPLIT=2)],
}
_SESSION10_BY_N = {   # 16 tokens at the smaller N: the split that fills the SMs
    4096: [dict(BT=16, STAGES=3, KS=4, SPLIT=4), dict(BT=16, STAGES=3, KS=4, SPLIT=8),
           dict(BT=16, STAGES=4, KS=2, SPLIT=8)],
    11008: [dict(BT=16, STAGES=3, KS=4, SPLIT=3), dict(BT=16, STAGES=3, KS=4, SPLIT=2),
            dict(BT=16, STAGES=4, KS=4, SPLIT=1)],
}
SESSION10 = [("w4frag", (m, n, 4096), dict(c, warp_specialize=False))
             for m, n in ((16, 14336), (128, 14336), (64, 14336), (16, 4096), (128, 4096),
                          (16, 11008))
             for c in (_SESSION10_BY_N[n] if m == 16 and n in _SESSION10_BY_N
                       else _SESSION10_BY_M[m])]
# Session 11: 16 tokens (and 1) with the cp.async ring (session 10's best): the split
# factor against the SMs (N = 14336: 224 row tiles; 4 blocks an SM by registers; the split
# is read from the grid, one build for all), deeper rings for fewer, longer blocks, 2-4
# warpgroups of rows sharing the activations (WG). Round 1 also timed the k-step in
# parts (PARTS: each part's dequantization overlapping the last part's wgmmas): slower
# at every shape (results file), removed. Row 0 is session 10's best (ncu'd in round 1).
_CP = dict(BT=16, load_path="cp.async")
_SESSION11_BY_N = {
    14336: [dict(_CP, KS=4, SPLIT=4, STAGES=3), dict(_CP, KS=4, SPLIT=3, STAGES=3),
            dict(_CP, KS=4, SPLIT=2, STAGES=4), dict(_CP, KS=4, SPLIT=1, STAGES=6),
            dict(_CP, KS=4, SPLIT=1, STAGES=5), dict(_CP, KS=4, SPLIT=6, STAGES=3),
            dict(_CP, KS=4, SPLIT=4, STAGES=3, WG=2)],
    4096: [dict(_CP, KS=4, SPLIT=4, STAGES=3), dict(_CP, KS=4, SPLIT=6, STAGES=3),
           dict(_CP, KS=4, SPLIT=8, STAGES=3), dict(_CP, KS=2, SPLIT=8, STAGES=4)],
}
SESSION11 = ([("w4frag", (16, n, 4096), dict(c, warp_specialize=False))
              for n in (14336, 4096) for c in _SESSION11_BY_N[n]]
             + [("w4frag", (16, 4096, 14336), dict(_CP, KS=4, SPLIT=s, STAGES=3,
                                                    warp_specialize=False)) for s in (4, 8)]
             + [("w4frag", (1, 14336, 4096), dict(_CP, KS=4, SPLIT=s, STAGES=st,
                                                   warp_specialize=False))
                for s, st in ((3, 3), (1, 6))]
             + [("w4frag", (128, 4096, 4096), dict(BT=128, KS=2, SPLIT=s, STAGES=3,
                                                   warp_specialize=False)) for s in (4, 8)])
# Session 12: fewer SASS a weight (benchmarks/w4a16_sass.py: 4.22 at session 11's best):
# INTEGER_ZEROS=1 (quantize_w4's integer zeros: no residue HADD2, 3.71), SCALE_AFTER=1 at
# KS=4/8 (the scale on each group's f32 sums, the step in parts of a group: 3.39 / 3.04),
# against session 11's best per shape (row 0 of each shape), the cp.async ring and TMA;
# WG = 2-4 warpgroups of rows a block (more warps an SM at 16 tokens; at 64-128 tokens
# fewer row blocks re-reading the activations from L2).
_IZ = dict(_CP, INTEGER_ZEROS=1)
_SA = dict(_IZ, SCALE_AFTER=1)
SESSION12 = ([("w4frag", (16, 14336, 4096), dict(c, warp_specialize=False)) for c in (
    dict(_CP, KS=4, STAGES=6), dict(_IZ, KS=4, STAGES=6), dict(_SA, KS=4, STAGES=6),
    # splits in one wave: KS=4 SA (96 registers, 48 KB) 4 blocks an SM, 448 blocks at
    # split 2; KS=2 SA (80 registers, 32 KB) 6 an SM, 672 at split 3
    dict(_SA, KS=8, STAGES=4), dict(_SA, KS=4, STAGES=3, SPLIT=2),
    dict(_SA, KS=4, STAGES=3, SPLIT=4), dict(_SA, KS=2, STAGES=4, SPLIT=3),
    dict({k: v for k, v in _SA.items() if k != "load_path"}, KS=4, STAGES=6),
    # two warpgroups of rows a block: twice the warps an SM, half the activation bytes
    dict(_SA, KS=4, STAGES=4, WG=2, SPLIT=2), dict(_SA, KS=4, STAGES=4, WG=2))]
    + [("w4frag", (128, 4096, 4096), dict(c, warp_specialize=False)) for c in (
        dict(BT=128, KS=2, STAGES=3, SPLIT=4), dict(BT=128, KS=2, STAGES=3, SPLIT=4,
                                                     INTEGER_ZEROS=1),
        dict(BT=128, KS=2, STAGES=3, SPLIT=4, INTEGER_ZEROS=1, WG=2),
        # more rows a block: every row block re-reads the activations from L2 (64 MB at
        # BN = 64, 8x the weights' bytes), 128 / 256 rows a block cut that to 1/2, 1/4
        dict(BT=128, KS=2, STAGES=3, SPLIT=8, INTEGER_ZEROS=1, WG=2),
        dict(BT=128, KS=2, STAGES=3, SPLIT=8, INTEGER_ZEROS=1, WG=4))]
    + [("w4frag", (16, 4096, 4096), dict(c, warp_specialize=False)) for c in (
        dict(_CP, KS=4, STAGES=3, SPLIT=4), dict(_SA, KS=4, STAGES=3, SPLIT=4),
        dict(_SA, KS=8, STAGES=3, SPLIT=4), dict(_SA, KS=2, STAGES=4, SPLIT=8))]
    + [("w4frag", (64, 14336, 4096), dict(c, warp_specialize=False)) for c in (
        dict(BT=64, KS=2, STAGES=2, SPLIT=2), dict(BT=64, KS=2, STAGES=2, SPLIT=2,
                                                   INTEGER_ZEROS=1),
        dict(BT=64, KS=2, STAGES=3, SPLIT=2, INTEGER_ZEROS=1, WG=2))]
    + [("w4frag", (16, 4096, 14336), dict(c, warp_specialize=False)) for c in (
        dict(_CP, KS=4, STAGES=3, SPLIT=4), dict(_SA, KS=4, STAGES=3, SPLIT=4),
        dict(_SA, KS=2, STAGES=4, SPLIT=8))]
    + [("w4frag", (128, 14336, 4096), dict(c, warp_specialize=False)) for c in (
        dict(BT=128, KS=2, STAGES=3, SPLIT=2), dict(BT=128, KS=2, STAGES=3, SPLIT=2,
                                                    INTEGER_ZEROS=1, WG=2))])
# Session 12, round 2: around round 1's best (two warpgroups of rows, unsplit, 21.5 µs at
# 16x14336x4096): ring depth, KS=2, without the scale after, and at 11008 rows.
_WG2 = dict(_SA, WG=2)
SESSION12B = [("w4frag", shape, dict(c, warp_specialize=False)) for shape, c in (
    ((16, 14336, 4096), dict(_WG2, KS=4, STAGES=4)), ((16, 14336, 4096), dict(_WG2, KS=4, STAGES=3)),
    ((16, 14336, 4096), dict(_WG2, KS=4, STAGES=6)), ((16, 14336, 4096), dict(_WG2, KS=2, STAGES=6)),
    ((16, 14336, 4096), dict(_IZ, WG=2, KS=4, STAGES=4)),
    ((16, 11008, 4096), dict(_WG2, KS=4, STAGES=4)), ((16, 11008, 4096), dict(_SA, KS=4, STAGES=6)))]
# Session 13: the CUDA-core kernel for a few tokens on the same fragment-ordered words
# (`quant_gemv`, name "w4gemv": launched through `w4a16_config` with GEMV=1) — KS stored
# blocks a step over KW warps — beside the tensor-core kernel's best configs of session 12
# at each shape (the entry point's picks, round 2).
_GV = dict(GEMV=1, INTEGER_ZEROS=1)
_FRAG_1 = {(14336, 4096): dict(_SA, KS=4, STAGES=6), (11008, 4096): dict(_SA, KS=4, STAGES=6),
           (4096, 4096): dict(_CP, INTEGER_ZEROS=1, KS=2, STAGES=4, SPLIT=4),
           (4096, 14336): dict(_CP, INTEGER_ZEROS=1, KS=4, STAGES=3, SPLIT=4)}
SESSION13 = [row for (n, k), gemv in (   # (KS, KW, ASTAGES[, SPLIT])
    ((14336, 4096), ((8, 8, 0), (8, 8, 3), (16, 8, 0), (16, 8, 3), (16, 4, 0), (16, 4, 3),
                     (32, 8, 3))),
    ((4096, 4096), ((8, 8, 0), (8, 8, 3), (16, 8, 3), (16, 4, 0), (16, 4, 3), (8, 4, 3, 2))),
    ((4096, 14336), ((16, 8, 3), (16, 4, 3), (32, 8, 3))),
    ((11008, 4096), ((8, 8, 3), (16, 8, 3), (16, 4, 3))))
    for row in [("w4frag", (1, n, k), dict(_FRAG_1[n, k], BT=16, warp_specialize=False))]
    + [("w4gemv", (1, n, k), dict(_GV, KS=c[0], KW=c[1], ASTAGES=c[2],
                                  SPLIT=c[3] if len(c) > 3 else 1)) for c in gemv]] + [
    ("w4gemv", (m, 14336, 4096), dict(_GV, KS=ks, KW=8, ASTAGES=3, MT=m))
    for m in (4, 2) for ks in (8, 16)] + [
    ("w4frag", (4, 14336, 4096), dict(_SA, KS=4, STAGES=6, BT=16, warp_specialize=False))]
# ... and split K summed in the same launch by each tile's last block (FUSED=1,
# `tg.last_arrival`) against the two-launch split, at the entry point's split picks.
SESSION13 += [("w4frag", shape, dict(c, FUSED=fused, warp_specialize=False))
              for shape, c in (((16, 4096, 4096), dict(_CP, INTEGER_ZEROS=1, KS=4, SPLIT=4)),
                               ((1, 4096, 4096), dict(_CP, INTEGER_ZEROS=1, KS=2, STAGES=4,
                                                      SPLIT=4)),
                               ((16, 4096, 14336), dict(_CP, INTEGER_ZEROS=1, KS=4, SPLIT=4)),
                               ((128, 4096, 4096), dict(BT=128, KS=2, SPLIT=4,
                                                        INTEGER_ZEROS=1)),
                               ((64, 14336, 4096), dict(BT=64, KS=2, SPLIT=2, WG=2,
                                                        INTEGER_ZEROS=1)))
              for fused in (0, 1)]
# ... and split K at the 16-token shapes that ran unsplit (21.5-22 µs at 16x14336x4096): its
# second launch cost more than the warps it added; fused, it adds warps alone
SESSION13 += [("w4frag", (16, n, 4096), dict(_SA, KS=4, STAGES=6 if split == 1 else 3,
                                             SPLIT=split, FUSED=int(split > 1),
                                             warp_specialize=False))
              for n in (14336, 11008) for split in (1, 2, 3)]
# Session 13, round 2: the GEMV configs added after round 1 (4 warps of one block a step:
# one wave at N = 14336; the activations a step ahead; two row quarters a thread) at the
# shapes it lost
SESSION13B = [("w4gemv", (1, n, k), dict(_GV, KS=ks, KW=kw, AHEAD=ahead, RW=rw))
              for n, k in ((14336, 4096), (4096, 14336))
              for ks, kw, ahead, rw in ((8, 8, 0, 1), (8, 8, 1, 1), (4, 4, 0, 1),
                                        (4, 4, 1, 1), (4, 4, 0, 2), (8, 8, 0, 2),
                                        (4, 4, 1, 2))]
# Session 14: two k-steps an iteration with two register A operands (PAIRS=1: the words
# straight into registers, the tokens through the warp-specialized TMA ring; one operand
# would make ptxas serialize the consumer's wgmmas, C7513; within a warpgroup ptxas still
# waits before dequantizing the next operand), SCALE_AFTER (each step's f32 sum scaled:
# 2.86 SASS a weight at 16 tokens, 3.17 without), WG warpgroups of rows a block (one block
# an SM by registers: 4-16 consumer warps), consumers="pingpong" (two warpgroups taking
# turns at the tensor cores), and the same fragment kernel built for sm_90 without "a"
# (`_M`: mma.sync, no wgmma: 66-99 registers, several blocks an SM, and no ptxas rule
# against dequantizing while the HMMAs run), beside each shape's best of sessions 12-13
# (its first row).
_P = dict(WSMEM=0, PAIRS=1, warp_specialize=True, INTEGER_ZEROS=1, KS=2, STAGES=3)
_M = dict(_IZ, target="sm_90", STAGES=4)   # mma.sync: sm_90 without "a" has no wgmma
SESSION14 = [("w4frag", shape, c) for shape, configs in (
    ((16, 14336, 4096), (dict(_SA, KS=4, STAGES=6, warp_specialize=False),
                         dict(_P, BT=16, WG=2), dict(_P, BT=16, WG=4, SPLIT=2, SCALE_AFTER=1),
                         dict(_M, KS=4, SCALE_AFTER=1, SPLIT=2),
                         dict(_M, KS=4, SCALE_AFTER=1, WG=2, SPLIT=2),
                         dict(_P, BT=16, WG=4, SPLIT=2), dict(_P, BT=16, WG=2, SCALE_AFTER=1),
                         dict(_M, KS=2, SPLIT=2))),
    ((16, 4096, 4096), (dict(_IZ, KS=2, STAGES=4, SPLIT=4, warp_specialize=False),
                        dict(_P, BT=16, WG=4, SPLIT=8, SCALE_AFTER=1),
                        dict(_M, KS=4, SCALE_AFTER=1, SPLIT=4),
                        dict(_P, BT=16, WG=4, SPLIT=8), dict(_P, BT=16, WG=2, SPLIT=4))),
    ((1, 14336, 4096), (dict(_SA, KS=4, STAGES=6, warp_specialize=False),   # 8-token tiles:
                        dict(_M, KS=4, SCALE_AFTER=1, SPLIT=2),   # mma.sync n8 / wgmma n8
                        dict(_M, KS=4, SCALE_AFTER=1, SPLIT=2, BT=8),
                        dict(_SA, KS=4, STAGES=6, BT=8, warp_specialize=False),
                        dict(_P, BT=16, WG=4, SPLIT=2, SCALE_AFTER=1))),
    ((64, 14336, 4096), (dict(BT=64, KS=2, STAGES=3, SPLIT=2, WG=2, INTEGER_ZEROS=1,
                              warp_specialize=False),
                         dict(_P, BT=64, WG=2), dict(_P, BT=64, WG=4, SPLIT=2),
                         dict(_P, BT=64, WG=2, consumers="pingpong"),
                         dict(_M, BT=64, KS=2, WG=2, SPLIT=2))),
    ((128, 4096, 4096), (dict(BT=128, KS=2, SPLIT=4, INTEGER_ZEROS=1, warp_specialize=False),
                         dict(_P, BT=128, WG=2, SPLIT=4),
                         dict(_P, BT=128, WG=2, SPLIT=4, consumers="pingpong"))),
    )
    for c in configs]
SETS = {"session6": SESSION6, "swapped": SWAPPED, "refined": REFINED, "fragment": FRAGMENT,
        "session9": SESSION9, "session10": SESSION10, "session11": SESSION11,
        "session12": SESSION12, "session12b": SESSION12B, "session13": SESSION13,
        "session13b": SESSION13B, "session14": SESSION14}


GROUP = 128


def _tensors(torch, gemv: bool, shape):
    """The inputs of one shape (f16; W4A16 weights quantized in groups of GROUP with zero
    points, or an f16 weight for the GEMV), a NaN-poisoned output, the floor bytes, the
    float64 reference and torch's f16 matmul."""
    import tegula.kernels as tk

    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    if gemv:
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        return dict(a=a, w=w, out=out, floor=w.numel() * 2, torch=lambda: a @ w.T,
                    ref=lambda: a.double() @ w.double().T)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.05
    packed, scales, zeros = tk.quantize_w4(w, GROUP)
    w_q = tk.unpack_w4(packed)
    deq = ((w_q.float() - zeros.float().repeat_interleave(GROUP, 1))
           * scales.float().repeat_interleave(GROUP, 1)).half()
    return dict(a=a, packed=packed, scales=scales, zeros=zeros, out=out,
                floor=packed.numel() + 2 * scales.numel() * 2, torch=lambda: a @ deq.T,
                ref=lambda: a.double() @ deq.double().T)


def _runner(name, shape, t, config):
    """A zero-argument launch of one config on the shape's tensors `t` (the W4A16 kinds
    through `w4a16_config` and `launch_w4a16`, as the entry points run them)."""
    import torch

    import tegula as tg
    from tegula.build import launch
    from tegula.dtypes import f16
    from tegula.kernels import quant
    from tegula.kernels.gemv import gemv_kernel

    m, n, k = shape
    if name == "gemv":
        grid, constexprs = (tg.cdiv(n, config["BN"]),), dict(config, M=m)
        return lambda: launch(gemv_kernel(f16), grid, t["a"], t["w"], t["out"], **constexprs)
    parts = {}  # split K's workspace, allocated once

    def empty_f32(shape):
        if shape not in parts:
            parts[shape] = torch.empty(shape, dtype=torch.float32, device="cuda")
        return parts[shape]

    run = lambda kernel, g, args, cx: launch(kernel, g, *args, **cx)  # noqa: E731
    if name == "w4frag":
        from tegula.kernels import quant_fragment as qf
        if "stored" not in t:
            t["stored"] = qf.as_words(qf.pack_fragments(t["packed"]))
        grid, constexprs = qf.fragment_config(m, n, k, GROUP, **config)
        operands = (t["a"], t["stored"], t["scales"], t["zeros"])
        def counters(size):   # FUSED=1's, zeroed once: each launch leaves them at zero
            return t.setdefault(("counters", size),
                                torch.zeros(size, dtype=torch.int32, device="cuda"))
        return lambda: qf.launch_w4a16_fragment(grid, constexprs, f16, True, operands,
                                                t["out"], run, empty_f32, counters)
    kind, grid, constexprs = quant.w4a16_config(m, n, k, GROUP, **config)
    operands = (*quant.w4a16_operands(kind, t["a"], t["packed"], GROUP), t["scales"],
                t["zeros"])
    return lambda: quant.launch_w4a16(
        kind, grid, constexprs, f16, True, operands, t["out"],
        run, empty_f32)


def _print_row(r) -> None:
    shape = "x".join(map(str, r[1]))
    cfg = ",".join(f"{k}={v}" for k, v in r[2].items() if k != "warp_specialize" or v)
    if isinstance(r[3], str):
        print(f"{r[0]:7} {shape:>14} {cfg:44} {r[3]}", flush=True)
    else:
        print(f"{r[0]:7} {shape:>14} {cfg:44} {r[3]:7.1f} {r[4]:5.2f} {r[5]:5.0%} "
              f"{r[6]:6.2f} {r[7]:8.1e} {r[8]:6.0f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), default="session6",
                        help="which list of configs (default session6)")
    parser.add_argument("--only", default="", help="names starting with this")
    parser.add_argument("--budget", type=float, default=35.0, help="seconds in all")
    parser.add_argument("--rep-ms", type=float, default=100.0,
                        help="milliseconds of timed runs per config (default 100)")
    parser.add_argument("--index", type=int, nargs="*", default=None,
                        help="only these rows of the set (0-based)")
    parser.add_argument("--profile", action="store_true",
                        help="launch each config once after its check, untimed (under ncu)")
    args = parser.parse_args()
    import torch

    from tegula.bench.gpu import copy_bandwidth, time_ms

    start = time.time()
    copy = copy_bandwidth(torch, gib=0.5)
    print(f"{torch.cuda.get_device_name()}: copy {copy / 1e12:.2f} TB/s")
    torch_us = {}
    print(f"{'kernel':7} {'MxNxK':>14} {'config':44} {'us':>7} {'TB/s':>5} {'copy':>5} "
          f"{'xtorch':>6} {'relerr':>8} {'host':>6}")
    timer = lambda fn: time_ms(fn, warmup_ms=args.rep_ms / 4, rep_ms=args.rep_ms)  # noqa: E731
    host_us = [0.0]
    tensors_of = {}  # the current shape's tensors (quantizing each config again is slow)
    for row, (name, shape, config) in enumerate(SETS[args.set]):
        if not name.startswith(args.only) or time.time() - start > args.budget:
            continue
        if args.index is not None and row not in args.index:
            continue
        key = (name == "gemv", shape)
        if key not in tensors_of:
            tensors_of.clear()
            torch.cuda.empty_cache()
            tensors_of[key] = _tensors(torch, *key)
        t = tensors_of[key]
        try:
            t["out"].fill_(float("nan"))
            run = _runner(name, shape, t, config)
            run()
            torch.cuda.synchronize()
            ref = t["ref"]()
            err = ((t["out"].double() - ref).norm() / ref.norm()).item()
            if args.profile:
                run()
                torch.cuda.synchronize()
                print(f"profiled {name} {shape} {config}: relerr {err:.1e}", flush=True)
                continue
            began = time.perf_counter()
            run()
            host_us[0] = (time.perf_counter() - began) * 1e6   # the launch path's host time
            torch.cuda.synchronize()
            us = timer(run) * 1e3
        except Exception as e:  # noqa: BLE001 — a config that fails is a row, not the end
            _print_row((name, shape, config, f"{type(e).__name__}: {str(e)[:60]}"))
            continue
        if key not in torch_us:
            torch_us[key] = timer(t["torch"]) * 1e3
            print(f"{'torch':7} {'x'.join(map(str, shape)):>14} {'f16 matmul (cuBLAS)':44} "
                  f"{torch_us[key]:7.1f}", flush=True)
        floor = t["floor"]
        _print_row((name, shape, config, us, floor / us / 1e6,
                    floor / us / 1e6 / (copy / 1e12), torch_us[key] / us, err, host_us[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
