"""What the hardware would silently get wrong in asynchronous thread IR, the emulator
reports: each test injects one bug into a Hopper sample that the pipeline tests show right,
and checks the report names the statement, the barrier and the role — never a hang (every
run has a deadline), never a wrong answer."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.emulate import EmulationError, run_thread_kernel
from tegula.lower.async_ir import (BulkWait, FenceProxyAsync, MBarrierArrive, MBarrierInit,
                                   MBarrierWait, NamedBarrier, TmaLoad, WgmmaFence,
                                   WgmmaWait)
from tegula.lower.thread_ir import Barrier, Const

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_kernels import (gemm_inputs, gemm_kernel, loop_body, remove, role_body,  # noqa: E402
                           round_trip_kernel, run_gemm, run_with_deadline)


def _gemm_error(kernel, m=97, n=70, k=330, role_order="listed") -> str:
    a, b, c = gemm_inputs(m, n, k)
    with pytest.raises(EmulationError) as info:
        run_gemm(kernel, a, b, c, role_order=role_order)
    return str(info.value)


def _round_trip_error(kernel) -> str:
    x = np.random.default_rng(0).standard_normal((70, 45)).astype(np.float32)
    y = np.zeros_like(x)
    with pytest.raises(EmulationError) as info:
        run_with_deadline(lambda: run_thread_kernel(kernel, (2, 2), {"x": x, "y": y}))
    return str(info.value)


def test_missing_empty_arrival_is_a_deadlock_naming_both_roles():
    kernel = gemm_kernel()
    consumer = role_body(kernel, "consumer")
    assert remove(loop_body(consumer), lambda s: isinstance(s, MBarrierArrive)) == 1
    msg = _gemm_error(kernel)
    assert "deadlock" in msg
    assert "role 'producer' (warp_specialized_gemm: producer warpgroup) waits at MBarrierWait" \
        in msg and "empty[0] parity 0" in msg
    assert "role 'consumer' (warp_specialized_gemm: consumer warpgroup) waits at MBarrierWait" \
        in msg and "full[0] parity 1" in msg
    # The barrier's state and the loop iteration each role stopped at.
    assert "empty[0] in phase 0 (parity 0), 128 of 128 arrivals pending" in msg
    assert "kt=2" in msg and "kt=0" not in msg.split("role 'consumer'")[1].split("\n")[0]


# Which role runs first decides where an unsynchronized consumer is caught: before the
# producer has issued anything (reading shared memory nothing wrote) or after (reading
# TMA data whose phase it never waited for). Both orders must report.
@pytest.mark.parametrize("producer_first", [False, True])
def test_wrong_parity_is_reported(producer_first):
    kernel = gemm_kernel()
    wait = next(s for s in loop_body(role_body(kernel, "consumer"))
                if isinstance(s, MBarrierWait))
    wait.parity = wait.parity ^ 1           # passes a fresh barrier at once
    msg = _gemm_error(kernel, role_order="reversed" if producer_first else "listed")
    if producer_first:   # full[0] completed phase 0: waiting for parity 1 blocks for good
        assert "deadlock" in msg and "role 'consumer'" in msg and "full[0] parity 1" in msg
        assert "full[0] in phase 1 (parity 1)" in msg
    else:
        assert "Wgmma" in msg and "which nothing has written" in msg
        assert "role 'consumer'" in msg


@pytest.mark.parametrize("producer_first", [False, True])
def test_reading_tma_data_before_its_wait_is_reported(producer_first):
    kernel = gemm_kernel()
    assert remove(loop_body(role_body(kernel, "consumer")),
                  lambda s: isinstance(s, MBarrierWait)) == 1
    msg = _gemm_error(kernel, role_order="reversed" if producer_first else "listed")
    assert "Wgmma" in msg and "role 'consumer'" in msg
    if producer_first:
        assert "shared memory a TMA copy may still be writing" in msg
        assert "before a wait observed phase 0 of mbarrier full[0]" in msg
    else:
        assert "which nothing has written" in msg


def test_generic_read_of_tma_data_before_its_wait_is_reported():
    kernel = round_trip_kernel()
    assert remove(kernel.body, lambda s: isinstance(s, MBarrierWait)) == 1
    msg = _round_trip_error(kernel)
    assert "read of shared memory a TMA copy may still be writing" in msg
    assert "SharedLoad" in msg and "mbarrier bar[0]" in msg


def test_missing_wgmma_wait_is_reported():
    kernel = gemm_kernel()
    assert remove(role_body(kernel, "consumer"), lambda s: isinstance(s, WgmmaWait)) == 1
    msg = _gemm_error(kernel)
    # The consumer frees the stage while its wgmmas still read it: the producer's next copy
    # into the stage is the first to notice.
    assert "while a wgmma or TMA store still reads it" in msg and "TmaLoad" in msg


def test_reading_an_accumulator_in_flight_is_reported():
    kernel = gemm_kernel()
    consumer = role_body(kernel, "consumer")
    # Keep the in-loop wait (the ring stays safe) but let the last group fly: wait_group 1
    # at the end of the loop, so the epilogue reads accumulators a wgmma still writes.
    wait = next(s for s in loop_body(consumer) if isinstance(s, WgmmaWait))
    wait.pending = 1
    msg = _gemm_error(kernel, k=64)
    assert "accesses register acc[0], an accumulator of Wgmma" in msg
    assert "missing wgmma.wait_group" in msg and "GlobalStore" in msg


def test_wgmma_without_fence_after_register_writes_is_reported():
    kernel = gemm_kernel()
    assert remove(role_body(kernel, "consumer"), lambda s: isinstance(s, WgmmaFence)) == 1
    msg = _gemm_error(kernel)
    assert "no wgmma.fence" in msg and "warpgroup 0" in msg


def test_missing_proxy_fence_before_tma_store_is_reported():
    kernel = round_trip_kernel()
    assert remove(kernel.body, lambda s: isinstance(s, FenceProxyAsync)) == 1
    msg = _round_trip_error(kernel)
    assert "TmaStore" in msg and "no fence.proxy.async after the write" in msg


def test_tma_store_not_waited_for_is_reported():
    kernel = round_trip_kernel()
    assert remove(kernel.body, lambda s: isinstance(s, BulkWait)) == 1
    assert "TMA stores not waited for" in _round_trip_error(kernel)


def test_unsatisfiable_wait_outside_roles_is_a_deadlock():
    kernel = round_trip_kernel()
    wait = next(s for s in kernel.body if isinstance(s, MBarrierWait))
    wait.parity = Const(1)
    msg = _round_trip_error(kernel)
    assert "deadlock: the block waits at MBarrierWait" in msg
    assert "bar[0] in phase 1 (parity 1)" in msg


def test_mbarrier_misuse_is_reported():
    # Used before init.
    kernel = round_trip_kernel()
    remove(kernel.body, lambda s: isinstance(s, MBarrierInit))
    assert "used before mbarrier.init" in _round_trip_error(kernel)
    # Every thread arrives on a barrier that counts one arrival.
    kernel = round_trip_kernel()
    arrive = next(s for s in kernel.body if isinstance(s, MBarrierArrive))
    kernel.body.insert(kernel.body.index(arrive), MBarrierArrive("bar", Const(0)))
    assert "arrival count underflow" in _round_trip_error(kernel)
    # expect_tx smaller than the box: more bytes arrive than expected.
    kernel = round_trip_kernel()
    next(s for s in kernel.body if isinstance(s, MBarrierArrive)).tx_bytes -= 4
    assert "4 more transaction bytes than were expected" in _round_trip_error(kernel)
    # Used by other threads with no barrier after the init.
    kernel = round_trip_kernel()
    kernel.body.remove(next(s for s in kernel.body if isinstance(s, Barrier)))
    msg = _round_trip_error(kernel)
    assert "initialized by thread 0 with no barrier in between" in msg


def test_producer_overwriting_an_unconsumed_stage_is_reported():
    kernel = gemm_kernel()
    assert remove(loop_body(role_body(kernel, "producer")),
                  lambda s: isinstance(s, MBarrierWait)) == 1
    msg = _gemm_error(kernel)
    assert "TmaLoad" in msg and "TMA copy may still be writing" in msg


def test_syncthreads_inside_a_role_is_reported():
    kernel = gemm_kernel()
    consumer = role_body(kernel, "consumer")
    consumer[consumer.index(next(s for s in consumer if isinstance(s, NamedBarrier)))] = Barrier()
    assert "__syncthreads inside role 'consumer'" in _gemm_error(kernel)


def test_named_barrier_waiting_for_more_threads_than_arrive_is_a_deadlock():
    kernel = gemm_kernel()
    named = next(s for s in role_body(kernel, "consumer") if isinstance(s, NamedBarrier))
    named.threads = 256                     # the producer never arrives at it
    msg = _gemm_error(kernel)
    assert "deadlock" in msg and "NamedBarrier" in msg and "128 of 256 threads arrived" in msg
    assert "role 'producer' (warp_specialized_gemm: producer warpgroup): finished" in msg


def test_tma_load_with_a_box_outside_the_buffer_is_reported():
    kernel = gemm_kernel()
    load = next(s for s in loop_body(role_body(kernel, "producer")) if isinstance(s, TmaLoad))
    load.offset = load.offset + 64 * 64     # stage 1's box lands past the ring
    msg = _gemm_error(kernel)
    assert "TmaLoad" in msg and "leaves shared buffer 'sa'" in msg and "kt=1" in msg


def test_tma_load_breaking_a_box_rule_is_reported():
    kernel = gemm_kernel()
    load = next(s for s in loop_body(role_body(kernel, "producer")) if isinstance(s, TmaLoad))
    load.offset = load.offset + 64          # off the 1024-byte swizzle atom
    msg = _gemm_error(kernel)
    assert "TmaLoad" in msg and "must be 1024-byte aligned" in msg


def test_deadlock_threads_do_not_linger():
    """The role threads of a failed block are unwound and joined, not left parked."""
    import threading
    before = threading.active_count()
    kernel = gemm_kernel()
    remove(loop_body(role_body(kernel, "consumer")), lambda s: isinstance(s, MBarrierArrive))
    _gemm_error(kernel)
    assert threading.active_count() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("tegula-role")]


def test_mbarriers_overlapping_a_buffer_are_refused():
    kernel = gemm_kernel()
    full = kernel.mbarriers[0]
    kernel.mbarriers[0] = type(full)(full.name, full.count, full.byte_offset - 8)
    msg = _gemm_error(kernel)
    assert "mbarrier array 'full'" in msg and "overlaps" in msg and "'sb'" in msg


def test_releasing_a_stage_a_wgmma_group_still_reads_is_reported():
    """wait_group 1 keeps the last group in flight, so the stage it reads may not be
    released yet: the producer's next copy into it is reported."""
    kernel = gemm_kernel(64, 2)
    body = loop_body(role_body(kernel, "consumer"))
    body[body.index(next(s for s in body if isinstance(s, WgmmaWait)))] = WgmmaWait(1)
    msg = _gemm_error(kernel)
    assert "TmaLoad" in msg and "while a wgmma or TMA store still reads it" in msg


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_parity_a_round_behind_is_reported(role_order):
    """A consumer that always waits for parity 0 passes its second-round wait at once when
    the barrier still shows the first round's completion: on the GPU it would read the
    stage's old data. Whichever role runs first, this is reported: the producer cannot
    refill the stage before the consumer frees it."""
    kernel = gemm_kernel()
    wait = next(s for s in loop_body(role_body(kernel, "consumer"))
                if isinstance(s, MBarrierWait))
    wait.parity = Const(0)
    msg = _gemm_error(kernel, role_order=role_order)
    assert "passes its wait on mbarrier full[0] at the same phase (1 completed) as its " \
        "previous wait" in msg and "role 'consumer'" in msg


