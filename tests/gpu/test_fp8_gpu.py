"""FP8 (e4m3) GEMM on the GPU: per-tensor scales against `torch._scaled_mm` and a float64
reference, blockwise (DeepSeek-V3) scales against a float64 reference, every element,
NaN-poisoned outputs, shapes that divide no tile, the kernels launched directly (sm_90a:
TMA + wgmma; sm_90: mma.sync) and through the autotuned `tegula.kernels.matmul_fp8`.

Error bounds: the FP8 wgmma keeps about 14 bits of its running sum per k32 instruction
(`tegula/arch/wgmma.py`; measured up to 2^-12.2 of Σ|a·b|, allowed 2^-11 per instruction
as the fuzzer's GPU model does), so a per-tensor GEMM may be off by ⌈K/32⌉·2^-11·Σ|a·b|,
while the blockwise kernel promotes every 128 of K into f32 and is off by at most
4·2^-11·Σ|a·b| whatever K is — the bound these tests hold it to.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tegula as tg
from tegula.dtypes import bf16, f16, f32
from tegula.kernels.fp8 import fp8_blockwise_gemm_kernel, fp8_gemm_kernel, scale_shapes

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import poison  # noqa: E402

OUT = {bf16: torch.bfloat16, f16: torch.float16, f32: torch.float32}
UNIT = {bf16: 2.0 ** -8, f16: 2.0 ** -11, f32: 2.0 ** -24}
PER_INSTRUCTION = 2.0 ** -11      # FP8 wgmma: kept bits per k32 instruction (see above)


def e4m3(m, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(m, k, device="cuda", generator=g) * 4).to(torch.float8_e4m3fn)


def check(c, ref, magnitude, instructions, out_t, what=""):
    """Every element within the tensor-core bound (`instructions` k32 steps per promoted
    partial sum, over `magnitude` = Σ|scaled a·b|), f32 additions and one output rounding."""
    assert not torch.isnan(c).any(), f"{what}: unwritten (poisoned) elements remain"
    bound = (instructions * PER_INSTRUCTION + 64 * 2.0 ** -24) * magnitude \
        + UNIT[out_t] * ref.abs() + 1e-30
    err = (c.double() - ref).abs()
    worst = int(torch.argmax(err / bound))
    i, j = divmod(worst, c.shape[1])
    assert bool((err <= bound).all()), (f"{what} ({i}, {j}): got {c[i, j].item()}, expected "
                                        f"{ref[i, j].item()}, bound {bound[i, j].item():.3g}")
    return float((err / magnitude.clamp_min(1e-30)).max())


PER_TENSOR_SHAPES = [(128, 128, 64), (257, 129, 80), (33, 17, 96), (1, 300, 64),
                     (200, 8, 256), (64, 64, 16), (512, 384, 2048)]
PER_TENSOR_CONFIGS = [dict(BM=128, BN=128, BK=64, STAGES=3),
                      dict(BM=64, BN=64, BK=32, STAGES=2),
                      dict(BM=128, BN=128, BK=128, STAGES=4, threads=256),
                      dict(BM=128, BN=256, BK=128, STAGES=3, threads=256)]


@pytest.mark.parametrize("out_t", [bf16, f16, f32], ids=str)
@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
@pytest.mark.parametrize("m,n,k", PER_TENSOR_SHAPES)
def test_per_tensor_kernel(m, n, k, target, out_t):
    a, w = e4m3(m, k, m + k), e4m3(n, k, n + 2 * k)
    sa = torch.tensor([[0.37]], device="cuda")
    sb = torch.tensor([[1.9]], device="cuda")
    s = 0.37 * 1.9
    ref = (a.double() @ w.double().T) * float(sa) * float(sb)
    magnitude = (a.double().abs() @ w.double().abs().T) * s
    instructions = -(-k // 32) if target == "sm_90a" else 0   # mma.sync is exact to f32
    for config in PER_TENSOR_CONFIGS:
        c = poison(torch.empty(m, n, device="cuda", dtype=OUT[out_t]))
        tiles = {key: v for key, v in config.items() if key != "threads"}
        extra = {"threads": config["threads"]} if "threads" in config else {}
        fp8_gemm_kernel(out_t)[(tg.cdiv(m, tiles["BM"]), tg.cdiv(n, tiles["BN"]))](
            a, w, sa, sb, c, target=target, **tiles, **extra)
        torch.cuda.synchronize()
        check(c, ref, magnitude, instructions, out_t, f"{config}")


@pytest.mark.parametrize("config", [dict(BM=128, BN=256, BK=128, STAGES=3, threads=256),
                                    dict(BM=128, BN=128, BK=128, STAGES=4, threads=256),
                                    dict(BM=64, BN=64, BK=32, STAGES=2, GROUP=3)],
                         ids=["128x256", "128x128", "64x64"])
@pytest.mark.parametrize("m,n,k", PER_TENSOR_SHAPES + [(2000, 1500, 512)])
def test_per_tensor_persistent_kernel(m, n, k, config):
    """The persistent per-tensor kernel (matmul_fp8's first candidate for large shapes on
    sm_90a) on min(tiles, SMs) blocks."""
    from tegula.kernels.fp8 import fp8_persistent_gemm_kernel
    from tegula.kernels.gemm import persistent_grid

    a, w = e4m3(m, k, 3 * m + k), e4m3(n, k, n + k)
    sa, sb = torch.tensor([[0.37]], device="cuda"), torch.tensor([[1.9]], device="cuda")
    ref = (a.double() @ w.double().T) * 0.37 * 1.9
    magnitude = (a.double().abs() @ w.double().abs().T) * 0.37 * 1.9
    c = poison(torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fp8_persistent_gemm_kernel(bf16)[persistent_grid(m, n, sms, config["BM"], config["BN"])](
        a, w, sa, sb, c, **config)
    torch.cuda.synchronize()
    check(c, ref, magnitude, -(-k // 32), bf16, f"{config}")


@pytest.mark.parametrize("m,n,k", [(257, 129, 80), (1024, 1024, 4096), (16, 4096, 4096)])
def test_per_tensor_entry_point_against_scaled_mm(m, n, k):
    """`tk.matmul_fp8` (autotuned; into a poisoned `out`, then returned) against
    `torch._scaled_mm` on the same operands: both within the bound of the exact result."""
    import tegula.kernels as tk

    a, w = e4m3(m, k, 1), e4m3(n, k, 2)
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
    out = poison(torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
    assert tk.matmul_fp8(a, w.T, sa, sb, out=out) is out
    c = tk.matmul_fp8(a, w.T, sa, sb)
    ref = (a.double() @ w.double().T) * 0.125
    magnitude = (a.double().abs() @ w.double().abs().T) * 0.125
    results = [("out=", out), ("returned", c)]
    if n % 16 == 0 and k % 16 == 0:  # torch._scaled_mm refuses other extents
        results.append(("torch._scaled_mm",
                        torch._scaled_mm(a, w.T, sa, sb, out_dtype=torch.bfloat16)))
    instructions = -(-k // 32)
    for name, result in results:
        worst = check(result, ref, magnitude, instructions, bf16, name)
        print(f"{name}: worst error {worst:.3g} of Σ|a·b| at K={k}")
    assert torch.equal(c, out)   # one configuration, one result


BLOCKWISE_SHAPES = [(128, 128, 128), (257, 129, 384), (33, 200, 256), (1, 300, 128),
                    (512, 640, 4096), (300, 500, 336)]          # K ends in a partial block
BLOCKWISE_CONFIGS = [dict(BM=64, BN=128, STAGES=4), dict(BM=128, BN=128, STAGES=3, threads=256),
                     dict(BM=64, BN=64, STAGES=2), dict(BM=128, BN=32, STAGES=2),
                     dict(BM=128, BN=192, STAGES=3, threads=256)]   # two b scales a tile


def blockwise_operands(m, n, k, seed):
    a, w = e4m3(m, k, seed), e4m3(n, k, seed + 1)
    shape_a, shape_b = scale_shapes(m, n, k, True)
    g = torch.Generator(device="cuda").manual_seed(seed + 2)
    sa = 10.0 ** (torch.rand(shape_a, device="cuda", generator=g) * 4 - 2)
    sb = 10.0 ** (torch.rand(shape_b, device="cuda", generator=g) * 4 - 2)
    ea = sa.double().repeat_interleave(128, 1)[:m, :k]
    eb = sb.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    ref = (a.double() * ea) @ (w.double() * eb).T
    magnitude = (a.double().abs() * ea) @ (w.double().abs() * eb).T
    return a, w, sa, sb, ref, magnitude


@pytest.mark.parametrize("out_t", [bf16, f32], ids=str)
@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
@pytest.mark.parametrize("m,n,k", BLOCKWISE_SHAPES)
def test_blockwise_kernel(m, n, k, target, out_t):
    """Scales spread over four decades (a scale on the wrong block is far off); the bound
    is 4 instructions' worth per 128 of K, whatever K is: the promotion must hold it."""
    a, w, sa, sb, ref, magnitude = blockwise_operands(m, n, k, m * n + k)
    for config in BLOCKWISE_CONFIGS:
        c = poison(torch.empty(m, n, device="cuda", dtype=OUT[out_t]))
        tiles = {key: v for key, v in config.items() if key != "threads"}
        extra = {"threads": config["threads"]} if "threads" in config else {}
        fp8_blockwise_gemm_kernel(out_t)[(tg.cdiv(m, tiles["BM"]), tg.cdiv(n, tiles["BN"]))](
            a, w, sa, sb, c, target=target, **tiles, **extra)
        torch.cuda.synchronize()
        check(c, ref, magnitude, 4 if target == "sm_90a" else 0, out_t, f"{config}")


