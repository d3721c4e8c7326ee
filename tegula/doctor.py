"""`tegula doctor`: what is installed here and which of emulate / compile / launch works.

Each probe is a small function returning a `Finding` (what was found, whether it is usable,
and the fix when it is not); `diagnose()` runs them all — every probe catches its own
failures, so a broken install is reported, never a traceback — and `verdicts()` turns the
findings into the three answers a user needs:

* emulate — numpy, and a tiny kernel run in the emulator;
* compile — NVRTC or nvcc, and a test compile of a tiny kernel to a cubin;
* launch  — the above, cuda-bindings, an NVIDIA driver with a GPU, and torch built with CUDA.

Like `tegula.build`, this module sits above the pipeline (it compiles and emulates a kernel).
"""
from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

GPU_EXTRA = "pip install 'tegula[gpu]'  (cuda-bindings and the nvidia-cuda-nvrtc wheel)"


@dataclass
class Finding:
    """One line of the report: `name: detail`, usable or not, and the fix when not."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    extra: list[str] = field(default_factory=list)  # further indented lines


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- probes

def probe_python() -> Finding:
    import tegula

    where = os.path.dirname(os.path.abspath(tegula.__file__))
    ok = sys.version_info >= (3, 10)
    return Finding("python", ok, f"{platform.python_version()} ({sys.executable}); tegula "
                   f"{tegula.__version__} at {where}", "" if ok else "tegula needs Python 3.10+")


def probe_numpy() -> Finding:
    try:
        import numpy
    except ImportError:
        return Finding("numpy", False, "not installed", "pip install numpy")
    return Finding("numpy", True, numpy.__version__)


def probe_torch() -> Finding:
    try:
        import torch
    except ImportError:
        return Finding("torch", False, "not installed (needed only to launch on tensors)",
                       "pip install torch (a CUDA build: https://pytorch.org/get-started)")
    cuda = torch.version.cuda
    if cuda is None:
        return Finding("torch", False, f"{torch.__version__}, a CPU-only build",
                       "install a CUDA build of torch to launch kernels on tensors")
    if not torch.cuda.is_available():
        return Finding("torch", False, f"{torch.__version__} (CUDA {cuda}), but "
                       f"torch.cuda.is_available() is False",
                       "torch sees no GPU: check the driver (below) and CUDA_VISIBLE_DEVICES")
    return Finding("torch", True, f"{torch.__version__} (CUDA {cuda}), "
                   f"{torch.cuda.device_count()} GPU(s) visible")


def probe_cuda_bindings() -> Finding:
    version = _version("cuda-bindings") or _version("cuda-python")
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        return Finding("cuda-bindings", False, "not installed", GPU_EXTRA)
    return Finding("cuda-bindings", True, version or "installed (version unknown)")


def probe_nvrtc() -> Finding:
    from tegula.runtime import compiler

    nvrtc = compiler._nvrtc()
    if nvrtc is None:
        return Finding("NVRTC", False, "cannot be loaded", GPU_EXTRA)
    _, major, minor = nvrtc.nvrtcVersion()
    found = Finding("NVRTC", True, f"{major}.{minor}")
    return _test_compile(found, compiler.Compiler("nvrtc", f"nvrtc-{major}.{minor}"))


def probe_nvcc() -> Finding:
    from tegula.runtime import compiler

    path = compiler.find_nvcc()
    if path is None:
        return Finding("nvcc", False, "not found (optional: NVRTC is enough)",
                       "only needed without NVRTC: install the CUDA toolkit or set CUDA_HOME")
    found = Finding("nvcc", True, f"{compiler._nvcc_version(path)} at {path}")
    if compiler._nvrtc() is not None:
        return found  # NVRTC is used first; its test compile stands for the compile path
    return _test_compile(found, compiler.Compiler("nvcc", f"nvcc-{compiler._nvcc_version(path)}",
                                                  path))


def _test_compile(found: Finding, which) -> Finding:
    """Compile a tiny tegula kernel to a cubin with `which`; record the outcome."""
    import time

    from tegula.runtime.compiler import compile_cuda

    try:
        source, name = _tiny_kernel_source()
        start = time.perf_counter()
        cubin = compile_cuda(source, name, "sm_80", compiler=which)
        ok = cubin[:4] == b"\x7fELF"
        found.extra.append(f"test compile (sm_80): {'ok' if ok else 'FAILED, not a cubin'}, "
                           f"{len(cubin)} bytes in {time.perf_counter() - start:.2f} s")
        found.ok = ok
    except Exception as err:  # noqa: BLE001 — a doctor reports whatever went wrong
        found.ok = False
        found.extra.append(f"test compile FAILED: {type(err).__name__}: {_first_line(err)}")
        found.fix = found.fix or "reinstall it: " + GPU_EXTRA
    return found


def _tiny_kernel_source() -> tuple[str, str]:
    from tegula.build import build
    from tegula.dtypes import f32
    from tegula.kernels.copy import copy_kernel

    result = build(copy_kernel(f32), dict(BM=4, BN=64))
    return result.cuda_source(), result.thread_kernel.name


def probe_driver() -> Finding:
    """The NVIDIA driver through cuda-bindings: version, and each GPU with its target."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return Finding("driver", False, "unknown (cuda-bindings not installed)", GPU_EXTRA)
    try:
        err, = driver.cuInit(0)
    except Exception as e:  # noqa: BLE001 — libcuda.so not found raises here
        return Finding("driver", False, f"no NVIDIA driver ({_first_line(e)})",
                       "launching needs a machine with an NVIDIA GPU and its driver; "
                       "emulate and compile work without one")
    if err != driver.CUresult.CUDA_SUCCESS:
        return Finding("driver", False, f"cuInit failed: {err.name}",
                       "check that the GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)")
    _, version = driver.cuDriverGetVersion()
    _, count = driver.cuDeviceGetCount()
    found = Finding("driver", count > 0, f"CUDA {version // 1000}.{version % 1000 // 10}, "
                    f"{count} GPU(s)", "" if count else "no GPU visible to the driver")
    for index in range(count):
        found.extra.append(_gpu_line(driver, index))
    return found


