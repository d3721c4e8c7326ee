"""Transposed gemm operands from the fuzzer on the GPU (`pytest -m gpu`, a Hopper device):
the hand-written forms of test_fuzz_transposed.py (MN-major shared operands on wgmma with
TMA, global `.T` views, K over several swizzle spans, ragged shapes) and the generated
programs of one seed that store an operand transposed, built for `sm_90a` and `sm_90`
(the Ampere path: ldmatrix.trans), and the generated programs in clusters of two blocks
on sm_90a, launched into poisoned outputs and judged against the
reference (loose: the GPU's FMA and math) and, for the emulator's strict model, first in
the emulator."""
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))  # gpu_helpers
sys.path.insert(0, str(HERE))
from gpu_helpers import judge_fuzz_program_on_gpu  # noqa: E402
from test_fuzz_transposed import CASES, transposed_gemm  # noqa: E402

SEED = 909


def check_on_gpu(program, data: int, target: str):
    """'rejected', or the paths the emulated build took once the GPU's outputs passed;
    an AssertionError naming the program otherwise."""
    paths = judge_fuzz_program_on_gpu(program, data, target)
    return "rejected" if paths is None else paths


def transposed_programs(count: int):
    """(index, program) of the generated programs of SEED with a transposed gemm operand."""
    for index in range(count):
        program = make_program(SEED, index)
        if any(isinstance(s, Gemm) and (s.ta or s.tb) for s in program.body):
            yield index, program


def clustered_programs(count: int):
    """(index, program) of the generated programs of SEED in clusters of two blocks."""
    for index in range(count):
        program = make_program(SEED, index)
        if program.cluster > 1:
            yield index, program


@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_transposed_forms_on_the_gpu(case, dtype, target):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("sm_90a and sm_90 builds need a Hopper GPU")
    ta, tb, stages, bk, extent, m, n = case
    paths = check_on_gpu(transposed_gemm(ta, tb, dtype, stages, bk, extent, m, n),
                         data_seed(7, stages + bk), target)
    assert paths != "rejected"
    if target == "sm_90":
        assert "wgmma" not in paths


@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
def test_generated_transposed_programs_on_the_gpu(target):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("sm_90a and sm_90 builds need a Hopper GPU")
    ran = [index for index, program in transposed_programs(150)
           if check_on_gpu(program, data_seed(SEED, index), target) != "rejected"]
    assert len(ran) >= 10, ran


def test_generated_clustered_programs_on_the_gpu():
    """Clusters of two blocks (multicast boxes, remote releases) launched on sm_90a."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("clusters need a Hopper GPU")
    paths = [check_on_gpu(program, data_seed(SEED, index), "sm_90a")
             for index, program in clustered_programs(300)]
    ran = [p for p in paths if p != "rejected"]
    assert len(ran) >= 5 and any("TMA" in p for p in ran), paths
