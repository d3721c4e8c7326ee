"""Cluster launches on CPU: the cluster is checked when the kernel is wrapped and against
the grid at each launch, and the launch goes through cuLaunchKernelEx with one
cluster-dimension attribute (the driver call itself is recorded by a fake)."""
from __future__ import annotations

import dataclasses
import types

import pytest

from tegula.codegen.samples import vector_copy
from tegula.dtypes import f32
from tegula.errors import LaunchError
from tegula.runtime import CompiledKernel, launcher

driver = pytest.importorskip("cuda.bindings.driver")


def clustered(cluster):
    return dataclasses.replace(vector_copy(f32, 4), cluster=cluster)


class Array:
    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"shape": (1000,), "typestr": "<f4",
                                         "data": (ptr, False), "version": 3, "strides": None}


@pytest.fixture
def recorded(monkeypatch):
    """Every cuLaunchKernelEx / cuLaunchKernel call, with the driver otherwise real."""
    calls = []

    def launch_ex(config, function, params, extra):
        calls.append(("ex", config, function, params))
        return (driver.CUresult.CUDA_SUCCESS,)

    fake = types.SimpleNamespace(**{n: getattr(driver, n) for n in dir(driver)
                                    if not n.startswith("__")})
    fake.cuLaunchKernelEx = launch_ex
    monkeypatch.setattr(launcher.drv, "cuda_driver", lambda: fake)
    monkeypatch.setattr(launcher, "_C_LAUNCH", [None])  # the ctypes path, stubbed below
    monkeypatch.setattr(launcher, "_RAW_LAUNCH",
                        [lambda *a: calls.append(("plain",) + a) or 0])
    monkeypatch.setattr(launcher, "_stream_handle", lambda stream, device: 0)
    return calls


def wrapped(cluster, monkeypatch):
    ck = CompiledKernel(clustered(cluster), b"", "", "sm_90a")
    monkeypatch.setattr(ck, "function", lambda device: driver.CUfunction(0x1234))
    ck._raw_functions[0] = 0x1234
    return ck


@pytest.mark.parametrize("cluster,words", [
    ((2, 0, 1), "three positive ints"), ((2, 1), "three positive ints"),
    ((2.0, 1, 1), "three positive ints"), ((4, 3, 1), "12 blocks; at most 8"),
])
def test_bad_clusters_are_refused_when_wrapped(cluster, words):
    with pytest.raises(LaunchError, match=f"tg_copy_f32_v4.*{words}"):
        CompiledKernel(clustered(cluster), b"", "", "sm_90a")


def test_cluster_launch_uses_launch_kernel_ex_with_the_cluster_attribute(recorded, monkeypatch):
    ck = wrapped((2, 1, 1), monkeypatch)
    args = [Array(0x10000), Array(0x20000)]
    ck.launch_values((4, 3), ck.plan.flatten(args)[0], 0)
    ck.launch_values((4, 3), ck.plan.flatten(args)[0], 0)
    assert [c[0] for c in recorded] == ["ex", "ex"]
    _, config, function, params = recorded[0]
    assert recorded[1][1] is config  # built once per grid and stream
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (4, 3, 1)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (ck.threads, 1, 1)
    assert config.sharedMemBytes == ck.shared_bytes and config.numAttrs == 1
    attribute = config.attrs[0]
    assert attribute.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    dims = attribute.value.clusterDim
    assert (dims.x, dims.y, dims.z) == (2, 1, 1)
    assert int(function) == 0x1234 and params == ck._args.address.value


def test_grid_must_be_a_multiple_of_the_cluster(recorded, monkeypatch):
    ck = wrapped((2, 2, 1), monkeypatch)
    values = ck.plan.flatten([Array(0x10000), Array(0x20000)])[0]
    with pytest.raises(LaunchError,
                       match=r"tg_copy_f32_v4: grid \(4, 3, 1\) is not a multiple .*\(2, 2, 1\)"):
        ck.launch_values((4, 3), values, 0)
    assert recorded == []


def test_kernels_without_a_cluster_keep_the_plain_launch(recorded, monkeypatch):
    ck = wrapped((1, 1, 1), monkeypatch)
    ck.launch_values(3, ck.plan.flatten([Array(0x10000), Array(0x20000)])[0], 0)
    assert [c[0] for c in recorded] == ["plain"]


def test_the_launch_calls_hand_the_bindings_types_they_accept():
    from .test_tensor_map import reaches_the_driver
    config = launcher.cluster_launch_config(driver, (4, 2, 1), 128, 1024, 0, (2, 1, 1))
    reaches_the_driver(lambda: driver.cuLaunchKernelEx(config, driver.CUfunction(0), 0x1000, 0))
    reaches_the_driver(lambda: driver.cuLaunchKernel(driver.CUfunction(0), 1, 1, 1, 128, 1, 1,
                                                     0, driver.CUstream(0), 0x1000, 0))
