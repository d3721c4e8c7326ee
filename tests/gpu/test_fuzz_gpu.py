"""The fuzzer's programs on the GPU against the emulator (`pytest -m gpu`).

The same generator as tests/fuzz: each program the emulator runs correctly is compiled
and launched on CUDA tensors (outputs poisoned first). Programs computing only on
integers must agree with the emulator bit for bit; float programs must agree with the
emulator within the reference's bounds — the GPU judged against the reference in its
"loose" model (f32 multiply-adds may be contracted into FMAs, `expf` is not numpy's
`exp`), the emulator against the strict one.

A GPU round may run more seeds: `TEGULA_FUZZ_GPU_SEEDS=1621,1622` adds the ordinary and
the warp-specialized samples of each (`-k extra`); unset, there are none.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tegula.fuzz import make_program
from tegula.fuzz.generate import Switches
from tegula.fuzz.runner import check_outputs, data_seed, program_inputs, run_emulator
from tegula.fuzz.source import kernel_source
from tegula.fuzz.specialized import make_specialized_program

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import assert_fuzz_program_right_on_gpu, judge_fuzz_program_on_gpu  # noqa: E402

SEED = 4242
PROGRAMS = 150
SWITCHES = Switches()  # everything, as tests/fuzz's CI run
SPECIALIZED = 48  # warp-specialized programs (about half run in roles)
#: Seeds a GPU round adds (module docstring).
EXTRA_SEEDS = [int(x) for x in os.environ.get("TEGULA_FUZZ_GPU_SEEDS", "").split(",") if x]


def _ordinary_programs_agree(seed: int, chunk: int) -> None:
    compared = 0
    for index in range(chunk, PROGRAMS, 5):
        program = make_program(seed, index, SWITCHES)
        inputs = program_inputs(program, data_seed(seed, index))
        emulated, verdict = run_emulator(program, inputs)
        if verdict is not None:
            assert verdict.status == "rejected", f"program {index}: {verdict.detail}"
            continue
        assert check_outputs(program, inputs, emulated).status == "pass", index
        where = f"python -m tegula.fuzz --seed {seed} --program {index}\n" + \
            kernel_source(program)
        assert_fuzz_program_right_on_gpu(program, inputs, emulated, where)
        compared += 1
    assert compared >= 5  # the sample must reach the GPU, not only collect refusals


@pytest.mark.parametrize("chunk", range(5))
def test_fuzz_programs_agree_on_gpu_and_emulator(chunk):
    _ordinary_programs_agree(SEED, chunk)


@pytest.mark.parametrize("seed,chunk", [(s, c) for s in EXTRA_SEEDS for c in range(5)])
def test_extra_fuzz_programs_agree_on_gpu_and_emulator(seed, chunk):
    _ordinary_programs_agree(seed, chunk)


def _specialized_programs_agree(seed: int, chunk: int, least: int) -> None:
    """Chunk `chunk` of seed's warp-specialized sample; at least `least` reach the GPU."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("warp roles need sm_90a")
    compared = 0
    for index in range(chunk, SPECIALIZED, 4):
        program = make_specialized_program(seed, index, SWITCHES)
        where = f"python -m tegula.fuzz --seed {seed} --specialized {index}"
        used = judge_fuzz_program_on_gpu(program, data_seed(seed, index), "sm_90a", where,
                                         role_order=f"random:{index}")
        if used is not None:
            assert "warp roles" in used, where
            compared += 1
    assert compared >= least, compared


@pytest.mark.parametrize("chunk", range(4))
def test_warp_specialized_fuzz_programs_agree_on_gpu_and_emulator(chunk):
    """`make_specialized_program`: built with warp_specialize=True (some with a consumer
    schedule, some in clusters of two, some with TMA-store epilogues), emulated with the
    roles in an interleaving drawn per program, then launched with the same build options
    into poisoned outputs."""
    _specialized_programs_agree(SEED, chunk, 4)


@pytest.mark.parametrize("seed,chunk", [(s, c) for s in EXTRA_SEEDS for c in range(4)])
def test_extra_warp_specialized_fuzz_programs_agree_on_gpu_and_emulator(seed, chunk):
    _specialized_programs_agree(seed, chunk, 1)  # another seed: 2-7 of 12 run in roles