BLOCKWISE_PERSISTENT_CONFIGS = [
    dict(BM=128, BN=128, STAGES=4, threads=256),
    dict(BM=128, BN=128, STAGES=4, threads=256, CLUSTER=2),
    dict(BM=192, BN=128, STAGES=3, threads=384), dict(BM=64, BN=64, STAGES=2, GROUP=3),
    dict(BM=128, BN=192, STAGES=4, threads=256),                  # session 12: per-column
    dict(BM=128, BN=192, STAGES=4, threads=256, CLUSTER=2),       # b scales, one of two
    dict(BM=128, BN=128, STAGES=2, threads=256, TWIN=1),          # session 14: two K
    dict(BM=128, BN=128, STAGES=3, threads=256, TWIN=1),          # blocks a stage
    dict(BM=64, BN=128, STAGES=2, TWIN=1)]


@pytest.mark.parametrize("config", BLOCKWISE_PERSISTENT_CONFIGS,
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("m,n,k", BLOCKWISE_SHAPES + [(1000, 1030, 640)])
def test_blockwise_persistent_kernel(m, n, k, config):
    """The persistent warp-specialized blockwise kernel (session 10) on min(tiles, SMs)
    blocks: its TMA ring runs across the tiles with the promotion in the consumers; in
    2-CTA clusters b's boxes are multicast; 192x128 tiles on three consumer warpgroups."""
    from tegula.kernels.fp8 import fp8_blockwise_persistent_kernel
    from tegula.kernels.gemm import persistent_grid

    a, w, sa, sb, ref, magnitude = blockwise_operands(m, n, k, m + 7 * n + k)
    c = poison(torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = persistent_grid(m, n, sms, config["BM"], config["BN"], config.get("CLUSTER", 1))
    fp8_blockwise_persistent_kernel(bf16)[grid](a, w, sa, sb, c, **config)
    torch.cuda.synchronize()
    check(c, ref, magnitude, 4, bf16, f"{config}")


@pytest.mark.parametrize("m,n,k", [(257, 129, 384), (2048, 2048, 7168), (64, 4096, 4096)])
def test_blockwise_entry_point(m, n, k):
    import tegula.kernels as tk

    a, w, sa, sb, ref, magnitude = blockwise_operands(m, n, k, 5)
    out = poison(torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
    assert tk.matmul_fp8(a, w.T, sa, sb, torch.bfloat16, True, out=out) is out
    worst = check(out, ref, magnitude, 4, bf16, "blockwise")
    print(f"blockwise: worst error {worst:.3g} of Σ|a·b| at K={k}")
    c = tk.matmul_fp8(a, w.T, sa, sb, block_scales=True)
    assert torch.equal(c, out)


def test_promotion_beats_one_long_fp8_sum():
    """With unit scales, the blockwise kernel (f32 every 128 of K) is closer to the exact
    result than the per-tensor kernel's single tensor-core sum over K = 8192 (measured,
    reported; both within their bounds)."""
    m, n, k = 256, 256, 8192
    a, w = e4m3(m, k, 8), e4m3(n, k, 9)
    ref = a.double() @ w.double().T
    magnitude = a.double().abs() @ w.double().abs().T
    one = torch.ones(1, 1, device="cuda")
    per_tensor = poison(torch.empty(m, n, device="cuda", dtype=torch.float32))
    fp8_gemm_kernel(f32)[(2, 2)](a, w, one, one, per_tensor, BM=128, BN=128, BK=128,
                                 STAGES=4, threads=256)
    blockwise = poison(torch.empty(m, n, device="cuda", dtype=torch.float32))
    fp8_blockwise_gemm_kernel(f32)[(2, 2)](a, w, torch.ones(m, k // 128, device="cuda"),
                                          torch.ones(2, k // 128, device="cuda"), blockwise,
                                          BM=128, BN=128, STAGES=3, threads=256)
    torch.cuda.synchronize()
    e_pt = check(per_tensor, ref, magnitude, k // 32, f32, "per-tensor")
    e_bw = check(blockwise, ref, magnitude, 4, f32, "blockwise")
    print(f"K={k}: per-tensor worst {e_pt:.3g}, blockwise worst {e_bw:.3g} of Σ|a·b|")
    rms = lambda c: float(((c.double() - ref) / magnitude).pow(2).mean().sqrt())  # noqa: E731
    assert rms(blockwise) <= rms(per_tensor)
