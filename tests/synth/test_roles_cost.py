"""The warp-roles decision priced by the cost model (`synth/cost_roles.py`): where the kernel
leaves `warp_specialize` open, synthesis gives a TMA pipeline a producer warpgroup only where
the model prices it below one role. Golden decisions: the attention backward's kernels (four
dependent gemms and their register work per query block, two blocks per SM in one role)
keep one role; the README GEMM's default tile (a lone gemm, two blocks per SM in one role)
takes one role; the library's GEMMs with a ring filling shared memory or a persistent tile
loop keep their producer; an explicit option or a consumer schedule still decides."""
from __future__ import annotations

import importlib
import importlib.util
import math
from pathlib import Path

import pytest

from tegula.arch.targets import get_target
from tegula.build import build
from tegula.dtypes import f16
from tegula.ir.ops import ForLoop, walk_ops
from tegula.synth.cost_roles import roles_cost

backward = importlib.import_module("tegula.kernels.attention_backward")
attention = importlib.import_module("tegula.kernels.attention")
gemm = importlib.import_module("tegula.kernels.gemm")


def tma_loops(result) -> list[ForLoop]:
    return [op for op in walk_ops(result.traced.body) if isinstance(op, ForLoop)
            and ("roles" in op.choices or "roles_skipped" in op.choices)]


def backward_build(which: str, d: int, **options):
    kernel = {"dkdv": backward.attention_backward_dkdv_kernel,
              "dq": backward.attention_backward_dq_kernel,
              "dkdvdq": backward.attention_backward_dkdvdq_kernel}[which](f16)
    return build(kernel, dict(D=d, SCALE=1 / math.sqrt(d), CAUSAL=False, **options),
                 None, "sm_90a")


@pytest.mark.parametrize("which", ["dkdv", "dq", "dkdvdq"])
@pytest.mark.parametrize("d", [64, 128])
def test_attention_backward_keeps_one_role_by_the_model(which, d):
    result = backward_build(which, d)
    (loop,) = tma_loops(result)
    assert "roles" not in loop.choices
    assert loop.choices["roles_skipped"].startswith("a producer warpgroup does not pay")
    assert result.thread_kernel.threads == 128        # no producer warpgroup added
    priced = roles_cost(result.traced, loop, result.target)
    assert priced.serial and priced.one_role_blocks == 2
    assert priced.specialized > priced.one_role


def test_the_backward_kernels_leave_the_decision_to_synthesis():
    for kernel in (backward.attention_backward_dkdv_kernel(f16),
                   backward.attention_backward_dq_kernel(f16),
                   backward.attention_backward_dkdvdq_kernel(f16)):
        assert getattr(kernel, "warp_specialize", None) is None


def test_256_thread_backward_blocks_take_the_producer():
    """One block per SM either way (128 KB of shared memory): measured 0.89-0.96x of one
    role on an H100 (session 11)."""
    for which, tiles in (("dkdv", dict(BM=64, BN=128)), ("dq", dict(BM=128, BN=64))):
        (loop,) = tma_loops(backward_build(which, 128, threads=256, **tiles))
        assert "roles" in loop.choices


def test_forcing_the_producer_still_specializes_the_backward():
    result = backward_build("dkdv", 128, warp_specialize=True)
    (loop,) = tma_loops(result)
    assert "roles" in loop.choices and result.thread_kernel.threads == 256


@pytest.mark.parametrize("tiles", [
    dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=8, threads=256),
    dict(BM=64, BN=256, BK=64, STAGES=4, GROUP=8, threads=128)],
    ids=["persistent-128x256", "persistent-pingpong-64x256"])
def test_the_persistent_gemm_keeps_its_producer(tiles):
    result = build(gemm.persistent_gemm_kernel(f16), tiles, None, "sm_90a")
    (loop,) = tma_loops(result)
    assert "roles" in loop.choices
    priced = roles_cost(result.traced, loop, result.target)
    assert priced.one_role_blocks == 1 and priced.producer_pays


