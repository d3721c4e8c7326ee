"""CUDA C++ source → cubin, with NVRTC in-process or an `nvcc -cubin` subprocess.

NVRTC (through `cuda.bindings.nvrtc`) needs no GPU and no toolkit install — the
`nvidia-cuda-nvrtc` wheel is enough, because generated sources include no headers. When
NVRTC cannot be loaded, `nvcc` (found through `$CUDA_HOME`, `$PATH` or /usr/local/cuda)
is used instead. `$TEGULA_COMPILER=nvrtc|nvcc` forces one. Both produce SASS for exactly
the requested target (`sm_90a` as `-gencode=arch=compute_90a,code=sm_90a`): tegula ships
and caches cubins, never PTX, so nothing is JIT-compiled by the driver at load time.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from tegula.errors import CompileError

#: Options every compile gets (both compilers understand them). No fast-math: division,
#: sqrt and denormals stay IEEE, as the emulator computes them. Multiply-add contraction
#: stays on (both compilers' default, as in Triton): an f32 `a * b + c` may round once
#: where the emulator rounds twice (docs/compiler.md, "Floats on the GPU and in the emulator").
DEFAULT_OPTIONS: tuple[str, ...] = ("-std=c++17",)


@dataclass(frozen=True)
class Compiler:
    """One available compiler: `kind` ("nvrtc" or "nvcc"), a version string for cache keys,
    and, for nvcc, the executable."""

    kind: str
    version: str
    path: str = ""


def _check_target(target: str) -> str:
    match = re.fullmatch(r"sm_(\d+[a-z]?)", target)
    if match is None:
        raise ValueError(f"target must look like 'sm_80' or 'sm_90a', not {target!r}")
    return match.group(1)


@functools.lru_cache(maxsize=None)
def _nvrtc():
    """The NVRTC bindings module, or None when they (or libnvrtc) cannot be loaded."""
    try:
        from cuda.bindings import nvrtc
        err, major, minor = nvrtc.nvrtcVersion()
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None
        return nvrtc
    except Exception:  # ImportError, or the shared library failed to load
        return None


def find_nvcc() -> str | None:
    """Path of an nvcc executable, or None."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.access(default, os.X_OK) else None


@functools.lru_cache(maxsize=None)
def _nvcc_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"V(\d+\.\d+\.\d+)", out.stdout)
    return match.group(1) if match else out.stdout.strip().splitlines()[-1:][0]


def available_compilers() -> list[Compiler]:
    """The compilers usable here, preferred first (NVRTC, then nvcc)."""
    found = []
    nvrtc = _nvrtc()
    if nvrtc is not None:
        _, major, minor = nvrtc.nvrtcVersion()
        found.append(Compiler("nvrtc", f"nvrtc-{major}.{minor}"))
    nvcc = find_nvcc()
    if nvcc is not None:
        found.append(Compiler("nvcc", f"nvcc-{_nvcc_version(nvcc)}", nvcc))
    return found


def default_compiler() -> Compiler:
    """The compiler `compile_cuda` uses: `$TEGULA_COMPILER` if set, else the first available."""
    compilers = available_compilers()
    wanted = os.environ.get("TEGULA_COMPILER")
    if wanted:
        compilers = [c for c in compilers if c.kind == wanted]
    if not compilers:
        why = f" named by TEGULA_COMPILER={wanted}" if wanted else ""
        raise CompileError(
            f"no CUDA compiler{why} found: install NVRTC (`pip install cuda-bindings "
            f"nvidia-cuda-nvrtc`) or put nvcc on PATH / set CUDA_HOME")
    return compilers[0]


def compile_cuda(source: str, name: str, target: str = "sm_90a",
                 options: tuple[str, ...] = (), compiler: Compiler | None = None) -> bytes:
    """Compile `source` (defining kernel `name`) to a cubin for `target`.

    Raises `CompileError` carrying the compiler's log and the source lines it points at.
    """
    return _compile(source, name, target, options, compiler)[0]


