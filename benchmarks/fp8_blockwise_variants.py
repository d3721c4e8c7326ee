"""Measurement-only variants of the blockwise FP8 persistent kernel (session 11, issue 10),
to find what keeps it below the per-tensor kernel. Each variant is `kernels/fp8.py`'s
`blockwise_product` with one thing changed (MODE):

* "base": the library's product (scales loaded from global memory in the K block that uses
  them, right after its stage lands);
* "noscale": no scale loads, the promotion is `acc += part` -- an ablation, right only for
  unit scales (the benchmark runs it with all scales 1 and checks it against that
  reference): what the scale loads cost;
* "tilescale": the promotion `acc += part * s` with one scale loaded per output tile (no
  loads in the K loop) -- the same ablation of the loads that keeps the multiply-adds
  ("noscale" lets ptxas accumulate straight into `acc`: the per-tensor kernel's code);
* "ahead": a K block's scales loaded one iteration earlier and carried;
* "halves": a (BM, BN) tile as two (BM/2, BN) row halves sharing b's stage, each K block
  multiplied and promoted half after half into one product tile (BM = 256 on two consumer
  warpgroups has the per-tensor 128x256 tile's bytes per FLOP), scales one block ahead.
  ptxas would hoist the second half's wgmmas above the first half's multiply-adds, giving
  the second product its own 64 registers (256 live: spills); the lowering repeats the
  stage's full-mbarrier wait between the halves (`split_reused_products`), which ends
  ptxas's scheduling region; "halves_membar" has a memory fence there instead
  (`split_halves`, a source patch, measurement only).

`install_one_gemm_turns` (session 13): lets `consumers="pingpong"` on a 2-warpgroup tile
mean turns inside the loop for a one-gemm body, in the persistent kernel too (the rule,
`synth/roles.py` `takes_turns_in_loop`, asks for two gemms and no tile loop): each
warpgroup issues its K block's wgmmas in turn and promotes while the other's run, so the
two stop issuing and promoting in step (`benchmarks/fp8_blockwise.py --turns`).

Used by `benchmarks/fp8_blockwise.py --variants` / `--turns`; nothing here is a library
kernel.
"""
from __future__ import annotations

from functools import lru_cache

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, f8e4m3
from tegula.kernels.fp8 import SCALE_BLOCK, blockwise_buffers
from tegula.kernels.gemm import persistent_tiles

MODES = ("base", "noscale", "tilescale", "ahead", "halves", "halves_membar", "pairs")


