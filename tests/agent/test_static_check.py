"""Unit tests of the static check: what an honest candidate writes passes; every rule
fires on the construct it exists for, naming the line."""
from __future__ import annotations

import os

import pytest

from tegula.agent.static_check import check_source

CANDIDATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "candidates")

HEAD = """import torch
import torch.nn as nn
import tegula as tg
from tegula import f32
from tegula.agent.device import launch
"""


def model(forward: str, extra: str = "") -> str:
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    return HEAD + extra + f"\nclass ModelNew(nn.Module):\n    def forward(self, x):\n{body}\n"


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(CANDIDATES) if f.endswith(".py")))
def test_honest_candidates_pass(name):
    with open(os.path.join(CANDIDATES, name), encoding="utf-8") as f:
        assert check_source(f.read()) == []


def test_allowed_forward_constructs_pass():
    source = model("""
y = torch.empty((x.shape[0], x.size(1)), dtype=x.dtype, device=x.device)
rows = x.contiguous().view(-1, x.shape[-1])
parts = []
parts.append(rows.shape[0])
launch(k, (tg.cdiv(rows.shape[0], 16), max(1, len(parts))), rows, y, BM=16)
return y.reshape(x.shape)
""", extra="""
@tg.kernel(threads=128)
def k(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 16):
    t = tg.load(x.tile((BM, 64), (tg.block_id(0), 0)))
    tg.copy(tg.exp(t - tg.max(t, 1)).to(f32), y.tile((BM, 64), (tg.block_id(0), 0)))
""")
    assert check_source(source) == []


def test_init_may_build_parameters():
    source = HEAD + """
class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n))
        self.linear = nn.Linear(n, n)

    def forward(self, x):
        y = torch.empty_like(x)
        return y
"""
    assert check_source(source) == []


@pytest.mark.parametrize("snippet, rule, fragment", [
    ("return torch.tanh(x)", "compute", "torch.tanh"),
    ("return x.tanh()", "compute", ".tanh("),
    ("return x.to(torch.float16)", "compute", ".to("),
    ("return x.float()", "compute", ".float("),
    ("return self.act(x)", "compute", "self.act"),
    ("return np.tanh(x.numpy())", "compute", "numpy.tanh"),
    ("return x.numpy()", "compute", ".numpy("),
    ("try:\n    return x\nexcept Exception:\n    return x", "try", "try/except"),
    ("s = torch.cuda.Stream()\nreturn x", "stream", "Stream"),
    ("torch.cuda.synchronize()\nreturn x", "banned", "synchronization"),
    ("e = torch.cuda.Event(enable_timing=True)\nreturn x", "banned", "timer events"),
    ("torch.backends.cuda.matmul.allow_tf32 = True\nreturn x", "patch", "monkeypatching"),
    ("self.cache = x\nreturn x", "state", "state kept"),
    ("CACHE.append(x)\nreturn x", "state", "state kept"),
    ("CACHE[0] = x\nreturn x", "state", "state kept"),
    ("global CACHE\nreturn x", "state", "across calls"),
    ("return eval('x')", "dynamic", "eval"),
    ("return getattr(torch, 'relu')(x)", "dynamic", "getattr"),
    ("f = open('/tmp/out.npy', 'rb')\nreturn x", "dynamic", "open"),
    ("return x.__class__", "dynamic", "__class__"),
    ("return torch._C._nn.gelu(x)", "dynamic", "private attribute"),
    ("return torch.load('/tmp/y.pt')", "banned", "reading files"),
    ("return torch.compile(lambda t: t)(x)", "banned", "torch.compile"),
    ("launch(k, (1,), x, x, stream=0)\nreturn x", "stream", "stream="),
    ("x.tofile('/tmp/leak')\nreturn x", "banned", "files"),
    ("f = torch.relu\nreturn f(x)", "value", "torch.relu as a value"),
    ("g = np\nreturn x", "value", "numpy as a value"),
    ("h = lambda t: t.exp()\nreturn x", "compute", ".exp("),
])
def test_each_rule_fires(snippet, rule, fragment):
    extra = "import numpy as np\nCACHE = []\n"
    findings = check_source(model(snippet, extra))
    assert any(f.rule == rule and fragment in f.message for f in findings), findings
    assert all(f.line > 0 for f in findings)


@pytest.mark.parametrize("line, fragment", [
    ("import threading", "threads"), ("import multiprocessing", "threads"),
    ("import time", "timers"), ("from time import perf_counter", "timers"),
    ("import os", "files"), ("import pickle", "files"), ("import gc", "reflection"),
    ("import ctypes", "reflection"), ("import sys", "reflection"),
    ("import tegula.agent.evaluator", "evaluator is off limits"),
    ("from tegula.agent import checks", "evaluator is off limits"),
    ("import torch.utils.cpp_extension", "may import"), ("import triton", "may import"),
    ("from . import helper", "relative imports"), ("import mytask", "the task's reference"),
])
def test_imports(line, fragment):
    findings = check_source(line + "\n" + model("return x"), task_modules=("mytask",))
    assert any(fragment in f.message for f in findings), findings
    assert findings[0].line == 1


def test_kernel_bodies_may_not_call_torch():
    source = model("return x", extra="""
@tg.kernel(threads=128)
def k(x: tg.Tensor[f32]):
    y = torch.relu(x)
""")
    findings = check_source(source)
    assert any("a kernel body" in f.message for f in findings), findings


def test_missing_model_new_and_syntax_errors():
    assert "no class ModelNew" in str(check_source("import torch\n")[0])
    finding = check_source("def f(:\n")[0]
    assert finding.rule == "syntax" and finding.line == 1