def compile_cuda_report(source: str, name: str, target: str = "sm_90a",
                        options: tuple[str, ...] = (),
                        compiler: Compiler | None = None) -> tuple[bytes, "PtxasReport"]:
    """`compile_cuda` with ptxas's verbose report (`--ptxas-options=-v`): the cubin and
    what the compiler says of kernel `name` (registers, spills, stack, its warnings).
    The machine code is the same as without the report (the ELF records the option)."""
    cubin, log = _compile(source, name, target, tuple(options) + (PTXAS_VERBOSE,), compiler)
    return cubin, parse_ptxas_log(log, name)


#: Both compilers accept it: ptxas prints each function's resources into the log.
PTXAS_VERBOSE = "--ptxas-options=-v"


def _compile(source: str, name: str, target: str, options: tuple[str, ...],
             compiler: Compiler | None) -> tuple[bytes, str]:
    """(cubin, the compiler's log) for `source`."""
    _check_target(target)
    compiler = compiler or default_compiler()
    opts = DEFAULT_OPTIONS + tuple(options)
    if compiler.kind == "nvrtc":
        return _compile_nvrtc(source, name, target, opts)
    return _compile_nvcc(source, name, target, opts, compiler.path)


@dataclass(frozen=True)
class PtxasReport:
    """What ptxas reported for one kernel: `registers` per thread, bytes of `spill_stores`,
    `spill_loads` and `stack_frame` (local memory), static `shared_bytes`, `barriers`, and
    its performance `warnings` (e.g. wgmma serialized for lack of registers)."""

    kernel: str
    target: str
    registers: int
    spill_stores: int = 0
    spill_loads: int = 0
    stack_frame: int = 0
    shared_bytes: int = 0
    barriers: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)

    def __str__(self) -> str:
        spill = (f"SPILLS {self.spill_stores} B stored, {self.spill_loads} B loaded"
                 if self.spills else "no spills")
        lines = [f"compiler's report (ptxas, {self.target}): {self.registers} registers per "
                 f"thread, {spill}, {self.stack_frame} B stack frame, {self.shared_bytes} B "
                 f"static shared memory, {self.barriers} barrier(s)"]
        lines += [f"  ptxas: {w}" for w in self.warnings]
        return "\n".join(lines)


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_NUMBERS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack_frame": re.compile(r"(\d+) bytes stack frame"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "barriers": re.compile(r"used (\d+) barriers"),
}


def parse_ptxas_log(log: str, kernel: str) -> "PtxasReport | None":
    """The report of entry function `kernel` in a `ptxas -v` log (NVRTC's program log or
    nvcc's output), or None when the log holds none (the option was not given). Warnings
    ("Potential Performance Loss", "Registers are spilled") anywhere in the log are kept:
    a generated source has one kernel."""
    sections = _ENTRY.split(log)
    # split gives [before, name1, target1, text1, name2, ...]
    for i in range(1, len(sections) - 2, 3):
        found_name, target, text = sections[i], sections[i + 1], sections[i + 2]
        if found_name != kernel:
            continue
        values = {}
        for field_name, pattern in _NUMBERS.items():
            match = pattern.search(text)
            values[field_name] = int(match.group(1)) if match else 0
        if not _NUMBERS["registers"].search(text):
            return None
        warnings = tuple(dict.fromkeys(
            re.sub(r"^ptxas\s+(info|warning)\s*:\s*", "", line).strip()
            for line in log.splitlines()
            if re.search(r"Performance Loss|spill|warning", line, re.I)
            and "bytes spill stores" not in line))
        return PtxasReport(found_name, target, warnings=warnings, **values)
    return None


