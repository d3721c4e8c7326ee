"""The fuzzer's scratch-tile programs on the GPU (`pytest -m gpu`): programs that carry a
shared tile across loop iterations (`Stash` / `Unstash`) or run a K loop through a scratch
tile (`Gemm.scratch`, the warp-specialized consumer body that writes then reads one tile),
launched with outputs poisoned and judged against the reference in its loose model (as
tests/gpu/test_fuzz_gpu.py judges the general programs). The emulator's verdict on the same
programs is the CPU suite's (tests/fuzz). Run as a script for a time-boxed sample:
`python tests/fuzz/test_fuzz_scratch_gpu.py SECONDS`."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tegula.errors import TegulaError
from tegula.fuzz import make_program
from tegula.fuzz.program import Gemm, Loop, Stash, Unstash
from tegula.fuzz.runner import check_outputs, data_seed, program_inputs
from tegula.fuzz.source import kernel_source

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # gpu_helpers
from gpu_helpers import launch_fuzz_program  # noqa: E402

SEED = 8500


def uses_scratch(body) -> bool:
    return any(isinstance(s, (Stash, Unstash)) or (isinstance(s, Gemm) and s.scratch)
               or (isinstance(s, Loop) and uses_scratch(s.body)) for s in body)


def run_sample(seconds: float, seed: int = SEED) -> tuple[int, int, list]:
    """Scratch programs of `seed` for about `seconds`: (compared, refused, failures)."""
    compared, refused, failures = 0, 0, []
    start, index = time.time(), 0
    while time.time() - start < seconds:
        program = make_program(seed, index)
        index += 1
        if not uses_scratch(program.body):
            continue
        inputs = program_inputs(program, data_seed(seed, index - 1))
        try:
            gpu = launch_fuzz_program(program, inputs)
        except TegulaError:
            refused += 1  # refused for this target: the CPU suite checks it is clean
            continue
        verdict = check_outputs(program, inputs, gpu, loose=True)
        compared += 1
        if verdict.status != "pass":
            failures.append(f"python -m tegula.fuzz --seed {seed} --program {index - 1}\n"
                            + kernel_source(program) + verdict.detail)
    return compared, refused, failures


def test_scratch_programs_are_right_on_the_gpu():
    compared, _, failures = run_sample(60.0)
    assert not failures, failures[0]
    assert compared >= 5


if __name__ == "__main__":
    done, refusals, wrong = run_sample(float(sys.argv[1]) if len(sys.argv) > 1 else 30.0)
    for text in wrong:
        print(text)
    print(f"scratch programs: {done} compared on the GPU, {refusals} refused, "
          f"{len(wrong)} wrong")
