"""The prompts of the loop: what the model is told at each step (after CuTeGen's design:
a generation prompt with an example, diagnose-then-repair prompts with debugging
guidelines, and one-optimization-at-a-time prompts with a menu per task class, the
profiling summary added only after a few steps).

Every prompt is a list of chat messages: the system message (the language and the rules)
and one user message. The loop sends each step on its own (no hidden conversation), so a
recorded run replays exactly.
"""
from __future__ import annotations

from tegula.agent.edits import numbered

SYSTEM = """You write GPU kernels in tegula, a Python tile-level kernel language whose compiler
synthesizes every layout and instruction. Your output is a Python module defining
`class ModelNew(nn.Module)` with the same constructor arguments and `forward` signature as
the task's `Model`; its computation must run in tegula kernels.

The language (import tegula as tg):
- `@tg.kernel(threads=128)` over parameters `x: tg.Tensor[f32]` (global tensors, rank 2 by
  default), `int` scalars and `tg.constexpr` compile-time values.
- `tg.block_id(axis)`; `x.tile((BM, BN), (m, n))` is block (m, n)'s tile view, a `None`
  coordinate tiles that dim into a trailing one (`x.tile((BM, BK), (m, None))[:, :, k]`).
- `tg.load(view, fill=0.0)` reads a view into registers (out-of-range elements get `fill`);
  `tg.copy(src, dst)` moves data between any scopes (out-of-range elements are not stored).
- compute: Python operators, `tg.exp, exp2, log, sqrt, rsqrt, sigmoid, tanh, maximum,
  minimum, where`, `.to(dtype)`, `tg.sum/max/min(t, axis)` (keeps the axis with extent 1),
  `tg.gemm(acc, a, b)` (acc += a @ b.T; f16/bf16 operands, f32 accumulator).
- memory: `tg.zeros/full(shape, dtype)` register tiles, `tg.shared(shape, dtype, stages=S)`,
  loops `tg.range(n)` and `tg.pipeline(n, stages=S)` (copies run S-1 steps ahead).
- launch from forward: `from tegula.agent.device import launch`,
  `launch(kernel, grid, *tensors, **constexprs)` (GPU tensors: the GPU; CPU: the emulator).
- library kernels you may reuse: `tegula.kernels.gemm.gemm_kernel(f16)` (c = a @ b.T, tiles
  BM/BN/BK/STAGES), `tegula.kernels.softmax.softmax_kernel(f32)`,
  `tegula.kernels.norm.rms_norm_kernel(f32)`, `tegula.kernels.elementwise.silu_mul_kernel(f32)`.

Rules (an evaluator checks them; breaking one rejects the kernel):
- forward may only allocate outputs (torch.empty, torch.empty_like), view/reshape tensors
  and launch kernels: no torch or numpy computation outside kernels, not even `x * 2`.
- keep the reference's precision: f32 tasks compute in f32 (no f16/bf16 shortcuts).
- no try/except, streams, threads, timers, file access, global state, monkeypatching,
  imports beyond torch, numpy, tegula, math, functools, typing.
- outputs: new tensors with the reference's shape, dtype and device; inputs unchanged.

Example of a complete answer (for `torch.relu(x)` on an (M, N) f32 tensor):
```python
{example}```"""

GENERATE = """Task `{name}` ({category}). The reference, in KernelBench's format:
```python
{source}```
Sizes: small (the emulator, where your kernel is checked now) {small}; real (GPU) {real}.
Tolerance: {tolerance}.

Write ModelNew. Reply with one ```python block holding the whole module."""

DIAGNOSE = """Your kernel for task `{name}` fails the evaluator.
```python
{kernel}
```
The evaluator says:
{verdict}

Debugging guidelines for tegula:
- A `tegula` error names the op, the tensors, their shapes or layouts, and your source
  line: read it first. Rank mismatches: tensors are rank 2 unless declared
  `tg.Tensor[f32, 1]`; a (N,) vector passed to a rank-2 parameter needs `.view(1, -1)`.
- Wrong values at the edges (last rows/columns) mean out-of-range elements: loads fill
  with 0 by default, which is wrong for a max (use fill=-float('inf')) or a product.
- Wrong values everywhere: check the reduction axis, broadcasting shapes ((BM, 1) vs
  (1, BN)), the accumulator type, and the grid (one block per tile: tg.cdiv).
- NaN: a division by a sum or norm of padded elements, or exp of an unfilled value.

Diagnose: explain the most likely cause in a few sentences. Do not write code yet."""

REPAIR = """Repair the kernel for task `{name}` following your diagnosis.
Numbered kernel:
```
{numbered}
```
Evaluator: {verdict}
Your diagnosis: {diagnosis}

Reply with the smallest fix as edits of the numbered lines (numbers refer to the listing
above), in one block:
```edits
@@ replace 12-14
<new lines>
@@ insert 20
<lines inserted after line 20>
@@ delete 7-8
```"""

