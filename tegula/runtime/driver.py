"""The CUDA driver API, through `cuda.bindings.driver`: context, library loading, launch.

Kept small on purpose: load a cubin as a context-independent library (`cuLibraryLoadData`),
take its kernel, raise its dynamic shared-memory limit when it needs more than the default
48 KB (`cuKernelSetAttribute`), and fetch the function handle for the current context;
launches go through `cuLaunchKernel` with a prepared `void**` parameter array (see
`launcher.py`). The context is the one torch uses (the device's primary context), so
kernels interoperate with torch tensors and streams.
"""
from __future__ import annotations

import functools
from typing import Any

from tegula.errors import LaunchError

#: Dynamic shared memory a kernel may use without opting in.
DEFAULT_SHARED_LIMIT = 48 * 1024


@functools.lru_cache(maxsize=None)
def cuda_driver():
    """`cuda.bindings.driver`, imported on first use (the compiler never needs it)."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise LaunchError("launching kernels needs the CUDA Python bindings: "
                          "pip install 'tegula[gpu]' (cuda-bindings)") from e
    return driver


def check(result: tuple, what: str) -> Any:
    """Unwrap a driver call's `(CUresult, value…)`, raising `LaunchError` on failure."""
    driver = cuda_driver()
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        decode = lambda b: b.decode() if isinstance(b, bytes) else str(b)  # noqa: E731
        raise LaunchError(f"{what} failed: {decode(name)}: {decode(text)}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def _torch_cuda():
    """torch.cuda if torch is imported already (never import torch just for this)."""
    import sys
    torch = sys.modules.get("torch")
    return getattr(torch, "cuda", None) if torch is not None else None


def current_device() -> int:
    """The device launches go to: torch's current device, else the current context's, else 0."""
    tc = _torch_cuda()
    if tc is not None and tc.is_available():
        return tc.current_device()
    driver = cuda_driver()
    err, dev = driver.cuCtxGetDevice()
    return int(dev) if err == driver.CUresult.CUDA_SUCCESS else 0


def ensure_context(device: int) -> None:
    """Make `device`'s primary context current on this thread (torch's context too)."""
    tc = _torch_cuda()
    if tc is not None and tc.is_available():
        tc.init()  # torch creates / retains the primary context lazily
    driver = cuda_driver()
    check(driver.cuInit(0), "cuInit")
    ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is not None and int(ctx) != 0:
        if int(check(driver.cuCtxGetDevice(), "cuCtxGetDevice")) == device:
            return
    dev = check(driver.cuDeviceGet(device), "cuDeviceGet")
    primary = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(driver.cuCtxSetCurrent(primary), "cuCtxSetCurrent")


def compute_capability(device: int) -> tuple[int, int]:
    driver = cuda_driver()
    check(driver.cuInit(0), "cuInit")
    dev = check(driver.cuDeviceGet(device), "cuDeviceGet")
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
    minor = check(driver.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
    return int(major), int(minor)


def max_shared_per_block_optin(device: int) -> int:
    driver = cuda_driver()
    dev = check(driver.cuDeviceGet(device), "cuDeviceGet")
    return int(check(driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
        "cuDeviceGetAttribute"))


class LoadedLibrary:
    """One cubin loaded into the driver; `function(device)` gives a launchable handle."""

    def __init__(self, cubin: bytes, name: str, shared_bytes: int):
        driver = cuda_driver()
        self.name = name
        self.shared_bytes = shared_bytes
        self._cubin = cubin  # keep the image alive as long as the library
        self.library = check(driver.cuLibraryLoadData(cubin, None, None, 0, None, None, 0),
                             f"cuLibraryLoadData({name})")
        self.kernel = check(driver.cuLibraryGetKernel(self.library, name.encode()),
                            f"cuLibraryGetKernel({name})")
        self._functions: dict[int, Any] = {}

    def function(self, device: int):
        """The CUfunction for `device` (its context made current first), cached."""
        fn = self._functions.get(device)
        if fn is not None:
            return fn
        driver = cuda_driver()
        ensure_context(device)
        if self.shared_bytes > DEFAULT_SHARED_LIMIT:
            limit = max_shared_per_block_optin(device)
            if self.shared_bytes > limit:
                raise LaunchError(f"kernel {self.name} needs {self.shared_bytes} bytes of shared "
                                  f"memory; device {device} allows {limit} per block")
            dev = check(driver.cuDeviceGet(device), "cuDeviceGet")
            check(driver.cuKernelSetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                self.shared_bytes, self.kernel, dev), "cuKernelSetAttribute")
        fn = check(driver.cuKernelGetFunction(self.kernel), f"cuKernelGetFunction({self.name})")
        self._functions[device] = fn
        return fn

    def __del__(self):
        try:
            cuda_driver().cuLibraryUnload(self.library)
        except Exception:
            pass  # interpreter shutdown: the driver may already be gone


@functools.lru_cache(maxsize=None)
def raw_launcher():
    """`cuLaunchKernel` from libcuda through ctypes, or None where it cannot be loaded.

    The same driver function cuda-bindings wraps, called with raw handles: the wrapper
    converts its argument objects on every call (several microseconds), which is most of
    a cached kernel's launch overhead. Handles come from cuda-bindings objects once
    (`int(CUfunction)`, `int(CUstream)`).

    Callers pass the three handles and the parameter array as `ctypes.c_void_p` objects
    and every other argument as an int below 2^31: the function has no `argtypes`, because
    converting eleven arguments through declared types costs about a microsecond per launch
    (ctypes then passes a Python int as a C int, which matches the driver's unsigned ints
    for these values on the 64-bit ABIs CUDA supports)."""
    import ctypes
    import ctypes.util

    for name in ("libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn = lib.cuLaunchKernel
        fn.restype = ctypes.c_int
        return fn
    return None
