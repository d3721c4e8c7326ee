"""The fuzzer's programs on the GPU against the emulator (`pytest -m gpu`).

The same generator as tests/fuzz: each program the emulator runs correctly is compiled
and launched on CUDA tensors (outputs poisoned first). Programs computing only on
integers must agree with the emulator bit for bit; float programs must agree with the
emulator within the reference's bounds — the GPU judged against the reference in its
"loose" model (f32 multiply-adds may be contracted into FMAs, `expf` is not numpy's
`exp`), the emulator against the strict one.

Warp-specialized programs (`make_specialized_program`, a third of them persistent tile
loops on ping-pong consumers) and the ordinary generator's role-block programs run in
warp roles on sm_90a; split-K GEMMs merged by their last block (`split_merge`,
`tg.last_arrival`) are relaunched on the same counters; chains of two gemms in a pipeline
(`gemm_chains`) run with their two consumer warpgroups taking turns inside the loop.

A GPU round may run more seeds: `TEGULA_FUZZ_GPU_SEEDS=1621,1622` adds the ordinary and
the warp-specialized samples of each (`-k extra`), and their split merges and gemm chains;
unset, there are none.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import numpy as np

from tegula.dtypes import dtype_from_name
from tegula.fuzz import make_program
from tegula.fuzz import gemm_chains as gc
from tegula.fuzz import split_merge as sm
from tegula.fuzz.generate import Switches
from tegula.fuzz.program import Gemm
from tegula.fuzz.runner import check_outputs, data_seed, program_inputs, run_emulator
from tegula.fuzz.source import kernel_source
from tegula.fuzz.specialized import make_specialized_program

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import (assert_fuzz_program_right_on_gpu, judge_fuzz_program_on_gpu,  # noqa: E402
                         poison, to_device, values_of)

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


def _run_in_roles_on_gpu(programs, least: int) -> None:
    """Each (program, data seed, reproducing command) judged on the GPU for sm_90a, its
    roles emulated in an interleaving drawn per program; a program sm_90a runs must run in
    warp roles, and at least `least` must reach the GPU."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("warp roles need sm_90a")
    compared = 0
    for program, data, where in programs:
        used = judge_fuzz_program_on_gpu(program, data, "sm_90a", where,
                                         role_order=f"random:{data}")
        if used is not None:
            assert "warp roles" in used, where
            compared += 1
    assert compared >= least, compared


def _specialized_programs_agree(seed: int, chunk: int, least: int) -> None:
    """Chunk `chunk` of seed's warp-specialized sample; at least `least` reach the GPU."""
    _run_in_roles_on_gpu(((make_specialized_program(seed, i, SWITCHES), data_seed(seed, i),
                           f"python -m tegula.fuzz --seed {seed} --specialized {i}")
                          for i in range(chunk, SPECIALIZED, 4)), least)


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


ROLE_BLOCK_SEED, ROLE_BLOCK_PROGRAMS = 2, 400  # tests/fuzz/test_fuzz_roles.py: 6+ in roles


def test_role_block_fuzz_programs_agree_on_gpu_and_emulator():
    """The ordinary generator's pipelines written as `tg.producer` / `tg.consumer` blocks."""
    programs = (make_program(ROLE_BLOCK_SEED, i) for i in range(ROLE_BLOCK_PROGRAMS))
    _run_in_roles_on_gpu(((p, data_seed(ROLE_BLOCK_SEED, i),
                           f"python -m tegula.fuzz --seed {ROLE_BLOCK_SEED} --program {i}")
                          for i, p in enumerate(programs)
                          if any(isinstance(s, Gemm) and s.roles for s in p.body)), 4)


SPLIT_MERGES = 24


def _split_merge_on_gpu(p: sm.SplitMerge, x: dict) -> np.ndarray:
    """c after `p.launches` launches on one set of counters (partials and c poisoned), each
    leaving the counters zero and writing the c of the first."""
    names = (p.dtype, p.dtype, "f32", p.out, "i32")
    a, b, part, c, counters = (to_device(v, dtype_from_name(t))
                               for v, t in zip(sm._arrays(p, x), names))
    poison(part)
    poison(c)
    first = None
    for launch in range(p.launches):
        sm.kernel(p)[p.grid()](a, b, part, c, counters, **sm.constexprs(p))
        torch.cuda.synchronize()
        got = values_of(c, dtype_from_name(p.out)).astype(np.float64)
        assert not counters.any().item(), f"launch {launch} left counters {counters.tolist()}"
        assert first is None or np.array_equal(got, first, equal_nan=True), launch
        first = got
    return first


