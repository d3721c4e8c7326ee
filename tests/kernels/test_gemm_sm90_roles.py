"""The README's design-sketch GEMM, unchanged, warp-specialized by synthesis on sm_90a
(`warp_specialize=True`: at these tiles the cost model's default is one role): a
producer warpgroup issuing the TMA boxes and a consumer role running the wgmmas meet at
full/empty mbarriers. In the emulator against numpy at shapes that do not divide the tiles,
with K long enough that every stage is reused several times, under both role orders
(two interleavings), and bit-identical to the single-role build; an injected bug is a
deadlock report naming both roles; the CUDA compiles without spills; on the GPU (-m gpu)
against torch with poisoned outputs, both forms."""
from __future__ import annotations

import copy
import os
import re
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import bf16, f16
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.kernels.common import poisoned, random_input
from tegula.kernels.gemm import gemm_kernel
from tegula.lower.async_ir import MBarrierArrive, MBarrierWait, NamedBarrier, Roles
from tegula.lower.thread_ir import walk

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "emulate"))
from async_kernels import remove, role_body, run_with_deadline  # noqa: E402
from examples.gemm import gemm as readme_gemm  # noqa: E402
from test_gemm import check_gemm  # noqa: E402

#: f16 is examples/gemm.py itself; bf16 the library's copy of the same text.
KERNELS = {f16: readme_gemm, bf16: gemm_kernel(bf16)}

#: (tiles, M, N, K): K gives every stage of the ring several uses (k-tiles >= 3 x STAGES).
CASES = [
    (dict(BM=64, BN=64, BK=32, STAGES=3), 130, 72, 328),                  # 11 k-tiles
    (dict(BM=64, BN=128, BK=16, STAGES=4), 70, 150, 264),                 # 17 k-tiles, 32 B swizzle
    (dict(BM=128, BN=64, BK=64, STAGES=2, threads=256), 200, 100, 456),   # 2 consumer warpgroups
]


def run(dtype, m, n, k, seed, role_order="listed", **tiles):
    tiles.setdefault("warp_specialize", True)
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), dtype), random_input(rng, (n, k), dtype)
    c = poisoned((m, n), dtype)
    grid = (tg.cdiv(m, tiles.get("BM", 128)), tg.cdiv(n, tiles.get("BN", 128)))
    report = run_with_deadline(lambda: tg.emulate(KERNELS[dtype], grid, a, b, c,
                                                  target="sm_90a", role_order=role_order,
                                                  **tiles))
    return a, b, c, report


def ran_specialized(report, threads: int = 128) -> bool:
    """Whether an emulated run was the warp-specialized TMA pipeline (the build follows the
    arrays' facts: a row that is not a multiple of 16 bytes takes cp.async, one role)."""
    return report.threads == threads + 128 and report.kind("TmaLoad").count > 0


def specialized(dtype, **tiles):
    tk = build(KERNELS[dtype], dict(tiles, warp_specialize=True), None, "sm_90a").thread_kernel
    return any(isinstance(s, Roles) for s in tk.body)


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
@pytest.mark.parametrize("case", CASES, ids=["64x64x32s3", "64x128x16s4", "2wg-128x64x64s2"])
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_warp_specialized_readme_gemm_is_right(dtype, case, role_order):
    tiles, m, n, k = case
    assert specialized(dtype, **tiles)
    a, b, c, report = run(dtype, m, n, k, seed=m + k, role_order=role_order, **tiles)
    assert ran_specialized(report, tiles.get("threads", 128))
    check_gemm(c, a, b, dtype)
    # The same k16 steps in the same order as one role: the very same bits.
    _, _, single, report = run(dtype, m, n, k, seed=m + k, warp_specialize=False, **tiles)
    assert report.threads == tiles.get("threads", 128) and report.kind("TmaLoad").count
    assert np.array_equal(c.view(np.uint16) if c.dtype == np.float16 else c,
                          single.view(np.uint16) if single.dtype == np.float16 else single)


