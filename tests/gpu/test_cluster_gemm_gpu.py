"""On an H100: the persistent GEMM (examples/persistent_gemm.py) with 2-CTA clusters
(CLUSTER=2: the two blocks of a cluster take row tiles 2*mc and 2*mc+1 of one column tile,
b's boxes multicast to both, each stage released by both blocks' consumers through remote
mbarrier arrives) against a float64 reference: ragged shapes, an odd number of row tiles
(one block's last tile lies past M), more tile pairs than clusters and fewer, one
cluster doing every pair, one-iteration and empty-remainder K loops, every stage count that
fits; outputs poisoned (NaN) first, every element checked. Then compute-sanitizer
racecheck and synccheck on one clustered launch.

A mistake in the cluster's protocol hangs the GPU rather than failing, so every launch runs
in one child process (this file with `--child`) under a time limit: a hang fails the test
that was running instead of stalling the session. The child prints one line per case."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import (check_child_case, check_f16_gemm, print_case_outcomes,  # noqa: E402
                         sm90_child_outcomes)

#: The benchmark's 128x256x64 tiles (two consumer warpgroups, b's 256 rows multicast as
#: two 128-row slices) at 4 and 3 stages, 128x128x64, and small tiles (many per block).
CONFIGS = {
    "128x256x64-s4": dict(BM=128, BN=256, BK=64, STAGES=4, threads=256),
    "128x256x64-s3": dict(BM=128, BN=256, BK=64, STAGES=3, threads=256),
    "128x128x64-s2": dict(BM=128, BN=128, BK=64, STAGES=2, threads=256),
    "64x64x32-s5": dict(BM=64, BN=64, BK=32, STAGES=5),
}
#: (M, N, K, SMs the grid is sized for): None = the GPU's.
SHAPES = [(1000, 1500, 264, None),      # ragged everywhere
          (3000, 2000, 512, None),      # more tile pairs than clusters for every config
          (1100, 700, 200, None),       # 9 row tiles of 128: the last pair's second is past M
          (257, 129, 72, 2),            # one cluster walks every pair
          (700, 900, 136, 6),           # 3 clusters: uneven pairs per cluster
          (33, 17, 96, None),           # one tile: its pair's second block has nothing
          (200, 300, 64, 4),            # one K iteration (BK=64)
          (130, 70, 8, 4)]              # one partial K iteration
CASES = [(c, s) for c in CONFIGS for s in SHAPES]
TIME_LIMIT_S = 420


def _case_id(case) -> str:
    config, (m, n, k, sms) = case
    return f"{config}-{m}x{n}x{k}-sms{sms or 'all'}"


def _example():
    spec = importlib.util.spec_from_file_location("persistent_gemm_cluster_gpu",
                                                  ROOT / "examples" / "persistent_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(case, module, torch) -> str:
    """'ok' or what went wrong, for one case (in the child process)."""
    config_name, (m, n, k, sms) = case
    config = CONFIGS[config_name]
    sms = sms or torch.cuda.get_device_properties(0).multi_processor_count
    grid = module.persistent_grid(m, n, sms, config["BM"], config["BN"], 2)
    return check_f16_gemm(torch, m, n, k, lambda a, b, c: module.persistent_gemm[grid](
        a, b, c, target="sm_90a", CLUSTER=2, **config))


def child() -> None:
    import torch

    from tegula.build import build
    module = _example()
    # Each build must multicast b (and not a) across a 2x1 cluster.
    for name, config in CONFIGS.items():
        built = build(module.persistent_gemm, dict(config, CLUSTER=2), None, "sm_90a")
        assert built.thread_kernel.cluster == (2, 1, 1), name
        assert ".multicast::cluster" in built.cuda_source(), name
    print_case_outcomes(CASES, lambda c: run_case(c, module, torch), _case_id)


@pytest.fixture(scope="module")
def outcomes():
    return sm90_child_outcomes(__file__, ROOT, TIME_LIMIT_S)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_cluster_gemm_on_the_gpu(outcomes, case):
    check_child_case(outcomes, _case_id(case), [_case_id(c) for c in CASES], TIME_LIMIT_S)


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["racecheck", "synccheck", "memcheck"])
def test_sanitizers_are_clean_on_a_clustered_launch(tool):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from test_sanitize import _sanitize, assert_clean
    out = _sanitize(tool, "persistent_gemm_cluster")
    assert "persistent_gemm_cluster: ok" in out, out[-4000:]
    assert_clean(tool, out)


if __name__ == "__main__" and "--child" in sys.argv:
    child()
