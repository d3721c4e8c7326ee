"""On an H100: the persistent GEMM (examples/persistent_gemm.py) with ping-pong consumers
(`consumers="pingpong"`: two consumer warpgroups own alternate tiles of the block's tile
loop, their main loops taking turns through named barriers, `lower/hopper.py`) against a
float64 reference: shapes that divide no tile, more tiles than blocks with an odd count
per block (one warpgroup does one more tile than the other), a block with a single tile
(the second warpgroup idle), one-iteration and partial K loops, stage counts 2-6;
outputs poisoned (NaN) first, every element checked.

A wrong turn or ring phase hangs the GPU, so every launch runs in one child process (this
file with `--child`) under a time limit; the child prints one line per case. Then
compute-sanitizer's memcheck, racecheck and synccheck on a small ping-pong launch."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import (check_child_case, check_f16_gemm, print_case_outcomes,  # noqa: E402
                         sm90_child_outcomes)

CONFIGS = {
    "64x256x64-s4": dict(BM=64, BN=256, BK=64, STAGES=4),   # matmul's tuner candidate
    "128x128x64-s5": dict(BM=128, BN=128, BK=64, STAGES=5),
    "128x128x64-s2": dict(BM=128, BN=128, BK=64, STAGES=2),
    "64x64x32-s6": dict(BM=64, BN=64, BK=32, STAGES=6),
}
#: (M, N, K, blocks): blocks None = one per SM (min(tiles, SMs)).
SHAPES = [(1000, 1500, 264, None),      # ragged; more tiles than SMs for the small tiles
          (3000, 2000, 520, None),      # more tiles than SMs for every config
          (257, 129, 72, 1),            # one block walks every tile (odd count: 3 or 9)
          (700, 900, 136, 7),           # 7 blocks: uneven tiles per block
          (33, 17, 96, None),           # one tile: the second warpgroup has none
          (200, 300, 64, 3),            # one K iteration (BK=64), several tiles per block
          (130, 70, 8, 2)]              # one partial K iteration
CASES = [(c, s) for c in CONFIGS for s in SHAPES]
TIME_LIMIT_S = 300


def _case_id(case) -> str:
    config, (m, n, k, blocks) = case
    return f"pingpong-{config}-{m}x{n}x{k}-b{blocks or 'sms'}"


def _example():
    spec = importlib.util.spec_from_file_location("persistent_gemm_example",
                                                  ROOT / "examples" / "persistent_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(case, module, torch) -> str:
    """'ok' or what went wrong, for one case (in the child process)."""
    config_name, (m, n, k, blocks) = case
    config = CONFIGS[config_name]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = module.persistent_grid(m, n, blocks or sms, config["BM"], config["BN"])
    return check_f16_gemm(torch, m, n, k, lambda a, b, c: module.persistent_gemm[grid](
        a, b, c, target="sm_90a", threads=128, consumers="pingpong", **config))


def child() -> None:
    import torch

    from tegula.build import build
    from tegula.lower.async_ir import Roles
    module = _example()
    for name, config in CONFIGS.items():  # the build is the ping-pong one
        built = build(module.persistent_gemm, dict(config, threads=128, consumers="pingpong"),
                      None, "sm_90a")
        roles = next(s for s in built.thread_kernel.body if isinstance(s, Roles))
        assert [r.name for r in roles.roles] == ["consumer0", "consumer1", "producer"], name
        assert "bar.arrive" in built.cuda_source(), name
    # A short GPU round: TEGULA_PINGPONG_CONFIGS=N runs the first N configurations,
    # TEGULA_PINGPONG_SHAPES=i,j,... those shapes (indexes into SHAPES).
    first = int(os.environ.get("TEGULA_PINGPONG_CONFIGS", len(CONFIGS)))
    picked = os.environ.get("TEGULA_PINGPONG_SHAPES")
    shapes = [SHAPES[int(i)] for i in picked.split(",")] if picked else SHAPES
    chosen = [c for c in CASES if c[0] in list(CONFIGS)[:first] and c[1] in shapes]
    print_case_outcomes(chosen, lambda c: run_case(c, module, torch), _case_id)


@pytest.fixture(scope="module")
def outcomes():
    return sm90_child_outcomes(__file__, ROOT, TIME_LIMIT_S)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_pingpong_gemm_on_the_gpu(outcomes, case):
    check_child_case(outcomes, _case_id(case), [_case_id(c) for c in CASES], TIME_LIMIT_S)


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizers_are_clean_on_a_pingpong_launch(tool):
    """The turn barriers (bar.sync / bar.arrive of two warpgroups), the per-warpgroup
    staging and the shared ring under compute-sanitizer (tests/gpu/sanitize.py)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from test_sanitize import _sanitize, assert_clean
    out = _sanitize(tool, "persistent_gemm_pingpong")
    assert "persistent_gemm_pingpong: ok" in out, out[-4000:]
    assert_clean(tool, out)


if __name__ == "__main__" and "--child" in sys.argv:
    child()