def test_k_shorter_than_the_ring_and_empty_k():
    """K = 24 (one partial k-tile: the producer issues one stage of three) and K = 0 (no
    iteration: the accumulator's zeros are the result)."""
    a, b, c, report = run(f16, 70, 9, 24, seed=5, BM=64, BN=64, STAGES=3)
    assert ran_specialized(report)
    check_gemm(c, a, b, f16)
    # K = 0 arrays prove no TMA facts, so run the specialized build's thread IR directly.
    tk = build(readme_gemm, dict(BM=64, BN=64, STAGES=3, warp_specialize=True), None,
               "sm_90a").thread_kernel
    assert tk.threads == 256
    a, b = np.zeros((65, 0), np.float16), np.zeros((48, 0), np.float16)
    c = poisoned((65, 48), f16)                 # 48 columns: the default facts' alignment
    run_with_deadline(lambda: run_thread_kernel(tk, (2, 1), {"a": a, "b": b, "c": c}))
    assert np.array_equal(c, np.zeros((65, 48), np.float16))


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_split_k_pipeline_starting_past_zero(role_order):
    """The library's split-K GEMM: block (m, n, s) runs k-tiles s*per … s*per+per-1, so
    the ring's parities count from a start that is not 0, and the last split's tiles past
    K arrive zero-filled. Partials summed over the splits against numpy."""
    from tegula.kernels.gemm import gemm_split_k_kernel
    kernel = gemm_split_k_kernel(f16)
    # 22 k-tiles: splits start at 0 and 11 (a parity counted from 0 would be off by one
    # round for the second); rows of 2704 bytes, a multiple of 16, so TMA is proven.
    m, n, k, split, bm, bn = 70, 100, 1352, 2, 64, 128
    forced = dict(warp_specialize=True)
    assert any(isinstance(s, Roles) for s in build(kernel, forced, None, "sm_90a").thread_kernel.body)
    rng = np.random.default_rng(12)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    m_tiles = tg.cdiv(m, bm)
    partial = poisoned((split * m_tiles * bm, n), tg.f32)
    report = run_with_deadline(lambda: tg.emulate(
        kernel, (m_tiles, tg.cdiv(n, bn), split), a, b, partial, target="sm_90a",
        role_order=role_order, **forced))
    assert ran_specialized(report)
    total = sum(partial[s * m_tiles * bm:s * m_tiles * bm + m].astype(np.float64)
                for s in range(split))
    af, bf = a.astype(np.float64), b.astype(np.float64)
    bound = (k + split) * 2.0 ** -24 * (np.abs(af) @ np.abs(bf).T)
    assert np.all(np.abs(total - af @ bf.T) <= bound)


