"""`cuLaunchKernel` through a tiny C extension instead of a ctypes foreign call.

A ctypes call of an eleven-argument C function costs about 1.3 µs on the development CPU
(argument conversion and libffi), a fifth of a replayed launch; a METH_FASTCALL C
function taking nine ints costs about 0.1 µs. The extension is compiled with the system C
compiler on first use (about a third of a second), stored in the private disk cache under
a key naming its source, the Python ABI and the compiler, and loaded from a private
temporary copy. Where anything of that is missing (no compiler, no Python headers, an
unusable cache) the launcher keeps the ctypes call: same driver function, same arguments.
`TEGULA_C_LAUNCHER=0` turns the extension off (to compare the two). Where the optional
libtorch extension (`tegula.runtime.torch_alloc`) is loaded too, the replay key's reads of
a plain torch tensor come from it (`use_tensor_reader`) rather than from torch's Python
bindings.
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
#include <string.h>

#if PY_VERSION_HEX < 0x030D0000  /* its name before Python 3.13 */
#define PyObject_GetOptionalAttr _PyObject_LookupAttr
#endif
#if PY_VERSION_HEX < 0x030B0000  /* public from Python 3.11 */
#define PyFloat_Pack4 _PyFloat_Pack4
#endif

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

/* The replay key of a launch (runtime/replay.py's replay_key): key = head + per argument:
   an int or float (subclasses too, but no tensor) adds its type and a None pointer; an
   object with data_ptr adds (data_ptr() & 15, .shape, .stride(), .dtype, .get_device())
   and its pointer. Returns 1 with *key and *pointers set (new references), 0 where an
   argument makes the launch not replayable, -1 on an error. */
static PyObject *s_data_ptr, *s_shape, *s_stride, *s_dtype, *s_get_device, *fifteen;

/* The same reads of a plain torch tensor from C++ (tegula.runtime.torch_alloc's
   read_tensor: *ptr, and the five parts unless parts is NULL; 1 done, 0 not such a
   tensor, -1 error), once set_tensor_reader installs it; NULL: through Python. */
typedef int (*read_tensor_t)(PyObject *, PyObject **, PyObject **);
static read_tensor_t read_tensor = NULL;

/* set_tensor_reader(capsule or None): install (or remove) read_tensor. */
static PyObject *set_tensor_reader(PyObject *self, PyObject *capsule)
{
    if (capsule == Py_None) {
        read_tensor = NULL;
        Py_RETURN_NONE;
    }
    void *reader = PyCapsule_GetPointer(capsule, "tegula.runtime.read_tensor");
    if (reader == NULL)
        return NULL;
    read_tensor = (read_tensor_t)reader;
    Py_RETURN_NONE;
}

static int build_key(PyObject *head, PyObject *args, PyObject **key_out,
                     PyObject **pointers_out)
{
    Py_ssize_t nargs = PyTuple_GET_SIZE(args), nhead = PyTuple_GET_SIZE(head);
    PyObject *parts = PyList_New(0), *pointers = PyList_New(nargs), *key = NULL;
    if (parts == NULL || pointers == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < nhead; i++)
        if (PyList_Append(parts, PyTuple_GET_ITEM(head, i)) < 0)
            goto fail;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *arg = PyTuple_GET_ITEM(args, i);
        PyObject *data_ptr = NULL;
        if (read_tensor != NULL) {
            PyObject *ptr, *read[5];
            int done = read_tensor(arg, &ptr, read);
            if (done < 0)
                goto fail;
            if (done > 0) {
                PyList_SET_ITEM(pointers, i, ptr);  /* the list owns it */
                int failed = 0;
                for (int k = 0; k < 5; k++) {
                    failed = failed || PyList_Append(parts, read[k]) < 0;
                    Py_DECREF(read[k]);
                }
                if (failed)
                    goto fail;
                continue;
            }
        }
        if (!PyLong_CheckExact(arg) && !PyFloat_CheckExact(arg) &&
                PyObject_GetOptionalAttr(arg, s_data_ptr, &data_ptr) < 0)
            goto fail;
        if (data_ptr == NULL) {
            if (!PyLong_Check(arg) && !PyFloat_Check(arg)) {  /* not replayable */
                Py_DECREF(parts);
                Py_DECREF(pointers);
                return 0;
            }
            if (PyList_Append(parts, (PyObject *)Py_TYPE(arg)) < 0)
                goto fail;
            Py_INCREF(Py_None);
            PyList_SET_ITEM(pointers, i, Py_None);
            continue;
        }
        PyObject *ptr = PyObject_CallNoArgs(data_ptr);
        Py_DECREF(data_ptr);
        if (ptr == NULL)
            goto fail;
        PyList_SET_ITEM(pointers, i, ptr);  /* the list owns it */
        for (int k = 0; k < 5; k++) {  /* in order, stopping at the first error */
            PyObject *item = k == 0 ? PyNumber_And(ptr, fifteen)
                           : k == 1 ? PyObject_GetAttr(arg, s_shape)
                           : k == 2 ? PyObject_CallMethodNoArgs(arg, s_stride)
                           : k == 3 ? PyObject_GetAttr(arg, s_dtype)
                           : PyObject_CallMethodNoArgs(arg, s_get_device);
            if (item == NULL)
                goto fail;
            int appended = PyList_Append(parts, item);
            Py_DECREF(item);
            if (appended < 0)
                goto fail;
        }
    }
    key = PyList_AsTuple(parts);
    Py_CLEAR(parts);
    if (key == NULL)
        goto fail;
    *key_out = key;
    *pointers_out = pointers;
    return 1;
fail:
    Py_XDECREF(parts);
    Py_XDECREF(pointers);
    return -1;
}

/* replay_lookup(table, head, args) -> (prepared launch or None, key or None, pointers):
   the replay key (build_key) and its table lookup in one call; (None, None, None) where
   the launch is not replayable. */
static PyObject *replay_lookup(PyObject *self, PyObject *const *a, Py_ssize_t n)
{
    if (n != 3 || !PyDict_Check(a[0]) || !PyTuple_Check(a[1]) || !PyTuple_Check(a[2])) {
        PyErr_SetString(PyExc_TypeError, "replay_lookup(dict, tuple, tuple)");
        return NULL;
    }
    PyObject *key, *pointers;
    int built = build_key(a[1], a[2], &key, &pointers);
    if (built <= 0)
        return built < 0 ? NULL : Py_BuildValue("(OOO)", Py_None, Py_None, Py_None);
    PyObject *hit = PyDict_GetItemWithError(a[0], key);  /* borrowed */
    PyObject *result = (hit == NULL && PyErr_Occurred()) ? NULL :
        PyTuple_Pack(3, hit ? hit : Py_None, key, pointers);
    Py_DECREF(key);
    Py_DECREF(pointers);
    return result;
}

/* runtime/replay.py's constexpr_key where every value is exactly an int, str, bool,
   None or float: per item (name, type, value), a float's value its repr (the build key
   tells floats apart by repr: 0.0 from -0.0, every NaN alike). */
static PyObject *keywords_with_floats(PyObject *kwargs, Py_ssize_t n)
{
    PyObject *items = PyTuple_New(n), *name, *value;
    Py_ssize_t pos = 0, i = 0;
    if (items == NULL)
        return NULL;
    while (PyDict_Next(kwargs, &pos, &name, &value) && i < n) {
        PyObject *shown = Py_TYPE(value) == &PyFloat_Type ? PyObject_Repr(value)
                                                          : Py_NewRef(value);
        if (shown == NULL)
            goto fail;
        PyObject *item = PyTuple_Pack(3, name, (PyObject *)Py_TYPE(value), shown);
        Py_DECREF(shown);
        if (item == NULL)
            goto fail;
        PyTuple_SET_ITEM(items, i++, item);
    }
    if (i == n)
        return items;
    PyErr_SetString(PyExc_RuntimeError, "plain_keywords: the dict changed");
fail:
    Py_DECREF(items);
    return NULL;
}

/* plain_keywords(kwargs) -> (tuple(kwargs.items()), tuple of their types), where every
   value's type is exactly int, str, bool or NoneType; keywords_with_floats' tuple where
   some are exactly floats too; else None (runtime/replay.py's constexpr_key then builds
   the keywords' part in Python). */
static PyObject *plain_keywords(PyObject *self, PyObject *kwargs)
{
    if (!PyDict_Check(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "plain_keywords(dict)");
        return NULL;
    }
    Py_ssize_t n = PyDict_Size(kwargs), pos = 0, i = 0;
    PyObject *name, *value;
    int floats = 0;
    while (PyDict_Next(kwargs, &pos, &name, &value)) {
        PyTypeObject *t = Py_TYPE(value);
        if (t == &PyFloat_Type)
            floats = 1;
        else if (t != &PyLong_Type && t != &PyUnicode_Type && t != &PyBool_Type &&
                 value != Py_None)
            Py_RETURN_NONE;
    }
    if (floats)
        return keywords_with_floats(kwargs, n);
    PyObject *items = PyTuple_New(n), *types = PyTuple_New(n);
    if (items == NULL || types == NULL)
        goto fail;
    pos = 0;
    while (PyDict_Next(kwargs, &pos, &name, &value) && i < n) {
        PyObject *item = PyTuple_Pack(2, name, value);
        if (item == NULL)
            goto fail;
        PyTuple_SET_ITEM(items, i, item);
        Py_INCREF(Py_TYPE(value));
        PyTuple_SET_ITEM(types, i, (PyObject *)Py_TYPE(value));
        i++;
    }
    if (i != n) {
        PyErr_SetString(PyExc_RuntimeError, "plain_keywords: the dict changed");
        goto fail;
    }
    PyObject *result = PyTuple_Pack(2, items, types);
    Py_DECREF(items);
    Py_DECREF(types);
    return result;
fail:
    Py_XDECREF(items);
    Py_XDECREF(types);
    return NULL;
}

#ifndef Py_GIL_DISABLED
#define MAX_POINTERS 64  /* launches with more data pointers keep the Python path */
#define MAX_MAPS 16

/* runtime/aliasing.py's AliasCheck.c_pairs (i, lo_i, hi_i, j, lo_j, hi_j, same_ok) on these
   pointers: 1 where the byte ranges [p_i + lo_i, p_i + hi_i), [p_j + lo_j, p_j + hi_j)
   overlap (not same_ok with equal pointers: in place), 0 where none does, -1 error. */
static int alias_overlap(PyObject *pairs, PyObject *pointers)
{
    if (!PyTuple_Check(pairs))
        return PyErr_SetString(PyExc_TypeError, "launch_pointers: aliases: a tuple"), -1;
    Py_ssize_t have = PySequence_Fast_GET_SIZE(pointers);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(pairs); k++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, k);
        long long v[7];
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 7)
            return PyErr_SetString(PyExc_TypeError, "launch_pointers: an alias: 7 ints"), -1;
        for (int i = 0; i < 7; i++) {
            v[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, i));
            if (v[i] == -1 && PyErr_Occurred())
                return -1;
        }
        if (v[0] < 0 || v[0] >= have || v[3] < 0 || v[3] >= have)
            return PyErr_SetString(PyExc_IndexError, "launch_pointers: alias index"), -1;
        long long pi = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(pointers, v[0]));
        long long pj = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(pointers, v[3]));
        if ((pi == -1 || pj == -1) && PyErr_Occurred())
            return -1;
        if (pi + v[1] < pj + v[5] && pj + v[4] < pi + v[2] && !(v[6] && pi == pj))
            return 1;
    }
    return 0;
}

/* Write pointers[indices[i]] as 8-byte values at dest + 8 i, then the scalars
   args[scalar_indices[j]] as 4-byte values after them (kinds[j] 'i': a Python int in
   32-bit range; 'f': a Python float as an f32, rounded as struct's "f" packs it), then
   each tensor map's 128 bytes at dest + its offset (maps: per map (the index of its
   tensor's pointer, the offset, a dict from that pointer to the encoded map)), then
   cuLaunchKernel on grid g[0..2] and stream g[3]; spec = (cuLaunchKernel address,
   function, threads, shared bytes, parameter array, dest, indices[, scalar_indices,
   kinds, maps][, aliases]). Aliases (alias_overlap) are checked first: an overlap
   returns 1. Every value is converted or found before any is written. The GIL is
   held from the first write to the driver's return (the driver copies the values during
   the call), so no other Python thread can rewrite the buffer in between: no lock
   needed. 0 with *code set (the CUresult); 1 where a scalar is not of its kind's exact
   type or out of its range, or a map is not in its dict (nothing written: Python checks,
   encodes and packs); -1 on an error. */
static int launch_direct(PyObject *spec, const unsigned long long g[4], PyObject *pointers,
                         PyObject *args, int *code)
{
    Py_ssize_t spec_size = PyTuple_Check(spec) ? PyTuple_GET_SIZE(spec) : 0;
    if ((spec_size != 7 && spec_size != 8 && spec_size != 10 && spec_size != 11) ||
            !(PyList_Check(pointers) || PyTuple_Check(pointers))) {
        PyErr_SetString(PyExc_TypeError, "launch_pointers(spec, gx, gy, gz, stream, list or tuple)");
        return -1;
    }
    unsigned long long v[6];  /* address, function, threads, shared, params, dest */
    for (int i = 0; i < 6; i++) {
        v[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(spec, i));
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
    }
    if (g[0] > 0xFFFFFFFFull || g[1] > 0xFFFFFFFFull || g[2] > 0xFFFFFFFFull ||
            v[2] > 0xFFFFFFFFull || v[3] > 0xFFFFFFFFull) {
        PyErr_SetString(PyExc_OverflowError, "a grid, block or shared size exceeds 2^32-1");
        return -1;
    }
    PyObject *indices = PyTuple_GET_ITEM(spec, 6);
    int full = spec_size >= 10;
    if ((spec_size == 8 || spec_size == 11) &&
            alias_overlap(PyTuple_GET_ITEM(spec, spec_size - 1), pointers) != 0)
        return PyErr_Occurred() ? -1 : 1;  /* shared memory: Python decides or raises */
    PyObject *scalars = full ? PyTuple_GET_ITEM(spec, 7) : NULL;
    PyObject *kinds = full ? PyTuple_GET_ITEM(spec, 8) : NULL;
    PyObject *maps = full ? PyTuple_GET_ITEM(spec, 9) : NULL;
    if (!PyTuple_Check(indices) || (full && (!PyTuple_Check(scalars) || !PyTuple_Check(maps) ||
            !PyBytes_Check(kinds) || PyBytes_GET_SIZE(kinds) != PyTuple_GET_SIZE(scalars)))) {
        PyErr_SetString(PyExc_TypeError, "launch_pointers: indices and maps must be tuples, "
                        "kinds one byte per scalar");
        return -1;
    }
    unsigned long long *dest = (unsigned long long *)(uintptr_t)v[5], values[MAX_POINTERS];
    int32_t ints[MAX_POINTERS];
    Py_ssize_t count = PyTuple_GET_SIZE(indices), have = PySequence_Fast_GET_SIZE(pointers);
    Py_ssize_t nints = scalars == NULL ? 0 : PyTuple_GET_SIZE(scalars);
    Py_ssize_t nmaps = maps == NULL ? 0 : PyTuple_GET_SIZE(maps);
    if (count > MAX_POINTERS || nints > MAX_POINTERS || nmaps > MAX_MAPS) {
        PyErr_SetString(PyExc_ValueError,
                        "launch_pointers: too many pointers, scalars or tensor maps");
        return -1;
    }
    const char *map_bytes[MAX_MAPS];
    Py_ssize_t map_offsets[MAX_MAPS];
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(indices, i));
        if (j == -1 && PyErr_Occurred())
            return -1;
        if (j < 0 || j >= have) {
            PyErr_SetString(PyExc_IndexError, "launch_pointers: index out of range");
            return -1;
        }
        unsigned long long p = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(pointers, j));
        if (p == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        values[i] = p;
    }
    for (Py_ssize_t i = 0; i < nints; i++) {
        Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(scalars, i));
        if (j == -1 && PyErr_Occurred())
            return -1;
        if (args == NULL || !(PyList_Check(args) || PyTuple_Check(args)) || j < 0 ||
                j >= PySequence_Fast_GET_SIZE(args))
            return 1;
        PyObject *item = PySequence_Fast_GET_ITEM(args, j);
        if (PyBytes_AS_STRING(kinds)[i] == 'f') {
            if (!PyFloat_CheckExact(item))
                return 1;
            if (PyFloat_Pack4(PyFloat_AS_DOUBLE(item), (char *)&ints[i], 1) < 0) {
                PyErr_Clear();  /* past f32's range: Python's check names it */
                return 1;
            }
            continue;
        }
        if (!PyLong_CheckExact(item))
            return 1;
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (value == -1 && PyErr_Occurred())
            return -1;
        if (overflow || value < -2147483648LL || value > 2147483647LL)
            return 1;
        ints[i] = (int32_t)value;
    }
    for (Py_ssize_t i = 0; i < nmaps; i++) {
        PyObject *map = PyTuple_GET_ITEM(maps, i), *found;
        Py_ssize_t j;
        if (!PyTuple_Check(map) || PyTuple_GET_SIZE(map) != 3 ||
                !PyDict_Check(PyTuple_GET_ITEM(map, 2))) {
            PyErr_SetString(PyExc_TypeError, "launch_pointers: a map is (index, offset, dict)");
            return -1;
        }
        j = PyLong_AsSsize_t(PyTuple_GET_ITEM(map, 0));
        map_offsets[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(map, 1));
        if ((j == -1 || map_offsets[i] == -1) && PyErr_Occurred())
            return -1;
        if (j < 0 || j >= have || map_offsets[i] < 0) {
            PyErr_SetString(PyExc_IndexError, "launch_pointers: map index out of range");
            return -1;
        }
        /* borrowed: the dict keeps it, and no Python code runs before the memcpy */
        found = PyDict_GetItemWithError(PyTuple_GET_ITEM(map, 2),
                                        PySequence_Fast_GET_ITEM(pointers, j));
        if (found == NULL)
            return PyErr_Occurred() ? -1 : 1;  /* a new pointer: Python encodes its map */
        if (!PyBytes_Check(found) || PyBytes_GET_SIZE(found) != 128) {
            PyErr_SetString(PyExc_TypeError, "launch_pointers: a tensor map is 128 bytes");
            return -1;
        }
        map_bytes[i] = PyBytes_AS_STRING(found);
    }
    memcpy(dest, values, (size_t)count * 8);
    if (nints)
        memcpy((char *)dest + count * 8, ints, (size_t)nints * 4);
    for (Py_ssize_t i = 0; i < nmaps; i++)
        memcpy((char *)dest + map_offsets[i], map_bytes[i], 128);
    launch_kernel_t launch_kernel = (launch_kernel_t)(uintptr_t)v[0];
    *code = launch_kernel((void *)(uintptr_t)v[1], (unsigned)g[0], (unsigned)g[1],
                          (unsigned)g[2], (unsigned)v[2], 1, 1, (unsigned)v[3],
                          (void *)(uintptr_t)g[3], (void **)(uintptr_t)v[4], NULL);
    return 0;
}

/* launch_pointers(spec, gx, gy, gz, stream, pointers (a list or tuple)[, args]) ->
   CUresult, or None where a scalar is not an int in 32-bit range (nothing launched):
   launch_direct from Python (PreparedLaunch.__call__). */
static PyObject *launch_pointers(PyObject *self, PyObject *const *a, Py_ssize_t n)
{
    if (n != 6 && n != 7) {
        PyErr_SetString(PyExc_TypeError, "launch_pointers(spec, gx, gy, gz, stream, list or tuple[, args])");
        return NULL;
    }
    unsigned long long g[4];  /* gx, gy, gz, stream */
    for (int i = 0; i < 4; i++) {
        g[i] = PyLong_AsUnsignedLongLong(a[1 + i]);
        if (g[i] == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    int code;
    int done = launch_direct(a[0], g, a[5], n == 7 ? a[6] : NULL, &code);
    if (done < 0)
        return NULL;
    if (done > 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(code);
}

/* The grid as three blocks counts where it is an int or a tuple of one to three ints
   (exactly int: a bool or float is Python's business) in CUDA's limits (x below 2^31,
   y and z at most 65535, none zero): runtime/replay.py's launch_grid fast cases. 1, or
   0 where Python must look at it (normalize_grid: numpy ints, zero extents, errors). */
static int plain_grid(PyObject *grid, unsigned long long g[3])
{
    PyObject *items[3] = {grid, NULL, NULL};
    Py_ssize_t n = 1;
    if (PyTuple_CheckExact(grid)) {
        n = PyTuple_GET_SIZE(grid);
        if (n < 1 || n > 3)
            return 0;
        for (Py_ssize_t i = 0; i < n; i++)
            items[i] = PyTuple_GET_ITEM(grid, i);
    }
    for (Py_ssize_t i = 0; i < 3; i++) {
        if (i >= n) {
            g[i] = 1;
            continue;
        }
        if (!PyLong_CheckExact(items[i]))
            return 0;
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow || (value == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        if (value < 1 || value > (i == 0 ? 0x7FFFFFFFLL : 65535LL))
            return 0;
        g[i] = (unsigned long long)value;
    }
    return 1;
}

static PyObject *s_direct, *s_device, *s_kernel;

/* A prepared launch's direct launch (runtime/launcher.py's PreparedLaunch: its `direct`
   spec, its `device`, its `kernel`) on grid g[0..2] and current_stream(device): the
   pointers and args through launch_direct; a failed launch raises through
   kernel.check_result. 0 launched, 1 where a scalar needs Python's check (nothing
   launched), -1 on an error. */
static int launch_prepared(PyObject *prepared, PyObject *direct, unsigned long long g[4],
                           PyObject *pointers, PyObject *args, PyObject *current_stream)
{
    PyObject *device = PyObject_GetAttr(prepared, s_device), *stream = NULL, *kernel = NULL;
    int status = -1, code;
    if (device == NULL || (stream = PyObject_CallOneArg(current_stream, device)) == NULL)
        goto done;
    g[3] = PyLong_AsUnsignedLongLong(stream);
    if (g[3] == (unsigned long long)-1 && PyErr_Occurred())
        goto done;
    status = launch_direct(direct, g, pointers, args, &code);
    if (status != 0 || code == 0)
        goto done;
    status = -1;
    if ((kernel = PyObject_GetAttr(prepared, s_kernel)) == NULL)
        goto done;
    PyObject *checked = PyObject_CallMethod(kernel, "check_result", "iKKK", code,
                                            g[0], g[1], g[2]);
    if (checked == NULL)
        goto done;
    Py_DECREF(checked);
    status = 0;
done:
    Py_XDECREF(device);
    Py_XDECREF(stream);
    Py_XDECREF(kernel);
    return status;
}

/* replay_launch(table, head, args, grid, current_stream) -> the replayed launch's
   CompiledKernel, or replay_lookup's (hit, key, pointers) for Python to finish: the key,
   the lookup and, for a hit whose prepared launch writes pointers and ints only (its
   `direct` spec) on a plain grid, launch_prepared, in one call (kernel[grid](...)'s
   replay without the Python frames in between). */
static PyObject *replay_launch(PyObject *self, PyObject *const *a, Py_ssize_t n)
{
    if (n != 5 || !PyDict_Check(a[0]) || !PyTuple_Check(a[1]) || !PyTuple_Check(a[2])) {
        PyErr_SetString(PyExc_TypeError, "replay_launch(dict, tuple, tuple, grid, stream)");
        return NULL;
    }
    PyObject *key, *pointers, *direct = NULL, *result = NULL;
    int built = build_key(a[1], a[2], &key, &pointers);
    if (built <= 0)
        return built < 0 ? NULL : Py_BuildValue("(OOO)", Py_None, Py_None, Py_None);
    /* owned: the launch calls Python, which may drop the table's entry (another thread) */
    PyObject *hit = PyDict_GetItemWithError(a[0], key);
    if (hit == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(hit);
    unsigned long long g[4];
    if (hit == NULL || a[4] == Py_None || !plain_grid(a[3], g))
        goto python;
    if ((direct = PyObject_GetAttr(hit, s_direct)) == NULL)
        goto done;
    if (!PyTuple_Check(direct))  /* not decided yet, or the Python path */
        goto python;
    int launched = launch_prepared(hit, direct, g, pointers, a[2], a[4]);
    if (launched < 0)
        goto done;
    if (launched > 0)
        goto python;  /* a scalar for Python's check, a map to encode */
    result = PyObject_GetAttr(hit, s_kernel);
    goto done;
python:
    result = PyTuple_Pack(3, hit ? hit : Py_None, key, pointers);
done:
    Py_XDECREF(hit);
    Py_DECREF(key);
    Py_DECREF(pointers);
    Py_XDECREF(direct);
    return result;
}

static PyObject *s_prepared, *s_grid, *s_allocate;

/* entry_launch(table, head, tensors, current_stream) -> the replayed call's output, or
   replay_lookup's (hit, key, pointers) for Python to finish: a library entry point's
   replay (tegula/kernels/api.py's EntryReplay: .prepared, .grid, .allocate) in one call
   where its prepared launch writes pointers (and tensor maps) only. The output is
   allocate(tensors[0]), or the last tensor where allocate is None (out=); its pointer
   follows the tensors'. */
static PyObject *entry_launch(PyObject *self, PyObject *const *a, Py_ssize_t n)
{
    if (n != 4 || !PyDict_Check(a[0]) || !PyTuple_Check(a[1]) || !PyTuple_Check(a[2]) ||
            PyTuple_GET_SIZE(a[2]) < 1) {
        PyErr_SetString(PyExc_TypeError, "entry_launch(dict, tuple, non-empty tuple, stream)");
        return NULL;
    }
    PyObject *key, *pointers, *prepared = NULL, *direct = NULL, *grid = NULL;
    PyObject *allocate = NULL, *out = NULL, *ptr = NULL, *result = NULL;
    int built = build_key(a[1], a[2], &key, &pointers);
    if (built <= 0)
        return built < 0 ? NULL : Py_BuildValue("(OOO)", Py_None, Py_None, Py_None);
    /* owned: allocate and the launch call Python, which may drop the table's entry */
    PyObject *hit = PyDict_GetItemWithError(a[0], key);
    if (hit == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(hit);
    if (hit == NULL || a[3] == Py_None)
        goto python;
    if (PyObject_GetOptionalAttr(hit, s_prepared, &prepared) < 0)
        goto done;
    if (prepared == NULL)
        goto python;  /* another kind of replay (the GEMM's): Python calls it */
    if ((direct = PyObject_GetAttr(prepared, s_direct)) == NULL ||
            (grid = PyObject_GetAttr(hit, s_grid)) == NULL)
        goto done;
    unsigned long long g[4];
    if (!PyTuple_Check(direct) || !plain_grid(grid, g) || (PyTuple_GET_SIZE(direct) > 8 &&
            (!PyTuple_Check(PyTuple_GET_ITEM(direct, 7)) ||
             PyTuple_GET_SIZE(PyTuple_GET_ITEM(direct, 7)) != 0)))
        goto python;  /* (scalars: no entry point's) */
    if ((allocate = PyObject_GetAttr(hit, s_allocate)) == NULL)
        goto done;
    if (allocate == Py_None) {
        out = PyTuple_GET_ITEM(a[2], PyTuple_GET_SIZE(a[2]) - 1);
        Py_INCREF(out);
    } else {
        if ((out = PyObject_CallOneArg(allocate, PyTuple_GET_ITEM(a[2], 0))) == NULL)
            goto done;
        int read = read_tensor == NULL ? 0 : read_tensor(out, &ptr, NULL);
        if (read < 0 || (read == 0 && (ptr = PyObject_CallMethodNoArgs(out, s_data_ptr)) == NULL) ||
                PyList_Append(pointers, ptr) < 0)
            goto done;
    }
    int launched = launch_prepared(prepared, direct, g, pointers, NULL, a[3]);
    if (launched > 0) {  /* a map to encode: Python allocates its own output */
        if (allocate != Py_None &&
                PyList_SetSlice(pointers, PyList_GET_SIZE(pointers) - 1,
                                PyList_GET_SIZE(pointers), NULL) < 0)
            goto done;
        goto python;
    }
    if (launched == 0) {
        result = out;
        out = NULL;
    }
    goto done;
python:
    result = PyTuple_Pack(3, hit ? hit : Py_None, key, pointers);
done:
    Py_XDECREF(hit);
    Py_DECREF(key);
    Py_DECREF(pointers);
    Py_XDECREF(prepared);
    Py_XDECREF(direct);
    Py_XDECREF(grid);
    Py_XDECREF(allocate);
    Py_XDECREF(out);
    Py_XDECREF(ptr);
    return result;
}
#endif

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "cuLaunchKernel"},
    {"replay_lookup", (PyCFunction)(void (*)(void))replay_lookup, METH_FASTCALL,
     "replay key and lookup"},
    {"plain_keywords", plain_keywords, METH_O, "the keywords' part of a replay key"},
    {"set_tensor_reader", set_tensor_reader, METH_O, "read plain tensors' key parts in C++"},
#ifndef Py_GIL_DISABLED
    {"launch_pointers", (PyCFunction)(void (*)(void))launch_pointers, METH_FASTCALL,
     "write data pointers, cuLaunchKernel"},
    {"replay_launch", (PyCFunction)(void (*)(void))replay_launch, METH_FASTCALL,
     "replay key, lookup and pointer launch"},
    {"entry_launch", (PyCFunction)(void (*)(void))entry_launch, METH_FASTCALL,
     "an entry point's replay: key, lookup, output, pointer launch"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tegula_fastcall", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit_tegula_fastcall(void)
{
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_shape = PyUnicode_InternFromString("shape");
    s_stride = PyUnicode_InternFromString("stride");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_get_device = PyUnicode_InternFromString("get_device");
    fifteen = PyLong_FromLong(15);
    if (!s_data_ptr || !s_shape || !s_stride || !s_dtype || !s_get_device || !fifteen)
        return NULL;
#ifndef Py_GIL_DISABLED
    s_direct = PyUnicode_InternFromString("direct");
    s_device = PyUnicode_InternFromString("device");
    s_kernel = PyUnicode_InternFromString("kernel");
    s_prepared = PyUnicode_InternFromString("prepared");
    s_grid = PyUnicode_InternFromString("grid");
    s_allocate = PyUnicode_InternFromString("allocate");
    if (!s_direct || !s_device || !s_kernel || !s_prepared || !s_grid || !s_allocate)
        return NULL;
#endif
    return PyModule_Create(&module);
}
"""

