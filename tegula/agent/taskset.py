"""The built-in task set: KernelBench level 1-2 style problems written for tegula.

Each entry is a short reference (`Model.forward` plus `get_inputs`) that `builtin_task`
turns into a full task file (`tegula agent tasks --write DIR` writes them out): imports,
the size constants at their "real" values, `TEGULA_*` constants and the body. Sizes:
"small" is an odd-shaped problem the emulator runs in well under a second (extents that
do not divide tiles), "real" a GPU-sized one.

Matmul-like tasks take f16 operands and compute in f32 (tegula's tensor cores take
f16/bf16); the rest are f32 in and out. Tolerances are (atol relative to the reference's
rms, rtol): tight enough that computing an f32 task in f16 fails (f16 rounds at 4.9e-4).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from tegula.agent.tasks import Task, task_from_source

EW_SMALL, EW_REAL = {"M": 37, "N": 45}, {"M": 4096, "N": 8192}
ROW_SMALL, ROW_REAL = {"M": 13, "N": 100}, {"M": 4096, "N": 4096}
MM_SMALL, MM_REAL = {"M": 37, "N": 45, "K": 64}, {"M": 4096, "N": 4096, "K": 4096}
ATT_SMALL, ATT_REAL = {"S": 24, "D": 32}, {"S": 2048, "D": 64}
F32_TIGHT = (1e-5, 1e-5)      # one f32 op per element: a few ulp
F32_REDUCE = (1e-5, 1e-4)     # sums over a row reorder
F16_OUT = (2e-3, 2e-3)        # f16 outputs round at 2^-11

HEADER = '''"""tegula agent task {name} ({category}): {doc}"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

