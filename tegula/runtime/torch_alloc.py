"""Output allocation and tensor reads from C++ (libtorch): a replayed entry point's output
and replay key for a fraction of what torch's Python API charges.

A replayed `tegula.kernels.softmax(x)` spends more host time allocating its output
through torch's Python API (`torch.empty_like`: argument parsing, the dispatcher, the
caching allocator, wrapping the result; ~1.8 µs on an H100 host, `new_empty` of another
shape or dtype ~4.8) than torch's own softmax spends on all of its allocation in C++.
This module builds a tiny C++ extension linked against the running torch whose
allocators call `at::empty` directly: `allocator(shape, dtype)` returns a function of a
tensor `t` giving a new contiguous tensor of that shape and dtype on `t`'s device (None
for the shape/dtype: `t`'s own), the same as `torch.empty(shape, dtype=dtype,
device=t.device)` but one C call. It also reads a plain tensor's replay-key parts (data
pointer, sizes, strides, dtype, device) from the C++ tensor for `tegula.runtime.fastcall`
(`tensor_reader`, installed by `fastcall.use_tensor_reader` when this extension becomes
ready), instead of six calls into torch's Python bindings per replay.

It is optional. The extension is compiled with the system C++ compiler against torch's
headers (about 15 s, once per machine and torch version: the binary is kept in tegula's
private disk cache, keyed by the source, torch's version, the Python ABI and the
compiler) and loaded from a private temporary copy. `start()` begins that in a
background thread, so no call waits for the compile; entry points allocate through
torch's Python API until it is ready, then `on_ready` callbacks switch the replays they
remembered over. Where anything is missing (no compiler, no torch headers, a compile
error, `TEGULA_TORCH_ALLOCATOR=0`) the Python allocation stays: `unavailable` says why.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from typing import Any, Callable

SOURCE = r"""
#include <Python.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <stdint.h>

#include <vector>

/* What an allocator made by make_allocator allocates: a shape (or the argument's own)
   and a dtype (or the argument's own). */
struct Spec {
    bool own_shape;
    std::vector<int64_t> sizes;
    bool own_dtype;
    at::ScalarType dtype;
};

static void free_spec(PyObject *capsule)
{
    delete static_cast<Spec *>(PyCapsule_GetPointer(capsule, "tegula.torch_alloc.Spec"));
}

/* allocate(t): a new contiguous tensor of the spec's shape and dtype on t's device. */
static PyObject *allocate(PyObject *capsule, PyObject *arg)
{
    HANDLE_TH_ERRORS
    if (!THPVariable_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "tegula allocator: expected a torch.Tensor, got %s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const Spec *spec = static_cast<Spec *>(PyCapsule_GetPointer(capsule,
                                                               "tegula.torch_alloc.Spec"));
    if (spec == NULL)
        return NULL;
    const at::Tensor &t = THPVariable_Unpack(arg);
    at::TensorOptions options = t.options();
    if (!spec->own_dtype)
        options = options.dtype(spec->dtype);
    return THPVariable_Wrap(at::empty(spec->own_shape ? t.sizes() : at::IntArrayRef(spec->sizes),
                                      options));
    END_HANDLE_TH_ERRORS
}

static PyMethodDef allocate_def = {"allocate", allocate, METH_O,
                                   "a new contiguous tensor on the argument's device"};

/* make_allocator(shape or None, dtype template tensor or None) -> allocate bound to it */
static PyObject *make_allocator(PyObject *self, PyObject *args)
{
    HANDLE_TH_ERRORS
    PyObject *shape, *like;
    if (!PyArg_ParseTuple(args, "OO", &shape, &like))
        return NULL;
    Spec *spec = new Spec();
    spec->own_shape = shape == Py_None;
    spec->own_dtype = like == Py_None;
    if (!spec->own_shape) {
        PyObject *items = PySequence_Fast(shape, "make_allocator: shape must be a sequence");
        if (items == NULL) {
            delete spec;
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); i++) {
            long long n = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(items, i));
            if (n == -1 && PyErr_Occurred()) {
                Py_DECREF(items);
                delete spec;
                return NULL;
            }
            spec->sizes.push_back(n);
        }
        Py_DECREF(items);
    }
    if (!spec->own_dtype) {
        if (!THPVariable_Check(like)) {
            delete spec;
            PyErr_SetString(PyExc_TypeError, "make_allocator: dtype template must be a tensor");
            return NULL;
        }
        spec->dtype = THPVariable_Unpack(like).scalar_type();
    }
    PyObject *capsule = PyCapsule_New(spec, "tegula.torch_alloc.Spec", free_spec);
    if (capsule == NULL) {
        delete spec;
        return NULL;
    }
    PyObject *bound = PyCFunction_New(&allocate_def, capsule);
    Py_DECREF(capsule);
    return bound;
    END_HANDLE_TH_ERRORS
}