SPLIT_CHUNKS = 4  # the sample in chunks, so a round's workers share it


@pytest.mark.parametrize("seed,chunk", [(SEED, c) for c in range(SPLIT_CHUNKS)] +
                         [(s, c) for s in EXTRA_SEEDS for c in range(SPLIT_CHUNKS)])
def test_split_merges_agree_on_gpu_and_numpy(seed, chunk):
    """`tg.last_arrival` split-K GEMMs: emulated first (no race, counters zero), then on the
    GPU every element of c within the model's bound after every launch."""
    compared = 0
    for index in range(chunk, SPLIT_MERGES, SPLIT_CHUNKS):
        p = sm.make_split_merge(seed, index)
        where = f"python -m tegula.fuzz --seed {seed} --split-merge {index}: {p.describe()}"
        status, reason, detail = sm.check_split_merge(p, index, targets=("sm_90a",))
        assert status in ("pass", "rejected"), f"{where}\n{reason}\n{detail}"
        if status == "rejected":
            continue
        x = sm.inputs(p, index)
        want, bound = sm.expected(p, x)
        wrong = sm.judge(p, _split_merge_on_gpu(p, x), want, bound)
        assert not wrong, f"{where}\n{wrong}"
        compared += 1
    assert compared >= SPLIT_MERGES // SPLIT_CHUNKS // 2, compared


GEMM_CHAINS = 8   # of each kind


def _gemm_chains(seed: int, turns: bool):
    """The first GEMM_CHAINS chains of `seed` in ping-pong's frame (turns) / outside it."""
    frame = lambda p: p.consumers == "pingpong" and p.bm == 128 and not p.persistent  # noqa: E731
    found = ((i, p) for i in range(400) if frame(p := gc.make_gemm_chain(seed, i)) == turns)
    return [next(found) for _ in range(GEMM_CHAINS)]


@pytest.mark.parametrize("seed,turns,half", [(SEED, t, h) for t in (True, False) for h in (0, 1)]
                         + [(s, t, h) for s in EXTRA_SEEDS for t in (True, False) for h in (0, 1)])
def test_gemm_chains_agree_on_gpu_and_numpy(seed, turns, half):
    """Two gemms a pipeline iteration (q @ k_j.T, f, p @ v_j), most on ping-pong consumers
    taking turns inside the loop: emulated first, then o (and the row sum) poisoned on the
    GPU, every element within the model's bound."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("warp roles need sm_90a")
    compared = 0
    for index, p in _gemm_chains(seed, turns)[half::2]:
        where = f"python -m tegula.fuzz --seed {seed} --gemm-chain {index}: {p.describe()}"
        status, reason, detail = gc.check_gemm_chain(p, index, targets=("sm_90a",))
        assert status in ("pass", "rejected"), f"{where}\n{reason}\n{detail}"
        if status == "rejected":
            continue
        x = gc.inputs(p, index)
        dt, out = gc._types(p)
        q, k, v, o, rowsum = (to_device(a, dtype_from_name(t)) for a, t in
                              zip(gc._arrays(p, x), (dt, dt, dt, out, "f32")))
        poison(o)
        poison(rowsum)
        extra = dict(consumers=p.consumers) if p.consumers else {}
        gc.kernel(p)[p.grid()](q, k, v, o, rowsum, **gc.options(p), **extra)
        torch.cuda.synchronize()
        got = (values_of(o, dtype_from_name(out)).astype(np.float64),
               values_of(rowsum, dtype_from_name("f32")).astype(np.float64))
        wrong = gc.judge(p, got, gc.expected(p, x))
        assert not wrong, f"{where}\n{wrong}"
        compared += 1
    assert compared >= GEMM_CHAINS // 4, compared
