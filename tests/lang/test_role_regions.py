"""`with tg.producer(): …` / `with tg.consumer(): …` at trace time (tegula/lang/roles.py):
what a pipeline with role blocks records (`ForLoop.regions`), and every misuse the language
can see refused as a TraceError at the user's own line (checked against marker comments):
a block outside a `tg.pipeline` body, blocks nested, a consumer without a producer (and
the reverse), two blocks of a role, the consumer first, an op of the body in neither, a
producer op that is not a stage load, a stage load in the consumer, a shared buffer
written by both roles, and register budgets setmaxnreg cannot set."""
from __future__ import annotations

import os
import sys

import pytest

import tegula as tg
from tegula import f16, f32
from tegula.errors import TraceError
from tegula.ir.ops import Copy, ForLoop, Gemm, walk_ops

sys.path.insert(0, os.path.dirname(__file__))
from source_lines import marked_line  # noqa: E402


def line_of(marker: str) -> int:
    return marked_line(__file__, marker)


def expect(kernel, marker: str, *phrases: str, **constexprs) -> TraceError:
    """Tracing `kernel` fails at the line holding `marker`, with every phrase in the text."""
    with pytest.raises(TraceError) as info:
        kernel.trace_fresh(**constexprs)
    err = info.value
    assert err.loc is not None and err.loc.lineno == line_of(marker), (str(err), marker)
    for phrase in phrases:
        assert phrase in err.message, (phrase, err.message)
    assert "internal" not in err.message and "tegula bug" not in err.message
    return err


@tg.kernel(threads=128)
def stated(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
           BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32,
           STAGES: tg.constexpr = 3, P: tg.constexpr = 40, C: tg.constexpr = None):
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        with tg.producer(regs=P):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
        with tg.consumer(regs=C):
            tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


def test_a_pipeline_records_its_role_blocks_over_one_flat_body():
    traced = stated.trace_fresh(C=232)
    loop = next(op for op in walk_ops(traced.body) if isinstance(op, ForLoop))
    producer, consumer = loop.region("producer"), loop.region("consumer")
    assert [r.role for r in loop.regions] == ["producer", "consumer"]
    assert (producer.registers, consumer.registers) == (40, 232)
    # The body is the same flat list a plain pipeline has; the regions name parts of it.
    assert [type(op) for op in loop.body] == [Copy, Copy, Gemm]
    assert all(producer.holds(op) for op in loop.body[:2])
    assert consumer.holds(loop.body[2]) and not producer.holds(loop.body[2])
    assert producer.loc.line.startswith("with tg.producer")


@tg.kernel(threads=128)
def outside_loop(a: tg.Tensor[f16]):
    with tg.producer():  # MARK-outside
        pass


@tg.kernel(threads=128)
def in_range(a: tg.Tensor[f16]):
    for k in tg.range(4):
        with tg.consumer():  # MARK-range
            pass


@tg.kernel(threads=128)
def in_branch(a: tg.Tensor[f16], n: int):
    sa = tg.shared((64, 32), f16, stages=2)
    for k in tg.pipeline(4, stages=2):
        with tg.if_(n > 0):
            with tg.producer():  # MARK-branch
                tg.copy(a.tile((64, 32), (0, k)), sa[k])


@tg.kernel(threads=128)
def nested(a: tg.Tensor[f16]):
    sa = tg.shared((64, 32), f16, stages=2)
    for k in tg.pipeline(4, stages=2):
        with tg.producer():
            with tg.consumer():  # MARK-nested
                tg.copy(a.tile((64, 32), (0, k)), sa[k])


def test_a_block_outside_a_pipeline_body_is_refused_at_its_line():
    expect(outside_loop, "MARK-outside", "tg.producer", "directly in the body of a "
           "tg.pipeline", "outside any loop")
    expect(in_range, "MARK-range", "tg.consumer", "inside the tg.range loop")
    expect(in_branch, "MARK-branch", "inside the tg.if_ block")
    expect(nested, "MARK-nested", "do not nest", "tg.producer block at line")


