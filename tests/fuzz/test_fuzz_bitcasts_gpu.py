"""The fuzzer's programs with `tg.bitcast` (tests/fuzz/test_fuzz_bitcasts.py) on the GPU
(`pytest -m gpu`): emulated for the device's target, launched with outputs poisoned and
judged against the reference; integer-only programs match the emulator bit for bit. The
emitter once truncated f32 <-> i32 bitcasts to 16 bits, which only the GPU shows."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.fuzz import make_program
from tegula.fuzz.runner import data_seed

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # gpu_helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import judge_fuzz_program_on_gpu  # noqa: E402
from test_fuzz_bitcasts import SEED, bitcast_programs  # noqa: E402


def test_bitcast_fuzz_programs_agree_on_gpu_and_emulator():
    from tegula.runtime import default_target
    target = default_target()
    compared = sum(judge_fuzz_program_on_gpu(
        make_program(SEED, index), data_seed(SEED, index), target,
        f"python -m tegula.fuzz --seed {SEED} --program {index}") is not None
        for index in bitcast_programs()[:12])  # about 1 s of compile each
    assert compared >= 4, compared