#: Why the extension is not in use (None while it is, or before the first attempt).
unavailable: str | None = None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _cache_key(cc: str, include: str) -> str:
    blob = "\0".join([SOURCE, sys.version, sysconfig.get_config_var("EXT_SUFFIX") or "",
                      os.path.realpath(cc), include, "fastcall-11"])
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


def _load(binary: bytes, name: str = "tegula_fastcall"):
    """Import the extension `name` from a private temporary copy (the dynamic loader needs
    a file; the copy is deleted once loaded)."""
    with tempfile.TemporaryDirectory(prefix="tegula-fastcall-") as folder:
        path = os.path.join(folder, name + sysconfig.get_config_var("EXT_SUFFIX"))
        with open(path, "wb") as f:
            f.write(binary)
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module


def c_launcher(launch_kernel_address: int, cache=None) -> Callable[..., int] | None:
    """`launch(function, gx, gy, gz, threads, shared, stream, params) -> CUresult` calling
    the `cuLaunchKernel` at `launch_kernel_address` from C (all arguments ints), or None
    where the extension cannot be built or loaded (`unavailable` says why)."""
    module = c_extension(cache)
    return None if module is None else partial(module.launch, launch_kernel_address)


def c_extension(cache=None):
    """The extension module (`launch`, `replay_lookup`, `plain_keywords`, and
    `launch_pointers` where Python has a GIL), built or found in the cache; None where it cannot be built or loaded
    (`unavailable` says why)."""
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
    _LOADED.append(module)
    use_tensor_reader()
    return module


_LOADED: list = []  # every copy of the extension loaded in this process


def use_tensor_reader(on: bool = True) -> bool:
    """Let every loaded copy of the extension read plain torch tensors' replay-key parts
    from C++ (`tegula.runtime.torch_alloc`'s reader: no call into torch's Python bindings
    per attribute) where that extension is ready (`on=False`: through Python again, to
    compare); called again when it becomes ready. Whether the reader is in use."""
    from tegula.runtime import torch_alloc
    loaded = torch_alloc.module() if on else None
    reader = None if loaded is None else loaded.tensor_reader()
    for module in _LOADED:
        module.set_tensor_reader(reader)
    return reader is not None
