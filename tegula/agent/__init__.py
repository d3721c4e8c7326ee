"""tegula.agent: a kernel-writing agent and the evaluator that judges its kernels.

* `tasks`, `taskset` — tasks in KernelBench's format (`Model`, `get_inputs`,
  `get_init_inputs`) with tegula's optional `TEGULA_*` data; 38 built-in tasks.
* `evaluator` — `evaluate(task, candidate_path) -> Verdict`: the static check
  (`static_check`), the candidate's separate process (`forkserver`, `sandbox`), the
  element-wise checks (`checks`), GPU timing with a roofline bound (`timing`).
* `loop` — generation, diagnose/repair (`edits`), optimization (`prompts`, `profile`),
  on a model `backends` (OpenAI-compatible endpoint, or recorded replies).
* `device` — the one module a candidate imports: `launch(kernel, grid, *tensors)`.
* `cli` — `tegula agent ...`.

Submodules are imported where used: a candidate's process imports `tegula.agent.device`
and must not pay for (or reach) the rest. See docs/agent.md.
"""