/* A tuple of Python ints. */
static PyObject *int_tuple(at::IntArrayRef values)
{
    PyObject *tuple = PyTuple_New((Py_ssize_t)values.size());
    if (tuple == NULL)
        return NULL;
    for (size_t i = 0; i < values.size(); i++) {
        PyObject *n = PyLong_FromLongLong(values[i]);
        if (n == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, (Py_ssize_t)i, n);
    }
    return tuple;
}

/* The replay key's reads of a torch tensor (tegula/runtime/fastcall.py's build_key) from
   the C++ tensor instead of through torch's Python bindings (six calls, each parsing
   its arguments and wrapping its result): *ptr = data_ptr(), and where parts is not
   NULL parts[0..4] = (data_ptr() & 15, shape as a tuple, stride(), dtype, get_device()),
   new references equal to (and hashing as) what Python reads. Only for a plain tensor
   (torch.Tensor or nn.Parameter, strided, with storage and concrete sizes) outside any
   __torch_function__ mode, whose attributes no Python code can override: returns 1;
   0 for anything else (and on any C++ error), where the caller reads through Python;
   -1 with a Python error set where building a Python object failed. */
static int read_tensor(PyObject *obj, PyObject **ptr, PyObject **parts)
{
    if (!THPVariable_CheckExact(obj) || at::impl::torch_function_mode_enabled())
        return 0;
    uintptr_t address;
    int64_t device;
    at::ScalarType dtype;
    at::IntArrayRef sizes, strides;
    try {
        const at::Tensor &t = THPVariable_Unpack(obj);
        if (t.layout() != at::kStrided || !t.has_storage() ||
                t.unsafeGetTensorImpl()->has_symbolic_sizes_strides())
            return 0;
        address = (uintptr_t)t.data_ptr();
        device = t.get_device();
        dtype = t.scalar_type();
        sizes = t.sizes();
        strides = t.strides();
    } catch (...) {
        return 0;  /* Python's own read raises its error */
    }
    if ((*ptr = PyLong_FromVoidPtr((void *)address)) == NULL)
        return -1;
    if (parts == NULL)
        return 1;
    parts[0] = PyLong_FromLong((long)(address & 15));
    parts[1] = int_tuple(sizes);
    parts[2] = int_tuple(strides);
    parts[3] = (PyObject *)torch::getTHPDtype(dtype);
    Py_XINCREF(parts[3]);
    parts[4] = PyLong_FromLongLong(device);
    for (int k = 0; k < 5; k++) {
        if (parts[k] == NULL) {
            for (int j = 0; j < 5; j++)
                Py_CLEAR(parts[j]);
            Py_CLEAR(*ptr);
            return -1;
        }
    }
    return 1;
}

/* tensor_reader() -> a capsule of read_tensor, for tegula_fastcall.set_tensor_reader. */
static PyObject *tensor_reader(PyObject *self, PyObject *unused)
{
    return PyCapsule_New((void *)read_tensor, "tegula.runtime.read_tensor", NULL);
}

