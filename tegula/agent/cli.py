"""`tegula agent ...`: the agent's commands (hooked into `tegula.cli` as one subcommand).

    tegula agent TASK [--endpoint URL --model NAME | --replay FILE] [--run-dir DIR] ...
    tegula agent evaluate TASK CANDIDATE.py [--trials N] [--size small|real] [--json]
    tegula agent tasks [--write DIR]

TASK is a built-in task name (`tegula agent tasks` lists them) or a task file in
KernelBench's format. `evaluate` exits 0 only for a correct candidate.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence


class AgentUsageError(Exception):
    """Bad command-line input (printed as one line by tegula.cli)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`tegula agent` takes its own sub-grammar; everything after `agent` goes to main."""
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="TASK [--endpoint URL --model NAME | --replay FILE], "
                        "or: evaluate TASK CANDIDATE.py, or: tasks [--write DIR]")


def run(args: argparse.Namespace) -> int:
    """Entry point from tegula.cli: usage errors print one line, status 2 (as tegula's)."""
    try:
        return main(args.rest)
    except AgentUsageError as err:
        print(f"tegula: error: {err}", file=sys.stderr)
        return 2


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] == "evaluate":
        return _evaluate(argv[1:])
    if argv[0] == "tasks":
        return _tasks(argv[1:])
    return _loop(argv)


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"tegula agent {prog}".strip(),
                                   description=description)


def _evaluate(argv: list[str]) -> int:
    from tegula.agent.evaluator import EvalOptions, evaluate
    from tegula.agent.tasks import TaskError, load_task

    p = _parser("evaluate", "judge a candidate ModelNew against a task; exit 0 only if correct")
    p.add_argument("task", help="a built-in task name or a task file (KernelBench format)")
    p.add_argument("candidate", help="the candidate's Python file (defines ModelNew)")
    p.add_argument("--trials", type=int, default=3, help="correctness trials (default 3)")
    p.add_argument("--timing-trials", type=int, default=5, help="timed calls per round (GPU)")
    p.add_argument("--size", choices=("small", "real"), default=None,
                   help="problem size (default: small without a GPU, real with one)")
    p.add_argument("--seed", type=int, default=None, help="base seed (default: random)")
    p.add_argument("--cpu", action="store_true", help="do not use a GPU even if there is one")
    p.add_argument("--explain", action="store_true",
                   help="also print tegula explain of the kernels at the real size")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    args = p.parse_args(argv)
    if not os.path.isfile(args.candidate):
        raise AgentUsageError(f"no candidate file {args.candidate!r}")
    if args.trials < 1:
        raise AgentUsageError("--trials must be at least 1")
    try:
        task = load_task(args.task)
    except TaskError as err:
        raise AgentUsageError(str(err)) from None
    options = EvalOptions(trials=args.trials, timing_trials=args.timing_trials, size=args.size,
                          seed=args.seed, gpu=False if args.cpu else None, explain=args.explain)
    verdict = evaluate(task, args.candidate, options)
    if args.json:
        print(json.dumps(verdict.to_json(), indent=1, default=str))
    else:
        print(verdict.summary())
        if args.explain and verdict.profile:
            print(verdict.profile)
    return 0 if verdict.ok else 1


def _tasks(argv: list[str]) -> int:
    from tegula.agent.taskset import SPECS, task_source

    p = _parser("tasks", "list the built-in tasks, or write them out as task files")
    p.add_argument("--write", metavar="DIR", default=None, help="write TASK.py files into DIR")
    args = p.parse_args(argv)
    for spec in SPECS:
        print(f"{spec.name:24s} {spec.category:12s} {spec.doc}")
    if args.write:
        os.makedirs(args.write, exist_ok=True)
        for spec in SPECS:
            with open(os.path.join(args.write, f"{spec.name}.py"), "w", encoding="utf-8") as f:
                f.write(task_source(spec))
        print(f"wrote {len(SPECS)} task files to {args.write}")
    return 0


def _loop(argv: list[str]) -> int:
    from tegula.agent.backends import BackendError, OpenAIBackend, ReplayBackend
    from tegula.agent.evaluator import EvalOptions
    from tegula.agent.loop import AgentConfig, run_agent
    from tegula.agent.tasks import TaskError, load_task

    p = _parser("", "generate, check and optimize a tegula kernel for a task")
    p.add_argument("task", help="a built-in task name or a task file (KernelBench format)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--endpoint", help="an OpenAI-compatible API base URL")
    source.add_argument("--replay", metavar="FILE",
                        help="play recorded replies (a replay file or a run directory)")
    p.add_argument("--model", help="the model name for --endpoint")
    p.add_argument("--key-env", default="OPENAI_API_KEY",
                   help="environment variable holding the API key (default OPENAI_API_KEY)")
    p.add_argument("--run-dir", default=None,
                   help="where to record the run (default agent-runs/TASK-TIMESTAMP)")
    p.add_argument("--repair-rounds", type=int, default=4)
    p.add_argument("--optimize-steps", type=int, default=3)
    p.add_argument("--profile-after", type=int, default=1,
                   help="optimization steps before tegula explain's summary is shown")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="do not use a GPU even if there is one")
    args = p.parse_args(argv)
    if args.endpoint and not args.model:
        raise AgentUsageError("--endpoint needs --model")
    try:
        task = load_task(args.task)
        backend = (ReplayBackend.from_path(args.replay) if args.replay else
                   OpenAIBackend(args.endpoint, args.model, args.key_env))
    except (TaskError, BackendError) as err:
        raise AgentUsageError(str(err)) from None
    run_dir = args.run_dir or os.path.join(
        "agent-runs", f"{task.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    config = AgentConfig(repair_rounds=args.repair_rounds, optimize_steps=args.optimize_steps,
                         profile_after=args.profile_after,
                         eval_options=EvalOptions(trials=args.trials, explain=True,
                                                  gpu=False if args.cpu else None))
    try:
        result = run_agent(task, backend, run_dir, config)
    except BackendError as err:
        print(f"tegula agent: the model backend failed: {err} (the run so far is recorded in "
              f"{run_dir})", file=sys.stderr)
        return 1
    if result.best is not None:
        print(f"best kernel: {os.path.join(run_dir, 'best.py')}")
    return 0 if result.ok else 1


__all__ = ["add_arguments", "run", "main", "AgentUsageError"]
