"""The scan kernels the emulator tests (tests/emulate/test_scan.py) and the GPU tests
(tests/gpu/test_scan_gpu.py) both run, with their shapes and data."""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula import f16, f32, i32

# (M, N, BM, BN, threads): the tile (BM, BN) scanned along either axis.
SHAPES = [
    (5, 60, 4, 64, 128),      # 4 rows: 32 lanes per row along N, 1 lane along M (axis 0)
    (3, 1000, 1, 1024, 128),  # one row over all 4 warps: warp totals through shared memory
    (7, 33, 8, 40, 64),       # 40 = 8 lanes x 5 registers; ragged both ways
    (9, 100, 2, 100, 128),    # 100 = 4 lanes x 25; 128 threads for 200 elements: replicas
    (2, 5, 2, 5, 128),        # 10 elements on 128 threads: one thread per row, replicas
    (64, 96, 64, 96, 128),    # rows first: each thread scans whole rows in registers
    (1, 2048, 1, 2048, 256),  # 8 warps along one row
]


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    """Random non-zero f32 data of both signs."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.25, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
    return x.astype(np.float32)


@tg.kernel(threads=128)
def cumsum_tile(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4,
                BN: tg.constexpr = 64, AXIS: tg.constexpr = 1, REVERSE: tg.constexpr = False):
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m, 0)))
    tg.copy(tg.cumsum(t, AXIS, reverse=REVERSE), y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=128)
def cumsum_i32(x: tg.Tensor[i32], y: tg.Tensor[i32], BM: tg.constexpr = 2,
               BN: tg.constexpr = 64, REVERSE: tg.constexpr = False):
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m, 0)))
    tg.copy(tg.cumsum(t, 1, reverse=REVERSE), y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=128)
def cumsum_f16(x: tg.Tensor[f16], y: tg.Tensor[f16], BN: tg.constexpr = 4096):
    t = tg.load(x.tile((1, BN), (0, 0)))
    tg.copy(tg.cumsum(t, 1), y.tile((1, BN), (0, 0)))


@tg.kernel(threads=128)
def affine_scan(a: tg.Tensor[i32], b: tg.Tensor[i32], pa: tg.Tensor[i32],
                pb: tg.Tensor[i32], BM: tg.constexpr = 2, BN: tg.constexpr = 64,
                REVERSE: tg.constexpr = False):
    """Composition of the maps h -> a*h + b (in wrapping i32, exactly associative and not
    commutative): the linear recurrence's combine, checked bit for bit."""
    m = tg.block_id(0)
    ta = tg.load(a.tile((BM, BN), (m, 0)), fill=1)
    tb = tg.load(b.tile((BM, BN), (m, 0)))
    ra, rb = tg.scan((ta, tb), 1, lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]),
                     reverse=REVERSE)
    tg.copy(ra, pa.tile((BM, BN), (m, 0)))
    tg.copy(rb, pb.tile((BM, BN), (m, 0)))


@tg.kernel(threads=128)
def max_and_first(x: tg.Tensor[f32], mx: tg.Tensor[f32], first: tg.Tensor[f32],
                  BM: tg.constexpr = 4, BN: tg.constexpr = 64, AXIS: tg.constexpr = 1):
    m = tg.block_id(0)
    t = tg.load(x.tile((BM, BN), (m, 0)), fill=-float("inf"))
    tg.copy(tg.scan(t, AXIS, tg.maximum), mx.tile((BM, BN), (m, 0)))
    tg.copy(tg.scan(t, AXIS, lambda a, b: a), first.tile((BM, BN), (m, 0)))


@tg.kernel(threads=128)
def chunked_affine(a: tg.Tensor[i32], b: tg.Tensor[i32], pa: tg.Tensor[i32],
                   pb: tg.Tensor[i32], last: tg.Tensor[i32], BM: tg.constexpr = 2,
                   BN: tg.constexpr = 64, AXIS: tg.constexpr = 1,
                   REVERSE: tg.constexpr = False):
    """The affine scan of whole rows (AXIS=1; columns for AXIS=0) in chunks of BN, the
    state carried from chunk to chunk by `initial=` and the carry (both halves of the
    pair); `last` gets the final carry's b half (the recurrence's last state)."""
    m = tg.block_id(0)
    tile = (BM, BN) if AXIS == 1 else (BN, BM)
    one = (BM, 1) if AXIS == 1 else (1, BM)
    steps = a.shape[AXIS]
    state = (tg.full(one, 1, i32), tg.zeros(one, i32))
    for i in tg.range(tg.cdiv(steps, BN)):
        k = tg.cdiv(steps, BN) - 1 - i if REVERSE else i
        at = (m, k) if AXIS == 1 else (k, m)
        ta = tg.load(a.tile(tile, at), fill=1)
        tb = tg.load(b.tile(tile, at))
        (ra, rb), state = tg.scan((ta, tb), AXIS, lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]),
                                  reverse=REVERSE, initial=state)
        tg.copy(ra, pa.tile(tile, at))
        tg.copy(rb, pb.tile(tile, at))
    tg.copy(state[1], last.tile(one, (m, 0) if AXIS == 1 else (0, m)))
