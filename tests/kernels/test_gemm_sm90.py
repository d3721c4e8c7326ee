"""The README's design-sketch GEMM, unchanged, compiled for sm_90a (TMA + mbarrier ring +
wgmma) and for sm_80 (cp.async + ldmatrix + mma.sync), in the emulator against numpy at
shapes that do not divide the tiles, every element checked."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import bf16, f16
from tegula.ir.ops import Gemm, walk_ops
from tegula.kernels.common import poisoned, random_input
from tegula.kernels.gemm import gemm_kernel
from tegula.lower.async_ir import TmaLoad, Wgmma
from tegula.lower.thread_ir import Mma, walk

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from examples.gemm import gemm as readme_gemm  # noqa: E402
from test_gemm import check_gemm  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemm_fixtures import readme_gemm as gemm_fixture  # noqa: E402

#: The README kernel for each operand type: f16 is examples/gemm.py itself; bf16 is the
#: library's copy of the same text with the operand type swapped.
KERNELS = {f16: readme_gemm, bf16: gemm_kernel(bf16)}


def run(dtype, m: int, n: int, k: int, target: str, seed: int, **tiles):
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), dtype), random_input(rng, (n, k), dtype)
    c = poisoned((m, n), dtype)
    bm, bn = tiles.get("BM", 128), tiles.get("BN", 128)
    tg.emulate(KERNELS[dtype], (tg.cdiv(m, bm), tg.cdiv(n, bn)), a, b, c, target=target,
               **tiles)
    return a, b, c


def statements(dtype, target: str, **tiles) -> set:
    return {type(s) for s in walk(build(KERNELS[dtype], tiles, None, target).thread_kernel.body)}


@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_readme_gemm_on_sm90a_is_right_where_shapes_do_not_divide_the_tiles(dtype):
    tiles = dict(BM=64, BN=64)
    assert {TmaLoad, Wgmma} <= statements(dtype, "sm_90a", **tiles)
    a, b, c = run(dtype, 200, 136, 72, "sm_90a", seed=90, **tiles)
    check_gemm(c, a, b, dtype)


@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_long_k_reuses_every_stage_of_the_ring(dtype):
    """K = 328 is 11 k-tiles of 32 (the last partial) through a 3-stage ring: each stage
    and each mbarrier phase is used several times, with one wgmma group in flight."""
    a, b, c = run(dtype, 130, 72, 328, "sm_90a", seed=96, BM=64, BN=64)
    check_gemm(c, a, b, dtype)


@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_sm80_still_uses_mma_sync_and_gives_the_same_result(dtype):
    tiles = dict(BM=64, BN=64)
    kinds = statements(dtype, "sm_80", **tiles)
    assert Mma in kinds and Wgmma not in kinds and TmaLoad not in kinds
    _, _, hopper = run(dtype, 200, 136, 72, "sm_90a", seed=91, **tiles)
    a, b, ampere = run(dtype, 200, 136, 72, "sm_80", seed=91, **tiles)
    check_gemm(ampere, a, b, dtype)
    # Both round the f32 accumulator after every k16 step, in the same order of k steps.
    assert np.array_equal(hopper, ampere)


@pytest.mark.parametrize("tiles,threads", [
    (dict(BM=128, BN=64, BK=64, STAGES=2), 256),     # two warpgroups along M, 128 B swizzle
    (dict(BM=64, BN=128, BK=16, STAGES=4), 128),     # 32 B swizzle, four stages
], ids=["2wg-bk64", "1wg-bk16"])
def test_other_tiles_warpgroups_and_swizzles(tiles, threads):
    build_ = build(readme_gemm, dict(tiles, threads=threads), None, "sm_90a")
    plan = next(op for op in walk_ops(build_.traced.body) if isinstance(op, Gemm)).choices["plan"]
    assert plan.atom.name.startswith("wgmma.")
    # K = 264: a row is 528 bytes (TMA proven), 5 or 17 k-tiles: every stage is reused
    assert TmaLoad in {type(s) for s in walk(build_.thread_kernel.body)}
    a, b, c = run(f16, 130, 150, 264, "sm_90a", seed=92, threads=threads, **tiles)
    check_gemm(c, a, b, f16)


def test_k_shorter_than_the_pipeline_and_one_partial_tile():
    """K = 24 is one partial k-tile of 32: the prologue must not issue (nor wait for) the
    stages that do not exist."""
    a, b, c = run(f16, 70, 9, 24, "sm_90a", seed=93, BM=64, BN=64, STAGES=3)
    check_gemm(c, a, b, f16)


def test_misaligned_rows_take_the_cp_async_path_to_wgmma():
    """K = 36 makes a row 72 bytes: TMA cannot be proven, so the copies stay cp.async (with
    fence.proxy.async) and wgmma still multiplies; results against numpy."""
    kinds = {type(s) for s in walk(build(
        readme_gemm, dict(BM=64, BN=64), _facts_for(36), "sm_90a").thread_kernel.body)}
    assert Wgmma in kinds and TmaLoad not in kinds
    a, b, c = run(f16, 100, 70, 36, "sm_90a", seed=94, BM=64, BN=64)
    check_gemm(c, a, b, f16)


def _facts_for(k: int) -> dict:
    from tegula.synth.facts import TensorFacts
    return {"a": TensorFacts.of((100, k), (k, 1), 0, 2),
            "b": TensorFacts.of((70, k), (k, 1), 0, 2),
            "c": TensorFacts.of((100, 70), (70, 1), 0, 2)}


def test_non_pipelined_shared_operands_are_fenced_for_wgmma():
    """Single-stage buffers filled by plain copies in a `tg.range` loop: generic writes,
    `fence.proxy.async` before each barrier, wgmma reads; right against numpy."""
    @tg.kernel(threads=128)
    def plain(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16]):
        m, n = tg.block_id(0), tg.block_id(1)
        acc = tg.zeros((64, 64), tg.f32)
        sa = tg.shared((64, 16), f16)
        sb = tg.shared((64, 16), f16)
        for k in tg.range(tg.cdiv(a.shape[1], 16)):
            tg.copy(a.tile((64, 16), (m, k)), sa)
            tg.copy(b.tile((64, 16), (n, k)), sb)
            tg.gemm(acc, sa, sb)
        tg.copy(acc.to(f16), c.tile((64, 64), (m, n)))

    from tegula.lower.async_ir import FenceProxyAsync
    kinds = {type(s) for s in walk(build(plain, {}, None, "sm_90a").thread_kernel.body)}
    assert {Wgmma, FenceProxyAsync} <= kinds and TmaLoad not in kinds
    rng = np.random.default_rng(95)
    a, b = random_input(rng, (90, 40), f16), random_input(rng, (70, 40), f16)
    c = poisoned((90, 70), f16)
    tg.emulate(plain, (2, 2), a, b, c, target="sm_90a")
    check_gemm(c, a, b, f16)


# ---------------------------------------------------------------------- on the GPU

GPU_SHAPES = [(128, 128, 64), (200, 136, 72), (257, 129, 72), (33, 17, 96), (1, 300, 64),
              (200, 8, 256), (64, 64, 8), (512, 384, 1024)]
GPU_CONFIGS = [dict(), dict(BM=64, BN=64, BK=32, STAGES=2), dict(BM=128, BN=64, BK=64, STAGES=4),
               dict(BM=64, BN=128, BK=16, STAGES=3), dict(BM=128, BN=128, threads=256)]


def _gpu_ready(min_cc: int):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    major, minor = torch.cuda.get_device_capability()
    if 10 * major + minor < min_cc:
        pytest.skip(f"needs compute capability {min_cc / 10}")
    return torch


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: "-".join(
    f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_readme_gemm_on_the_gpu_against_torch(dtype, m, n, k, config, target):
    """The README kernel launched for sm_90a (TMA + wgmma) and for sm_90 (the Ampere path,
    mma.sync, built for Hopper: sm_80 cubins do not load on an H100) on an
    H100, outputs poisoned first (NaN), every element within the f32-accumulation bound."""
    torch = _gpu_ready(90)
    from tegula.build import build as build_for
    kernel = KERNELS[dtype]
    tdtype = torch.float16 if dtype == f16 else torch.bfloat16
    source = build_for(kernel, dict(config), None, target).cuda_source()
    assert ("wgmma.mma_async" in source and "cp.async.bulk.tensor" in source) == \
        (target == "sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(m * 7919 + n * 31 + k)
    a = torch.randn(m, k, device="cuda", generator=gen).to(tdtype)
    b = torch.randn(n, k, device="cuda", generator=gen).to(tdtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    bm, bn = config.get("BM", 128), config.get("BN", 128)
    kernel[(tg.cdiv(m, bm), tg.cdiv(n, bn))](a, b, c, target=target, **config)
    torch.cuda.synchronize()
    ref = a.double() @ b.double().T
    scale = a.double().abs() @ b.double().abs().T
    err = (c.double() - ref).abs()
    bound = 2.0 ** -dtype.mantissa_bits * ref.abs() + k * 2.0 ** -23 * scale + 2.0 ** -24
    assert not torch.isnan(c).any(), "unwritten (poisoned) elements remain"
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}"


@tg.kernel(threads=128)
def gemm_and_count(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                   steps: tg.Tensor[tg.f32]):
    """A TMA pipeline whose body does more than the gemm (a per-iteration count): since
    session 14 the gemm's group runs on into the next iteration (`carry_wgmma_groups`),
    which retires it by its end (wait_group 1) before the release barrier and refill."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((64, 32), (m, None))
    gb = b.tile((64, 32), (n, None))
    acc = tg.zeros((64, 64), tg.f32)
    count = tg.zeros((64, 64), tg.f32)
    sa = tg.shared((64, 32), f16, stages=3)
    sb = tg.shared((64, 32), f16, stages=3)
    for k in tg.pipeline(ga.shape[2], stages=3):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])
        count = count + 1.0
    tg.copy(acc.to(f16), c.tile((64, 64), (m, n)))
    tg.copy(count, steps.tile((64, 64), (m, n)))