def _gpu_line(driver, index: int) -> str:
    _, dev = driver.cuDeviceGet(index)
    _, name = driver.cuDeviceGetName(64, dev)
    attr = driver.CUdevice_attribute
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    text = name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name)
    return f"GPU {index}: {text}, compute capability {major}.{minor}"


def probe_cache() -> Finding:
    """The cubin cache directory: path, owner, permissions, size, and whether the runtime
    will trust it (the same rule `tegula.runtime.cache` applies)."""
    from tegula.runtime import cache

    root = cache.default_cache_dir()
    if not root.exists():
        return Finding("cache", True, f"{root} (not created yet; made 0700 on first compile)")
    try:
        st = root.stat()
    except OSError as e:
        return Finding("cache", False, f"{root}: cannot stat ({e.strerror})",
                       "set TEGULA_CACHE_DIR to a directory you own")
    owner = _user_name(st.st_uid)
    files, size = _tree_size(root)
    detail = (f"{root}, owner {owner}, mode {st.st_mode & 0o777:04o}, {files} files, "
              f"{_human(size)}")
    why = cache._distrust(st)
    if why is not None:
        return Finding("cache", False, f"{detail}; the runtime refuses it: it {why}",
                       f"chmod 700 {root} (if yours), or set TEGULA_CACHE_DIR to a directory "
                       f"you own; kernels still compile, uncached")
    return Finding("cache", True, detail)