def _compile_nvrtc(source: str, name: str, target: str,
                   options: tuple[str, ...]) -> tuple[bytes, str]:
    nvrtc = _nvrtc()
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    if err != ok:
        raise CompileError(f"nvrtcCreateProgram failed: {err}")
    try:
        args = [f"--gpu-architecture={target}".encode()] + [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(args), args)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log_text = ""
        if size > 1:
            # NVRTC writes into the buffer it is given. `b" " * 1` is CPython's interned
            # one-byte object, so an empty log (size 1: the NUL) would overwrite every b" "
            # of the process (print's spaces became NULs); only ask for non-empty logs.
            log = bytes(size)
            nvrtc.nvrtcGetProgramLog(prog, log)
            log_text = log.rstrip(b"\x00 ").decode(errors="replace")
        if result != ok:
            raise compile_error("NVRTC", target, log_text, source)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        if err != ok or size == 0:
            raise CompileError(f"NVRTC produced no cubin for {target} ({err}); log:\n{log_text}")
        cubin = bytes(size)  # a fresh object (size > 1): NVRTC writes into it
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if err != ok:
            raise CompileError(f"nvrtcGetCUBIN failed: {err}")
        return bytes(cubin), log_text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def nvcc_arch_flag(target: str) -> str:
    """`-gencode=arch=compute_90a,code=sm_90a` for "sm_90a": SASS only, no PTX embedded."""
    version = _check_target(target)
    return f"-gencode=arch=compute_{version},code=sm_{version}"


def _compile_nvcc(source: str, name: str, target: str, options: tuple[str, ...],
                  nvcc: str) -> tuple[bytes, str]:
    with tempfile.TemporaryDirectory(prefix="tegula-nvcc-") as tmp:
        src = os.path.join(tmp, f"{name}.cu")
        out = os.path.join(tmp, f"{name}.cubin")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, "-cubin", nvcc_arch_flag(target), *options, "-o", out, src]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            log = (proc.stdout + proc.stderr).replace(src, f"{name}.cu")
            raise compile_error("nvcc", target, log, source)
        with open(out, "rb") as f:
            return f.read(), (proc.stdout + proc.stderr).replace(src, f"{name}.cu")


def compile_error(compiler: str, target: str, log: str, source: str) -> CompileError:
    """A CompileError quoting the log and, for each line the log names, that source line."""
    lines = source.splitlines()
    quoted: list[str] = []
    error_lines = {int(m) for m in re.findall(r"\((\d+)\): (?:catastrophic )?error", log)}
    for num in sorted(error_lines):
        if 1 <= num <= len(lines):
            for i in range(max(1, num - 2), min(len(lines), num + 2) + 1):
                mark = ">>" if i == num else "  "
                quoted.append(f"{mark} {i:5d} | {lines[i - 1]}")
            quoted.append("   ...")
    text = f"{compiler} rejected the generated source for {target}:\n{log.strip()}"
    if quoted:
        text += "\n\nsource lines the log points at:\n" + "\n".join(quoted)
    return CompileError(text)


def find_cuobjdump() -> str | None:
    """Path of cuobjdump (toolkit, PATH, or the `nvidia-cuda-cuobjdump` wheel), or None."""
    nvcc = find_nvcc()
    candidates = [os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cuobjdump")] if nvcc else []
    candidates.append(shutil.which("cuobjdump") or "")
    try:
        import nvidia  # namespace package of NVIDIA's wheels
        for root in nvidia.__path__:
            candidates += [os.path.join(root, sub, "bin", "cuobjdump") for sub in ("cu13", "cu12")]
            candidates.append(os.path.join(root, "cuda_cuobjdump", "bin", "cuobjdump"))
    except ImportError:
        pass
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    return None


def disassemble(cubin: bytes) -> str | None:
    """The SASS of a cubin as cuobjdump prints it, or None when cuobjdump is unavailable."""
    tool = find_cuobjdump()
    if tool is None:
        return None
    # cuobjdump runs nvdisasm, which the wheels install beside it but not on PATH.
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(tool) + os.pathsep + env.get("PATH", "")
    if shutil.which("nvdisasm", path=env["PATH"]) is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        proc = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                              check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {proc.stderr.strip()}")
    return proc.stdout
