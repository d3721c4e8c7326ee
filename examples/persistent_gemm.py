"""A persistent GEMM: one block per SM walks the output tiles in an L2-friendly order.

c = a @ b.T, with a (M, K) and b (N, K) both K-major, f16 in, f32 accumulation, f16 out —
the README's GEMM body inside a grid-stride loop over output tiles. The grid is
`min(tiles, SMs)` blocks (`persistent_grid`); block b does tiles b, b + grid, b + 2*grid, …
(`tg.num_programs(0)` is the grid size at run time, so one compiled kernel serves every
grid), and `grouped_tile` (tegula.kernels.schedule) turns the linear tile index into a
(row tile, column tile) pair in groups of GROUP row tiles, so blocks running at the same
time share operand tiles in L2.

On sm_90a the K pipeline is TMA + wgmma with one mbarrier ring for the whole block: its
stage and phase come from a use count that runs on from one tile to the next, and the
producer warpgroup walks the same tiles, so it loads the next tile's first stages while the
consumer warpgroups run the current tile's epilogue, which itself goes through a swizzled
shared buffer and TMA stores where c's rows allow (`lower/hopper.py`). The README's
tiles on an H100: `BM=128, BN=256, BK=64, STAGES=4, threads=256` at launch. On sm_80 it is
the Ampere path (cp.async + mma.sync), each tile refilling its stages from the start.
`tegula explain examples/persistent_gemm.py:persistent_gemm` shows the decisions.
"""
import tegula as tg
from tegula import f16, f32
from tegula.kernels.schedule import grouped_tile


@tg.kernel(threads=128)
def persistent_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                    BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
                    STAGES: tg.constexpr = 3, GROUP: tg.constexpr = 8,
                    CLUSTER: tg.constexpr = 1):
    tg.cluster(CLUSTER)                       # CLUSTER blocks share each column tile of b
    tiles_m = tg.cdiv(tg.cdiv(a.shape[0], BM), CLUSTER)   # in units of CLUSTER row tiles
    tiles_n = tg.cdiv(b.shape[0], BN)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for t in tg.range(tg.block_id(0) // CLUSTER, tiles_m * tiles_n,
                      tg.num_programs(0) // CLUSTER):
        mc, n = grouped_tile(t, tiles_m, tiles_n, GROUP)
        m = mc * CLUSTER + tg.block_id(0) % CLUSTER   # may be past a's rows: zeros, no store
        ga = a.tile((BM, BK), (m, None))
        gb = b.tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), f32)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])          # acc += sa @ sb.T
        tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


def persistent_grid(m: int, n: int, num_sms: int, bm: int = 128, bn: int = 128,
                    cluster: int = 1) -> tuple:
    """The launch grid: one block per SM, fewer when there are fewer tiles; whole clusters
    of `cluster` blocks, each cluster walking units of `cluster` row tiles."""
    units = tg.cdiv(tg.cdiv(m, bm), cluster) * tg.cdiv(n, bn)
    return (max(1, min(units, num_sms // cluster)) * cluster,)


def main(m: int = 97, n: int = 130, k: int = 72, num_sms: int = 6) -> None:
    """Emulate at a shape that does not divide the tiles, with more tiles than blocks
    (20 tiles of 32x32 on 6 'SMs'), and check every element against numpy."""
    import numpy as np

    from tegula.build import emulate
    from tegula.kernels.common import random_input

    rng = np.random.default_rng(0)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    # One f16 ulp of the result plus the worst f32 accumulation error over K.
    bound = 2.0 ** -10 * np.abs(ref) + k * 2.0 ** -24 * (np.abs(a) @ np.abs(b).T)
    c = np.empty((m, n), np.float16)
    grid = persistent_grid(m, n, num_sms, 32, 32)
    emulate(persistent_gemm, grid, a, b, c, BM=32, BN=32, BK=32, GROUP=3, num_sms=num_sms)
    assert np.all(np.abs(c - ref) <= bound)
    print(f"persistent gemm {m}x{n}x{k} on {grid[0]} blocks: max error "
          f"{np.abs(c - ref).max():.3g} ok")


if __name__ == "__main__":
    main()