def test_grid_of_partial_clusters_is_refused():
    kernel = round_trip_kernel()
    kernel.cluster = (2, 1, 1)
    x = np.ones((70, 45), dtype=np.float32)
    with pytest.raises(EmulationError, match=r"grid \(3, 2, 1\) is not a multiple of its "
                                             r"cluster dimensions \(2, 1, 1\)"):
        run_thread_kernel(kernel, (3, 2), {"x": x, "y": np.zeros_like(x)})
    y = np.zeros_like(x)
    run_with_deadline(lambda: run_thread_kernel(kernel, (2, 2), {"x": x, "y": y}))
    assert np.array_equal(y, x + 1)


def test_tensor_map_whose_box_rank_differs_from_its_dims_is_refused():
    kernel = round_trip_kernel()
    i = next(i for i, p in enumerate(kernel.params) if p.name == "x_map")
    m = kernel.params[i]
    kernel.params[i] = type(m)(m.name, m.tensor, m.dtype, dims=(1, 0), box=(32, 64, 1),
                               swizzle=m.swizzle)
    assert "tensor map 'x_map' has 2 dims but a box of rank 3" in _round_trip_error(kernel)


@pytest.mark.parametrize("producer_first", [False, True])
def test_a_repeated_wait_passes_at_its_phase_and_is_reported_before_one(producer_first):
    """`MBarrierWait.repeat` (the lowering's `split_reused_products`): right after the
    stage's own wait it passes and the GEMM stays right; placed before that wait (the
    thread never observed this phase) the emulator reports it."""
    import dataclasses
    order = "reversed" if producer_first else "listed"
    kernel = gemm_kernel()
    body = loop_body(role_body(kernel, "consumer"))
    at, wait = next((i, s) for i, s in enumerate(body) if isinstance(s, MBarrierWait))
    body.insert(at + 1, dataclasses.replace(wait, repeat=True))
    a, b, c = gemm_inputs(97, 70, 330)
    run_gemm(kernel, a, b, c, role_order=order)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.abs(c - ref).max() <= 1e-2 * np.abs(ref).max()
    kernel = gemm_kernel()
    body = loop_body(role_body(kernel, "consumer"))
    at, wait = next((i, s) for i, s in enumerate(body) if isinstance(s, MBarrierWait))
    body.insert(at, dataclasses.replace(wait, repeat=True))
    msg = _gemm_error(kernel, role_order=order)
    assert "repeats its wait on mbarrier full" in msg and "moved on" in msg
