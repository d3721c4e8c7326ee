"""The fuzzer's programs with cumulative sums (`tg.cumsum`, tests/fuzz/test_fuzz_scans.py)
on the GPU (`pytest -m gpu`): each is emulated for the device's target (strict against the
reference), launched with outputs poisoned, and the GPU's results judged against the
reference in its loose model; integer-only programs match the emulator bit for bit."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.fuzz import make_program
from tegula.fuzz.program import Cumsum
from tegula.fuzz.runner import data_seed

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # gpu_helpers
from gpu_helpers import judge_fuzz_program_on_gpu  # noqa: E402

SEED, PROGRAMS = 3, 150


def test_cumsum_fuzz_programs_agree_on_gpu_and_emulator():
    from tegula.runtime import default_target
    target = default_target()
    compared = 0
    for index in range(PROGRAMS):
        program = make_program(SEED, index)
        if any(isinstance(s, Cumsum) for s in program.body):
            compared += judge_fuzz_program_on_gpu(
                program, data_seed(SEED, index), target,
                f"python -m tegula.fuzz --seed {SEED} --program {index}") is not None
    assert compared >= 12, compared
