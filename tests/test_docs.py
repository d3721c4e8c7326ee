"""The user-facing docs hold: every code block of docs/first-kernel.md runs, and every path
the README, docs, examples and docstrings mention exists inside the repository."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import types

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TUTORIAL = os.path.join(ROOT, "docs", "first-kernel.md")
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(path: str) -> list[tuple[str, str, str]]:
    """(language, info after it, code) of every fenced block, in order."""
    with open(path, encoding="utf-8") as f:
        return [(lang, info.strip(), code) for lang, info, code in BLOCK.findall(f.read())]


def run_tutorial(folder: str, gpu: bool) -> list[str]:
    """Do what the page says in `folder`: save the `my_kernels.py` blocks there, run the
    Python blocks in order in one namespace and the `tegula` commands as the CLI; returns
    what was run. `gpu` blocks run only when `gpu`, else they are only compiled."""
    from tegula.cli import main as tegula_main

    parts = blocks(TUTORIAL)
    with open(os.path.join(folder, "my_kernels.py"), "w", encoding="utf-8") as f:
        f.write("".join(code for lang, info, code in parts if info == "my_kernels.py"))
    # A real module in sys.modules: torch.compile imports the module of every global it
    # reads, so a bare namespace dict with an invented __name__ breaks dynamo.
    module = types.ModuleType("tegula_tutorial_blocks")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    done, cwd = [], os.getcwd()
    sys.path.insert(0, folder)
    os.chdir(folder)
    try:
        for number, (lang, info, code) in enumerate(parts):
            where = f"docs/first-kernel.md block {number} ({lang} {info})"
            if lang == "python" and info != "my_kernels.py":
                compiled = compile(code, where, "exec")
                if info == "gpu" and not gpu:
                    continue
                exec(compiled, namespace)  # noqa: S102 — the tutorial's own code
                done.append(where)
            elif lang == "bash":
                for line in code.splitlines():
                    if line.strip():
                        argv = shlex.split(line)
                        assert argv[0] == "tegula", f"{where}: not a tegula command: {line}"
                        assert tegula_main(argv[1:]) == 0, f"{where}: {line} failed"
                        done.append(line)
    finally:
        os.chdir(cwd)
        sys.path.remove(folder)
        sys.modules.pop("my_kernels", None)
        sys.modules.pop(module.__name__, None)
    return done


def test_tutorial_blocks_are_all_recognized():
    kinds = {(lang, info) for lang, info, _ in blocks(TUTORIAL)}
    assert kinds <= {("python", ""), ("python", "my_kernels.py"), ("python", "gpu"),
                     ("bash", "")}, kinds
    assert ("python", "gpu") in kinds and ("bash", "") in kinds


def test_first_kernel_tutorial_runs_end_to_end(tmp_path):
    pytest.importorskip("torch")
    from tegula.runtime.compiler import available_compilers

    if not available_compilers():
        pytest.skip("the tutorial's compile step needs NVRTC or nvcc")
    done = run_tutorial(str(tmp_path), gpu=False)
    assert any("tegula compile my_kernels.py:gemm_bias_relu" in d for d in done)
    assert (tmp_path / "build" / "gemm_bias_relu.cubin").read_bytes()[:4] == b"\x7fELF"
    # every non-GPU Python block ran
    python_blocks = [b for b in blocks(TUTORIAL) if b[0] == "python" and b[1] == ""]
    assert sum("(python )" in d for d in done) == len(python_blocks)


@pytest.mark.gpu
def test_first_kernel_tutorial_runs_on_a_gpu(tmp_path):
    # A fresh process: the tutorial registers a torch op, which a process can do once.
    done = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# ------------------------------------------------------------------------- references

USER_FACING = [os.path.join(ROOT, "README.md")] + \
    [os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
     if f.endswith(".md")] + \
    [os.path.join(folder, f) for top in ("tegula", "examples")
     for folder, _, files in os.walk(os.path.join(ROOT, top)) for f in files
     if f.endswith(".py")]
OUTSIDE = re.compile(r"\.\./shared|DESIGN\.md|\.library/|/work/")
MENTIONED = re.compile(r"`((?:docs|examples|benchmarks|tests|tegula)/[\w./-]+)`")


@pytest.mark.parametrize("path", USER_FACING, ids=lambda p: os.path.relpath(p, ROOT))
def test_references_resolve_inside_the_repository(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    outside = sorted(set(OUTSIDE.findall(text)))
    assert not outside, f"{os.path.relpath(path, ROOT)} points outside the repository: {outside}"
    for mentioned in MENTIONED.findall(text):
        target = mentioned.rstrip(".").split(":")[0]
        if any(c in target for c in "*<>{"):
            continue  # a pattern such as benchmarks/results/<suite>-<date>.json
        assert os.path.exists(os.path.join(ROOT, target)), \
            f"{os.path.relpath(path, ROOT)} mentions {mentioned}, which does not exist"


if __name__ == "__main__":  # the GPU test's fresh process: python tests/test_docs.py DIR
    print("\n".join(run_tutorial(sys.argv[1], gpu=True)))


def test_readme_layout_examples_run_and_the_tv_example_is_a_tv_layout(capsys, tmp_path,
                                                                        monkeypatch):
    from tegula.cli import main as tegula_main

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        commands = re.findall(r"`(tegula layout [^`]+)`", f.read())
    assert any("--tv" in c for c in commands) and any("--swizzle" in c for c in commands)
    monkeypatch.chdir(tmp_path)  # an --svg example writes where it is run
    for command in commands:
        argv = [a for a in shlex.split(command)[2:] if a not in ("[--svg", "out.svg]")]
        assert tegula_main(["layout", *argv]) == 0, command
        out = capsys.readouterr().out
        if "--tv" in argv:  # a whole TV layout: every cell of the tile covered
            assert "T0V0" in out and "covers" not in out and " . " not in out, command