OPTIMIZE = """Optimization step {step} of {steps} for task `{name}` ({category}). The kernel is
correct; make it faster without changing its results.
Numbered kernel:
```
{numbered}
```
{measurement}
Optimizations for {category} kernels (apply exactly ONE per step, one not tried yet):
{menu}
Tried so far: {tried}
{profile}
Reply with a first line `Optimization: <name from the list>`, then one ```edits block
(numbers refer to the listing above)."""

MENUS = {
    "elementwise": [
        "larger tiles: more elements per thread (raise BM or BN)",
        "a row-contiguous tile shape so loads and stores are 16-byte vectors",
        "fuse neighbouring element-wise ops into the same kernel",
        "fewer, fatter blocks: a grid that covers the tensor in one wave",
        "a different thread count (threads=64/256)",
    ],
    "reduction": [
        "several rows per block (BM) so every thread has work",
        "a BN that is the row length rounded up to a power of two",
        "exp2 of pre-scaled differences and one reciprocal per row",
        "a looped (online) kernel over chunks for long rows",
        "a different thread count (threads=64/256)",
    ],
    "matmul": [
        "a shared-memory pipeline: tg.shared buffers with stages and tg.pipeline",
        "tile sizes BM/BN/BK for the problem shape",
        "fuse the epilogue (bias, activation, scaling) into the gemm kernel",
        "more warps per block (threads=256) for larger tiles",
        "split-K for few-row problems",
    ],
    "attention": [
        "fuse q@k.T, softmax and @v into one kernel (online softmax over key tiles)",
        "keep the probabilities in registers as the second gemm's operand",
        "exp2 of pre-scaled scores",
        "pipeline the k/v tiles through shared memory",
        "tile sizes for the query and key blocks",
    ],
}


# The example answer (the honest relu candidate of tests/agent/candidates/relu_ok.py).
EXAMPLE = '''import torch
import torch.nn as nn

import tegula as tg
from tegula import f32
from tegula.agent.device import launch


@tg.kernel(threads=128)
def relu_kernel(x: tg.Tensor[f32], y: tg.Tensor[f32],
                BM: tg.constexpr = 16, BN: tg.constexpr = 64):
    m, n = tg.block_id(0), tg.block_id(1)
    tile = tg.load(x.tile((BM, BN), (m, n)))
    tg.copy(tg.maximum(tile, 0.0), y.tile((BM, BN), (m, n)))


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        grid = (tg.cdiv(x.shape[0], 16), tg.cdiv(x.shape[1], 64))
        launch(relu_kernel, grid, x, y, BM=16, BN=64)
        return y
'''


def messages(user: str) -> list[dict]:
    """The chat messages of one step."""
    return [{"role": "system", "content": SYSTEM.format(example=EXAMPLE)},
            {"role": "user", "content": user}]


def generate_prompt(task) -> list[dict]:
    return messages(GENERATE.format(
        name=task.name, category=task.category, source=task.source,
        small=task.sizes.get("small", "(the file's constants)"),
        real=task.sizes.get("real", "(the file's constants)"),
        tolerance=_tolerance_text(task)))


def diagnose_prompt(task, kernel: str, verdict_text: str) -> list[dict]:
    return messages(DIAGNOSE.format(name=task.name, kernel=kernel.rstrip("\n"),
                                    verdict=verdict_text))


def repair_prompt(task, kernel: str, verdict_text: str, diagnosis: str) -> list[dict]:
    return messages(REPAIR.format(name=task.name, numbered=numbered(kernel),
                                  verdict=verdict_text, diagnosis=diagnosis.strip()))


def optimize_prompt(task, kernel: str, step: int, steps: int, measurement: str,
                    tried: list[str], profile: str | None) -> list[dict]:
    menu = "\n".join(f"- {item}" for item in MENUS[task.category])
    profile_text = (f"Profiling summary (tegula explain of your kernels at the real size):\n"
                    f"{profile}" if profile else "")
    return messages(OPTIMIZE.format(
        step=step, steps=steps, name=task.name, category=task.category,
        numbered=numbered(kernel), measurement=measurement, menu=menu,
        tried=", ".join(tried) if tried else "nothing yet", profile=profile_text))


def _tolerance_text(task) -> str:
    if task.tolerance:
        return (f"|out - ref| <= {task.tolerance[0]:g} * rms(ref) + {task.tolerance[1]:g} "
                f"* |ref| element-wise")
    return "the default for the output dtype"


__all__ = ["generate_prompt", "diagnose_prompt", "repair_prompt", "optimize_prompt", "MENUS",
           "SYSTEM", "EXAMPLE"]
