"""W4A16 on the GPU against torch in float64: the kernels launched directly (the rows
kernel for M ≤ 8, its 16-byte u4 loads included; dequantize-to-shared GEMM beyond; the
swapped kernel with the weights as the MMA's register A operand) over group sizes, zero points or symmetric,
f16 and bf16, ragged and LLM shapes, outputs NaN-poisoned first, every element checked;
then `quantize_w4` on the GPU and the autotuned `tegula.kernels.matmul_w4a16`."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def random_w4(n, k, group, dtype, zero_point, seed):
    """(a generator, unpacked w_q (N, K) uint8 0..15, scales, zeros or None) on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w_q = torch.randint(0, 16, (n, k), device="cuda", generator=g, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, device="cuda", generator=g) * 0.05 + 2 ** -8
              ).to(DTYPES[dtype])
    zeros = (torch.randint(0, 16, (n, k // group), device="cuda", generator=g)
             .to(DTYPES[dtype]) if zero_point else None)
    return g, w_q, scales, zeros


def dequantized(w_q, scales, zeros, group):
    zero = 8.0 if zeros is None else zeros.double().repeat_interleave(group, dim=1)
    return (w_q.double() - zero) * scales.double().repeat_interleave(group, dim=1)


def check(c, a, w_q, scales, zeros, group, dequant_rounded: bool) -> None:
    """Every element within one ulp of |ref| plus, where the kernel rounds the dequantized
    weights to the activation type for the tensor cores, one ulp of Σ|a·w| (else 2^-16 of
    it, the f32 sum in another order)."""
    w = dequantized(w_q, scales, zeros, group)
    ref = a.double() @ w.T
    scale = a.double().abs() @ w.abs().T
    ulp = 2.0 ** -(10 if c.dtype == torch.float16 else 7)
    assert not torch.isnan(c).any(), "unwritten (poisoned) outputs remain"
    err = (c.double() - ref).abs()
    bound = ulp * ref.abs() + (ulp if dequant_rounded else 2.0 ** -16) * scale
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}"


CASES = [  # m, n, k, group, zero_point
    (1, 4096, 4096, 128, True), (1, 11008, 4096, 64, False), (1, 37, 256, 32, True),
    (3, 300, 1024, 128, False), (4, 4096, 4096, 32, True), (16, 1000, 2048, 64, True),
    (16, 21, 96, 32, False), (17, 300, 512, 128, True), (64, 4096, 4096, 128, True),
    (8, 333, 1024, 64, True), (9, 4096, 4096, 128, False), (129, 200, 512, 64, False),
    (70, 130, 256, 64, False), (128, 11008, 4096, 128, True), (100, 77, 192, 32, True),
]


@pytest.mark.parametrize("tiles", [{}, dict(R=1, UNROLL=1), dict(BN=3, R=2, threads=256),
                                   dict(BM=16, BK=32)],
                         ids=["default", "R1", "BN3-256thr", "BM16-BK32"])
@pytest.mark.parametrize("m,n,k,group,zero_point", CASES)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_w4a16_kernels_match_torch(dtype, m, n, k, group, zero_point, tiles):
    """Both kernels, as `w4a16_config` picks them for m (the rows-kernel tiles apply only
    up to MAX_ROWS_KERNEL_M rows; a BM sends any m to the GEMM kernel), into poisoned
    outputs."""
    from tegula.dtypes import bf16, f16
    from tegula.kernels.quant import (MAX_ROWS_KERNEL_M, prepack, w4a16_config, w4a16_kernel,
                                      w4a16_operands)
    g, w_q, scales, zeros = random_w4(n, k, group, dtype, zero_point, m * 131 + n + k)
    a = torch.randn(m, k, device="cuda", generator=g, dtype=DTYPES[dtype])
    c = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    tiles = dict(tiles)
    if m > MAX_ROWS_KERNEL_M and "BM" not in tiles:
        tiles = {}                 # the GEMM kernel keeps its default tiles
    if "BK" in tiles:
        tiles["BK"] = min(tiles["BK"], group)  # a chunk lies in one group
    kind, grid, constexprs = w4a16_config(m, n, k, group, **tiles)
    kernel = w4a16_kernel(kind, f16 if dtype == "f16" else bf16, zeros is not None)
    zeros_arg = zeros if zeros is not None else torch.zeros(1, 1, device="cuda",
                                                            dtype=DTYPES[dtype])
    operands = w4a16_operands(kind, a, prepack(w_q), group)
    kernel[grid](*operands, scales, zeros_arg, c, **constexprs)
    torch.cuda.synchronize()
    check(c, a, w_q, scales, zeros, group, dequant_rounded=kind == "gemm")


@pytest.mark.parametrize("tiles", [dict(STAGES=1), dict(STAGES=2), dict(STAGES=4, BK=32),
                                   dict(BM=128, BN=128, threads=256),
                                   dict(BM=16, BN=32, BK=32, STAGES=1)],
                         ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items()))
