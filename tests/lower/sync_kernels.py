"""Kernels whose shared-memory accesses need barriers across loop iterations, after loops,
inside nested loops and branches, and in a warp-specialized consumer loop (`lower.py`
`SharedSync`), with numpy references; shared by `test_shared_sync.py` and the GPU test.

Every kernel reads a shared tile through `.T`, so each thread reads elements other threads
wrote: a missing barrier is a race, not a thread reading back its own value."""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula import f16, f32

T = 16


@tg.kernel(threads=64)
def carried(x: tg.Tensor[f32], y: tg.Tensor[f32], n: int):
    """Written at the end of iteration i, read at the start of i + 1."""
    s = tg.shared((T, T), f32)
    tg.copy(x.tile((T, T), (0, 0)), s)
    acc = tg.zeros((T, T), f32)
    for i in tg.range(n):
        r = tg.load(s.T)
        acc = acc + r
        tg.copy(r * 0.5 + 1.0, s)
    tg.copy(acc, y.tile((T, T), (0, 0)))


def carried_ref(x, n):
    s, acc = x[0:T], np.zeros((T, T), np.float32)
    for _ in range(n):
        r = s.T.copy()
        acc = acc + r
        s = r * np.float32(0.5) + np.float32(1)
    return acc


@tg.kernel(threads=64)
def write_after_loop(x: tg.Tensor[f32], y: tg.Tensor[f32], n: int):
    """A tile only read inside a loop (no barrier needed per iteration), written after it."""
    s = tg.shared((T, T), f32)
    tg.copy(x.tile((T, T), (0, 0)), s)
    acc = tg.zeros((T, T), f32)
    for i in tg.range(n):
        acc = acc + tg.load(s.T) * (i + 1)
    tg.copy(x.tile((T, T), (1, 0)), s)
    acc = acc + tg.load(s.T)
    tg.copy(acc, y.tile((T, T), (0, 0)))


def write_after_loop_ref(x, n):
    acc = np.zeros((T, T), np.float32)
    for i in range(n):
        acc = acc + x[0:T].T * np.float32(i + 1)
    return acc + x[T:2 * T].T


@tg.kernel(threads=64)
def nested(x: tg.Tensor[f32], y: tg.Tensor[f32], n: int, m: int):
    """Written in an outer loop, read in an inner one (run-time trip counts, maybe 0)."""
    s = tg.shared((T, T), f32)
    acc = tg.zeros((T, T), f32)
    for i in tg.range(n):
        tg.copy(x.tile((T, T), (i, 0)), s)
        for _ in tg.range(m):
            acc = acc + tg.load(s.T)
    tg.copy(acc, y.tile((T, T), (0, 0)))


def nested_ref(x, n, m):
    acc = np.zeros((T, T), np.float32)
    for i in range(n):
        for _ in range(m):
            acc = acc + x[i * T:(i + 1) * T].T
    return acc


@tg.kernel(threads=64)
def branch_in_loop(x: tg.Tensor[f32], y: tg.Tensor[f32], n: int):
    """A write inside a branch of a loop, read at the top of the next iteration; and a
    branch of register work only, which needs no barrier."""
    s = tg.shared((T, T), f32)
    tg.copy(x.tile((T, T), (0, 0)), s)
    acc = tg.zeros((T, T), f32)
    for i in tg.range(n):
        acc = acc + tg.load(s.T)
        with tg.if_(i % 2 == 0):
            tg.copy(x.tile((T, T), (i + 1, 0)), s)
        with tg.if_(i == 1):
            acc = acc * 2.0
    tg.copy(acc, y.tile((T, T), (0, 0)))


def branch_in_loop_ref(x, n):
    s, acc = x[0:T], np.zeros((T, T), np.float32)
    for i in range(n):
        acc = acc + s.T
        if i % 2 == 0:
            s = x[(i + 1) * T:(i + 2) * T]
        if i == 1:
            acc = acc * np.float32(2)
    return acc


