"""On an H100: the per-tensor FP8 persistent GEMM (`fp8.fp8_persistent_gemm_kernel`) in
2-CTA clusters (CLUSTER=2: b's boxes multicast to the cluster's two row tiles, each stage
released by both blocks) against a float64 reference of the same e4m3 inputs: ragged
shapes, an odd number of row tiles, fewer clusters than tile pairs, one cluster doing
every pair, one K iteration; outputs NaN-poisoned, every element checked within the
tensor-core bound. As in test_cluster_gemm_gpu.py, every launch runs in one child process
(this file with `--child`) under a time limit, so a hang fails the case it was running."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import check_child_case, print_case_outcomes, sm90_child_outcomes  # noqa: E402

#: matmul_fp8's large-shape tile (128x256x128, 3 stages, two consumer warpgroups) and a
#: small one (many tiles per block).
CONFIGS = {"128x256x128-s3": dict(BM=128, BN=256, BK=128, STAGES=3, threads=256),
           "64x64x64-s3": dict(BM=64, BN=64, BK=64, STAGES=3, GROUP=3)}
#: (M, N, K, SMs the grid is sized for): None = the GPU's.
SHAPES = [(1000, 1500, 384, None),      # ragged M and N
          (1100, 700, 256, None),       # 9 row tiles of 128: the last pair's second past M
          (257, 129, 128, 2),           # one cluster walks every pair
          (700, 900, 256, 6),           # 3 clusters, uneven pairs each
          (33, 17, 128, None),          # one tile: its pair's second block has nothing
          (200, 300, 64, 4)]            # one K iteration at BK=64, a partial one at 128
CASES = [(c, s) for c in CONFIGS for s in SHAPES]
TIME_LIMIT_S = 300
#: |error| allowed per element, relative to Σ|a·b| per k32 instruction (Hopper's FP8 wgmma
#: truncates its running sum; the bound of tests/gpu/test_fp8_gpu.py), plus f32 additions
#: and the bf16 output rounding relative to the result.
PER_INSTRUCTION = 2.0 ** -11


def _case_id(case) -> str:
    config, (m, n, k, sms) = case
    return f"{config}-{m}x{n}x{k}-sms{sms or 'all'}"


def run_case(case, torch) -> str:
    """'ok' or what went wrong, for one case (in the child process)."""
    from tegula.dtypes import bf16
    from tegula.kernels.fp8 import fp8_persistent_gemm_kernel
    from tegula.kernels.gemm import persistent_grid
    config_name, (m, n, k, sms) = case
    config = CONFIGS[config_name]
    sms = sms or torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(m * 131 + n * 7 + k)
    a = (torch.randn(m, k, device="cuda", generator=gen) * 3).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 3).to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([[0.37]], device="cuda"), torch.tensor([[1.9]], device="cuda")
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    grid = persistent_grid(m, n, sms, config["BM"], config["BN"], 2)
    fp8_persistent_gemm_kernel(bf16)[grid](a, w, sa, sb, c, target="sm_90a", CLUSTER=2,
                                            **config)
    torch.cuda.synchronize()
    s = 0.37 * 1.9
    ref = (a.double() @ w.double().T) * s
    magnitude = (a.double().abs() @ w.double().abs().T) * s
    if torch.isnan(c).any():
        return f"{int(torch.isnan(c).sum())} elements unwritten (still NaN)"
    bound = (-(-k // 32) * PER_INSTRUCTION + 64 * 2.0 ** -24) * magnitude \
        + 2.0 ** -8 * ref.abs() + 1e-30
    bad = int(((c.double() - ref).abs() > bound).sum())
    return "ok" if bad == 0 else f"{bad} elements outside the bound"


def child() -> None:
    import torch

    from tegula.build import build
    from tegula.dtypes import bf16
    from tegula.kernels.fp8 import fp8_persistent_gemm_kernel
    for name, config in CONFIGS.items():   # each build multicasts b across a 2x1 cluster
        built = build(fp8_persistent_gemm_kernel(bf16), dict(config, CLUSTER=2), None,
                      "sm_90a")
        assert built.thread_kernel.cluster == (2, 1, 1), name
        assert ".multicast::cluster" in built.cuda_source(), name
    print_case_outcomes(CASES, lambda c: run_case(c, torch), _case_id)


@pytest.fixture(scope="module")
def outcomes():
    return sm90_child_outcomes(__file__, ROOT, TIME_LIMIT_S)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_fp8_cluster_gemm_on_the_gpu(outcomes, case):
    check_child_case(outcomes, _case_id(case), [_case_id(c) for c in CASES], TIME_LIMIT_S)


if __name__ == "__main__" and "--child" in sys.argv:
    child()