def _user_name(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _tree_size(root: Path) -> tuple[int, int]:
    files = size = 0
    for folder, _, names in os.walk(root, followlinks=False):
        for name in names:
            try:
                size += os.lstat(os.path.join(folder, name)).st_size
                files += 1
            except OSError:
                pass
    return files, size


def _human(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def probe_emulator() -> Finding:
    """A tiny copy kernel run in the emulator and checked element by element."""
    try:
        import numpy as np

        from tegula.build import emulate
        from tegula.dtypes import f32
        from tegula.kernels.copy import copy_kernel

        x = np.arange(5 * 70, dtype=np.float32).reshape(5, 70) * 0.5 - 3.0
        y = np.full_like(x, np.nan)
        emulate(copy_kernel(f32), (2, 2), x, y, BM=4, BN=64)
        ok = bool(np.array_equal(x, y))
        return Finding("emulator", ok, "a 5x70 copy kernel ran and matched" if ok else
                       "a 5x70 copy kernel gave a wrong result (a tegula bug; please report)")
    except Exception as err:  # noqa: BLE001
        return Finding("emulator", False, f"{type(err).__name__}: {_first_line(err)}",
                       "a tegula bug or a broken install; reinstall with pip install -e .")


def probe_c_launcher() -> Finding:
    """Whether replayed launches go through the small C extension (`runtime/fastcall.py`,
    built with the system compiler on first use) or the slower pure-Python/ctypes path."""
    from tegula.runtime import fastcall
    if fastcall.c_extension() is not None:
        return Finding("C launcher", True, "built and loaded: replayed launches key, pack and "
                       "call cuLaunchKernel from C")
    return Finding("C launcher", False, f"not in use ({fastcall.unavailable}); launches work "
                   "through Python and ctypes, with about twice the host time per launch",
                   "install a C compiler and the Python headers (e.g. gcc and python3-dev), "
                   "or leave TEGULA_C_LAUNCHER unset")


def probe_torch_extension() -> Finding:
    """Whether the optional C++ extension linked against torch (`runtime/torch_alloc.py`:
    replayed entry points allocate their outputs and read their tensors' replay keys from
    C++) is in the cache, will be built, or cannot be. Not built here: the first CUDA
    entry-point call builds it in the background."""
    name, without = "torch C++", "entry points work without it, ~1.5 µs more host time a call"
    try:
        import torch  # noqa: F401
    except ImportError:
        return Finding(name, False, "no torch (needed only to launch on tensors)",
                       "pip install torch")
    from tegula.runtime import torch_alloc
    if os.environ.get("TEGULA_TORCH_ALLOCATOR", "1") == "0":
        return Finding(name, False, f"turned off by TEGULA_TORCH_ALLOCATOR=0; {without}",
                       "unset TEGULA_TORCH_ALLOCATOR")
    why = torch_alloc.cannot_build()
    if why is not None:
        return Finding(name, False, f"cannot be built: {why}; {without}",
                       "install a C++ compiler (g++) and a torch with its headers")
    try:
        module = torch_alloc._prepare(build=False)
    except Exception as err:  # noqa: BLE001
        return Finding(name, False, f"{type(err).__name__}: {_first_line(err)}; {without}",
                       "delete the cache directory's entry (tegula rebuilds it)")
    if module is not None:
        return Finding(name, True, "in the cache: replayed entry points allocate their "
                       "outputs and read their arguments from C++")
    return Finding(name, True, "not built yet: the first CUDA entry-point call builds it in "
                   "the background (about 15 s, once per machine and torch version)")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


PROBES: list[Callable[[], Finding]] = [probe_python, probe_numpy, probe_torch,
                                       probe_cuda_bindings, probe_nvrtc, probe_nvcc,
                                       probe_driver, probe_cache, probe_c_launcher,
                                       probe_torch_extension, probe_emulator]


def diagnose(probes: list[Callable[[], Finding]] | None = None) -> dict[str, Finding]:
    """Every probe's finding by name (a probe that raises is reported as a failure)."""
    found = {}
    for probe in probes or PROBES:
        try:
            finding = probe()
        except Exception as err:  # noqa: BLE001
            name = probe.__name__.removeprefix("probe_")
            finding = Finding(name, False, f"probe failed: {type(err).__name__}: "
                              f"{_first_line(err)}")
        found[finding.name] = finding
    return found


# --------------------------------------------------------------------------- verdicts

def verdicts(found: dict[str, Finding]) -> list[tuple[str, bool, str]]:
    """(capability, works, why or how to fix) for emulate, compile and launch."""
    def ok(name: str) -> bool:
        return name in found and found[name].ok

    def fixes(*names: str) -> str:
        return "; ".join(f"{n}: {found[n].fix or found[n].detail}" for n in names
                         if n in found and not found[n].ok)

    emulate = ok("numpy") and ok("emulator")
    compiler = "NVRTC" if ok("NVRTC") else "nvcc" if ok("nvcc") else None
    compile_ = compiler is not None
    launch_needs = ("cuda-bindings", "driver", "torch")
    launch = compile_ and all(ok(n) for n in launch_needs)
    return [
        ("emulate", emulate, "tg.emulate(kernel, grid, *arrays) runs kernels on the CPU"
         if emulate else fixes("numpy", "emulator")),
        ("compile", compile_, f"tegula compile / explain build cubins with {compiler}"
         if compile_ else fixes("NVRTC", "nvcc") or GPU_EXTRA),
        ("launch", launch, "kernel[grid](*tensors) runs on the GPU" if launch else
         fixes(*launch_needs) + ("; and a compiler (above)" if not compile_ else "")),
    ]


def report(found: dict[str, Finding]) -> str:
    """The text `tegula doctor` prints."""
    lines = ["tegula doctor", ""]
    width = max(len(name) for name in found)
    for finding in found.values():
        mark = "ok  " if finding.ok else "--  "
        lines.append(f"{mark}{finding.name:<{width}}  {finding.detail}")
        lines += [f"{'':4}{'':<{width}}  {line}" for line in finding.extra]
        if not finding.ok and finding.fix:
            lines.append(f"{'':4}{'':<{width}}  fix: {finding.fix}")
    lines += ["", "what works here:"]
    for what, works, why in verdicts(found):
        lines.append(f"  {what:<8} {'yes' if works else 'NO '}  "
                     f"{why if works else 'fix: ' + why}")
    return "\n".join(lines) + "\n"


__all__ = ["Finding", "PROBES", "diagnose", "verdicts", "report"]