@tg.kernel(threads=64)
def register_branch(x: tg.Tensor[f32], y: tg.Tensor[f32], n: int):
    """A shared write, then a branch of register work only (no barrier before it), then a
    branch reading the tile (a barrier before it)."""
    s = tg.shared((T, T), f32)
    tg.copy(x.tile((T, T), (0, 0)), s)
    acc = tg.indices((T, T), 1, offset=n).to(f32)
    with tg.if_(n > 1):
        acc = acc * 3.0
    with tg.if_(n > 2):
        acc = acc + tg.load(s.T)
    tg.copy(acc, y.tile((T, T), (0, 0)))


def register_branch_ref(x, n):
    acc = np.broadcast_to(np.arange(T, dtype=np.float32) + n, (T, T)).copy()
    if n > 1:
        acc = acc * np.float32(3)
    if n > 2:
        acc = acc + x[0:T].T
    return acc


#: (name, kernel, reference, scalar arguments)
PLAIN_CASES = [
    ("carried", carried, carried_ref, (3,)),
    ("carried_zero_trips", carried, carried_ref, (0,)),
    ("write_after_loop", write_after_loop, write_after_loop_ref, (3,)),
    ("write_after_loop_zero_trips", write_after_loop, write_after_loop_ref, (0,)),
    ("nested", nested, nested_ref, (3, 2)),
    ("nested_inner_zero_trips", nested, nested_ref, (2, 0)),
    ("branch_in_loop", branch_in_loop, branch_in_loop_ref, (4,)),
    ("register_branch", register_branch, register_branch_ref, (3,)),
    ("register_branch_skipped", register_branch, register_branch_ref, (1,)),
]


