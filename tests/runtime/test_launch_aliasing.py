"""Launch-time aliasing checks (`tegula.runtime.aliasing`): a tensor the kernel writes
must not share memory with another argument, except the identical tensor of a kernel that
reads and writes each element in one thread; checked by the full flatten, the Python
replay and the C replay (`fastcall.launch_direct`) alike."""
from __future__ import annotations

import pytest

from tegula.codegen.samples import shared_transpose, vector_copy
from tegula.dtypes import f32
from tegula.errors import LaunchError
from tegula.runtime import CompiledKernel, PreparedLaunch
from tegula.runtime.aliasing import (alias_rules, byte_range, elements_share_bytes,
                                     in_place_reason, writes_itself)

from .test_args import FakeCudaArray
from .test_direct_launch import direct, pointers_of  # noqa: F401  (the fixture)

BASE = 0x7F0000000000


def copy_kernel():
    return CompiledKernel(vector_copy(f32, 1), b"", "", "sm_90a")


def test_only_pairs_with_a_written_tensor_are_checked():
    rules = alias_rules(vector_copy(f32, 1))
    assert [(r.written, r.other) for r in rules] == [("y", "x")]
    assert rules[0].reason is None                     # y[i] = x[i] by one thread: in place
    reason = in_place_reason(shared_transpose(), "y", "x")
    assert "not followed by a store" in reason         # the transpose moves elements


def test_byte_ranges_and_exact_interleaving():
    assert byte_range((4, 6), (6, 1), 32) == (0, 96)
    assert byte_range((4, 0), (6, 1), 32) is None      # empty: no memory
    assert byte_range((3,), (1,), 4) == (0, 2)         # three nibbles: two bytes
    even = (BASE, (8, 4), (8, 2), 32)                  # columns 0, 2, 4, 6 of an 8x8
    odd = (BASE + 4, (8, 4), (8, 2), 32)
    assert not elements_share_bytes(even, odd)
    assert elements_share_bytes(even, (BASE + 8, (8, 4), (8, 2), 32))
    assert writes_itself((4, 5), (0, 1)) and not writes_itself((4, 5), (5, 1))


@pytest.mark.parametrize("x,y,message", [
    ((BASE, (64,), None), (BASE + 4, (64,), None), "their memory overlaps"),   # x, x[1:]
    ((BASE, (64,), None), (BASE + 252, (64,), None), "their memory overlaps"),  # one element
])
def test_overlapping_arguments_are_refused_at_launch(x, y, message):
    ck = copy_kernel()
    args = [FakeCudaArray(s[1], "<f4", ptr=s[0]) for s in (x, y)]
    with pytest.raises(LaunchError, match=message) as info:
        ck.plan.flatten(args)
    text = str(info.value)
    assert "tg_copy_f32_v1" in text and "'y' (written)" in text and "'x'" in text
    assert "test_launch_aliasing.py" in text            # the user's line


def test_identical_and_disjoint_and_interleaved_arguments_launch():
    ck = copy_kernel()
    same = FakeCudaArray((64,), "<f4", ptr=BASE)
    ck.plan.flatten([same, same])                                        # in place
    ck.plan.flatten([FakeCudaArray((64,), "<f4", ptr=BASE),
                     FakeCudaArray((64,), "<f4", ptr=BASE + 256)])       # adjacent
    ck.plan.flatten([FakeCudaArray((32,), "<f4", ptr=BASE, strides=(2,)),
                     FakeCudaArray((32,), "<f4", ptr=BASE + 4, strides=(2,))])  # interleaved


def test_a_kernel_that_moves_elements_is_refused_in_place_and_broadcast_outputs():
    ck = CompiledKernel(shared_transpose(), b"", "", "sm_90a")
    square = FakeCudaArray((64, 64), "<f4", ptr=BASE)
    with pytest.raises(LaunchError, match="cannot run in place: a load of 'x'"):
        ck.plan.flatten([square, square])
    with pytest.raises(LaunchError, match="broadcast view"):
        copy_kernel().plan.flatten([FakeCudaArray((64,), "<f4", ptr=BASE),
                                    FakeCudaArray((64,), "<f4", ptr=BASE + 4096,
                                                  strides=(0,))])


def test_replays_check_every_launch_in_c_and_in_python(direct):  # noqa: F811
    ck = copy_kernel()
    driver = direct(ck)
    first = [FakeCudaArray((64,), "<f4", ptr=BASE), FakeCudaArray((64,), "<f4", ptr=BASE + 4096)]
    prepared = PreparedLaunch(ck, ck.plan.flatten(first)[0], device=0)
    assert prepared.aliases.c_pairs == ((1, 0, 256, 0, 0, 256, 1),)
    prepared((1, 1, 1), first, pointers_of(first))
    assert isinstance(prepared.direct, tuple) and len(driver.launches) == 1
    overlapping = [BASE, BASE + 128]                       # y starts inside x: refused
    with pytest.raises(LaunchError, match="share memory"):
        prepared((1, 1, 1), first, overlapping)
    with pytest.raises(LaunchError, match="share memory"):
        prepared((1, 1, 1), first, tuple(overlapping))     # the entry points' tuple
    assert len(driver.launches) == 1                       # nothing launched
    prepared((1, 1, 1), first, [BASE, BASE])               # identical: in place, in C
    assert len(driver.launches) == 2
    prepared.direct = None                                 # the Python replay
    with pytest.raises(LaunchError, match="share memory"):
        prepared((1, 1, 1), first, overlapping)
