"""The agent loop: generation, a correctness stage, an optimization stage (after CuTeGen).

    generate ──▶ evaluate ──▶ correct? ──no──▶ diagnose ──▶ repair (edits) ──▶ evaluate ─┐
                                 │ yes                  ▲                                 │
                                 ▼                      └──────── up to repair_rounds ────┘
                 optimize: one optimization from the task class's menu per step,
                 `tegula explain`'s summary added after `profile_after` steps;
                 each step's kernel goes through the same correctness stage;
                 the best correct kernel is kept.

"Best" is the median measured time on a GPU; without one, the time tegula's cost model
predicts for the kernels one forward call launches at the task's real size (the emulator
checks correctness at the small size; its own run time says nothing about a GPU's).

Everything is recorded under the run directory, so a run can be audited and replayed:
`transcript.jsonl` (every prompt and reply, in order, with the backend's name),
`steps/NN-KIND/` (prompt.md, reply.md, and for evaluated kernels kernel.py and
verdict.json), `best.py` and `summary.json`. `ReplayBackend.from_path(run_dir)` replays it.
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tegula.agent.backends import Backend
from tegula.agent.edits import EditError, code_block, kernel_from_reply
from tegula.agent.evaluator import EvalOptions, Verdict, evaluate_source
from tegula.agent.prompts import (diagnose_prompt, generate_prompt, optimize_prompt,
                                  repair_prompt)
from tegula.agent.tasks import Task


@dataclass
class AgentConfig:
    """Budgets of the loop."""

    repair_rounds: int = 4        # diagnose + repair rounds per correctness stage
    optimize_steps: int = 3
    profile_after: int = 1        # optimization steps before the explain summary is shown
    eval_options: EvalOptions = field(default_factory=lambda: EvalOptions(explain=True))


@dataclass
class Candidate:
    """An evaluated kernel."""

    source: str
    verdict: Verdict
    measure: float | None         # seconds (measured or predicted); None: unmeasured


@dataclass
class AgentResult:
    """What a run produced."""

    ok: bool
    reason: str
    best: Candidate | None
    run_dir: str
    model_calls: int


def print_progress(line: str) -> None:
    """The default progress display: one line per event on stderr."""
    print(f"[tegula agent] {line}", file=sys.stderr, flush=True)


class Recorder:
    """Writes every prompt, reply, kernel and verdict of a run under its directory."""

    def __init__(self, run_dir: str, task: Task, backend: Backend) -> None:
        self.run_dir, self.task, self.backend = run_dir, task, backend
        os.makedirs(os.path.join(run_dir, "steps"), exist_ok=True)
        self.count = 0
        self.transcript = os.path.join(run_dir, "transcript.jsonl")
        open(self.transcript, "w", encoding="utf-8").close()
        with open(os.path.join(run_dir, "task.py"), "w", encoding="utf-8") as f:
            f.write(task.source)

    def ask(self, kind: str, prompt: list[dict]) -> str:
        """One model call, recorded before and after."""
        self.count += 1
        step = os.path.join(self.run_dir, "steps", f"{self.count:02d}-{kind}")
        os.makedirs(step, exist_ok=True)
        _write(os.path.join(step, "prompt.md"),
               "\n\n".join(f"## {m['role']}\n\n{m['content']}" for m in prompt))
        reply = self.backend.complete(prompt, kind)
        _write(os.path.join(step, "reply.md"), reply)
        with open(self.transcript, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": self.count, "kind": kind, "backend": self.backend.name,
                                "prompt": prompt, "reply": reply}) + "\n")
        self.last_step = step
        return reply

    def kernel(self, source: str, verdict: Verdict) -> None:
        """The kernel the last reply produced and its verdict."""
        _write(os.path.join(self.last_step, "kernel.py"), source)
        _write(os.path.join(self.last_step, "verdict.json"),
               json.dumps(verdict.to_json(), indent=1, default=str))


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


class Agent:
    """One run of the loop on one task."""

    def __init__(self, task: Task, backend: Backend, run_dir: str,
                 config: AgentConfig | None = None,
                 progress: Callable[[str], None] = print_progress) -> None:
        self.task, self.config, self.progress = task, config or AgentConfig(), progress
        self.recorder = Recorder(run_dir, task, backend)
        self.run_dir = run_dir

    # ----------------------------------------------------------------- the stages
    def run(self) -> AgentResult:
        self.progress(f"task {self.task.name} ({self.task.category}), backend "
                      f"{self.recorder.backend.name}, run directory {self.run_dir}")
        reply = self.recorder.ask("generate", generate_prompt(self.task))
        source = code_block(reply, "python") or ""
        verdict = self._evaluate(source, "generate") if source else Verdict(
            False, "edit", "the reply has no ```python block with the module")
        source, verdict = self._correctness(source, verdict, "generation")
        if not verdict.ok:
            return self._finish(None, f"no correct kernel after {self.config.repair_rounds} "
                                      f"repair rounds: {verdict.reason.splitlines()[0]}")
        best = Candidate(source, verdict, self._measure(verdict))
        best = self._optimization(best)
        return self._finish(best, "correct kernel found" + (
            f"; {self._measure_text(best)}" if best.measure is not None else ""))

    def _correctness(self, source: str, verdict: Verdict, label: str) -> tuple[str, Verdict]:
        """Diagnose and repair until the kernel is correct or the rounds run out."""
        for round_ in range(1, self.config.repair_rounds + 1):
            if verdict.ok:
                break
            self.progress(f"correctness ({label}) round {round_}/{self.config.repair_rounds}: "
                          f"diagnose")
            feedback = verdict.summary()
            diagnosis = self.recorder.ask("diagnose",
                                          diagnose_prompt(self.task, source, feedback))
            reply = self.recorder.ask("repair",
                                      repair_prompt(self.task, source, feedback, diagnosis))
            try:
                source, how = kernel_from_reply(reply, source)
            except EditError as err:
                verdict = Verdict(False, "edit", f"the repair could not be applied: {err}")
                self.progress(f"  repair not applied: {err}")
                continue
            verdict = self._evaluate(source, f"repair ({how})")
        return source, verdict

    def _optimization(self, best: Candidate) -> Candidate:
        """One optimization per step; each result re-checked; the fastest correct kept."""
        tried: list[str] = []
        steps = self.config.optimize_steps
        for step in range(1, steps + 1):
            profile = best.verdict.profile if step > self.config.profile_after else None
            prompt = optimize_prompt(self.task, best.source, step, steps,
                                     self._measure_text(best), tried, profile)
            reply = self.recorder.ask("optimize", prompt)
            name = _optimization_name(reply)
            tried.append(name)
            self.progress(f"optimize {step}/{steps}: {name}")
            try:
                source, _ = kernel_from_reply(reply, best.source)
            except EditError as err:
                self.progress(f"  not applied: {err}")
                continue
            verdict = self._evaluate(source, f"optimize {step}")
            source, verdict = self._correctness(source, verdict, f"optimization {step}")
            if not verdict.ok:
                self.progress("  no correct kernel from this step; the best is unchanged")
                continue
            candidate = Candidate(source, verdict, self._measure(verdict))
            if _faster(candidate, best):
                self.progress(f"  new best: {self._measure_text(candidate)}")
                best = candidate
            else:
                self.progress(f"  not faster ({self._measure_text(candidate)}); best unchanged")
        return best

    # ----------------------------------------------------------------- helpers
    def _evaluate(self, source: str, label: str) -> Verdict:
        verdict = evaluate_source(self.task, source, self.config.eval_options)
        self.recorder.kernel(source, verdict)
        first = verdict.reason.splitlines()[0] if verdict.reason else ""
        self.progress(f"  {label}: {'PASS' if verdict.ok else 'FAIL (' + verdict.stage + ')'}"
                      f" {first[:160]}")
        return verdict

    @staticmethod
    def _measure(verdict: Verdict) -> float | None:
        if verdict.timing:
            return verdict.timing["candidate_us"] * 1e-6
        return verdict.predicted_seconds

    @staticmethod
    def _measure_text(candidate: Candidate) -> str:
        if candidate.measure is None:
            return "Time: not measured (no GPU, no cost-model prediction)."
        if candidate.verdict.timing:
            t = candidate.verdict.timing
            return (f"Time: {t['candidate_us']:.1f} us measured (median), reference "
                    f"{t['reference_us']:.1f} us: speedup {t['speedup']:.2f}x.")
        return (f"Time: {candidate.measure * 1e6:.2f} us predicted by tegula's cost model at "
                f"the real size (no GPU here: not a measurement).")

    def _finish(self, best: Candidate | None, reason: str) -> AgentResult:
        if best is not None:
            _write(os.path.join(self.run_dir, "best.py"), best.source)
        summary = {"task": self.task.name, "ok": best is not None, "reason": reason,
                   "backend": self.recorder.backend.name, "model_calls": self.recorder.count,
                   "best_measure_seconds": best.measure if best else None,
                   "best_measure_kind": (None if not best or best.measure is None else
                                         "measured" if best.verdict.timing else "predicted"),
                   "best_verdict": best.verdict.to_json() if best else None}
        _write(os.path.join(self.run_dir, "summary.json"),
               json.dumps(summary, indent=1, default=str))
        self.progress(f"{'done' if best else 'failed'}: {reason} ({self.recorder.count} model "
                      f"calls; run recorded in {self.run_dir})")
        return AgentResult(best is not None, reason, best, self.run_dir, self.recorder.count)


def _optimization_name(reply: str) -> str:
    match = re.search(r"^\s*Optimization:\s*(.+)$", reply, re.M)
    return match.group(1).strip()[:120] if match else "(unnamed)"


def _faster(candidate: Candidate, best: Candidate) -> bool:
    if candidate.measure is None:
        return False
    return best.measure is None or candidate.measure < best.measure


def run_agent(task: Task, backend: Backend, run_dir: str, config: AgentConfig | None = None,
              progress: Callable[[str], None] = print_progress) -> AgentResult:
    """Run the loop (see the module docstring)."""
    return Agent(task, backend, run_dir, config, progress).run()


__all__ = ["AgentConfig", "AgentResult", "Candidate", "run_agent", "print_progress"]