static PyMethodDef methods[] = {
    {"make_allocator", make_allocator, METH_VARARGS, "an allocator of a shape and dtype"},
    {"tensor_reader", tensor_reader, METH_NOARGS, "the replay key's tensor reads, in C++"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tegula_torch_alloc", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit_tegula_torch_alloc(void)
{
    return PyModule_Create(&module);
}
"""

#: Why the extension is not in use (None while it is, or before it is ready).
unavailable: str | None = None

_MODULE: list = []          # [the loaded extension] once ready
_CALLBACKS: list = []       # run once, with the module, when it becomes ready
_LOCK = threading.Lock()
_STARTED = threading.Event()
_DONE = threading.Event()   # set when ready or given up


def _torch_paths(torch) -> tuple[str, str]:
    root = os.path.dirname(torch.__file__)
    return os.path.join(root, "include"), os.path.join(root, "lib")


def _cache_key(torch, cxx: str) -> str:
    include, _ = _torch_paths(torch)
    blob = "\0".join([SOURCE, torch.__version__, str(getattr(torch.version, "git_version", "")),
                      sys.version, sysconfig.get_config_var("EXT_SUFFIX") or "",
                      os.path.realpath(cxx), include, "torch-alloc-1"])
    return hashlib.sha256(blob.encode()).hexdigest()


def _build(torch, cxx: str) -> bytes:
    include, lib = _torch_paths(torch)
    python_include = sysconfig.get_paths().get("include", "")
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    with tempfile.TemporaryDirectory(prefix="tegula-torch-alloc-") as folder:
        source = os.path.join(folder, "torch_alloc.cpp")
        library = os.path.join(folder, "torch_alloc.so")
        with open(source, "w") as f:
            f.write(SOURCE)
        errors = []
        for std in ("-std=c++17", "-std=c++20"):  # newer torch headers need C++20
            command = [cxx, "-O2", "-shared", "-fPIC", std, "-w",
                       f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I", python_include,
                       "-I", include, "-I", os.path.join(include, "torch/csrc/api/include"),
                       source, "-o", library, "-L", lib, f"-Wl,-rpath,{lib}",
                       "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            if done.returncode == 0:
                with open(library, "rb") as f:
                    return f.read()
            errors.append(done.stderr.strip().splitlines()[-1:] or ["(no output)"])
        raise RuntimeError(f"{cxx} failed: {errors}")


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def cannot_build() -> str | None:
    """Why the extension cannot be built here (no C++ compiler, no torch headers), or
    None."""
    import torch
    include, _ = _torch_paths(torch)
    if _compiler() is None:
        return "no C++ compiler"
    if not os.path.exists(os.path.join(include, "torch/csrc/autograd/python_variable.h")):
        return f"no torch headers under {include}"
    return None


def _prepare(build: bool) -> Any:
    """The extension module, from the cache or (with `build`) compiled; None where it
    cannot be had (`unavailable` says why) or, without `build`, is not in the cache."""
    global unavailable
    import torch

    from tegula.runtime.cache import DiskCache
    from tegula.runtime.fastcall import _load
    why = cannot_build()
    if why is not None:
        unavailable = why
        return None
    cxx = _compiler()
    disk = DiskCache()
    key = _cache_key(torch, cxx)
    binary = disk.get(key)
    if binary is None and build:
        binary = _build(torch, cxx)
        disk.put(key, binary)
    return None if binary is None else _load(binary, "tegula_torch_alloc")


def _ready(module: Any) -> None:
    global unavailable
    with _LOCK:
        _MODULE.append(module)
        callbacks = list(_CALLBACKS)
        unavailable = None
    from tegula.runtime.fastcall import use_tensor_reader
    use_tensor_reader()  # the replay key's tensor reads from C++ too
    for callback in callbacks:
        callback(module)
    _DONE.set()


def _build_in_background() -> None:
    global unavailable
    try:
        module = _prepare(build=True)
    except Exception as e:  # any failure: the Python allocation stays
        unavailable = f"{type(e).__name__}: {e}"
        module = None
    if module is None:
        _DONE.set()
        return
    _ready(module)


def start() -> None:
    """Make the extension available, once per process: at once where the cache holds it,
    else compiled in a background thread (`wait` waits for it). Does nothing after the
    first call, or with TEGULA_TORCH_ALLOCATOR=0."""
    global unavailable
    if _STARTED.is_set():
        return
    with _LOCK:
        if _STARTED.is_set():
            return
        _STARTED.set()
    if os.environ.get("TEGULA_TORCH_ALLOCATOR", "1") == "0":
        unavailable = "turned off by TEGULA_TORCH_ALLOCATOR=0"
        _DONE.set()
        return
    try:
        module = _prepare(build=False)
    except Exception as e:
        unavailable = f"{type(e).__name__}: {e}"
        _DONE.set()
        return
    if module is not None:
        _ready(module)
        return
    unavailable = "being built"
    threading.Thread(target=_build_in_background, name="tegula-torch-alloc",
                     daemon=True).start()


def wait(timeout: float | None = None) -> bool:
    """Wait for `start`'s build; whether the extension is in use."""
    _DONE.wait(timeout)
    return bool(_MODULE)


def module() -> Any:
    """The extension, or None while it is not ready (or cannot be)."""
    return _MODULE[0] if _MODULE else None


def on_ready(callback: Callable[[Any], None]) -> None:
    """Call `callback(module)` when the extension becomes ready (at once if it is)."""
    with _LOCK:
        ready = module()
        if ready is None:
            _CALLBACKS.append(callback)
    if ready is not None:
        callback(ready)


def allocator(shape: tuple | None, like: Any = None) -> Callable[[Any], Any] | None:
    """The C++ allocator of `shape` (None: the argument's) and `like`'s dtype (None: the
    argument's), or None while the extension is not ready."""
    loaded = module()
    return None if loaded is None else loaded.make_allocator(
        None if shape is None else tuple(int(n) for n in shape), like)
