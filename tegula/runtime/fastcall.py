"""`cuLaunchKernel` through a tiny C extension instead of a ctypes foreign call.

A ctypes call of an eleven-argument C function costs about 1.3 µs on the development CPU
(argument conversion and libffi), a fifth of a replayed launch; a METH_FASTCALL C
function taking nine ints costs about 0.1 µs. The extension is compiled with the system C
compiler on first use (about a third of a second), stored in the private disk cache under
a key naming its source, the Python ABI and the compiler, and loaded from a private
temporary copy. Where anything of that is missing (no compiler, no Python headers, an
unusable cache) the launcher keeps the ctypes call: same driver function, same arguments.
`TEGULA_C_LAUNCHER=0` turns the extension off (to compare the two).
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from functools import partial
from typing import Callable

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*launch_kernel_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, void *, void **, void **);

/* launch(cuLaunchKernel address, function, gx, gy, gz, threads, shared bytes, stream,
   parameter array): all ints; returns the CUresult. */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    unsigned long long v[9];
    if (n != 9) {
        PyErr_SetString(PyExc_TypeError, "launch takes 9 ints");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < 9; i++) {
        v[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    for (int i = 2; i < 7; i++) {
        if (v[i] > 0xFFFFFFFFull) {
            PyErr_SetString(PyExc_OverflowError, "a grid, block or shared size exceeds 2^32-1");
            return NULL;
        }
    }
    launch_kernel_t launch_kernel = (launch_kernel_t)(uintptr_t)v[0];
    int code = launch_kernel((void *)(uintptr_t)v[1], (unsigned)v[2], (unsigned)v[3],
                             (unsigned)v[4], (unsigned)v[5], 1, 1, (unsigned)v[6],
                             (void *)(uintptr_t)v[7], (void **)(uintptr_t)v[8], NULL);
    return PyLong_FromLong(code);
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "cuLaunchKernel"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tegula_fastcall", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit_tegula_fastcall(void) { return PyModule_Create(&module); }
"""

#: Why the extension is not in use (None while it is, or before the first attempt).
unavailable: str | None = None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _cache_key(cc: str, include: str) -> str:
    blob = "\0".join([SOURCE, sys.version, sysconfig.get_config_var("EXT_SUFFIX") or "",
                      os.path.realpath(cc), include, "fastcall-1"])
    return hashlib.sha256(blob.encode()).hexdigest()


def _build(cc: str, include: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="tegula-fastcall-") as folder:
        source = os.path.join(folder, "fastcall.c")
        library = os.path.join(folder, "fastcall.so")
        with open(source, "w") as f:
            f.write(SOURCE)
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-I", include, source, "-o", library],
                       check=True, capture_output=True, timeout=60)
        with open(library, "rb") as f:
            return f.read()


def _load(binary: bytes):
    """Import the extension from a private temporary copy (the dynamic loader needs a
    file; the copy is deleted once loaded)."""
    with tempfile.TemporaryDirectory(prefix="tegula-fastcall-") as folder:
        path = os.path.join(folder, "tegula_fastcall" + sysconfig.get_config_var("EXT_SUFFIX"))
        with open(path, "wb") as f:
            f.write(binary)
        loader = importlib.machinery.ExtensionFileLoader("tegula_fastcall", path)
        spec = importlib.util.spec_from_file_location("tegula_fastcall", path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module


def c_launcher(launch_kernel_address: int, cache=None) -> Callable[..., int] | None:
    """`launch(function, gx, gy, gz, threads, shared, stream, params) -> CUresult` calling
    the `cuLaunchKernel` at `launch_kernel_address` from C (all arguments ints), or None
    where the extension cannot be built or loaded (`unavailable` says why)."""
    global unavailable
    if os.environ.get("TEGULA_C_LAUNCHER", "1") == "0":
        unavailable = "turned off by TEGULA_C_LAUNCHER=0"
        return None
    cc, include = _compiler(), sysconfig.get_paths().get("include", "")
    if cc is None or not os.path.exists(os.path.join(include, "Python.h")):
        unavailable = "no C compiler" if cc is None else f"no Python.h under {include}"
        return None
    try:
        from tegula.runtime.cache import DiskCache
        disk = cache if cache is not None else DiskCache()
        binary = disk.get_or_build(_cache_key(cc, include), lambda: _build(cc, include))
        module = _load(binary)
    except Exception as e:  # any failure: the ctypes call still works
        unavailable = f"{type(e).__name__}: {e}"
        return None
    unavailable = None
    return partial(module.launch, launch_kernel_address)
