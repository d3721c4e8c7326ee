"""GPU checks of the evaluator (run with `pytest -m gpu` on a machine with a GPU): an
honest candidate is timed at the real size against the reference, both the same way,
and its time is above the roofline bound."""
from __future__ import annotations

import os

import pytest

from tegula.agent.evaluator import EvalOptions, evaluate
from tegula.agent.taskset import builtin_task

CANDIDATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "candidates")


@pytest.mark.gpu
@pytest.mark.parametrize("task, name", [("relu", "relu_ok.py"), ("softmax", "softmax_ok.py"),
                                        ("matmul_nt", "matmul_nt_ok.py")])
def test_honest_candidate_is_timed_on_the_gpu(task, name):
    verdict = evaluate(builtin_task(task), os.path.join(CANDIDATES, name),
                       EvalOptions(gpu=True, size="real"))
    assert verdict.ok, verdict.summary()
    timing = verdict.timing
    assert timing["candidate_us"] >= timing["roofline_us"] > 0
    assert timing["reference_us"] > 0 and len(timing["candidate_times_us"]) == 10