def test_a_pipeline_body_with_more_than_the_gemm_carries_its_group_one_iteration():
    tk = build(gemm_and_count, {}, None, "sm_90a").thread_kernel
    from tegula.lower.async_ir import WgmmaWait
    # wait_group 1 in the loop (the previous iteration's group), 0 after it
    assert {s.pending for s in walk(tk.body) if isinstance(s, WgmmaWait)} == {0, 1}
    assert TmaLoad in {type(s) for s in walk(tk.body)}
    rng = np.random.default_rng(97)
    a, b = random_input(rng, (100, 232), f16), random_input(rng, (70, 232), f16)
    c, steps = poisoned((100, 70), f16), poisoned((100, 70), tg.f32)
    tg.emulate(gemm_and_count, (2, 2), a, b, c, steps, target="sm_90a")
    check_gemm(c, a, b, f16)
    assert np.all(steps == 8)                       # ceil(232 / 32) iterations


def f8_gemm(a_t, b_t):
    """The README kernel's text for 8-bit float operands (64-byte K rows, BK = 64)."""
    return gemm_fixture(a_t, tg.f32, tg.f32, b_dtype=b_t, BM=64, BN=64, BK=64, STAGES=3,
                        name="gemm_f8")


@pytest.mark.parametrize("a_t,b_t", [(tg.f8e4m3, tg.f8e4m3), (tg.f8e4m3, tg.f8e5m2),
                                     (tg.f8e5m2, tg.f8e5m2)], ids=str)