@tg.kernel(threads=128, warp_specialize=True)
def gemm_count_staged(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                      steps: tg.Tensor[tg.f32]):
    """More than the gemm in the pipeline body (the wgmmas retire inside each iteration,
    every consumer thread releases the stage), and an epilogue through shared memory
    (its block barriers become named barriers of the consumer role)."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
    acc = tg.zeros((64, 64), tg.f32)
    count = tg.zeros((64, 64), tg.f32)
    sa, sb = tg.shared((64, 32), f16, stages=3), tg.shared((64, 32), f16, stages=3)
    for k in tg.pipeline(ga.shape[2], stages=3):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])
        count = count + 1.0
    staged = tg.shared((64, 64), f16)
    tg.copy(acc.to(f16), staged)
    tg.copy(staged, c.tile((64, 64), (m, n)))
    tg.copy(count, steps.tile((64, 64), (m, n)))


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_a_body_with_more_than_the_gemm_and_a_shared_epilogue(role_order):
    tk = build(gemm_count_staged, {}, None, "sm_90a").thread_kernel
    consumer = role_body(tk, "consumer")
    assert any(isinstance(s, NamedBarrier) for s in walk(consumer))
    empty = next(m for m in tk.mbarriers if m.name.startswith("empty"))
    assert any(s.barrier == empty.name and s.pred is None for s in walk(consumer)
               if isinstance(s, MBarrierArrive))                   # every thread releases
    rng = np.random.default_rng(7)
    a, b = random_input(rng, (100, 328), f16), random_input(rng, (70, 328), f16)
    c, steps = poisoned((100, 70), f16), poisoned((100, 70), tg.f32)
    report = run_with_deadline(lambda: tg.emulate(gemm_count_staged, (2, 2), a, b, c, steps,
                                                  target="sm_90a", role_order=role_order))
    assert ran_specialized(report)
    check_gemm(c, a, b, f16)
    assert np.all(steps == 11)                                       # ceil(328 / 32)


# ------------------------------------------------------------------ injected bugs


def readme_thread_kernel(**tiles):
    return copy.deepcopy(build(readme_gemm, dict(tiles, warp_specialize=True), None,
                               "sm_90a").thread_kernel)


def run_kernel(tk, m, n, k, role_order, bm=64, bn=64):
    rng = np.random.default_rng(11)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    run_with_deadline(lambda: run_thread_kernel(tk, (tg.cdiv(m, bm), tg.cdiv(n, bn)),
                                                {"a": a, "b": b, "c": c},
                                                role_order=role_order))


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_a_consumer_that_never_releases_a_stage_is_a_deadlock_naming_both_roles(role_order):
    tk = readme_thread_kernel(BM=64, BN=64, STAGES=3)
    empty = next(m.name for m in tk.mbarriers if m.name.startswith("empty"))
    assert remove(role_body(tk, "consumer"),
                  lambda s: isinstance(s, MBarrierArrive) and s.barrier == empty) == 1
    with pytest.raises(EmulationError) as info:
        run_kernel(tk, 70, 60, 160, role_order)                     # 5 k-tiles > 3 stages
    text = str(info.value)
    assert "deadlock" in text.lower()
    for role in ("consumer", "producer"):
        assert re.search(rf"gemm\.py:\d+: {role} of the tg\.pipeline", text), (role, text)
    assert empty in text


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_a_producer_that_does_not_wait_for_the_release_is_reported(role_order):
    """Without its wait on `empty`, the producer refills a stage the consumer's wgmmas may
    still read (or completes a full phase twice): reported, never a silent wrong answer."""
    tk = readme_thread_kernel(BM=64, BN=64, STAGES=2)
    assert remove(role_body(tk, "producer"),
                  lambda s: isinstance(s, MBarrierWait) and s.barrier.startswith("empty")) == 1
    with pytest.raises(EmulationError, match="(?s)TMA copy may still be writing.*role 'producer'"):
        run_kernel(tk, 70, 60, 200, role_order)


def test_producer_and_consumer_roles_survive_a_wrong_parity_only_as_a_report():
    """The producer waiting on `empty` with the consumer's parity (no `^ 1`) blocks on a
    fresh barrier before the first box: a deadlock, both roles named."""
    tk = readme_thread_kernel(BM=64, BN=64, STAGES=3)
    producer = role_body(tk, "producer")
    loop = next(s for s in walk(producer) if isinstance(s, MBarrierWait))
    loop.parity = loop.parity.lhs                                 # drop the `^ 1`
    with pytest.raises(EmulationError, match="(?i)deadlock") as info:
        run_kernel(tk, 70, 60, 160, "listed")
    assert "producer of the tg.pipeline" in str(info.value)


# ------------------------------------------------------------------ CUDA


@pytest.mark.parametrize("config", [dict(), dict(BM=128, BN=256, BK=64, threads=256)],
                         ids=["default", "2wg-bk64"])
def test_warp_specialized_gemm_compiles_to_hgmma_without_spills(config):
    """NVRTC (or nvcc) for sm_90a: HGMMA, TMA loads, mbarrier waits, the roles' setmaxnreg,
    and no local memory — in the consumer (accumulators) nor in the 40-register producer."""
    from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble
    if not available_compilers():
        pytest.skip("neither NVRTC nor nvcc found")
    result = build(readme_gemm, dict(config, warp_specialize=True), None, "sm_90a")
    source = result.cuda_source()
    assert "setmaxnreg.dec.sync.aligned.u32 40" in source
    consumer = next(r for s in result.thread_kernel.body if isinstance(s, Roles)
                    for r in s.roles if r.name == "consumer")
    if consumer.max_registers is not None:
        assert f"setmaxnreg.inc.sync.aligned.u32 {consumer.max_registers}" in source
    sass = disassemble(compile_cuda(source, result.thread_kernel.name, "sm_90a"))
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    for op in ("HGMMA.64x", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "USETMAXREG"):
        assert op in sass, op
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


def test_the_launch_uses_the_block_with_the_producer_warpgroup():
    """The runtime launches ThreadKernel.threads (the user's threads + 128): a launch of
    the user's 128 would leave the producer out and the consumer waiting forever."""
    from tegula.runtime.compiler import available_compilers
    if not available_compilers():
        pytest.skip("neither NVRTC nor nvcc found")
    from tegula.runtime import compile_kernel
    result = build(readme_gemm, dict(warp_specialize=True), None, "sm_90a")
    assert compile_kernel(result.thread_kernel, "sm_90a").threads == 256
    assert "__launch_bounds__(256, 1)" in result.cuda_source()


# ------------------------------------------------------------------ on the GPU

GPU_SHAPES = [(128, 128, 64), (200, 136, 72), (257, 129, 72), (33, 17, 96), (1, 300, 64),
              (200, 8, 256), (64, 64, 8), (512, 384, 1024), (1000, 700, 2056)]
GPU_CONFIGS = [dict(), dict(BM=64, BN=64, BK=32, STAGES=2), dict(BM=128, BN=64, BK=64, STAGES=4),
               dict(BM=64, BN=128, BK=16, STAGES=3), dict(BM=128, BN=128, threads=256),
               dict(BM=128, BN=256, BK=64, STAGES=3, threads=256)]


@pytest.mark.gpu
@pytest.mark.parametrize("roles", [True, False], ids=["specialized", "one-role"])
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: "-".join(
    f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_warp_specialized_gemm_on_the_gpu_against_torch(dtype, m, n, k, config, roles):
    """The README kernel for sm_90a on an H100, warp-specialized and in one role (the
    default, the cost model's pick, is one of the two), outputs
    poisoned (NaN) first, every element within the f32-accumulation bound of a float64
    reference."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    kernel = KERNELS[dtype]
    config = dict(config, warp_specialize=roles)
    built = build(kernel, config, None, "sm_90a")
    assert any(isinstance(s, Roles) for s in built.thread_kernel.body) == roles
    tdtype = torch.float16 if dtype == f16 else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(m * 7919 + n * 31 + k)
    a = torch.randn(m, k, device="cuda", generator=gen).to(tdtype)
    b = torch.randn(n, k, device="cuda", generator=gen).to(tdtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    bm, bn = config.get("BM", 128), config.get("BN", 128)
    kernel[(tg.cdiv(m, bm), tg.cdiv(n, bn))](a, b, c, target="sm_90a", **config)
    torch.cuda.synchronize()
    ref = a.double() @ b.double().T
    scale = a.double().abs() @ b.double().abs().T
    err = (c.double() - ref).abs()
    bound = 2.0 ** -dtype.mantissa_bits * ref.abs() + k * 2.0 ** -23 * scale + 2.0 ** -24
    assert not torch.isnan(c).any(), "unwritten (poisoned) elements remain"
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}"
