"""On an H100: GEMMs whose warp roles are written in the source (`with tg.producer(regs=)`
/ `with tg.consumer(regs=)`, tegula/lang/roles.py) against a float64 reference —
examples/warp_roles_gemm.py (persistent; ping-pong consumers at 128 threads, cooperative
at 256) and the README GEMM with role blocks and budgets other than synthesis's own
(producer 24, consumer 240: `setmaxnreg` values no synthesized kernel uses). Shapes that
divide no tile, more tiles than blocks, one block walking every tile, a single tile, a
partial K iteration; outputs poisoned (NaN) first, every element checked.

A wrong ring phase hangs the GPU, so every launch runs in one child process (this file
with `--child`) under a time limit, printing one line per case. Then compute-sanitizer's
racecheck and synccheck on one small stated-roles launch (`--sanitize`)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tegula as tg
from tegula import f16, f32

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # gpu_helpers, beside us
from gpu_helpers import (check_child_case, check_f16_gemm, print_case_outcomes,  # noqa: E402
                         sm90_child_outcomes)


@tg.kernel(threads=128)
def stated_readme_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                       BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
                       STAGES: tg.constexpr = 3, P: tg.constexpr = None,
                       C: tg.constexpr = None):
    """The README GEMM with its pipeline body in role blocks (one tile per block)."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        with tg.producer(regs=P):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
        with tg.consumer(regs=C):
            tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


#: name -> (which kernel: the persistent "example" or the "readme" one, launch options)
CONFIGS = {
    "persistent-pingpong-128x128x64-s4": ("example", dict(BM=128, BN=128, BK=64, STAGES=4)),
    "persistent-pingpong-64x64x32-s3": ("example", dict(BM=64, BN=64, BK=32, STAGES=3,
                                                        GROUP=3)),
    "persistent-cooperative-128x256x64-s4": ("example", dict(BM=128, BN=256, BK=64,
                                                             STAGES=4, threads=256)),
    # The schedule stated at the tg.consumer block (one warpgroup's tile: synthesis would
    # take ping-pong; the block asks for one cooperative consumer warpgroup).
    "persistent-stated-cooperative-64x64x32-s3": ("example", dict(
        BM=64, BN=64, BK=32, STAGES=3, GROUP=3, SCHEDULE="cooperative")),
    "readme-p24-c240-128x256x64-s4": ("readme", dict(BM=128, BN=256, BK=64, STAGES=4,
                                                     threads=256, P=24, C=240)),
    "readme-c200-64x128x32-s2": ("readme", dict(BM=64, BN=128, BK=32, STAGES=2, C=200)),
}
#: (M, N, K, blocks): blocks None = one per SM (persistent kernels only).
SHAPES = [(1000, 1500, 264, None),      # ragged; more tiles than SMs for the small tiles
          (257, 129, 72, 1),            # one block walks every tile
          (33, 17, 96, None),           # one tile: the second consumer warpgroup has none
          (130, 70, 8, 2)]              # one partial K iteration
CASES = [(c, s) for c in CONFIGS for s in SHAPES]
TIME_LIMIT_S = 240


def _case_id(case) -> str:
    config, (m, n, k, blocks) = case
    return f"{config}-{m}x{n}x{k}-b{blocks or 'sms'}"


def _example():
    spec = importlib.util.spec_from_file_location("warp_roles_gemm_example",
                                                  ROOT / "examples" / "warp_roles_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(case, module, torch) -> str:
    """'ok' or what went wrong, for one case (in the child process)."""
    config_name, (m, n, k, blocks) = case
    which, config = CONFIGS[config_name]
    bm, bn = config["BM"], config["BN"]
    if which == "readme":
        grid = (tg.cdiv(m, bm), tg.cdiv(n, bn))
        return check_f16_gemm(torch, m, n, k, lambda a, b, c: stated_readme_gemm[grid](
            a, b, c, target="sm_90a", **config))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = module.persistent_grid(m, n, blocks or sms, bm, bn)
    return check_f16_gemm(torch, m, n, k, lambda a, b, c: module.warp_roles_gemm[grid](
        a, b, c, target="sm_90a", **config))


def child() -> None:
    import torch

    module = _example()
    # A short GPU round: TEGULA_STATED_CONFIGS=name,name,... runs only those.
    picked = os.environ.get("TEGULA_STATED_CONFIGS")
    names = picked.split(",") if picked else list(CONFIGS)
    chosen = [c for c in CASES if c[0] in names]
    print_case_outcomes(chosen, lambda c: run_case(c, module, torch), _case_id)


def sanitize_child() -> None:
    """One small launch of the persistent ping-pong kernel (two consumer warpgroups, the
    producer, stated budgets) for compute-sanitizer."""
    import torch

    module = _example()
    m, n, k = 200, 150, 200                     # 12 tiles on 3 blocks, 7 k-tiles
    # TEGULA_STATED_SANITIZE=<config name> sanitizes another persistent config instead.
    name = os.environ.get("TEGULA_STATED_SANITIZE", "persistent-pingpong-64x64x32-s3")
    _, config = CONFIGS[name]
    grid = module.persistent_grid(m, n, 3, config["BM"], config["BN"])
    outcome = check_f16_gemm(torch, m, n, k, lambda a, b, c: module.warp_roles_gemm[grid](
        a, b, c, target="sm_90a", **config))
    print(f"stated roles: {outcome}", flush=True)


@pytest.fixture(scope="module")
def outcomes():
    return sm90_child_outcomes(__file__, ROOT, TIME_LIMIT_S)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_stated_roles_gemm_on_the_gpu(outcomes, case):
    check_child_case(outcomes, _case_id(case), [_case_id(c) for c in CASES], TIME_LIMIT_S)


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["racecheck", "synccheck"])
def test_sanitizers_are_clean_on_a_stated_roles_launch(tool):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from test_sanitize import TOOL_OPTIONS, _sanitizer, assert_clean
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([_sanitizer(), *TOOL_OPTIONS[tool], sys.executable, __file__,
                           "--sanitize"], capture_output=True, text=True, env=env,
                          timeout=280, check=False)
    out = proc.stdout + proc.stderr
    if "Device not supported" in out:
        pytest.skip("compute-sanitizer does not support this device/runtime")
    assert "stated roles: ok" in out, out[-4000:]
    assert_clean(tool, out)


if __name__ == "__main__" and "--child" in sys.argv:
    child()
if __name__ == "__main__" and "--sanitize" in sys.argv:
    sanitize_child()
