"""Every file in examples/ runs: its `main()` emulates its kernels and checks them against
numpy (at a small size where it takes one), and each module-level kernel explains and, where
a CUDA compiler is installed, compiles for sm_80 (sm_90a for a kernel only it runs)."""
from __future__ import annotations

import importlib.util
import inspect
import os

import pytest

from tegula.cli import main as cli_main
from tegula.lang.kernel import Kernel

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
FILES = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py"))

# Constexprs an example's kernel needs for `tegula explain` / `compile` (no default).
DEFINES = {"layer_norm": ["-D", "N=300"], "rms_norm": ["-D", "N=300"]}
# Kernels that state sm_90a-only constructs (warp-role blocks) compile for that target.
TARGETS = {"warp_roles_gemm": "sm_90a"}
# Small problem sizes for the examples whose main takes them (each still has ragged edges).
SMALL = {"layer_norm.py": dict(m=9, n=200), "softmax.py": dict(m=9, n=200),
         "rms_norm.py": dict(m=9, n=200), "gemm_epilogue.py": dict(m=70, n=72, k=40),
         "persistent_gemm.py": dict(m=70, n=97, k=40, num_sms=5)}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_example_{name[:-3]}",
                                                  os.path.join(EXAMPLES, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_cover_the_row_kernels_a_fused_gemm_and_attention():
    # issue 14: the row kernels, a GEMM with a fused epilogue and attention, each run in
    # the emulator by test_example_runs_and_checks_itself
    assert {"softmax.py", "rms_norm.py", "layer_norm.py", "gemm.py",
            "gemm_epilogue.py", "attention.py"} <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_example_runs_and_checks_itself(name, capsys):
    module = _load(name)
    run = module.main
    kwargs = SMALL.get(name, {})
    assert set(kwargs) <= set(inspect.signature(run).parameters)
    run(**kwargs)
    assert "ok" in capsys.readouterr().out or name in ("gemm.py", "copy_transpose.py")


KERNELS = [(name, attr) for name in FILES for attr, value in vars(_load(name)).items()
           if isinstance(value, Kernel)]


def test_every_new_example_defines_its_kernel_in_the_file():
    defined = {name for name, _ in KERNELS}
    assert {"softmax.py", "rms_norm.py", "layer_norm.py", "gemm.py",
            "gemm_epilogue.py"} <= defined


@pytest.mark.parametrize("name, kernel", KERNELS)
def test_example_kernels_explain_and_compile(name, kernel, capsys, tmp_path):
    spec = f"{os.path.join(EXAMPLES, name)}:{kernel}"
    small = ["-D", "BM=64", "-D", "BN=64"] if "gemm" in kernel else []
    defines = DEFINES.get(kernel, []) + small
    assert cli_main(["explain", spec, *defines]) == 0
    assert f"kernel {kernel}" in capsys.readouterr().out
    from tegula.runtime.compiler import available_compilers
    if not available_compilers():
        pytest.skip("no CUDA compiler (NVRTC or nvcc) installed")
    assert cli_main(["compile", spec, "--target", TARGETS.get(kernel, "sm_80"), "--out",
                     str(tmp_path),
                     *defines]) == 0
    assert (tmp_path / f"{kernel}.cubin").read_bytes()[:4] == b"\x7fELF"
