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
tiles on an H100: `BM=128, BN=256, BK=64, STAGES=4, threads=256` at launch (two
cooperative consumer warpgroups). At `threads=128` (a tile of one warpgroup) synthesis
gives the block two consumer warpgroups that each compute whole tiles (alternate ones),
their K loops taking turns, so one's epilogue runs while the other's wgmmas do
(ping-pong; `consumers="cooperative"` at launch keeps one). On sm_80 it is the Ampere path
(cp.async + mma.sync), each tile refilling its stages from the start.
`tegula explain examples/persistent_gemm.py:persistent_gemm` shows the decisions.

The loop itself is the library's (`tegula.kernels.gemm.persistent_tiles`, which
`tegula.kernels.matmul` runs with fused epilogues): this kernel passes it the epilogue
(round to f16, store), and its comment spells out what it traces.
"""
import tegula as tg
from tegula import f16
from tegula.kernels.gemm import persistent_grid, persistent_tiles  # noqa: F401 (the grid)


@tg.kernel(threads=128)
def persistent_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                    BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
                    STAGES: tg.constexpr = 3, GROUP: tg.constexpr = 8,
                    CLUSTER: tg.constexpr = 1):
    def store(acc, m, n):                     # each tile's epilogue: round, store
        tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))
    # The tile loop, its K pipeline and the clusters: the library's persistent GEMM
    # (tegula.kernels.gemm.persistent_tiles, also under tegula.kernels.matmul), which is
    #   tg.cluster(CLUSTER)                   # CLUSTER blocks share each column tile of b
    #   tiles_m = cdiv(cdiv(M, BM), CLUSTER)  # in units of CLUSTER row tiles
    #   sa, sb = tg.shared(...), tg.shared(...)            # one ring for all the tiles
    #   for t in tg.range(tg.block_id(0) // CLUSTER, tiles_m * tiles_n,
    #                     tg.num_programs(0) // CLUSTER):
    #       mc, n = grouped_tile(t, tiles_m, tiles_n, GROUP)
    #       m = mc * CLUSTER + tg.block_id(0) % CLUSTER    # past a's rows: no store
    #       acc = the README's pipelined K loop for tile (m, n) through sa, sb
    #       store(acc, m, n)
    persistent_tiles(a, b, f16, BM, BN, BK, STAGES, GROUP, store, CLUSTER)


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