def test_f8_gemm_runs_on_k32_wgmma_and_matches_the_sm89_mma(a_t, b_t):
    kernel = f8_gemm(a_t, b_t)
    tk = build(kernel, {}, None, "sm_90a").thread_kernel
    assert {s.instr for s in walk(tk.body) if isinstance(s, Wgmma)} == {
        f"wgmma.m64n64k32.f32.{a_t.name.replace('f8', '')}.{b_t.name.replace('f8', '')}"}
    assert TmaLoad in {type(s) for s in walk(tk.body)}
    rng = np.random.default_rng(98)
    a, b = random_input(rng, (130, 208), a_t), random_input(rng, (70, 208), b_t)
    results = []
    for target in ("sm_90a", "sm_89"):
        c = poisoned((130, 70), tg.f32)
        tg.emulate(kernel, (3, 2), a, b, c, target=target)
        results.append(c)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    bound = 208 * 2.0 ** -24 * (np.abs(af) @ np.abs(bf).T)
    assert np.all(np.abs(results[0] - af @ bf.T) <= bound)
    assert np.array_equal(results[0], results[1])   # both round after every k32 step


@pytest.mark.parametrize("config,hgmma", [
    (dict(), "HGMMA.64x128x16.F32"),
    # two warpgroups split the 128 rows: one m64n256 each reads B once per k16 step
    (dict(BM=128, BN=256, BK=64, threads=256), "HGMMA.64x256x16.F32")],
    ids=["default", "2wg-bk64"])
