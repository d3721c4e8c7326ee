"""The fuzzer's warp-role programs (`with tg.producer` / `tg.consumer` blocks) on the GPU
(`pytest -m gpu`, sm_90a): each is emulated (strict against the reference), launched with
outputs poisoned, and the GPU's results judged against the reference in its loose model."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.fuzz import make_program
from tegula.fuzz.program import Gemm
from tegula.fuzz.runner import check_outputs, data_seed, emulate_for, program_inputs
from tegula.fuzz.source import kernel_source

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # gpu_helpers
from gpu_helpers import assert_fuzz_program_right_on_gpu  # noqa: E402

SEED, PROGRAMS = 2, 400  # tests/fuzz/test_fuzz_roles.py: 6+ of them run warp roles


def test_role_block_fuzz_programs_agree_on_gpu_and_emulator():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("role blocks need sm_90a")
    compared = 0
    for index in range(PROGRAMS):
        program = make_program(SEED, index)
        if not any(isinstance(s, Gemm) and s.roles for s in program.body):
            continue
        inputs = program_inputs(program, data_seed(SEED, index))
        emulated, verdict, used = emulate_for(program, inputs, "sm_90a",
                                              role_order=f"random:{index}")
        where = f"python -m tegula.fuzz --seed {SEED} --program {index}\n" + \
            kernel_source(program)
        if verdict is not None:
            assert verdict.status == "rejected", where + verdict.detail
            continue
        assert "warp roles" in used, where
        assert check_outputs(program, inputs, emulated).status == "pass", where
        assert_fuzz_program_right_on_gpu(program, inputs, emulated, where, "sm_90a")
        compared += 1
    assert compared >= 4, compared