@pytest.mark.parametrize("tiles", [dict(BM=64, BN=32, BK=128, STAGES=6),
                                   dict(BM=128, BN=256, BK=64, STAGES=3, threads=256)])
def test_the_tile_gemm_keeps_its_producer(tiles):
    result = build(gemm.gemm_kernel(f16), tiles, None, "sm_90a")
    (loop,) = tma_loops(result)
    assert "roles" in loop.choices


def readme_gemm():
    spec = importlib.util.spec_from_file_location(
        "readme_gemm", Path(__file__).resolve().parents[2] / "examples" / "gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gemm


@pytest.mark.parametrize("tiles,producer", [
    (dict(), False),                                   # the README default: 128x128x32 S3
    (dict(BM=128, BN=128, BK=64, STAGES=3), False),
    (dict(BM=128, BN=128, BK=64, STAGES=4), True),     # the ring fills shared memory
], ids=["128x128x32s3", "128x128x64s3", "128x128x64s4"])
def test_a_lone_gemm_takes_the_form_the_model_prices_faster(tiles, producer):
    """A body of one gemm is decided by the model too (session 12): two blocks per SM in
    one role beat one specialized block where the ring leaves room for the second
    (measured 1.57x / 1.15x at 3 stages, 0.64x at 4 on an H100, session 11)."""
    result = build(readme_gemm(), tiles, None, "sm_90a")
    (loop,) = tma_loops(result)
    priced = roles_cost(result.traced, loop, result.target)
    assert priced.gemms == 1 and not priced.serial
    assert ("roles" in loop.choices) == producer == priced.producer_pays
    assert result.thread_kernel.threads == (256 if producer else 128)
    if not producer:
        assert loop.choices["roles_skipped"].startswith("a producer warpgroup does not pay")
        assert "2 block(s) per SM" in loop.choices["roles_skipped"]


def test_a_gemm_launched_in_clusters_keeps_its_producer():
    """Only a producer warpgroup's ring multicasts: a cluster asked for is not priced."""
    tiles = dict(BM=64, BN=64, BK=32, STAGES=3)
    alone = build(gemm.gemm_kernel(f16), tiles, None, "sm_90a")
    assert all("roles" not in loop.choices for loop in tma_loops(alone))
    clustered = build(gemm.gemm_kernel(f16), dict(tiles, CLUSTER_N=2), None, "sm_90a")
    (loop,) = tma_loops(clustered)
    assert "roles" in loop.choices and loop.choices["roles"].cluster == (1, 2, 1)


def test_the_fused_epilogue_gemm_keeps_its_producer():
    """Bias + GELU after the K loop: the loop body is still a lone gemm."""
    result = build(gemm.gemm_kernel(f16, "gelu", True),
                   dict(BM=128, BN=256, BK=64, STAGES=3, threads=256), None, "sm_90a")
    (loop,) = tma_loops(result)
    assert "roles" in loop.choices


def test_attention_forward_one_warpgroup_takes_one_role_two_take_the_producer():
    """The forward's body (two gemms and the softmax between them): at 64 query rows on
    one warpgroup two blocks fit an SM in one role (measured ~1.5x faster than one
    specialized block, session 8); 128 rows on two warpgroups fit one either way."""
    d = 128
    fixed = dict(attention.default_tiles(d), D=d, QK_SCALE=attention.qk_scale(None, d))
    small = build(attention.attention_kernel(f16), fixed, None, "sm_90a")
    assert all("roles" not in loop.choices for loop in tma_loops(small))
    large = build(attention.attention_kernel(f16), dict(fixed, BM=128, threads=256), None,
                  "sm_90a")
    assert all("roles" in loop.choices for loop in tma_loops(large))


def test_a_consumer_schedule_asked_for_keeps_the_producer():
    d = 64
    fixed = dict(attention.default_tiles(d), D=d, QK_SCALE=attention.qk_scale(None, d),
                 BM=128, BN=128, threads=256, consumers="pingpong")
    result = build(attention.attention_kernel(f16), fixed, None, "sm_90a")
    assert all("roles" in loop.choices for loop in tma_loops(result))


def test_the_price_is_explained():
    result = backward_build("dq", 128)
    (loop,) = tma_loops(result)
    text = roles_cost(result.traced, loop, get_target("sm_90a")).describe()
    assert "one role" in text and "2 block(s) per SM" in text and "warp-specialized" in text


# ------------------------------------------------------------ the launch grid (grid_blocks)

def split_k_build(**options):
    tiles = dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=4)
    return build(gemm.gemm_split_k_kernel(f16), dict(tiles, **options), None, "sm_90a")


