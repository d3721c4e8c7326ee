"""The fuzzer writes some casts between f32 and i32 as `tg.bitcast` (`Cast.bits`): the
reference reinterprets the bits, known where the value is exact. Session 10: the CUDA
emitter truncated such bitcasts to 16 bits (the emulator, which runs the thread IR, was
right), and no fuzz program had a bitcast to show it on the GPU."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tegula.fuzz import fuzz_program, make_program
from tegula.fuzz.generate import Switches
from tegula.fuzz.program import Cast, Invalid, Loop, check
from tegula.fuzz.source import kernel_source

SEED, PROGRAMS = 5, 300


def _statements(body):
    for s in body:
        yield s
        if isinstance(s, Loop) or hasattr(s, "body"):
            yield from _statements(getattr(s, "body", ()))


def bitcast_programs(seed=SEED, count=PROGRAMS):
    return [i for i in range(count) if any(isinstance(s, Cast) and s.bits
                                           for s in _statements(make_program(seed, i).body))]


def test_bitcasts_are_generated_without_changing_the_other_programs():
    found = bitcast_programs()
    assert len(found) >= 8, found
    for i in range(PROGRAMS):
        p, q = make_program(SEED, i), make_program(SEED, i, Switches(bitcasts=False))
        if i not in found:
            assert p == q
    source = kernel_source(make_program(SEED, found[0]))
    assert "tg.bitcast(" in source


def test_the_generated_bitcasts_pass():
    statuses = [fuzz_program(make_program(SEED, i), SEED, i).status
                for i in bitcast_programs()[:8]]
    assert set(statuses) <= {"pass", "rejected"} and statuses.count("pass") >= 4, statuses


def test_a_bitcast_is_between_f32_and_i32():
    program = make_program(SEED, bitcast_programs()[0])
    body = tuple(replace(s, dtype="f16") if isinstance(s, Cast) and s.bits else s
                 for s in program.body)
    with pytest.raises(Invalid, match="bitcasts are generated between f32 and i32"):
        check(program.with_body(body))
