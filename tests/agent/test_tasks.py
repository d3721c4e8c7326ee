"""The task set: every reference runs, is deterministic, is not degenerate on any input
distribution, and its tolerance is sane — loose enough for an f64 recomputation of the
same math (f32 tasks), tight enough that zeros, the output's mean, noise at a few times
the tolerance, and inputs lowered to a cheaper precision all fail."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tegula.agent.checks import compare, degenerate_reason
from tegula.agent.tasks import TaskError, guess_category, load_task, task_from_source
from tegula.agent.taskset import SPECS, builtin_task, task_names, task_source

NAMES = task_names()


def outputs(task, inputs, seed=5):
    model = task.model("small", seed)
    with torch.no_grad():
        out = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    return out.detach().numpy()


def check(task, got, want):
    atol, rtol = task.tolerance_for(str(want.dtype))
    return compare(got.astype(want.dtype), want, atol, rtol)


def test_at_least_thirty_tasks_over_every_category():
    assert len(NAMES) >= 30 and len(set(NAMES)) == len(NAMES)
    assert {builtin_task(n).category for n in NAMES} == {"elementwise", "reduction", "matmul",
                                                         "attention"}


@pytest.mark.parametrize("name", NAMES)
def test_reference_runs_and_tolerance_is_sane(name):
    task = builtin_task(name)
    for k, dist in enumerate(task.distributions):
        inputs = task.make_inputs("small", 100 + k, dist)
        want = outputs(task, inputs)
        assert degenerate_reason(want) is None, (dist, degenerate_reason(want))
        assert np.array_equal(outputs(task, inputs), want)      # deterministic
        assert check(task, want, want).ok
        assert not check(task, np.zeros_like(want), want).ok
        assert not check(task, np.full_like(want, want.astype(np.float64).mean()), want).ok
        atol, rtol = task.tolerance_for(str(want.dtype))
        rms = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
        noise = np.random.default_rng(k).standard_normal(want.shape) * 4 * (atol * rms + rtol
                                                                            * np.abs(want))
        assert not check(task, (want + noise).astype(want.dtype), want).ok
    # A lowered-precision computation (inputs rounded to f16, or to bf16 for f16 tasks)
    # fails on at least one distribution.
    caught = False
    for k, dist in enumerate(task.distributions):
        inputs = task.make_inputs("small", 200 + k, dist)
        lower = torch.bfloat16 if any(isinstance(x, torch.Tensor) and x.dtype == torch.float16
                                      for x in inputs) else torch.float16
        rounded = [x.to(lower).to(x.dtype) if isinstance(x, torch.Tensor)
                   and x.is_floating_point() else x for x in inputs]
        caught |= not check(task, outputs(task, rounded), outputs(task, inputs)).ok
    assert caught, f"{name}: inputs lowered to {lower} pass the tolerance"


@pytest.mark.parametrize("name", [s.name for s in SPECS if ".half()" not in s.body
                                  and ".float()" not in s.body])
def test_f64_recomputation_passes_the_tolerance(name):
    """The same math in f64 is within tolerance of the f32 reference (not too tight)."""
    task = builtin_task(name)
    for k, dist in enumerate(task.distributions):
        inputs = task.make_inputs("small", 300 + k, dist)
        want = outputs(task, inputs)
        model = task.model("small", 5).double()
        with torch.no_grad():
            exact = model(*[x.double() if isinstance(x, torch.Tensor) else x for x in inputs])
        assert check(task, exact.numpy().astype(np.float32), want).ok, dist


def test_distributions_differ_and_seeds_matter():
    task = builtin_task("relu")
    normal, shifted, wide = (task.make_inputs("small", 1, d)[0] for d in task.distributions)
    assert float(shifted.mean()) > 0.5 and abs(float(normal.mean())) < 0.3
    assert not torch.equal(normal, task.make_inputs("small", 2, "normal")[0])
    assert (normal < 0).any() and (normal > 0).any() and (wide != normal).any()


def test_sizes_are_small_for_the_emulator_and_real_for_the_gpu():
    task = builtin_task("matmul_nt")
    assert task.make_inputs("small", 1, "normal")[0].shape == (37, 64)
    assert task.module("real").M == 4096 and task.flops("real") == 2 * 4096 ** 3


KERNELBENCH_FILE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    """Simple model that performs a Swish activation."""
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)

batch_size = 16
dim = 16384

def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]

def get_init_inputs():
    return []  # No special initialization inputs needed
'''


def test_kernelbench_file_format_is_accepted(tmp_path):
    path = tmp_path / "23_Swish.py"
    path.write_text(KERNELBENCH_FILE)
    task = load_task(str(path))
    assert task.name == "23_Swish" and task.category == "elementwise"
    x = task.make_inputs("small", 1, "normal")[0]
    assert x.shape == (16, 16384)
    assert task.tolerance_for("float32") == (1e-4, 1e-4)


def test_builtin_task_files_round_trip(tmp_path):
    path = tmp_path / "softmax.py"
    path.write_text(task_source(SPECS[NAMES.index("softmax")]))
    task = load_task(str(path))
    assert task.category == "reduction" and task.sizes["small"] == {"M": 13, "N": 100}
    assert load_task("softmax").source == task.source


@pytest.mark.parametrize("text, message", [
    ("x = 1\n", "defines no Model"),
    ("raise ValueError('boom')\n", "fails to load: ValueError: boom"),
    (KERNELBENCH_FILE + "TEGULA_TOLERANCE = (0, 0)\n", "TEGULA_TOLERANCE"),
    (KERNELBENCH_FILE + "TEGULA_CATEGORY = 'conv'\n", "TEGULA_CATEGORY"),
    (KERNELBENCH_FILE + "TEGULA_DISTRIBUTIONS = ('uniform',)\n", "TEGULA_DISTRIBUTIONS"),
])
def test_bad_task_files_are_named(text, message):
    with pytest.raises(TaskError, match=message):
        task_from_source("bad", text)


def test_unknown_task_is_named():
    with pytest.raises(TaskError, match="no task 'nope'"):
        load_task("nope")


@pytest.mark.parametrize("source, category", [
    ("torch.matmul(a, b)", "matmul"), ("nn.Linear(4, 4)", "matmul"),
    ("torch.softmax(x, 1)", "reduction"), ("torch.relu(x)", "elementwise"),
    ("F.scaled_dot_product_attention(q, k, v)", "attention")])
def test_category_guess(source, category):
    assert guess_category(source) == category


def test_task_paths_are_absolute(tmp_path):
    path = tmp_path / "t.py"
    path.write_text(KERNELBENCH_FILE)
    assert os.path.isabs(load_task(str(path)).path)
