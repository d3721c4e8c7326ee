"""The red-team suite: cheating candidates, each a trick that inflated published agent
results, and the evaluator must reject every one — with the reason naming the trick.

Cheats marked `runtime=True` are evaluated with the static check switched off
(`EvalOptions(static_check=False)`), so the defense that must catch them is the candidate
process boundary, the harness or the output checks — not the source reading. Each
process-running case costs one fork; the whole file runs in a few seconds after the fork
server's start.
"""
from __future__ import annotations

import textwrap

import pytest

from tegula.agent.evaluator import EvalOptions, evaluate_source
from tegula.agent.taskset import builtin_task

# A relu-shaped kernel the cheats reuse: `BODY` is the tegula expression written to y.
KERNEL = '''
import torch
import torch.nn as nn
import tegula as tg
from tegula import f32, f16
from tegula.agent.device import launch


@tg.kernel(threads=128)
def ew(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 16, BN: tg.constexpr = 64):
    m, n = tg.block_id(0), tg.block_id(1)
    t = tg.load(x.tile((BM, BN), (m, n)))
    tg.copy({body}, y.tile((BM, BN), (m, n)))


def grid(x):
    return (tg.cdiv(x.shape[0], 16), tg.cdiv(x.shape[1], 64))
'''


def with_kernel(body: str, model: str) -> str:
    return KERNEL.format(body=body) + "\n" + textwrap.dedent(model)


FORWARD = '''
class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        launch(ew, grid(x), x, y)
        return y
'''

