"""The fuzzer's GEMM-shaped programs on the GPU, built for each Hopper target
(`pytest -m gpu`, on an sm_90 device): `sm_90a` (TMA + wgmma + mbarriers where the program
allows) and `sm_90` (the Ampere path, cp.async + mma.sync, built for the H100). Each build
is emulated for its target, judged against the reference (strict), launched with outputs
poisoned, and the GPU's results judged against the reference in its loose model (FMA
contraction, CUDA's math functions, FP8 wgmma's shorter sums). Integer-only programs must
match the emulator bit for bit. tests/gpu/test_fuzz_gpu.py runs the general programs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.fuzz import make_program
from tegula.fuzz.program import Gemm
from tegula.fuzz.runner import data_seed

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # gpu_helpers
from gpu_helpers import judge_fuzz_program_on_gpu  # noqa: E402

SEED = 909
PROGRAMS = 240  # about a third are GEMM-shaped


def _gemm_shaped(program) -> bool:
    return any(isinstance(s, Gemm) and s.stages > 0 for s in program.body)


@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
def test_gemm_shaped_fuzz_programs_agree_on_gpu_and_emulator(target):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("sm_90a and sm_90 builds need a Hopper GPU")
    compared, paths = 0, set()
    for index in range(PROGRAMS):
        program = make_program(SEED, index)
        if not _gemm_shaped(program):
            continue
        used = judge_fuzz_program_on_gpu(program, data_seed(SEED, index), target,
                                         f"python -m tegula.fuzz --seed {SEED} --program {index}")
        if used is not None:
            compared += 1
            paths |= used
    assert compared >= 10, compared
    if target == "sm_90a":
        assert {"wgmma", "TMA"} <= paths, paths
    else:
        assert "mma.sync" in paths and "wgmma" not in paths, paths
