"""Honest candidates, written in tegula and run in the emulator, pass the evaluator; the
evaluator's protocol details (random seeds, alternated order, explain summary) hold."""
from __future__ import annotations

import os

import pytest
import torch

from tegula.agent.evaluator import EvalOptions, evaluate
from tegula.agent.taskset import builtin_task

CANDIDATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "candidates")

HONEST = {"relu": "relu_ok.py", "softmax": "softmax_ok.py", "rms_norm": "rms_norm_ok.py",
          "matmul_nt": "matmul_nt_ok.py", "linear_bias_relu": "linear_bias_relu_ok.py",
          "silu_mul": "silu_mul_ok.py"}


@pytest.mark.parametrize("task", sorted(HONEST))
def test_reference_solution_passes_in_the_emulator(task, fork_server):
    verdict = evaluate(builtin_task(task), os.path.join(CANDIDATES, HONEST[task]),
                       EvalOptions(gpu=False))
    assert verdict.ok, verdict.summary()
    assert verdict.stage == "passed" and 0 <= verdict.max_error <= 1
    assert [t["distribution"] for t in verdict.trials] == ["normal", "shifted", "wide"]
    assert [t["reference_first"] for t in verdict.trials] == [True, False, True]
    assert "no GPU" in verdict.notes[0]


def test_explain_summary_and_random_seeds(fork_server):
    path = os.path.join(CANDIDATES, "relu_ok.py")
    first = evaluate(builtin_task("relu"), path, EvalOptions(gpu=False, trials=1, explain=True))
    assert first.ok and "relu_kernel" in first.profile
    assert first.predicted_seconds and first.predicted_seconds > 0


def test_seed_is_random_unless_given():
    from tegula.agent.evaluator import _Session

    seeds = {_Session(builtin_task("relu"), "", EvalOptions(gpu=False)).base_seed
             for _ in range(4)}
    assert len(seeds) > 1
    assert _Session(builtin_task("relu"), "", EvalOptions(gpu=False, seed=7)).base_seed == 7


def test_fixed_seed_cheat_would_fool_a_fixed_seed_evaluator():
    """The red-team `fixed_seed` cheat replays relu of seed 0's inputs: it is a real cheat
    (it matches the first trial of an evaluator that always uses seed 0)."""
    torch.manual_seed(0)
    stored = torch.relu(torch.randn(37, 45))
    x = builtin_task("relu").make_inputs("small", 0, "normal")[0]
    assert torch.equal(stored, torch.relu(x))


def test_degenerate_reference_is_refused(tmp_path, fork_server):
    from tegula.agent.tasks import task_from_source

    task = task_from_source("zero_task", """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return x * 0.0
def get_inputs():
    return [torch.randn(8, 8)]
def get_init_inputs():
    return []
""")
    verdict = evaluate(task, os.path.join(CANDIDATES, "relu_ok.py"), EvalOptions(gpu=False))
    assert not verdict.ok and verdict.stage == "task"
    assert "degenerate reference" in verdict.reason and "all zero" in verdict.reason


def test_failing_reference_is_a_task_error(fork_server):
    from tegula.agent.tasks import task_from_source

    task = task_from_source("broken_task", """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return x @ torch.ones(3, 3)
def get_inputs():
    return [torch.randn(8, 8)]
def get_init_inputs():
    return []
""")
    verdict = evaluate(task, os.path.join(CANDIDATES, "relu_ok.py"), EvalOptions(gpu=False))
    assert not verdict.ok and verdict.stage == "task"
    assert "the task's reference forward failed: RuntimeError" in verdict.reason


def test_the_prompt_example_is_the_honest_relu_candidate():
    # The model is shown this example as a correct answer; it is the relu candidate the
    # evaluator passes above (after its docstring), so the example cannot drift into one
    # that fails.
    from tegula.agent.prompts import EXAMPLE

    with open(os.path.join(CANDIDATES, "relu_ok.py")) as f:
        source = f.read()
    assert source.split("\n", 1)[1] == EXAMPLE
