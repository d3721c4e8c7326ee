"""The fuzzer's warp-role programs (`with tg.producer` / `tg.consumer` blocks) on the GPU
(`pytest -m gpu`, sm_90a): each is emulated (strict against the reference), launched with
outputs poisoned, and the GPU's results judged against the reference in its loose model."""
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

SEED, PROGRAMS = 2, 400  # tests/fuzz/test_fuzz_roles.py: 6+ of them run warp roles


def test_role_block_fuzz_programs_agree_on_gpu_and_emulator():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("role blocks need sm_90a")
    compared = 0
    for index in range(PROGRAMS):
        program = make_program(SEED, index)
        if not any(isinstance(s, Gemm) and s.roles for s in program.body):
            continue
        where = f"python -m tegula.fuzz --seed {SEED} --program {index}"
        used = judge_fuzz_program_on_gpu(program, data_seed(SEED, index), "sm_90a", where,
                                         role_order=f"random:{index}")
        if used is not None:
            assert "warp roles" in used, where
            compared += 1
    assert compared >= 4, compared