'''


@dataclass(frozen=True)
class Spec:
    """One built-in task: its reference body and the TEGULA_* data around it."""

    name: str
    category: str
    doc: str
    body: str
    small: dict
    real: dict
    tolerance: tuple = F32_TIGHT
    flops: str = ""                 # an expression over the size constants, e.g. 2*M*N*K
    extra: dict = field(default_factory=dict)


def _ew(name: str, doc: str, expr: str, tolerance: tuple = F32_TIGHT, init: str = "",
        args: str = "x", inputs: str = "torch.randn(M, N)") -> Spec:
    """An element-wise task: forward(args) returns expr."""
    values = ", ".join(part.split("=")[1].strip() for part in init.split(",")) if init else ""
    init_fn = f"\n\ndef get_init_inputs():\n    return [{values}]\n" if init else ""
    ctor = ("    def __init__(self, " + ", ".join(_init_names(init)) + "):\n"
            "        super().__init__()\n"
            + "".join(f"        self.{p} = {p}\n" for p in _init_names(init)) + "\n"
            ) if init else ""
    body = (f"class Model(nn.Module):\n{ctor}    def forward(self, {args}):\n"
            f"        return {expr}\n\n\ndef get_inputs():\n    return [{inputs}]\n{init_fn}")
    return Spec(name, "elementwise", doc, body, EW_SMALL, EW_REAL, tolerance)


def _init_names(init: str) -> list[str]:
    """`"slope=0.01"` -> ["slope"]: the constructor's parameters."""
    return [part.split("=")[0].strip() for part in init.split(",")] if init else []


def _row(name: str, doc: str, expr: str, category: str = "reduction",
         tolerance: tuple = F32_REDUCE, args: str = "x", inputs: str = "torch.randn(M, N)",
         init: str = "") -> Spec:
    """A row-wise (reduction / normalization) task over (M, N) inputs."""
    spec = _ew(name, doc, expr, tolerance, init, args, inputs)
    return Spec(name, category, doc, spec.body, ROW_SMALL, ROW_REAL, tolerance)


def _mm(name: str, doc: str, expr: str, args: str = "a, b",
        inputs: str = "torch.randn(M, K).half(), torch.randn(N, K).half()",
        tolerance: tuple = F16_OUT, flops: str = "2 * M * N * K",
        category: str = "matmul") -> Spec:
    """A matmul-like task on f16 operands, computed in f32."""
    body = (f"class Model(nn.Module):\n    def forward(self, {args}):\n"
            + "".join(f"        {line}\n" for line in expr.strip().splitlines())
            + f"\n\ndef get_inputs():\n    return [{inputs}]\n")
    return Spec(name, category, doc, body, MM_SMALL, MM_REAL, tolerance, flops)


SPECS: list[Spec] = [
    # ----------------------------------------------------------- element-wise (level 1)
    _ew("relu", "ReLU", "torch.relu(x)", (0.0, 1e-6)),
    _ew("leaky_relu", "LeakyReLU with a slope from get_init_inputs",
        "F.leaky_relu(x, self.slope)", init="slope=0.01"),
    _ew("gelu_tanh", "GELU, tanh approximation", "F.gelu(x, approximate='tanh')"),
    _ew("sigmoid", "sigmoid", "torch.sigmoid(x)"),
    _ew("tanh", "tanh", "torch.tanh(x)"),
    _ew("silu", "SiLU (swish)", "F.silu(x)"),
    _ew("softplus", "softplus", "F.softplus(x)"),
    _ew("elu", "ELU (alpha 1)", "F.elu(x)"),
    _ew("hardtanh", "hardtanh: x clamped to [-1, 1]", "F.hardtanh(x)", (0.0, 1e-6)),
    _ew("hardsigmoid", "hardsigmoid", "F.hardsigmoid(x)"),
    _ew("silu_mul", "the gated-MLP activation SiLU(x) * y", "F.silu(x) * y", args="x, y",
        inputs="torch.randn(M, N), torch.randn(M, N)"),
    _ew("scale_shift", "x * w + b with (N,) vectors broadcast over rows", "x * w + b",
        args="x, w, b", inputs="torch.randn(M, N), torch.randn(N), torch.randn(N)"),
    _ew("add_relu", "relu(x + y) (a residual add and activation)", "torch.relu(x + y)",
        args="x, y", inputs="torch.randn(M, N), torch.randn(M, N)"),
    _ew("square_clamp", "min(x * x, 4): a product and a clamp", "torch.clamp(x * x, max=4.0)"),
    # ----------------------------------------------------------- reductions (level 1)
    _row("sum_rows", "sum over each row (keepdim)", "torch.sum(x, dim=1, keepdim=True)"),
    _row("mean_rows", "mean over each row (keepdim)", "torch.mean(x, dim=1, keepdim=True)"),
    _row("max_rows", "max over each row (keepdim)", "torch.amax(x, dim=1, keepdim=True)",
         tolerance=(0.0, 1e-6)),
    _row("sumsq_rows", "sum of squares over each row", "torch.sum(x * x, dim=1, keepdim=True)"),
    _row("l2_normalize", "rows scaled to unit L2 norm", "F.normalize(x, dim=1)"),
    _row("logsumexp_rows", "log-sum-exp over each row",
         "torch.logsumexp(x, dim=1, keepdim=True)"),
    # ----------------------------------------------------------- norms and softmax
    _row("softmax", "softmax over the rows", "torch.softmax(x, dim=1)"),
    _row("log_softmax", "log-softmax over the rows", "torch.log_softmax(x, dim=1)"),
    _row("rms_norm", "RMSNorm with a (N,) weight, eps 1e-6",
         "x * torch.rsqrt(torch.mean(x * x, dim=1, keepdim=True) + 1e-6) * w",
         args="x, w", inputs="torch.randn(M, N), torch.randn(N)"),
    _row("layer_norm", "LayerNorm with (N,) weight and bias, eps 1e-5",
         "F.layer_norm(x, (x.shape[1],), w, b, 1e-5)", args="x, w, b",
         inputs="torch.randn(M, N), torch.randn(N), torch.randn(N)"),
    _row("softmax_scaled", "softmax of x * temperature (a constructor argument)",
         "torch.softmax(x * self.temperature, dim=1)", init="temperature=0.7"),
    # ----------------------------------------------------------- matmul (level 1, f16)
    _mm("matmul_nt", "c = a @ b.T, f16 operands, f32 accumulation, f16 out",
        "return (a.float() @ b.float().T).half()"),
    _mm("matmul_nn", "c = a @ b with b (K, N), f16 in and out",
        "return (a.float() @ b.float()).half()",
        inputs="torch.randn(M, K).half(), torch.randn(K, N).half()"),
    _mm("matmul_f32_out", "c = a @ b.T in f32 (no rounding of c)",
        "return a.float() @ b.float().T", tolerance=(2e-5, 2e-5)),
    _mm("matvec_rows", "y = a @ b.T for a few rows of a (decode-like)",
        "return (a.float() @ b.float().T).half()",
        inputs="torch.randn(3, K).half(), torch.randn(N, K).half()", flops="2 * 3 * N * K"),
    # ----------------------------------------------------------- fused (level 2, f16)
    _mm("linear_bias_relu", "relu(a @ w.T + bias)",
        "return torch.relu(a.float() @ w.float().T + bias.float()).half()",
        args="a, w, bias",
        inputs="torch.randn(M, K).half(), torch.randn(N, K).half(), torch.randn(N).half()"),
    _mm("linear_gelu", "gelu(a @ w.T + bias), tanh approximation",
        "y = a.float() @ w.float().T + bias.float()\nreturn F.gelu(y, approximate='tanh').half()",
        args="a, w, bias",
        inputs="torch.randn(M, K).half(), torch.randn(N, K).half(), torch.randn(N).half()"),
    _mm("linear_scale_residual", "(a @ w.T) * 0.5 + residual",
        "return ((a.float() @ w.float().T) * 0.5 + r.float()).half()", args="a, w, r",
        inputs="torch.randn(M, K).half(), torch.randn(N, K).half(), torch.randn(M, N).half()"),
    _mm("gated_mlp", "silu(x @ wg.T) * (x @ wu.T)",
        "g = x.float() @ wg.float().T\nu = x.float() @ wu.float().T\nreturn (F.silu(g) * u).half()",
        args="x, wg, wu", flops="4 * M * N * K",
        inputs="torch.randn(M, K).half(), (torch.randn(N, K) / math.sqrt(K)).half(), "
               "(torch.randn(N, K) / math.sqrt(K)).half()"),
    _mm("matmul_softmax", "softmax over the rows of a @ b.T / sqrt(K), f32 out",
        "return torch.softmax((a.float() @ b.float().T) / math.sqrt(a.shape[1]), dim=1)",
        tolerance=(2e-4, 1e-3)),
    _mm("matmul_rownorm", "rms-normalize the rows of a @ b.T (eps 1e-6), f16 out",
        "y = a.float() @ b.float().T\nreturn (y * torch.rsqrt(torch.mean(y * y, 1, keepdim=True) + 1e-6)).half()"),
    # ----------------------------------------------------------- attention (f16)
    Spec("attention", "attention", "one-head attention softmax(q @ k.T / sqrt(D)) @ v",
         "class Model(nn.Module):\n    def forward(self, q, k, v):\n"
         "        s = (q.float() @ k.float().T) / math.sqrt(q.shape[1])\n"
         "        return (torch.softmax(s, dim=1) @ v.float()).half()\n\n\n"
         "def get_inputs():\n    return [torch.randn(S, D).half(), torch.randn(S, D).half(), "
         "torch.randn(S, D).half()]\n", ATT_SMALL, ATT_REAL, (3e-3, 3e-3), "4 * S * S * D"),
    Spec("attention_causal", "attention", "one-head causal attention",
         "class Model(nn.Module):\n    def forward(self, q, k, v):\n"
         "        s = (q.float() @ k.float().T) / math.sqrt(q.shape[1])\n"
         "        mask = torch.ones(s.shape, dtype=torch.bool).tril()\n"
         "        s = s.masked_fill(~mask, float('-inf'))\n"
         "        return (torch.softmax(s, dim=1) @ v.float()).half()\n\n\n"
         "def get_inputs():\n    return [torch.randn(S, D).half(), torch.randn(S, D).half(), "
         "torch.randn(S, D).half()]\n", ATT_SMALL, ATT_REAL, (3e-3, 3e-3), "2 * S * S * D"),
    # ----------------------------------------------------------- with parameters (KernelBench style)
    Spec("scale_param", "elementwise", "x * a learned (N,) scale made in __init__ (seeded)",
         "class Model(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
         "        self.scale = nn.Parameter(torch.randn(n))\n\n"
         "    def forward(self, x):\n        return x * self.scale\n\n\n"
         "def get_inputs():\n    return [torch.randn(M, N)]\n\n\n"
         "def get_init_inputs():\n    return [N]\n", EW_SMALL, EW_REAL),
]


def task_source(spec: Spec) -> str:
    """The full task file of a built-in task (real sizes as the module's constants)."""
    constants = "".join(f"{k} = {v}\n" for k, v in spec.real.items())
    flops = (f"\n\ndef tegula_flops():\n    return {spec.flops}\n" if spec.flops else "")
    body = spec.body if "def get_init_inputs" in spec.body else (
        spec.body + "\n\ndef get_init_inputs():\n    return []\n")
    return (HEADER.format(name=spec.name, category=spec.category, doc=spec.doc) + constants
            + f"TEGULA_CATEGORY = {spec.category!r}\n"
            + f"TEGULA_SIZES = {{'small': {spec.small!r}, 'real': {spec.real!r}}}\n"
            + f"TEGULA_TOLERANCE = {spec.tolerance!r}\n\n\n" + body + flops)


_BY_NAME = {spec.name: spec for spec in SPECS}


def task_names() -> list[str]:
    """Names of the built-in tasks, in catalogue order."""
    return [spec.name for spec in SPECS]


@lru_cache(maxsize=None)
def builtin_task(name: str) -> Task:
    """The built-in task called `name` (one Task object per name: it caches its modules)."""
    spec = _BY_NAME[name]
    return task_from_source(spec.name, task_source(spec))


__all__ = ["SPECS", "Spec", "task_names", "builtin_task", "task_source"]