def variant_product(a, b, scale_a, scale_b, m, n, BM: int, BN: int, STAGES: int,
                    buffers: tuple, mode: str):
    """`kernels.fp8.blockwise_product` with `mode`'s change (module docstring)."""
    sa, sb = buffers
    ga = a.tile((BM, SCALE_BLOCK), (m, None))
    gb = b.tile((BN, SCALE_BLOCK), (n, None))
    row_scales = scale_a.tile((BM, 1), (m, None))
    block_scales = scale_b.tile((1, 1), ((n * BN) // SCALE_BLOCK, None))

    def scales_of(k):
        return tg.load(row_scales[:, :, k]) * tg.load(block_scales[:, :, k])

    acc = tg.zeros((BM, BN), f32)
    ahead = scales_of(0) if mode == "ahead" else None
    if mode == "tilescale":
        scale = scales_of(0)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        if mode == "ahead":     # the last iteration reloads its own block's (clamped)
            scale, ahead = ahead, scales_of(tg.minimum(k + 1, ga.shape[2] - 1))
        elif mode == "base":
            scale = scales_of(k)
        part = tg.zeros((BM, BN), f32)
        tg.gemm(part, sa[k], sb[k])
        if mode == "noscale":
            acc += part
        else:
            acc += part * scale
    return acc


def pairs_product(a, b, scale_a, scale_b, m, n, BM: int, BN: int, STAGES: int,
                  buffers: tuple):
    """Mode "pairs" (session 13): two K blocks an iteration, each its own ring stage and
    product tile, both issued back to back; K block 2j's product is promoted while
    2j+1's wgmmas run, 2j+1's at the next iteration's start, so a warpgroup's tensor-core
    queue runs dry once every two K blocks, not every one (BN must divide 128: one b
    scale a tile)."""
    sa0, sb0, sa1, sb1 = buffers
    ga = a.tile((BM, SCALE_BLOCK), (m, None))
    gb = b.tile((BN, SCALE_BLOCK), (n, None))
    row_scales = scale_a.tile((BM, 1), (m, None))
    block_scales = scale_b.tile((1, 1), ((n * BN) // SCALE_BLOCK, None))

    def scales_of(k):        # past K: masked loads, zeros
        return tg.load(row_scales[:, :, k]) * tg.load(block_scales[:, :, k])

    acc = tg.zeros((BM, BN), f32)
    odd = tg.zeros((BM, BN), f32)              # K block 2j-1's product, promoted in j
    odd_scale = tg.zeros((BM, 1), f32)
    for j in tg.pipeline((ga.shape[2] + 1) // 2, stages=STAGES):
        tg.copy(ga[:, :, 2 * j], sa0[j])
        tg.copy(gb[:, :, 2 * j], sb0[j])
        tg.copy(ga[:, :, 2 * j + 1], sa1[j])
        tg.copy(gb[:, :, 2 * j + 1], sb1[j])
        even_scale, next_odd_scale = scales_of(2 * j), scales_of(2 * j + 1)
        acc += odd * odd_scale                 # K block 2j-1's, before either gemm issues
        odd.assign(0.0)                        # (ptxas waits for 2j's wgmmas before 2j+1's
        even = tg.zeros((BM, BN), f32)         # where odd's registers are written between)
        tg.gemm(even, sa0[j], sb0[j])
        tg.gemm(odd, sa1[j], sb1[j])
        acc += even * even_scale               # while 2j+1's run
        odd_scale = next_odd_scale
    acc += odd * odd_scale
    return acc


def halves_product(a, b, scale_a, scale_b, m, n, BM: int, BN: int, STAGES: int,
                   buffers: tuple):
    """Mode "halves": the (acc_lo, acc_hi) f32 (BM/2, BN) row halves of tile (m, n)."""
    half = BM // 2
    sa_lo, sa_hi, sb = buffers
    ga = [a.tile((half, SCALE_BLOCK), (2 * m + h, None)) for h in range(2)]
    gb = b.tile((BN, SCALE_BLOCK), (n, None))
    row_scales = [scale_a.tile((half, 1), (2 * m + h, None)) for h in range(2)]
    block_scales = scale_b.tile((1, 1), ((n * BN) // SCALE_BLOCK, None))

    def scales_of(k):
        block = tg.load(block_scales[:, :, k])
        return [tg.load(rs[:, :, k]) * block for rs in row_scales]

    accs = [tg.zeros((half, BN), f32) for _ in range(2)]
    part = tg.zeros((half, BN), f32)        # one product tile for both halves
    ahead = scales_of(0)
    for k in tg.pipeline(gb.shape[2], stages=STAGES):
        tg.copy(ga[0][:, :, k], sa_lo[k])
        tg.copy(ga[1][:, :, k], sa_hi[k])
        tg.copy(gb[:, :, k], sb[k])
        scales, ahead = ahead, scales_of(tg.minimum(k + 1, gb.shape[2] - 1))
        for acc, sa, scale in zip(accs, (sa_lo, sa_hi), scales):
            part.assign(0.0)
            tg.gemm(part, sa[k], sb[k])
            acc += part * scale
    return accs


#: How the halves kernels end ptxas's scheduling region between the halves, by kernel
#: name: the lowering's repeated stage wait (`lower.wgmma_waits.split_reused_products`,
#: its phase is complete), or, patched in its place by `split_halves`, a memory fence
#: (which also waits for the thread's loads in flight: the next block's scales).
SPLITS = {"fp8_blockwise_halves_membar": "membar"}


def split_halves(source: str, how: str = "membar") -> str:
    """The halves kernel's CUDA source with the lowering's repeated stage wait replaced by
    a `fence.acq_rel.cta` (`SPLITS`)."""
    if how != "membar":
        raise ValueError(f"split_halves: unknown split {how!r}")
    lines = source.split("\n")
    mark = next(i for i, line in enumerate(lines) if "again (ends ptxas" in line)
    if "mbarrier.try_wait.parity" not in lines[mark + 1]:
        raise ValueError("split_halves: the repeated wait's asm does not follow its comment")
    lines[mark + 1] = '        asm volatile("fence.acq_rel.cta;\\n" :  :  : "memory");'
    return "\n".join(lines)


def install_split_halves() -> None:
    """Patch `tegula.runtime.launcher.emit_cuda` so the "halves" kernels compile through
    `split_halves` (this process only; the cache key is the patched source)."""
    from tegula.runtime import launcher
    emit = launcher.emit_cuda
    if getattr(emit, "split_halves", False):
        return

    def patched(kernel, target):
        source = emit(kernel, target)
        how = SPLITS.get(kernel.name)
        return source if how is None else split_halves(source, how)
    patched.split_halves = True
    launcher.emit_cuda = patched


def install_one_gemm_turns() -> None:
    """Patch the turns-in-the-loop rule and its lowering to take a one-gemm pipeline body,
    in or out of a tile loop (this process only; measurement)."""
    from tegula.ir.ops import Gemm
    from tegula.lower import warp_roles
    from tegula.lower.async_ir import WgmmaCommit
    from tegula.lower.thread_ir import For
    from tegula.synth import roles
    if getattr(roles.takes_turns_in_loop, "one_gemm", False):
        return

    def takes(kernel, loop):
        return (kernel.threads == 2 * roles.WARPGROUP
                and any(isinstance(op, Gemm) for op in loop.body))

    def take(body, loc):
        found = []

        def rewrite(s):
            if isinstance(s, For) and any(isinstance(x, WgmmaCommit) for x in s.body):
                found.append(s)
                return warp_roles._loop_with_turns(s)
            return None
        out = warp_roles.map_stmts(body, rewrite)
        if len(found) != 1:
            raise ValueError(f"install_one_gemm_turns: {len(found)} pipeline loops")
        return out
    takes.one_gemm = True
    roles.takes_turns_in_loop = takes
    warp_roles.take_turns_in_loop = take


@lru_cache(maxsize=None)
def variant_kernel(out_t: DType, mode: str) -> tg.Kernel:
    """The persistent blockwise kernel (`fp8_blockwise_persistent_kernel`'s walk) around
    `variant_product` in `mode`."""
    if mode not in MODES:
        raise ValueError(f"fp8_blockwise_variants: mode {mode!r}, one of {MODES}")
    if mode.startswith("halves"):
        return halves_kernel(out_t, mode == "halves_membar")
    if mode == "pairs":
        return pairs_kernel(out_t)

    @tg.kernel(threads=128)
    def fp8_blockwise_variant(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3],
                              scale_a: tg.Tensor[f32], scale_b: tg.Tensor[f32],
                              c: tg.Tensor[out_t], BM: tg.constexpr = 128,
                              BN: tg.constexpr = 128, STAGES: tg.constexpr = 4,
                              GROUP: tg.constexpr = 8, CLUSTER: tg.constexpr = 1):
        def make_product():
            buffers = blockwise_buffers(BM, BN, STAGES)
            return lambda m, n: variant_product(a, b, scale_a, scale_b, m, n, BM, BN,
                                                STAGES, buffers, mode)

        def finish(acc, m, n):
            tg.copy(acc.to(out_t), c.tile((BM, BN), (m, n)))
        persistent_tiles(a, b, f8e4m3, BM, BN, SCALE_BLOCK, STAGES, GROUP, finish, CLUSTER,
                         make_product)

    return fp8_blockwise_variant


def halves_body(a, b, scale_a, scale_b, c, out_t, BM, BN, STAGES, GROUP, CLUSTER) -> None:
    """The "halves" kernels' body (trace time): the persistent walk around `halves_product`."""
    def make_product():
        buffers = (tg.shared((BM // 2, SCALE_BLOCK), f8e4m3, stages=STAGES),
                   *blockwise_buffers(BM // 2, BN, STAGES))
        return lambda m, n: halves_product(a, b, scale_a, scale_b, m, n, BM, BN, STAGES,
                                           buffers)

    def finish(accs, m, n):
        for h in range(2):
            tg.copy(accs[h].to(out_t), c.tile((BM // 2, BN), (2 * m + h, n)))
    persistent_tiles(a, b, f8e4m3, BM, BN, SCALE_BLOCK, STAGES, GROUP, finish, CLUSTER,
                     make_product)


@lru_cache(maxsize=None)
def halves_kernel(out_t: DType, membar: bool = False) -> tg.Kernel:
    """Mode "halves" (or "halves_membar") as its own kernel: its name selects the split."""

    @tg.kernel(threads=128)
    def fp8_blockwise_halves(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3],
                             scale_a: tg.Tensor[f32], scale_b: tg.Tensor[f32],
                             c: tg.Tensor[out_t], BM: tg.constexpr = 256,
                             BN: tg.constexpr = 128, STAGES: tg.constexpr = 3,
                             GROUP: tg.constexpr = 8, CLUSTER: tg.constexpr = 1):
        halves_body(a, b, scale_a, scale_b, c, out_t, BM, BN, STAGES, GROUP, CLUSTER)

    @tg.kernel(threads=128)
    def fp8_blockwise_halves_membar(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3],
                                    scale_a: tg.Tensor[f32], scale_b: tg.Tensor[f32],
                                    c: tg.Tensor[out_t], BM: tg.constexpr = 256,
                                    BN: tg.constexpr = 128, STAGES: tg.constexpr = 3,
                                    GROUP: tg.constexpr = 8, CLUSTER: tg.constexpr = 1):
        halves_body(a, b, scale_a, scale_b, c, out_t, BM, BN, STAGES, GROUP, CLUSTER)

    return fp8_blockwise_halves_membar if membar else fp8_blockwise_halves


@lru_cache(maxsize=None)
def pairs_kernel(out_t: DType) -> tg.Kernel:
    """Mode "pairs": the persistent walk around `pairs_product` (two rings of stages)."""

    @tg.kernel(threads=128)
    def fp8_blockwise_pairs(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3],
                            scale_a: tg.Tensor[f32], scale_b: tg.Tensor[f32],
                            c: tg.Tensor[out_t], BM: tg.constexpr = 128,
                            BN: tg.constexpr = 128, STAGES: tg.constexpr = 2,
                            GROUP: tg.constexpr = 8, CLUSTER: tg.constexpr = 1):
        def make_product():
            buffers = blockwise_buffers(BM, BN, STAGES) + blockwise_buffers(BM, BN, STAGES)
            return lambda m, n: pairs_product(a, b, scale_a, scale_b, m, n, BM, BN, STAGES,
                                              buffers)

        def finish(acc, m, n):
            tg.copy(acc.to(out_t), c.tile((BM, BN), (m, n)))
        persistent_tiles(a, b, f8e4m3, BM, BN, SCALE_BLOCK, STAGES, GROUP, finish, CLUSTER,
                         make_product)

    return fp8_blockwise_pairs