def test_a_grid_of_one_block_an_sm_keeps_the_producer():
    """Split-K 64x128x64 in 4 stages, 4 splits at 64 x 4096 x 4096: 128 blocks on 132 SMs.
    One role's second block per SM needs a grid that has it: without the grid the model
    prices two (one role), with it one (the producer; measured 0.96-0.97x of one role on
    an H100, session 12)."""
    (full,) = tma_loops(split_k_build())
    assert "roles" not in full.choices
    (small,) = tma_loops(split_k_build(grid_blocks=128))
    assert "roles" in small.choices
    priced = roles_cost(split_k_build(warp_specialize=True).traced, small, get_target("sm_90a"),
                        grid_blocks=128)
    assert priced.sm_blocks == 1 and priced.one_role_blocks == 1 and priced.producer_pays
    assert "the launch grid gives the busiest SM 1 block(s)" in priced.describe()


@pytest.mark.parametrize("grid_blocks", [None, 1024, 264, 10**6])
def test_a_full_grid_decides_as_without_one(grid_blocks):
    """The README GEMM's default tile at 4096^3 (1024 blocks: 8 an SM) or any grid giving
    every SM two blocks stays in one role, as priced without a grid."""
    result = build(readme_gemm(), {} if grid_blocks is None else dict(grid_blocks=grid_blocks),
                   None, "sm_90a")
    (loop,) = tma_loops(result)
    assert "roles" not in loop.choices


def test_a_grid_of_three_blocks_an_sm_stays_in_one_role():
    """README GEMM 128x128x32 S3 at 2048x3072 (384 blocks, three an SM at two resident):
    one role, as at a full grid (measured 1.75x faster than the producer, H100, session 13
    round 2; pricing the last block alone in its own round had chosen the producer)."""
    result = build(readme_gemm(), dict(warp_specialize=True), None, "sm_90a")
    (loop,) = tma_loops(result)
    target = get_target("sm_90a")
    three = roles_cost(result.traced, loop, target, grid_blocks=3 * target.sm_count)
    full = roles_cost(result.traced, loop, target)
    assert three.sm_blocks == 3 and three.one_role == full.one_role
    assert not three.producer_pays


def test_grids_share_the_full_grids_build_unless_they_change_the_roles():
    """The README GEMM's default tile holds two blocks an SM in one role: grids giving an
    SM two or more are the full grid's build; grids giving each SM one block share one
    build of their own (the producer's)."""
    target, kernel = get_target("sm_90a"), readme_gemm()
    full = build(kernel, {}, None, "sm_90a")
    assert full.synthesis.roles_grid_limit == 2
    a = build(kernel, dict(grid_blocks=target.sm_count + 1), None, "sm_90a")
    b = build(kernel, dict(grid_blocks=2 * target.sm_count), None, "sm_90a")
    assert a is full and b is full and "grid_blocks" not in full.constexprs
    c = build(kernel, dict(grid_blocks=target.sm_count), None, "sm_90a")
    d = build(kernel, dict(grid_blocks=7), None, "sm_90a")
    assert c is d and c is not full
    assert c.constexprs["grid_blocks"] == target.sm_count
    assert all("roles" in loop.choices for loop in tma_loops(c))