def _pipeline(roles: str):
    """A GEMM pipeline whose body is written per `roles` (each case below one misuse)."""

    @tg.kernel(threads=128)
    def kernel(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16]):
        ga = a.tile((64, 32), (tg.block_id(0), None))
        gb = b.tile((64, 32), (tg.block_id(1), None))
        acc = tg.zeros((64, 64), f32)
        sa = tg.shared((64, 32), f16, stages=3)
        sb = tg.shared((64, 32), f16, stages=3)
        sc = tg.shared((64, 32), f16, stages=3)
        for k in tg.pipeline(ga.shape[2], stages=3):
            if roles == "consumer only":
                tg.copy(ga[:, :, k], sa[k])  # MARK-bare-copy
                tg.copy(gb[:, :, k], sb[k])
                with tg.consumer():  # MARK-lone-consumer
                    tg.gemm(acc, sa[k], sb[k])
            elif roles == "producer only":
                with tg.producer():  # MARK-lone-producer
                    tg.copy(ga[:, :, k], sa[k])
                    tg.copy(gb[:, :, k], sb[k])
            elif roles == "consumer first":
                with tg.consumer():
                    tg.gemm(acc, sa[k], sb[k])
                with tg.producer():  # MARK-late-producer
                    tg.copy(ga[:, :, k], sa[k])
            elif roles == "two consumers":
                with tg.producer():
                    tg.copy(ga[:, :, k], sa[k])
                    tg.copy(gb[:, :, k], sb[k])
                with tg.consumer():
                    tg.gemm(acc, sa[k], sb[k])
                with tg.consumer():  # MARK-second-consumer
                    pass
            elif roles == "op in neither":
                with tg.producer():
                    tg.copy(ga[:, :, k], sa[k])
                    tg.copy(gb[:, :, k], sb[k])
                tg.gemm(acc, sa[k], sb[k])  # MARK-neither
                with tg.consumer():
                    pass
            elif roles == "gemm in producer":
                with tg.producer():
                    tg.copy(ga[:, :, k], sa[k])
                    tg.copy(gb[:, :, k], sb[k])
                    tg.gemm(acc, sa[k], sb[k])  # MARK-producer-gemm
                with tg.consumer():
                    pass
            elif roles == "register copy in producer":
                with tg.producer():
                    tg.copy(ga[:, :, k], sa[k])
                    x = tg.load(gb[:, :, k])  # MARK-producer-load
                with tg.consumer():
                    pass
            elif roles == "both write":
                with tg.producer():
                    tg.copy(ga[:, :, k], sa[k])  # MARK-producer-writes
                    tg.copy(gb[:, :, k], sb[k])
                with tg.consumer():
                    tg.copy(tg.zeros((64, 32), f16), sa[k])  # MARK-consumer-writes
                    tg.gemm(acc, sa[k], sb[k])
            elif roles == "stage load in consumer":
                with tg.producer():
                    tg.copy(ga[:, :, k], sa[k])
                    tg.copy(gb[:, :, k], sb[k])
                with tg.consumer():
                    tg.copy(ga[:, :, k], sc[k])  # MARK-consumer-load
                    tg.gemm(acc, sa[k], sb[k])
            elif roles == "empty producer":
                with tg.producer():  # MARK-empty-producer
                    pass
                with tg.consumer():
                    tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), c.tile((64, 64), (tg.block_id(0), tg.block_id(1))))

    return kernel


@pytest.mark.parametrize("roles, marker, phrases", [
    ("consumer only", "MARK-lone-consumer", ("has a tg.consumer block but no tg.producer",)),
    ("producer only", "MARK-lone-producer", ("has a tg.producer block but no tg.consumer",)),
    ("consumer first", "MARK-late-producer", ("must come before the tg.consumer",)),
    ("two consumers", "MARK-second-consumer", ("already has a tg.consumer block",)),
    ("op in neither", "MARK-neither", ("tg.gemm at line", "in neither")),
    ("gemm in producer", "MARK-producer-gemm", ("tg.gemm at line", "cannot run in the "
                                                "producer")),
    ("register copy in producer", "MARK-producer-load", ("cannot run in the producer",)),
    ("both write", "MARK-consumer-writes", ("writes %", "written by both roles")),
    ("stage load in consumer", "MARK-consumer-load", ("stage load", "tg.producer")),
    ("empty producer", "MARK-empty-producer", ("the block is empty",)),
])
def test_misused_role_blocks_are_refused_at_the_users_line(roles, marker, phrases):
    err = expect(_pipeline(roles), marker, *phrases)
    if roles == "both write":  # both lines are named: the consumer's write, the producer's
        assert err.other_loc.lineno == line_of("MARK-producer-writes")


@pytest.mark.parametrize("regs", [41, 16, 264, 0, -8, True, "40", 40.0])
def test_register_budgets_setmaxnreg_cannot_set_are_refused(regs):
    @tg.kernel(threads=128)
    def kernel(a: tg.Tensor[f16]):
        sa = tg.shared((64, 32), f16, stages=2)
        for k in tg.pipeline(4, stages=2):
            with tg.producer(regs=regs):  # MARK-bad-regs
                tg.copy(a.tile((64, 32), (0, k)), sa[k])
            with tg.consumer():
                pass

    expect(kernel, "MARK-bad-regs", f"regs={regs!r}", "multiple of 8 from 24 to 256")


def test_role_blocks_outside_a_kernel_are_refused():
    with pytest.raises(TraceError, match="inside the body of a @tg.kernel"):
        tg.producer()


def test_the_tile_ir_text_shows_the_blocks_and_verify_checks_them():
    from tegula.errors import TegulaError
    from tegula.ir.printer import format_kernel
    from tegula.ir.verify import verify
    traced = stated.trace_fresh(C=232)
    text = format_kernel(traced)
    producer_at = text.index("with producer(regs=40):")
    consumer_at = text.index("with consumer(regs=232):")
    assert producer_at < text.index("copy %a") < consumer_at < text.index("gemm %r0")
    loop = next(op for op in walk_ops(traced.body) if isinstance(op, ForLoop))
    outside = traced.body[-1]                      # the epilogue's store: not in the loop
    loop.region("consumer").ops.append(outside)
    with pytest.raises(TegulaError, match="consumer region holds ops outside its body"):
        verify(traced)
    loop.region("consumer").ops[-1] = loop.body[0]  # the producer's copy, twice
    with pytest.raises(TegulaError, match="an op is in two of its role regions"):
        verify(traced)
