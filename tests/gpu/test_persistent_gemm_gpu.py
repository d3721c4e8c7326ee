"""On an H100: the persistent GEMM (examples/persistent_gemm.py) for sm_90a — its K pipeline
one TMA + mbarrier ring that runs across the tiles of each block, its epilogue TMA stores
where N allows (N a multiple of 8) and st.global elsewhere, warp-specialized and in one
role — against a float64 reference on shapes that divide no tile, with more tiles than
blocks (one block doing every tile, 7 blocks, one per SM) and fewer, one-iteration and
empty K loops, every stage count that fits; outputs poisoned (NaN) first, every element
checked.

A mistake in a ring's phases hangs the GPU rather than failing, so every launch runs in one
child process (this file with `--child`) under a time limit: a hang fails the test that
was running instead of stalling the session. The child prints one line per case."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import (check_child_case, check_f16_gemm, print_case_outcomes,  # noqa: E402
                         sm90_child_outcomes)

#: Tiles: the README's 128x256x64 with two consumer warpgroups at 3 and 4 stages (4 is
#: the benchmark's), 128x128x64, and small tiles (many tiles per block at small shapes).
CONFIGS = {
    "128x256x64-s4": dict(BM=128, BN=256, BK=64, STAGES=4, threads=256),
    "128x256x64-s3": dict(BM=128, BN=256, BK=64, STAGES=3, threads=256),
    "128x128x64-s2": dict(BM=128, BN=128, BK=64, STAGES=2, threads=256),
    "64x64x32-s5": dict(BM=64, BN=64, BK=32, STAGES=5),
    "64x128x16-s3": dict(BM=64, BN=128, BK=16, STAGES=3),
}
#: (M, N, K, blocks): blocks None = one per SM (min(tiles, SMs)).
SHAPES = [(1000, 1500, 264, None),      # ragged; more tiles than SMs for the small tiles
          (3000, 2000, 512, None),      # more tiles than SMs for every config
          (257, 129, 72, 1),            # one block walks every tile
          (700, 900, 136, 7),           # 7 blocks: uneven tiles per block
          (33, 17, 96, None),           # one tile, fewer tiles than SMs
          (200, 300, 64, 3),            # one K iteration (BK=64), several tiles per block
          (130, 70, 8, 2)]              # one partial K iteration
ROLES = {"specialized": None, "one-role": False}
CASES = [(c, s, r) for c in CONFIGS for s in SHAPES for r in ROLES]
TIME_LIMIT_S = 420


def _case_id(case) -> str:
    config, (m, n, k, blocks), roles = case
    return f"{config}-{m}x{n}x{k}-b{blocks or 'sms'}-{roles}"


def _example():
    spec = importlib.util.spec_from_file_location("persistent_gemm_example",
                                                  ROOT / "examples" / "persistent_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(case, module, torch, tg) -> str:
    """'ok' or what went wrong, for one case (in the child process)."""
    config_name, (m, n, k, blocks), roles = case
    config = CONFIGS[config_name]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = module.persistent_grid(m, n, blocks or sms, config["BM"], config["BN"])
    return check_f16_gemm(torch, m, n, k, lambda a, b, c: module.persistent_gemm[grid](
        a, b, c, target="sm_90a", warp_specialize=ROLES[roles], **config))


def child() -> None:
    import torch

    import tegula as tg
    from tegula.build import build
    from tegula.lower.async_ir import Roles
    module = _example()
    # The build must be the persistent TMA ring (not the cp.async fallback), in the role
    # form the case names, with the TMA-store epilogue where c's rows allow (the default
    # facts; shapes whose N is not a multiple of 8 take st.global).
    for name, config in CONFIGS.items():
        for roles, option in ROLES.items():
            built = build(module.persistent_gemm, dict(config, warp_specialize=option), None,
                          "sm_90a")
            specialized = any(isinstance(s, Roles) for s in built.thread_kernel.body)
            assert specialized == (option is None), (name, roles)
            source = built.cuda_source()
            assert "cp.async.cg" not in source, (name, roles)
            assert "cp.async.bulk.tensor.2d.global.shared::cta" in source, (name, roles)
    print_case_outcomes(CASES, lambda c: run_case(c, module, torch, tg), _case_id)


@pytest.fixture(scope="module")
def outcomes():
    return sm90_child_outcomes(__file__, ROOT, TIME_LIMIT_S)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_persistent_gemm_on_the_gpu(outcomes, case):
    check_child_case(outcomes, _case_id(case), [_case_id(c) for c in CASES], TIME_LIMIT_S)


if __name__ == "__main__" and "--child" in sys.argv:
    child()