def test_a_kernel_without_priced_roles_builds_once_for_every_grid():
    """A pipeline the model gave the producer at a full grid, or a kernel with no TMA
    pipeline, is the same build on any grid (a grid never takes the producer away)."""
    from tegula.kernels.softmax import softmax_kernel
    rows = softmax_kernel(f16)
    full = build(rows, dict(BM=1, BN=1024), None, "sm_90a")
    assert full.synthesis.roles_grid_limit == 0
    assert build(rows, dict(BM=1, BN=1024, grid_blocks=5), None, "sm_90a") is full
    wide, kernel = dict(BM=128, BN=256, BK=64, STAGES=3, threads=256), readme_gemm()
    specialized = build(kernel, wide, None, "sm_90a")
    assert all("roles" in loop.choices for loop in tma_loops(specialized))
    assert build(kernel, dict(wide, grid_blocks=3), None, "sm_90a") is specialized


def test_emulate_builds_for_its_grid_as_a_launch_does():
    """tg.emulate of the README GEMM on 2 blocks runs the build a launch of that grid runs
    (the producer's), and its result is right."""
    import numpy as np
    import tegula as tg
    kernel = readme_gemm()
    rng = np.random.default_rng(5)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((200, 64)).astype(np.float16)
    c = np.zeros((128, 200), np.float16)
    tg.emulate(kernel, (1, 2), a, b, c)
    np.testing.assert_allclose(c.astype(np.float32), a.astype(np.float32) @ b.T.astype(np.float32),
                               rtol=2e-2, atol=2e-2)
    grids = [bld.constexprs.get("grid_blocks") for bld in kernel.__dict__["_builds"].values()]
    assert 2 in grids


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "128"])
def test_grid_blocks_must_be_a_positive_int(bad):
    from tegula.errors import TegulaError
    with pytest.raises(TegulaError, match=r"grid_blocks=.* must be None or a positive int"):
        build(readme_gemm(), dict(grid_blocks=bad), None, "sm_90a")


def test_explain_builds_for_its_grid_as_a_launch_does():
    """explain with a grid of 32 blocks (512 x 1024 at 128x128) explains the build a launch
    on it runs (the producer); a build made without the grid is told where the grid would
    change its roles."""
    from tegula.explain import explain, explain_build
    kernel = readme_gemm()
    shapes = dict(a=(512, 4096), b=(1024, 4096), c=(512, 1024))
    small = explain(kernel, grid=(4, 8), shapes=shapes)
    assert "roles: warp-specialized" in small and "grid_blocks=32" not in small
    full = explain(kernel, grid=(32, 32), shapes=dict(a=(4096, 4096), b=(4096, 4096),
                                                      c=(4096, 4096)))
    assert "grid_blocks=" not in full and "roles: warp-specialized" not in full
    untold = explain_build(build(kernel, {}, None, "sm_90a"), grid=(4, 8), shapes=shapes)
    assert ("this grid gives an SM at most 1 block(s): the cost model would give the "
            "pipeline at line") in untold and "a launch on this grid builds for it " \
        "(grid_blocks=32)" in untold


def test_the_grid_chosen_producer_computes_the_product():
    """A small grid (6 blocks) launched with grid_blocks gets the producer warpgroup, and
    the emulator's result is the product, every element, at a shape the tiles do not
    divide."""
    import numpy as np

    import tegula as tg
    kernel = readme_gemm()
    rng = np.random.default_rng(3)
    a = rng.standard_normal((200, 96)).astype(np.float16)
    b = rng.standard_normal((136, 96)).astype(np.float16)
    c = np.full((200, 136), np.nan, np.float16)
    grid = (tg.cdiv(200, 128), tg.cdiv(136, 64))
    cx = dict(BM=128, BN=64, BK=32, grid_blocks=grid[0] * grid[1])
    (loop,) = tma_loops(build(kernel, cx, None, "sm_90a"))
    assert "roles" in loop.choices
    tg.emulate(kernel, grid, a, b, c, target="sm_90a", **cx)
    want = a.astype(np.float32) @ b.astype(np.float32).T
    assert np.all(np.abs(c.astype(np.float32) - want) <= 2e-2 * np.abs(want).max())