def plain_inputs(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((6 * T, T)).astype(np.float32)


@tg.kernel(threads=128)
def consumer_scratch(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                     BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32,
                     STAGES: tg.constexpr = 2):
    """A warp-specialized consumer loop (sm_90a) that writes a scratch tile, then reads it
    transposed: iteration k + 1's write races iteration k's reads unless a barrier ends
    the body (no refill barrier tops a consumer iteration)."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    sx = tg.shared((BM, BN), f32)
    acc = tg.zeros((BM, BN), f32)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        part = tg.zeros((BM, BN), f32)
        tg.gemm(part, sa[k], sb[k])
        tg.copy(part, sx)
        acc = acc + tg.load(sx.T)
    tg.copy(acc, c.tile((BM, BN), (m, n)))


@tg.kernel(threads=128)
def consumer_branch_scratch(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                            BM: tg.constexpr = 64, BN: tg.constexpr = 64,
                            BK: tg.constexpr = 32, STAGES: tg.constexpr = 2):
    """`consumer_scratch` with the write inside a branch (always taken): the next
    iteration's first access is in a nested block, which the body's head must count."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    sx = tg.shared((BM, BN), f32)
    acc = tg.zeros((BM, BN), f32)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        part = tg.zeros((BM, BN), f32)
        tg.gemm(part, sa[k], sb[k])
        with tg.if_(k >= 0):
            tg.copy(part, sx)
        acc = acc + tg.load(sx.T)
    tg.copy(acc, c.tile((BM, BN), (m, n)))


CONSUMER_KERNELS = [consumer_scratch, consumer_branch_scratch]


def consumer_scratch_inputs(M: int, N: int, K: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    return a, b


def consumer_scratch_ref(a, b, BM=64, BN=64, BK=32):
    """Sum over K blocks of the block product, each block's tile transposed."""
    M, K = a.shape
    N = b.shape[0]
    c = np.zeros((M, N), np.float64)
    for m0 in range(0, M, BM):
        for n0 in range(0, N, BN):
            acc = np.zeros((BM, BN))
            for k0 in range(0, K, BK):
                pa = np.zeros((BM, BK)); pb = np.zeros((BN, BK))
                blk_a = a[m0:m0 + BM, k0:k0 + BK].astype(np.float64)
                blk_b = b[n0:n0 + BN, k0:k0 + BK].astype(np.float64)
                pa[:blk_a.shape[0], :blk_a.shape[1]] = blk_a
                pb[:blk_b.shape[0], :blk_b.shape[1]] = blk_b
                acc += (pa @ pb.T).T
            tile = c[m0:m0 + BM, n0:n0 + BN]
            tile[...] = acc[:tile.shape[0], :tile.shape[1]]
    return c


# Scans back to back: each cumsum over a row that spans the block's warps passes its warp
# totals through one shared scratch row, so the next scan's writes must wait for this
# one's reads — in straight line, across loop trips and after a branch that scans too.
SCAN_BN = 1024


@tg.kernel(threads=128)
def scan_chain(x: tg.Tensor[f32], y: tg.Tensor[f32], n: int):
    for i in tg.range(n):
        t = tg.load(x.tile((1, SCAN_BN), (0, i)))
        u = tg.cumsum(t, 1)
        v = tg.cumsum(u, 1, reverse=True)
        with tg.if_(tg.block_id(0) > 0):
            v = v + tg.cumsum(t * 2.0, 1)
        tg.copy(v, y.tile((1, SCAN_BN), (tg.block_id(0), i)))


def scan_chain_inputs(n: int = 3, seed: int = 0) -> np.ndarray:
    """Small integers (sums exact in f32 in any order), ragged: the last tile is partial."""
    rng = np.random.default_rng(seed)
    return rng.integers(-3, 4, (1, n * SCAN_BN - 77)).astype(np.float32)


def scan_chain_ref(x: np.ndarray, n: int) -> np.ndarray:
    """Rows of blocks 0 and 1 (block 1 takes the branch)."""
    padded = np.zeros(n * SCAN_BN)
    padded[:x.shape[1]] = x[0]
    rows = []
    for block in (0, 1):
        out = []
        for t in padded.reshape(n, SCAN_BN):
            v = np.cumsum(np.cumsum(t)[::-1])[::-1]
            out.append(v + np.cumsum(2 * t) if block else v)
        rows.append(np.concatenate(out)[:x.shape[1]])
    return np.stack(rows).astype(np.float32)


# A loop over the stages of one 2-stage buffer (SharedSync's per-stage carried barrier).
@tg.kernel(threads=64)
def stage_per_iteration(x: tg.Tensor[f32], y: tg.Tensor[f32], STEP: tg.constexpr = 1,
                        AHEAD: tg.constexpr = 0, B: tg.constexpr = 16):
    """Iteration k writes stage k + AHEAD of a 2-stage buffer and reads stage k through
    `.T` (other threads' elements): the write must wait for the reads of its stage."""
    m = tg.block_id(0)
    xv = x.tile((B, B), (m, None))
    s = tg.shared((B, B), f32, stages=2)
    acc = tg.zeros((B, B), f32)
    if AHEAD:
        tg.copy(xv[:, :, 0], s[0])
    for k in tg.range(0, xv.shape[2], STEP):
        tg.copy(xv[:, :, k + AHEAD], s[k + AHEAD])
        acc = acc + tg.load(s[k].T) * (k + 1)
    tg.copy(acc, y.tile((B, B), (0, m)))


def stage_reference(x, step):
    xp = np.pad(x, ((0, 0), (0, -x.shape[1] % 16 + 16))).astype(np.float64)
    blocks = []
    for b in range(x.shape[0] // 16):
        rows = xp[16 * b:16 * b + 16]
        blocks.append(sum(rows[:, 16 * k:16 * k + 16].T * (k + 1)
                          for k in range(0, -(-x.shape[1] // 16), step)))
    return np.concatenate(blocks, axis=1)


def stage_inputs(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((32, 70)).astype(np.float32)
