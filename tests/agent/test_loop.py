"""The whole loop offline, on hand-written replays (no model, no network), in the emulator:
a kernel that is right the first time, one that needs a diagnose + repair round, one that
needs a repair and is then optimized; the run directory holds everything, and a recorded
run replays."""
from __future__ import annotations

import json
import os

import pytest

from tegula.agent.backends import BackendError, ReplayBackend
from tegula.agent.evaluator import EvalOptions
from tegula.agent.loop import AgentConfig, run_agent
from tegula.agent.taskset import builtin_task

REPLAYS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replays")


def run(task, replay, run_dir, steps=0, lines=None):
    config = AgentConfig(optimize_steps=steps, profile_after=0,
                         eval_options=EvalOptions(gpu=False, explain=True))
    backend = ReplayBackend.from_path(os.path.join(REPLAYS, replay)
                                      if not os.path.isdir(replay) else replay)
    return run_agent(builtin_task(task), backend, str(run_dir), config,
                     progress=(lines.append if lines is not None else lambda line: None))


def verdicts(run_dir):
    steps = sorted(os.listdir(os.path.join(run_dir, "steps")))
    return [(s, json.load(open(os.path.join(run_dir, "steps", s, "verdict.json"))))
            for s in steps if os.path.exists(os.path.join(run_dir, "steps", s, "verdict.json"))]


def test_first_time_right_and_a_recorded_run_replays(tmp_path, fork_server):
    lines = []
    result = run("relu", "relu_first_try.txt", tmp_path / "run", lines=lines)
    assert result.ok and result.model_calls == 1
    assert result.best.verdict.ok and result.best.measure > 0
    assert any("generate: PASS" in line for line in lines)
    run_dir = tmp_path / "run"
    for name in ("transcript.jsonl", "summary.json", "best.py", "task.py",
                 "steps/01-generate/prompt.md", "steps/01-generate/reply.md",
                 "steps/01-generate/kernel.py", "steps/01-generate/verdict.json"):
        assert (run_dir / name).exists(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best_measure_kind"] == "predicted" and "replay of" in summary["backend"]
    # The run directory is itself a recording: replaying it gives the same kernel.
    again = run("relu", str(run_dir), tmp_path / "again")
    assert again.ok and again.best.source == result.best.source


def test_repair_after_a_mismatch(tmp_path, fork_server):
    result = run("softmax", "softmax_repair.txt", tmp_path)
    assert result.ok and result.model_calls == 3
    (generated, first), (repaired, second) = verdicts(tmp_path)
    assert generated == "01-generate" and not first["ok"] and first["stage"] == "check"
    assert first["worst"], "the mismatch report carries the worst elements"
    assert repaired == "03-repair" and second["ok"]
    # The diagnose prompt showed the model the failure with its worst elements, and the
    # repair prompt the numbered kernel.
    diagnose = (tmp_path / "steps" / "02-diagnose" / "prompt.md").read_text()
    assert "exceed the tolerance" in diagnose and "worst elements" in diagnose
    repair = (tmp_path / "steps" / "03-repair" / "prompt.md").read_text()
    assert "13 |     rows = tg.load(x.tile((BM, BN), (m, 0)))" in repair
    assert 'fill=-float("inf")' in (tmp_path / "best.py").read_text()


def test_compile_error_repair_then_optimization(tmp_path, fork_server):
    lines = []
    result = run("rms_norm", "rms_norm_repair_optimize.txt", tmp_path, steps=1, lines=lines)
    assert result.ok and result.model_calls == 4
    history = verdicts(tmp_path)
    assert [s for s, _ in history] == ["01-generate", "03-repair", "04-optimize"]
    assert "has rank 1, but the kernel declares" in history[0][1]["reason"]
    repaired, optimized = history[1][1], history[2][1]
    assert repaired["ok"] and optimized["ok"]
    assert optimized["predicted_seconds"] < repaired["predicted_seconds"]
    assert result.best.measure == optimized["predicted_seconds"]
    assert "BM=4" in result.best.source
    assert any("new best" in line for line in lines)
    # The optimization prompt offered the reduction menu and (profile_after=0) explain.
    prompt = (tmp_path / "steps" / "04-optimize" / "prompt.md").read_text()
    assert "several rows per block" in prompt and "== predicted time" in prompt


def test_replay_that_diverges_fails_loudly(tmp_path):
    backend = ReplayBackend([("diagnose", "x")], "test")
    with pytest.raises(BackendError, match="recorded for a diagnose prompt, but the loop "
                                           "asks for generate"):
        run_agent(builtin_task("relu"), backend, str(tmp_path), AgentConfig(),
                  progress=lambda line: None)
    assert (tmp_path / "steps" / "01-generate" / "prompt.md").exists()


def test_failed_run_reports_and_keeps_no_best(tmp_path, fork_server):
    backend = ReplayBackend([("generate", "I cannot write this kernel.")], "test")
    result = run_agent(builtin_task("relu"), backend, str(tmp_path),
                       AgentConfig(repair_rounds=0), progress=lambda line: None)
    assert not result.ok and result.best is None and "no correct kernel" in result.reason
    assert not (tmp_path / "best.py").exists()


def test_prompts_carry_the_task_the_rules_and_the_menu():
    from tegula.agent.prompts import MENUS, generate_prompt, optimize_prompt
    from tegula.agent.tasks import CATEGORIES

    assert set(MENUS) == set(CATEGORIES)
    task = builtin_task("softmax")
    system, user = generate_prompt(task)
    assert "torch.softmax(x, dim=1)" in user["content"] and "{'M': 13, 'N': 100}" in user["content"]
    assert "no torch or numpy computation outside kernels" in system["content"]
    assert "def relu_kernel" in system["content"]
    without = optimize_prompt(task, "a\nb\n", 1, 3, "Time: ?", [], None)[1]["content"]
    with_profile = optimize_prompt(task, "a\nb\n", 2, 3, "Time: ?", ["x"], "REPORT")[1]["content"]
    assert "Profiling summary" not in without and "REPORT" in with_profile
    assert "1 | a" in without and "Tried so far: x" in with_profile