@pytest.mark.parametrize("m,n,k,group", [(33, 300, 512, 32), (128, 4096, 4096, 128),
                                         (200, 130, 1024, 64), (5, 64, 256, 128)])
def test_w4a16_gemm_pipeline_and_tiles_match_torch(m, n, k, group, tiles):
    """The GEMM kernel at every pipeline depth (TMA + producer warpgroup on sm_90a for the
    activations, weights dequantized into the same stage), large tiles on 256 threads,
    and small tiles (a BM sends even M = 5 to the GEMM kernel)."""
    from tegula.dtypes import f16
    from tegula.kernels.quant import prepack, w4a16_config, w4a16_gemm_kernel
    g, w_q, scales, zeros = random_w4(n, k, group, "f16", True, m + n + k + len(tiles))
    a = torch.randn(m, k, device="cuda", generator=g, dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    tiles = dict(tiles)
    threads = tiles.pop("threads", None)
    kind, grid, constexprs = w4a16_config(m, n, k, group, BM=tiles.pop("BM", 64), **tiles)
    assert kind == "gemm"
    extra = {"threads": threads} if threads else {}
    w4a16_gemm_kernel(f16, True)[grid](a, prepack(w_q), scales, zeros, c, **constexprs,
                                       **extra)
    torch.cuda.synchronize()
    check(c, a, w_q, scales, zeros, group, dequant_rounded=True)


SWAPPED_SHAPES = [  # m, n, k, group, zero_point
    (1, 37, 256, 32, True), (5, 300, 1024, 128, False), (16, 4096, 4096, 128, True),
    (33, 1000, 2048, 64, True), (64, 4096, 4096, 128, True), (100, 77, 192, 32, True),
    (128, 14336, 4096, 128, False), (129, 200, 512, 64, False)]
SWAPPED_TILES = [{}, dict(BK=128), dict(STAGES=2, warp_specialize=True), dict(BT=16),
                 dict(BT=24, STAGES=1), dict(WSMEM=1, STAGES=4), dict(WSMEM=1, BK=128, STAGES=8, BT=16),
                 dict(ASMEM=1), dict(ASMEM=1, BK=128, SPLIT=3), dict(SPLIT=2, STAGES=2),
                 dict(ASMEM=1, BN=128, threads=256, SPLIT=2)]


@pytest.mark.parametrize("dtype,m,n,k,group,zero_point,tiles", [
    ("f16", *shape, tiles) for i, shape in enumerate(SWAPPED_SHAPES)
    for j, tiles in enumerate(SWAPPED_TILES) if (i + j) % 3 == 0 or not tiles] + [
    ("bf16", *shape, tiles) for shape in SWAPPED_SHAPES[2::3]
    for tiles in ({}, dict(ASMEM=1, SPLIT=2))],
    ids=lambda v: ("-".join(f"{k}{x}" for k, x in v.items()) or "default")
    if isinstance(v, dict) else None)
def test_w4a16_swapped_matches_torch(dtype, m, n, k, group, zero_point, tiles):
    """The swapped kernel (dequantized weights as the MMA's A operand from registers or
    shared memory, cᵀ through c.T; split K through an f32 workspace and the sum kernel),
    token tiles from `token_tile` or given, in one role and warp-specialized."""
    from tegula.dtypes import bf16, f16
    from tegula.kernels.quant import launch_w4a16, prepack, token_tile, w4a16_config
    g, w_q, scales, zeros = random_w4(n, k, group, dtype, zero_point, m * 17 + n + k)
    a = torch.randn(m, k, device="cuda", generator=g, dtype=DTYPES[dtype])
    c = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    tiles = dict(dict(BT=token_tile(m), warp_specialize=False), **tiles)
    tiles["BK"] = min(tiles.get("BK", 64), group)
    kind, grid, constexprs = w4a16_config(m, n, k, group, **tiles)
    assert kind == ("split" if tiles.get("SPLIT", 1) > 1 else "swapped")
    zeros_arg = zeros if zeros is not None else torch.zeros(1, 1, device="cuda",
                                                            dtype=DTYPES[dtype])
    launch_w4a16(kind, grid, constexprs, f16 if dtype == "f16" else bf16, zeros is not None,
                 (a, prepack(w_q), scales, zeros_arg), c,
                 lambda kernel, grid, args, cx: kernel[grid](*args, **cx),
                 lambda shape: torch.full(shape, float("nan"), device="cuda"))
    torch.cuda.synchronize()
    check(c, a, w_q, scales, zeros, group, dequant_rounded=True)


@pytest.mark.parametrize("m,n,k,group,zero_point", [
    (1, 4096, 4096, 128, True), (2, 11008, 4096, 64, True), (5, 333, 1024, 64, False),
    (16, 4096, 11008, 128, True), (64, 512, 1024, 32, True), (128, 4096, 4096, 128, False)])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_matmul_w4a16_matches_torch(dtype, m, n, k, group, zero_point):
    """The torch entry point on weights quantized on the GPU by `quantize_w4`."""
    import tegula.kernels as tk
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    w = torch.randn(n, k, device="cuda", generator=g, dtype=DTYPES[dtype]) * 0.1
    a = torch.randn(m, k, device="cuda", generator=g, dtype=DTYPES[dtype])
    packed, scales, zeros = tk.quantize_w4(w, group, zero_point)
    assert packed.dtype == torch.uint8 and packed.shape == (n, k // 2)
    w_q = tk.unpack_w4(packed)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    assert tk.matmul_w4a16(a, packed, scales, zeros, group, out=out) is out
    rounded = m > 2  # from 3 rows on, the tuner may pick the GEMM kernel (rounded weights)
    check(out, a, w_q, scales, zeros, group, dequant_rounded=rounded)
    for activations in (a, a, torch.randn_like(a)):  # tuned winner, then replayed launches
        check(tk.matmul_w4a16(activations, packed, scales, zeros, group), activations, w_q,
              scales, zeros, group, dequant_rounded=rounded)
    # the quantization itself: every weight within half a step (plus the scale's rounding)
    step = scales.double().repeat_interleave(group, dim=1)
    err = (dequantized(w_q, scales, zeros, group) - w.double()).abs()
    assert bool((err <= step * (0.5 + 16 * 2.0 ** -8) + 1e-6).all())


def test_w4a16_nan_reaches_only_its_outputs():
    import tegula.kernels as tk
    _, w_q, scales, zeros = random_w4(64, 256, 64, "f16", True, 7)
    scales[9, 2] = float("nan")
    for m in (1, 40):
        a = torch.randn(m, 256, device="cuda", dtype=torch.float16)
        c = tk.matmul_w4a16(a, tk.prepack(w_q), scales, zeros, 64)
        assert torch.isnan(c[:, 9]).all()
        keep = torch.arange(64, device="cuda") != 9
        check(c[:, keep], a, w_q[keep], scales[keep], zeros[keep], 64,
              dequant_rounded=m > 2)


@pytest.mark.parametrize("name", ["u4", "i4", "u8", "i8"])
def test_narrow_integer_to_float_conversion_of_every_value(name):
    """The magic-number conversion (codegen/expr.py) against the values themselves: every
    value of the type, to f32 and to f16, exactly."""
    import sys
    from pathlib import Path

    import numpy as np

    import tegula as tg
    from tegula.dtypes import f16, f32, i4, i8, u4, u8
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_helpers import to_device

    src = {"u4": u4, "i4": i4, "u8": u8, "i8": i8}[name]

    @tg.kernel(threads=32)
    def cast_to_float(x: tg.Tensor[src, 1], y: tg.Tensor[f32, 1], z: tg.Tensor[f16, 1],
                      B: tg.constexpr = 32):
        t = tg.load(x.tile((B,), (tg.block_id(0),)))
        tg.copy(t.to(f32), y.tile((B,), (tg.block_id(0),)))
        tg.copy(t.to(f16), z.tile((B,), (tg.block_id(0),)))

    if src.is_packed:
        nibbles = np.arange(16, dtype=np.uint8)
        values = (nibbles ^ 8).astype(np.int64) - 8 if name == "i4" else nibbles.astype(np.int64)
        host = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
        count = 16
    else:
        values = np.arange(256, dtype=np.int64) - (128 if name == "i8" else 0)
        host = values.astype(np.int8 if name == "i8" else np.uint8)
        count = 256
    x = to_device(host, src)
    y = torch.full((count,), float("nan"), device="cuda", dtype=torch.float32)
    z = torch.full((count,), float("nan"), device="cuda", dtype=torch.float16)
    cast_to_float[(tg.cdiv(count, 32),)](x, y, z)
    torch.cuda.synchronize()
    assert np.array_equal(y.cpu().numpy(), values.astype(np.float32))
    assert np.array_equal(z.cpu().numpy(), values.astype(np.float16))


@pytest.mark.parametrize("k", [64, 96, 30, 16])
def test_four_bit_rows_load_with_the_widest_vectors_their_facts_allow(k):
    """u4 tiles whose rows hold 32, 48, 15 and 8 bytes: 16-byte loads where the facts
    (divisors up to 32 elements for 4-bit types) allow them, narrower ones elsewhere; every
    weight read back exactly into a poisoned output."""
    import sys
    from pathlib import Path

    import numpy as np

    import tegula as tg
    from tegula.dtypes import f16, u4
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_helpers import to_device

    @tg.kernel(threads=32)
    def u4_rows(w: tg.Tensor[u4], out: tg.Tensor[f16], BN: tg.constexpr = 32,
                BK: tg.constexpr = 32):
        n = tg.block_id(0)
        gw, go = w.tile((BN, BK), (n, None)), out.tile((BN, BK), (n, None))
        for j in tg.range(gw.shape[2]):
            tg.copy(tg.load(gw[:, :, j]).to(f16), go[:, :, j])

    n = 45
    w_q = np.random.default_rng(k).integers(0, 16, size=(n, k), dtype=np.uint8)
    packed = (w_q[:, 0::2] | (w_q[:, 1::2] << 4)).astype(np.uint8)
    out = torch.full((n, k), float("nan"), device="cuda", dtype=torch.float16)
    u4_rows[(tg.cdiv(n, 32),)](to_device(packed, u4), out)
    torch.cuda.synchronize()
    assert np.array_equal(out.cpu().numpy(), w_q.astype(np.float16))


@pytest.mark.parametrize("dtype,m,n,k,group,zero_point,tiles", [
    (d, m, n, k, g, z, t) for d, m, n, k, g, z, t in [
        ("f16", 16, 4096, 4096, 128, True, dict(STAGES=4)),
        ("f16", 16, 4096, 4096, 128, True, dict(STAGES=4, SPLIT=4)),
        ("f16", 128, 14336, 4096, 128, True, dict(BT=128)),
        ("f16", 64, 4096, 4096, 64, False, dict(SPLIT=2)),
        ("f16", 13, 70, 192, 64, True, {}),           # N, K not multiples of 64
        ("f16", 20, 130, 224, 32, False, dict(SPLIT=3)),   # two groups a k-step, ragged K
        ("f16", 1, 333, 1024, 128, True, {}),
        ("f16", 100, 77, 192, 32, True, dict(BT=64)),
        ("bf16", 33, 300, 512, 128, True, {}),
        ("bf16", 16, 4096, 4096, 128, False, dict(SPLIT=2)),
        ("f16", 16, 4096, 4096, 128, True, dict(KS=2, SPLIT=8)),
        ("f16", 20, 130, 224, 32, True, dict(KS=2, SPLIT=3)),
        ("bf16", 128, 4096, 4096, 64, True, dict(KS=2, BT=128, WSMEM=0)),
        # WG warpgroups of 64 weight rows a block, sharing the activation tiles
        ("f16", 128, 14336, 4096, 128, True, dict(BT=128, KS=2, WG=2)),
        ("f16", 64, 4096, 4096, 128, True, dict(BT=64, KS=2, WG=4, SPLIT=2, WSMEM=0)),
        ("f16", 100, 77, 192, 32, True, dict(BT=128, WG=2)),      # rows 77-127 past N
        ("bf16", 64, 300, 512, 64, False, dict(KS=2, WG=2, SPLIT=3)),
        # the scale on each step's f32 sums, 7 blocks an SM
        ("f16", 16, 14336, 4096, 128, True, dict(KS=2, SPLIT=3, STAGES=3, SCALE_AFTER=1,
                                                 blocks_per_sm=7)),
        ("bf16", 13, 70, 192, 64, False, dict(SCALE_AFTER=1)),
        # the split read from the grid (one build for every split): splits of 3 to 8
        ("f16", 16, 14336, 4096, 128, True, dict(KS=4, SPLIT=3, load_path="cp.async")),
        ("f16", 16, 4096, 4096, 128, True, dict(KS=4, SPLIT=8, load_path="cp.async")),
        ("bf16", 5, 300, 1280, 128, True, dict(KS=4, SPLIT=6, load_path="cp.async")),
        ("f16", 16, 14336, 4096, 128, True, dict(KS=4, STAGES=6, load_path="cp.async")),
        # session 12: integer zeros without the residue step; the scale on each group's
        # f32 sums with several groups a step (one part, rings and gemm a group)
        ("f16", 16, 14336, 4096, 128, True, dict(KS=4, STAGES=6, INTEGER_ZEROS=1,
                                                 load_path="cp.async")),
        ("f16", 16, 14336, 4096, 128, True, dict(KS=4, STAGES=6, SCALE_AFTER=1,
                                                 INTEGER_ZEROS=1, load_path="cp.async")),
        ("bf16", 16, 4096, 4096, 128, True, dict(KS=8, STAGES=4, SCALE_AFTER=1, SPLIT=2,
                                                 INTEGER_ZEROS=1, load_path="cp.async")),
        ("f16", 13, 70, 320, 64, True, dict(KS=4, SCALE_AFTER=1, INTEGER_ZEROS=1,
                                            load_path="cp.async")),
        ("f16", 9, 300, 1024, 128, False, dict(KS=4, SCALE_AFTER=1, SPLIT=3,
                                               load_path="cp.async")),
        ("f16", 128, 4096, 4096, 128, True, dict(BT=128, KS=2, SPLIT=4, INTEGER_ZEROS=1)),
        # two warpgroups of rows: the tuner's 16-token pick of session 12, 64 tokens split 2
        ("f16", 16, 14336, 4096, 128, True, dict(KS=4, STAGES=4, WG=2, SCALE_AFTER=1,
                                                 INTEGER_ZEROS=1, load_path="cp.async")),
        ("bf16", 5, 300, 1280, 128, True, dict(KS=4, STAGES=4, WG=2, SCALE_AFTER=1, SPLIT=2,
                                               INTEGER_ZEROS=1, load_path="cp.async")),
        ("f16", 64, 14336, 4096, 128, True, dict(BT=64, KS=2, STAGES=3, SPLIT=2, WG=2,
                                                 INTEGER_ZEROS=1)),
        # session 14: built for sm_90 without "a": mma.sync, the weights its A fragment
        ("f16", 16, 14336, 4096, 128, True, dict(KS=4, STAGES=4, SPLIT=2, SCALE_AFTER=1,
                                                 INTEGER_ZEROS=1, load_path="cp.async",
                                                 target="sm_90")),
        ("bf16", 13, 300, 1344, 64, True, dict(KS=2, WG=2, SPLIT=3, load_path="cp.async",
                                               target="sm_90")),
        # 8-token tiles (wgmma n8) at one token, and a ragged 5
        ("f16", 1, 14336, 4096, 128, True, dict(BT=8, KS=4, STAGES=6, SCALE_AFTER=1,
                                                INTEGER_ZEROS=1, load_path="cp.async")),
        ("bf16", 5, 300, 1280, 128, False, dict(BT=8, KS=4, STAGES=6, SCALE_AFTER=1,
                                                load_path="cp.async"))]],
    ids=lambda v: ("-".join(f"{k}{x}" for k, x in v.items()) or "default")
    if isinstance(v, dict) else None)
def test_w4a16_fragment_matches_torch(dtype, m, n, k, group, zero_point, tiles):
    """The kernel reading weights pre-packed in the wgmma A fragment's order (16-byte
    loads, `quant_fragment`), split K included, in one role."""
    from tegula.dtypes import bf16, f16
    from tegula.kernels import quant_fragment as qf
    from tegula.kernels.quant import prepack
    g, w_q, scales, zeros = random_w4(n, k, group, dtype, zero_point, m * 17 + n + k)
    a = torch.randn(m, k, device="cuda", generator=g, dtype=DTYPES[dtype])
    c = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    stored = qf.pack_fragments(prepack(w_q))
    assert torch.equal(qf.unpack_fragments(stored, n, k), prepack(w_q))
    grid, constexprs = qf.fragment_config(m, n, k, group, warp_specialize=False, **tiles)
    zeros_arg = zeros if zeros is not None else torch.zeros(1, 1, device="cuda",
                                                            dtype=DTYPES[dtype])
    operands = (a, qf.as_words(stored), scales, zeros_arg)
    qf.launch_w4a16_fragment(grid, constexprs, f16 if dtype == "f16" else bf16,
                             zeros is not None, operands, c,
                             lambda kernel, grid, args, cx: kernel[grid](*args, **cx),
                             lambda shape: torch.full(shape, float("nan"), device="cuda"))
    torch.cuda.synchronize()
    check(c, a, w_q, scales, zeros, group, dequant_rounded=True)


@pytest.mark.parametrize("m,n,k,group,zero_point", [
    (1, 4096, 4096, 128, True), (16, 4096, 4096, 128, True), (13, 333, 1024, 32, False),
    (64, 4096, 4096, 128, True), (128, 14336, 4096, 64, True)])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_matmul_w4a16_prepacked_fragments_match_torch(dtype, m, n, k, group, zero_point):
    """The torch entry point on weights pre-packed by `pack_fragments` (6-D): the fragment
    kernel's configs, tuned, then replayed."""
    import tegula.kernels as tk
    g = torch.Generator(device="cuda").manual_seed(m + n + k + 1)
    w = torch.randn(n, k, device="cuda", generator=g, dtype=DTYPES[dtype]) * 0.1
    a = torch.randn(m, k, device="cuda", generator=g, dtype=DTYPES[dtype])
    packed, scales, zeros = tk.quantize_w4(w, group, zero_point)
    stored = tk.pack_fragments(packed)
    w_q = tk.unpack_w4(packed)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    assert tk.matmul_w4a16(a, stored, scales, zeros, group, out=out) is out
    check(out, a, w_q, scales, zeros, group, dequant_rounded=True)
    for activations in (a, a, torch.randn_like(a)):  # tuned winner, then replayed launches
        check(tk.matmul_w4a16(activations, stored, scales, zeros, group), activations, w_q,
              scales, zeros, group, dequant_rounded=True)
    with pytest.raises(ValueError, match="pre-packed weights"):
        tk.matmul_w4a16(a, stored[:, :-1], scales, zeros, group)


def fractional_zeros(zeros, g):
    """zeros + a fraction in (-0.5, 0.5): any f16 value, multiples of 1/16 in bf16 (its 8
    bits below 16). Zero points like these (HQQ) were silently rounded by the fragment
    kernel before session 11."""
    if zeros.dtype == torch.float16:
        fraction = torch.rand(zeros.shape, device="cuda", generator=g) * 0.998 - 0.499
    else:
        fraction = torch.randint(-7, 8, zeros.shape, device="cuda", generator=g) / 16
    out = (zeros.float() + fraction).to(zeros.dtype)
    assert bool((out != out.round()).any())
    return out


@pytest.mark.parametrize("dtype,m,n,k,group,tiles", [
    ("f16", 16, 4096, 4096, 128, dict(KS=4, SPLIT=4, STAGES=3, load_path="cp.async")),
    ("f16", 13, 70, 192, 64, {}),
    ("f16", 128, 4096, 4096, 128, dict(BT=128, KS=2, SPLIT=2, WSMEM=0)),
    ("f16", 16, 14336, 4096, 128, dict(KS=2, SPLIT=3, SCALE_AFTER=1)),
    ("f16", 16, 14336, 4096, 128, dict(KS=4, STAGES=6, SCALE_AFTER=1, load_path="cp.async")),
    ("bf16", 20, 300, 512, 64, dict(KS=2, SPLIT=2))],
    ids=lambda v: ("-".join(f"{k}{x}" for k, x in v.items()) or "default")
    if isinstance(v, dict) else None)
def test_w4a16_fragment_fractional_zero_points(dtype, m, n, k, group, tiles):
    """The fragment kernel with fractional zero points, into NaN-poisoned outputs, every
    element against float64 (the old kernel rounded them: errors of half a scale)."""
    from tegula.dtypes import bf16, f16
    from tegula.kernels import quant_fragment as qf
    from tegula.kernels.quant import prepack
    g, w_q, scales, zeros = random_w4(n, k, group, dtype, True, m * 31 + n + k)
    zeros = fractional_zeros(zeros, g)
    a = torch.randn(m, k, device="cuda", generator=g, dtype=DTYPES[dtype])
    c = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    grid, constexprs = qf.fragment_config(m, n, k, group, warp_specialize=False, **tiles)
    operands = (a, qf.as_words(qf.pack_fragments(prepack(w_q))), scales, zeros)
    qf.launch_w4a16_fragment(grid, constexprs, f16 if dtype == "f16" else bf16, True,
                             operands, c,
                             lambda kernel, grid, args, cx: kernel[grid](*args, **cx),
                             lambda shape: torch.full(shape, float("nan"), device="cuda"))
    torch.cuda.synchronize()
    check(c, a, w_q, scales, zeros, group, dequant_rounded=True)


@pytest.mark.parametrize("prepacked", [True, False])
@pytest.mark.parametrize("m", [1, 16, 128])
def test_matmul_w4a16_fractional_zero_points(m, prepacked):
    """The entry point (tuned, then replayed) with fractional zero points, on fragment
    pre-packed or row-major packed weights."""
    import tegula.kernels as tk
    n, k, group = 4096, 4096, 128
    g, w_q, scales, zeros = random_w4(n, k, group, "f16", True, 7 * m + prepacked)
    zeros = fractional_zeros(zeros, g)
    packed = tk.prepack(w_q)
    weights = tk.pack_fragments(packed) if prepacked else packed
    for _ in range(2):
        a = torch.randn(m, k, device="cuda", generator=g, dtype=torch.float16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        assert tk.matmul_w4a16(a, weights, scales, zeros, group, out=out) is out
        check(out, a, w_q, scales, zeros, group, dequant_rounded=m > 2 or prepacked)
        check(tk.matmul_w4a16(a, weights, scales, zeros, group), a, w_q, scales, zeros,
              group, dequant_rounded=m > 2 or prepacked)


@pytest.mark.parametrize("dtype,m,n,k,group,zero_point,tiles", [
    ("f16", 1, 14336, 4096, 128, "int", dict(KS=16, KW=4)),
    ("f16", 1, 14336, 4096, 128, "int", dict(KS=16, KW=8, ASTAGES=3)),
    ("f16", 1, 4096, 4096, 128, "int", dict(KS=8, KW=8)),
    ("f16", 1, 14336, 4096, 128, "int", dict(KS=4, KW=4, AHEAD=1)),
    ("f16", 1, 14336, 4096, 128, "int", dict(KS=4, KW=4, RW=2)),
    ("f16", 2, 1000, 2048, 64, "frac", dict(KS=8, KW=8, RW=4, SPLIT=2)),
    ("f16", 1, 4096, 14336, 128, "int", dict(KS=8, KW=4, SPLIT=2)),
    ("f16", 2, 11008, 4096, 64, None, dict(KS=16, KW=8)),
    ("f16", 4, 4096, 4096, 128, "frac", dict(KS=32, KW=8, ASTAGES=3)),
    ("f16", 3, 300, 1088, 64, "frac", dict(KS=4, KW=2, SPLIT=3, ASTAGES=2)),
    ("bf16", 1, 4096, 4096, 128, "int", dict(KS=16, KW=4)),
    ("bf16", 2, 70, 640, 128, "frac", dict(KS=2, KW=1))],
    ids=lambda v: ("-".join(f"{k}{x}" for k, x in v.items()) or "default")
    if isinstance(v, dict) else None)
def test_w4a16_gemv_matches_torch(dtype, m, n, k, group, zero_point, tiles):
    """The CUDA-core kernel for a few tokens on fragment-ordered words (`quant_gemv`),
    into NaN-poisoned outputs, every element against float64 with the f32 sum's bound
    (its w − zero is exact, no dequantized weight rounded)."""
    from tegula.dtypes import bf16, f16
    from tegula.kernels import quant_fragment as qf
    from tegula.kernels.quant import launch_w4a16, prepack, w4a16_config, w4a16_operands
    g, w_q, scales, zeros = random_w4(n, k, group, dtype, zero_point is not None,
                                      m * 37 + n + k)
    if zero_point == "frac":
        zeros = fractional_zeros(zeros, g)
    a = torch.randn(m, k, device="cuda", generator=g, dtype=DTYPES[dtype])
    c = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    kind, grid, constexprs = w4a16_config(m, n, k, group, GEMV=1, **tiles)
    if zero_point == "int":
        constexprs["INTEGER_ZEROS"] = 1
    zeros_arg = zeros if zeros is not None else torch.zeros(1, 1, device="cuda",
                                                            dtype=DTYPES[dtype])
    operands = (*w4a16_operands(kind, a, qf.pack_fragments(prepack(w_q)), group), scales,
                zeros_arg)
    launch_w4a16(kind, grid, constexprs, f16 if dtype == "f16" else bf16, zeros is not None,
                 operands, c, lambda kernel, grid, args, cx: kernel[grid](*args, **cx),
                 lambda shape: torch.full(shape, float("nan"), device="cuda"))
    torch.cuda.synchronize()
    check(c, a, w_q, scales, zeros, group, dequant_rounded=False)


@pytest.mark.parametrize("m,n,k,group,tiles", [
    (16, 4096, 4096, 128, dict(KS=4, SPLIT=4, INTEGER_ZEROS=1, load_path="cp.async")),
    (128, 4096, 4096, 128, dict(BT=128, KS=2, SPLIT=4, INTEGER_ZEROS=1)),
    (33, 300, 1024, 64, dict(BT=16, SPLIT=3, INTEGER_ZEROS=1))],
    ids=lambda v: ("-".join(f"{k}{x}" for k, x in v.items()) or "default")
    if isinstance(v, dict) else None)
def test_w4a16_fragment_fused_split_matches_torch(m, n, k, group, tiles):
    """Split K summed in the same launch by each tile's last block (FUSED=1,
    `tg.last_arrival`), into NaN-poisoned outputs, three launches on the same counters
    (each leaves them at zero)."""
    from tegula.dtypes import f16
    from tegula.kernels import quant_fragment as qf
    from tegula.kernels.quant import prepack
    g, w_q, scales, zeros = random_w4(n, k, group, "f16", True, m * 13 + n + k)
    grid, constexprs = qf.fragment_config(m, n, k, group, warp_specialize=False, FUSED=1,
                                          **tiles)
    counters = torch.zeros(grid[0] * grid[1], dtype=torch.int32, device="cuda")
    stored = qf.as_words(qf.pack_fragments(prepack(w_q)))
    for _ in range(3):
        a = torch.randn(m, k, device="cuda", generator=g, dtype=torch.float16)
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        qf.launch_w4a16_fragment(grid, constexprs, f16, True, (a, stored, scales, zeros), c,
                                 lambda kernel, grid, args, cx: kernel[grid](*args, **cx),
                                 lambda shape: torch.full(shape, float("nan"), device="cuda"),
                                 lambda size: counters)
        torch.cuda.synchronize()
        check(c, a, w_q, scales, zeros, group, dequant_rounded=True)
        assert not counters.any()


@pytest.mark.parametrize("dtype,m,n,k,group,zero_point,tiles", [
    ("f16", 16, 14336, 4096, 128, True, dict(KS=2, WG=2, INTEGER_ZEROS=1)),
    ("f16", 16, 4096, 4096, 128, True, dict(KS=2, WG=4, SPLIT=8, INTEGER_ZEROS=1)),
    ("bf16", 64, 4096, 4096, 64, True, dict(BT=64, KS=2, WG=2, SPLIT=3)),
    ("f16", 128, 4096, 4096, 128, False, dict(BT=128, KS=2, SPLIT=4)),
    ("f16", 13, 70, 320, 64, True, dict(SPLIT=2)),            # 5 steps: slices of 4 and 1
    ("bf16", 5, 300, 1344, 64, False, dict(KS=2, WG=2, SPLIT=3)),    # half pair past K
    ("f16", 128, 4096, 4096, 128, True, dict(BT=128, WG=2, SPLIT=4, consumers="pingpong")),
    ("f16", 16, 14336, 4096, 128, True, dict(KS=2, WG=4, SPLIT=2, SCALE_AFTER=1,
                                             INTEGER_ZEROS=1)),
    ("bf16", 9, 300, 1344, 64, True, dict(WG=2, SPLIT=3, SCALE_AFTER=1))],
    ids=lambda v: ("-".join(f"{k}{x}" for k, x in v.items()) or "default")
    if isinstance(v, dict) else None)
def test_w4a16_fragment_paired_steps_match_torch(dtype, m, n, k, group, zero_point, tiles):
    """PAIRS=1 (two k-steps an iteration, two register A operands, the words straight into
    registers, a warp-specialized TMA ring for the tokens; with the scale on each step's
    f32 sum, two warpgroups taking turns): split K into slices of an even count of steps,
    odd step counts, NaN-poisoned outputs and workspace, every element."""
    from tegula.dtypes import bf16, f16
    from tegula.kernels import quant_fragment as qf
    from tegula.kernels.quant import prepack
    g, w_q, scales, zeros = random_w4(n, k, group, dtype, zero_point, m * 19 + n + k)
    a = torch.randn(m, k, device="cuda", generator=g, dtype=DTYPES[dtype])
    c = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    stored = qf.as_words(qf.pack_fragments(prepack(w_q)))
    grid, constexprs = qf.fragment_config(m, n, k, group, warp_specialize=True, WSMEM=0,
                                          PAIRS=1, STAGES=3, **tiles)
    zeros_arg = zeros if zeros is not None else torch.zeros(1, 1, device="cuda",
                                                            dtype=DTYPES[dtype])
    qf.launch_w4a16_fragment(grid, constexprs, f16 if dtype == "f16" else bf16,
                             zeros is not None, (a, stored, scales, zeros_arg), c,
                             lambda kernel, grid, args, cx: kernel[grid](*args, **cx),
                             lambda shape: torch.full(shape, float("nan"), device="cuda"))
    torch.cuda.synchronize()
    check(c, a, w_q, scales, zeros, group, dequant_rounded=True)


def test_matmul_w4a16_fused_split_on_the_shared_arrival_counters(monkeypatch):
    """The entry point with a FUSED=1 pick (not a tuner candidate, so forced here) runs on
    the stream's shared arrival counters (`runtime/arrivals.py`): its first call and two
    replays, each output checked element by element (the replay allocates its output:
    a freed NaN tensor of that size is what the allocator hands it), and the counters left
    zero for the next entry point that merges in its last block."""
    import tegula.kernels.quant as quant
    from tegula.kernels.quant import matmul_w4a16, prepack
    from tegula.kernels.quant_fragment import pack_fragments
    from tegula.runtime.arrivals import arrival_counters
    m, n, k, group = 16, 4160, 4096, 128       # a bucket no other test tunes
    fused = dict(FRAGMENT=1, warp_specialize=False, BT=16, KS=4, STAGES=3, SPLIT=4,
                 FUSED=1, load_path="cp.async")
    monkeypatch.setattr(quant, "fragment_candidates", lambda *args, **kw: [fused])
    monkeypatch.setenv("TEGULA_AUTOTUNE", "0")
    g, w_q, scales, zeros = random_w4(n, k, group, "f16", True, 4160)
    packed = pack_fragments(prepack(w_q))
    for call in range(3):
        a = torch.randn(m, k, device="cuda", generator=g, dtype=torch.float16)
        if call == 0:
            c = matmul_w4a16(a, packed, scales, zeros, group,
                             out=torch.full((m, n), float("nan"), device="cuda",
                                            dtype=torch.float16))
        else:
            poison = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            del poison
            c = matmul_w4a16(a, packed, scales, zeros, group)
        torch.cuda.synchronize()
        check(c, a, w_q, scales, zeros, group, dequant_rounded=True)
        assert not arrival_counters(a.device, -(-n // 64)).any()   # one a 64-row tile
