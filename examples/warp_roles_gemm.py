"""A persistent GEMM whose warp roles are written in the source (sm_90a).

c = a @ b.T, a (M, K) and b (N, K) f16, f32 accumulation, f16 out. On sm_90a synthesis
already splits a TMA + wgmma `tg.pipeline` into a producer warpgroup that issues the stage
loads and consumer warps that compute (`examples/persistent_gemm.py` gets it without
asking). Here the kernel says so itself: the K loop's body is a `tg.producer` block (the
copies into the staged buffers: TMA boxes issued by one extra warpgroup, which waits for
each stage to be released) and a `tg.consumer` block (the gemm: the kernel's threads wait
for each stage to fill, run the wgmmas and release it), each with its register budget per
thread (`setmaxnreg`). Everything outside the pipeline (the tile loop's scalar code, the
accumulator, the epilogue) is the consumer's; the producer walks the same tiles.

With `threads=128` (one warpgroup's 128x128 tile) synthesis gives the block two consumer
warpgroups taking alternate tiles (ping-pong), 384 threads in all: the 40 + 232 budgets
below are what it would choose itself, so this kernel compiles to the same code as the
one without the two `with` lines (tests/lower/test_stated_roles.py compares the CUDA).
`SCHEDULE="cooperative"` (or `"pingpong"`) states the consumer schedule at the block
instead of leaving it to synthesis (`tg.consumer(schedule=)`, the `consumers=` option).
Misuse is an error at its line: a consumer without a producer, a buffer written by both,
a block outside a `tg.pipeline`, budgets over the register file, a target other than
sm_90a (write the loop without the blocks to run it on sm_80 too).

`tegula explain examples/warp_roles_gemm.py:warp_roles_gemm` prints "roles stated in the
source" under the pipeline.
"""
import tegula as tg
from tegula import f16, f32
from tegula.kernels.gemm import persistent_grid  # noqa: F401 (the grid: min(tiles, SMs))
from tegula.kernels.schedule import grouped_tile


@tg.kernel(threads=128)
def warp_roles_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                    BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 64,
                    STAGES: tg.constexpr = 4, GROUP: tg.constexpr = 8,
                    PRODUCER_REGS: tg.constexpr = 40, CONSUMER_REGS: tg.constexpr = 232,
                    SCHEDULE: tg.constexpr = None):
    tiles_m, tiles_n = tg.cdiv(a.shape[0], BM), tg.cdiv(b.shape[0], BN)
    sa = tg.shared((BM, BK), f16, stages=STAGES)     # one TMA + mbarrier ring for all tiles
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for t in tg.range(tg.block_id(0), tiles_m * tiles_n, tg.num_programs(0)):
        m, n = grouped_tile(t, tiles_m, tiles_n, GROUP)
        ga = a.tile((BM, BK), (m, None))
        gb = b.tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), f32)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            with tg.producer(regs=PRODUCER_REGS):    # an extra warpgroup: TMA boxes
                tg.copy(ga[:, :, k], sa[k])
                tg.copy(gb[:, :, k], sb[k])
            with tg.consumer(regs=CONSUMER_REGS, schedule=SCHEDULE):  # the kernel's threads
                tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


def main(m: int = 97, n: int = 130, k: int = 200, num_sms: int = 5) -> None:
    """Emulate for sm_90a at a shape that does not divide the tiles (10 tiles of 64x32 on
    5 'SMs', each tile's K loop reusing every stage), and check every element."""
    import numpy as np

    from tegula.build import emulate
    from tegula.kernels.common import random_input

    rng = np.random.default_rng(0)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    # One f16 ulp of the result plus the worst f32 accumulation error over K.
    bound = 2.0 ** -10 * np.abs(ref) + k * 2.0 ** -24 * (np.abs(a) @ np.abs(b).T)
    c = np.empty((m, n), np.float16)
    grid = persistent_grid(m, n, num_sms, 64, 32)
    emulate(warp_roles_gemm, grid, a, b, c, BM=64, BN=32, BK=32, STAGES=3, GROUP=3,
            num_sms=num_sms, target="sm_90a", role_order="random:1")
    assert np.all(np.abs(c - ref) <= bound)
    print(f"warp-role gemm {m}x{n}x{k} on {grid[0]} blocks (sm_90a, producer + 2 consumer "
          f"warpgroups): max error {np.abs(c - ref).max():.3g} ok")


if __name__ == "__main__":
    main()