def test_sm90a_gemm_compiles_to_hgmma_and_utmaldg_without_spills(config, hgmma):
    """NVRTC (or nvcc) on the CPU: the emitted CUDA of the README kernel is real Hopper
    code — HGMMA, TMA loads, mbarrier try-wait — and keeps its accumulators in registers."""
    import re

    from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble
    if not available_compilers():
        pytest.skip("neither NVRTC nor nvcc found")
    result = build(readme_gemm, config, None, "sm_90a")
    sass = disassemble(compile_cuda(result.cuda_source(), result.thread_kernel.name, "sm_90a"))
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    for op in (hgmma, "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT",
               "WARPGROUP.DEPBAR.LE"):
        assert op in sass, op
    assert not re.search(r"\b(LDL|STL)\b", sass), "accumulators fell back to local memory"


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
@pytest.mark.parametrize("m,n,k", [(130, 70, 208), (256, 128, 512), (1, 64, 64)])
@pytest.mark.parametrize("a_t,b_t", [(tg.f8e4m3, tg.f8e4m3), (tg.f8e4m3, tg.f8e5m2)], ids=str)
def test_f8_gemm_on_the_gpu_against_the_emulator(a_t, b_t, m, n, k, target):
    """8-bit operands on an H100 (k32 wgmma for sm_90a, mma.sync for sm_90) against the
    emulator's result within the f32 accumulation bound; outputs poisoned (NaN) first."""
    torch = _gpu_ready(90)
    kernel = f8_gemm(a_t, b_t)
    rng = np.random.default_rng(m + n + k)
    a, b = random_input(rng, (m, k), a_t), random_input(rng, (n, k), b_t)
    expected = poisoned((m, n), tg.f32)
    tg.emulate(kernel, (tg.cdiv(m, 64), tg.cdiv(n, 64)), a, b, expected, target=target)
    tdt = {tg.f8e4m3: torch.float8_e4m3fn, tg.f8e5m2: torch.float8_e5m2}
    ga = torch.from_numpy(np.asarray(a, np.float32)).cuda().to(tdt[a_t])
    gb = torch.from_numpy(np.asarray(b, np.float32)).cuda().to(tdt[b_t])
    c = torch.full((m, n), float("nan"), device="cuda")
    kernel[(tg.cdiv(m, 64), tg.cdiv(n, 64))](ga, gb, c, target=target)
    torch.cuda.synchronize()
    got = c.cpu().numpy()
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    bound = k * 2.0 ** -23 * scale
    if target == "sm_90a":
        # FP8 wgmma does not accumulate in full f32: measured on an H100 (2026-11-24) its
        # error reaches 2^-12.2 * sum|a||b| at K=512 (2^-13.9 at K=64) while mma.sync is
        # exact to f32 rounding — about 14 kept bits per k32 step, as DeepSeek-V3 (§3.3.2)
        # reports. The emulator computes in f32, so the GPU may differ from it by that much.
        bound = -(-k // 32) * 2.0 ** -12 * scale
    assert not np.isnan(got).any(), "unwritten (poisoned) elements remain"
    assert np.all(np.abs(got - expected) <= bound + 2.0 ** -24)