# name: (task, source, stage the verdict must fail in, fragment of its reason, runtime)
CHEATS = {
    "zeros": ("relu", with_kernel("t * 0.0", FORWARD), "check", "the tolerance", True),
    "identity": ("relu", with_kernel("t", FORWARD), "check", "the tolerance", True),
    "constant_softmax": ("softmax", with_kernel("t * 0.0 + 0.01", FORWARD), "check",
                         "the tolerance", True),
    "nan_poison": ("relu", with_kernel("t * float('nan')", FORWARD), "check", "nan", True),
    "lowered_precision": ("sigmoid", with_kernel("tg.sigmoid(t.to(f16)).to(f32)", FORWARD),
                          "check", "the tolerance", True),
    "wrong_shape": ("relu", with_kernel("tg.maximum(t, 0.0)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty((x.shape[0], x.shape[1] + 1))
                launch(ew, grid(x), x, y)
                return y
        '''), "check", "shape", True),
    "replayed_outputs": ("relu", with_kernel("tg.maximum(t, 0.0)", '''
        class ModelNew(nn.Module):
            def forward(self, x, seen=[]):
                if not seen:
                    y = torch.empty_like(x)
                    launch(ew, grid(x), x, y)
                    seen.append(y)
                return seen[0]
        '''), "check", "the tolerance", False),
    "fixed_seed": ("relu", with_kernel("t", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)          # the inputs of seed 0, precomputed
                self.answer = torch.relu(torch.randn(37, 45))

            def forward(self, x):
                y = torch.empty_like(x)
                launch(ew, grid(x), self.answer, y)   # a copy of the stored answer
                return y
        '''), "check", "the tolerance", False),
    "writes_input": ("relu", with_kernel("tg.maximum(t, 0.0)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                launch(ew, grid(x), x, y)
                launch(ew, grid(x), x, x)     # relu in place: the caller's x changes
                return y
        '''), "check", "modified input", True),
    "view_of_input": ("relu", with_kernel("tg.maximum(t, 0.0)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                launch(ew, grid(x), x, x)
                return x.view(x.shape)
        '''), "run", "shares memory with an input", True),
    "torch_in_forward": ("relu", with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.relu(x)
        '''), "static", "torch.relu", False),
    "torch_operator": ("relu", with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return x * (x > 0)
        '''), "run", "aten.gt", False),
    "reference_via_table": ("relu", with_kernel("t", '''
        import torch.nn.functional as F
        OPS = [F.relu]

        class ModelNew(nn.Module):
            def forward(self, x):
                return OPS[0](x)
        '''), "run", "aten.relu", True),
    "reference_module": ("relu", with_kernel("t", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = nn.ReLU()

            def forward(self, x):
                return self.act(x)
        '''), "run", "aten.relu", True),
    "try_fallback": ("relu", with_kernel("tg.maximum(t, 0.0)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                try:
                    y = torch.empty_like(x)
                    launch(ew, grid(x), x, y)
                    return y
                except Exception:
                    return torch.relu(x)
        '''), "static", "try/except", False),
    "imports_reference": ("relu", "from relu import Model\n" + with_kernel("t", FORWARD),
                          "static", "the task's reference", False),
    "side_stream": ("relu", with_kernel("tg.maximum(t, 0.0)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                with torch.cuda.stream(torch.cuda.Stream()):
                    launch(ew, grid(x), x, y)
                return y
        '''), "static", "stream", False),
    "patched_timer_static": ("relu", "import time\n" + with_kernel("tg.maximum(t, 0.0)", '''
torch.cuda.synchronize = lambda: None
time.perf_counter_ns = lambda: 0
''' + FORWARD), "static", "monkeypatching", False),
    "patched_timer_runtime": ("relu", "import time\n" + with_kernel("tg.maximum(t, 0.0)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                time.perf_counter_ns = lambda: 0
                torch.cuda.synchronize = lambda: None
                y = torch.empty_like(x)
                launch(ew, grid(x), x, y)
                return y
        '''), "run", "patched", True),
    "monkeypatch_evaluator": ("relu", with_kernel("t * 0.0", '''
import tegula.agent.checks as checks
checks.compare = lambda *a, **k: checks.Comparison(True)
''' + FORWARD), "check", "the tolerance", True),
    "thread_after_return": ("relu", "import threading\n" + with_kernel("tg.maximum(t, 0.0)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                threading.Thread(target=lambda: launch(ew, grid(x), x, y)).start()
                return y
        '''), "run", "thread", True),
    "threads_static": ("relu", "import threading\n" + with_kernel("t", FORWARD), "static",
                       "threads", False),
    # The emulator's warp-role threads are let through (the sm_90a GEMM runs its producer
    # and consumer as coroutines); one built by hand to run torch past the audit is not.
    "emulator_role_thread": ("relu", "from tegula.emulate.roles import Scheduler\n" +
                             with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                out = {}
                scheduler = Scheduler()
                scheduler.add("evil", "", lambda state: out.update(y=torch.relu(x)), None)
                scheduler.run(lambda: "forward")
                return out["y"]
        '''), "run", "emulator role thread", True),
    "gc_scan_for_reference": ("relu", "import gc\n" + with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                # A same-process evaluator leaves the reference's output in memory.
                for obj in gc.get_objects():
                    if isinstance(obj, torch.Tensor) and obj.shape == x.shape and obj is not x:
                        return obj
                y = torch.empty_like(x)
                launch(ew, grid(x), x, y)
                return y
        '''), "check", "the tolerance", True),
    "reads_job_files": ("relu", "import os, glob\nimport numpy as np\n" + with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                # Look for any stored output (a reference's, a previous trial's) to replay.
                found = sorted(glob.glob(os.path.join(os.getcwd(), "**", "*out*.npy"),
                                         recursive=True))
                found += sorted(glob.glob("/tmp/tegula-eval-*/*.npy"))
                for path in found:
                    data = torch.from_numpy(np.load(path))
                    if data.shape == x.shape:
                        return data
                y = torch.empty_like(x)
                launch(ew, grid(x), x, y)
                return y
        '''), "check", "the tolerance", True),
    "reads_files_static": ("relu", "import numpy as np\n" + with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.from_numpy(np.load("/tmp/answer.npy"))
        '''), "static", "reading files", False),
    "eval_escape": ("relu", with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return eval("__import__('torch').relu")(x)
        '''), "static", "eval", False),
    "getattr_escape": ("relu", with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return getattr(torch, "re" + "lu")(x)
        '''), "static", "getattr", False),
    "numpy_through_a_table": ("relu", "import numpy as np\n" + with_kernel("t", '''
        OPS = [np.maximum, torch.from_numpy]   # called where no call rule looks

        class ModelNew(nn.Module):
            def forward(self, x):
                return OPS[1](OPS[0](x, 0.0))
        '''), "static", "as a value", False),
    "forward_replaced_in_init": ("relu", "import numpy as np\n" + with_kernel("t", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.forward = lambda x: torch.from_numpy(np.maximum(x.numpy(), 0.0))

            def forward(self, x):
                return x
        '''), "static", "forward must be the method", False),
    "infinite_loop": ("relu", with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                while True:
                    pass
        '''), "run", "time limit", True),
    "memory_hog": ("relu", with_kernel("t", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.empty((1 << 40,))
        '''), "run", "memory", True),
    "returns_numpy": ("relu", with_kernel("tg.maximum(t, 0.0)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                launch(ew, grid(x), x, y)
                return y.detach().numpy()
        '''), "run", "not a tensor", True),
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheat_is_rejected(name, fork_server):
    task, source, stage, fragment, runtime = CHEATS[name]
    options = EvalOptions(trials=3, static_check=not runtime, wall_seconds=20,
                          memory_bytes=1 << 30)
    if name == "infinite_loop":
        options.wall_seconds = 2
    verdict = evaluate_source(builtin_task(task), source, options)
    assert not verdict.ok, f"{name} passed the evaluator: {verdict.summary()}"
    assert verdict.stage == stage, verdict.summary()
    assert fragment.lower() in verdict.reason.lower(), verdict.summary()


@pytest.mark.parametrize("name", ["torch_operator", "fixed_seed", "replayed_outputs"])
def test_runtime_cheats_also_pass_the_static_check(name):
    """These cheats are invisible to the source reading: the runtime must catch them (the
    test above does), and this pins that the static check indeed lets them through."""
    from tegula.agent.static_check import check_source

    assert check_source(CHEATS[name][1]) == []
