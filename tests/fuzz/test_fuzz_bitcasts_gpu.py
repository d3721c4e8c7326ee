"""The fuzzer's programs with `tg.bitcast` (tests/fuzz/test_fuzz_bitcasts.py) on the GPU
(`pytest -m gpu`): emulated for the device's target, launched with outputs poisoned and
judged against the reference; integer-only programs match the emulator bit for bit. The
emitter once truncated f32 <-> i32 bitcasts to 16 bits, which only the GPU shows."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.fuzz import make_program
from tegula.fuzz.runner import check_outputs, data_seed, emulate_for, program_inputs
from tegula.fuzz.source import kernel_source

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # gpu_helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import assert_fuzz_program_right_on_gpu  # noqa: E402
from test_fuzz_bitcasts import SEED, bitcast_programs  # noqa: E402


def test_bitcast_fuzz_programs_agree_on_gpu_and_emulator():
    from tegula.runtime import default_target
    target = default_target()
    compared = 0
    for index in bitcast_programs()[:12]:  # about 1 s of compile each
        program = make_program(SEED, index)
        inputs = program_inputs(program, data_seed(SEED, index))
        emulated, verdict, _ = emulate_for(program, inputs, target)
        where = f"python -m tegula.fuzz --seed {SEED} --program {index} ({target})\n" + \
            kernel_source(program)
        if verdict is not None:
            assert verdict.status == "rejected", where + verdict.detail
            continue
        assert check_outputs(program, inputs, emulated).status == "pass", where
        assert_fuzz_program_right_on_gpu(program, inputs, emulated, where, target)
        compared += 1
    assert compared >= 4, compared
