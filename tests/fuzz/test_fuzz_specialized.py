"""The fuzzer draws warp-specialized builds (`warp_specialize=True`, `consumers=`):
`specialized.make_specialized_program` and, for the ordinary generator's pipelines that
state no roles, `Generator.build_options`. Session 12: small random sm_90a programs mostly
built in one role (the cost model's choice), so the fuzzer never drew the producer /
consumer lowering except through role blocks."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tegula.fuzz import fuzz_program, make_program
from tegula.fuzz.generate import Switches
from tegula.fuzz.program import Gemm, check
from tegula.fuzz.runner import build_options
from tegula.fuzz.shrink import shrink
from tegula.fuzz.source import kernel_source
from tegula.fuzz.specialized import make_specialized_program

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fuzz_interleavings import early_release_lowering  # noqa: E402,F401 (a fixture)

SEED = 1601


def test_specialized_programs_are_valid_reproducible_gemm_pipelines():
    programs = [make_specialized_program(SEED, i) for i in range(40)]
    for index, p in enumerate(programs):
        check(p)
        assert make_specialized_program(SEED, index) == p
        assert p.warp_specialize is True and p.threads in (128, 256) and p.BM in (64, 128)
        assert any(isinstance(s, Gemm) and s.stages >= 2 for s in p.body)
        assert "--specialized" in kernel_source(p)
    assert {p.consumers for p in programs} == {None, "cooperative", "pingpong"}
    assert any(p.cluster == 2 for p in programs)
    # K loops inside a tg.range: the ring spans it, the stores become TMA-store epilogues
    assert any(s.repeat > 1 for p in programs for s in p.body if isinstance(s, Gemm))
    # persistent tile loops, ping-pong asked for in them (one warpgroup's tile)
    persistent = [p for p in programs if p.persistent]
    assert persistent and all(p.cluster == 1 for p in persistent)
    assert any(p.consumers == "pingpong" and p.threads == 128 for p in persistent)
    assert all("for t in tg.range(tg.block_id(0), " in kernel_source(p) for p in persistent)


def test_near_misses_are_a_minority_of_the_draws():
    """Session 13: 46% of the warp-specialized programs were refused, most of them
    transposing copies (a global `.T` view into a K-major buffer: no TMA box), 8-bit
    MN-major operands and 64-row tiles on two warpgroups. Near misses stay, rarely."""
    programs = [make_specialized_program(SEED + 1, i) for i in range(200)]
    gemms = [s for p in programs for s in p.body if isinstance(s, Gemm)]
    gmem = sum("gmem" in (g.ta, g.tb) for g in gemms)
    wide = sum(p.threads == 256 and p.BM < 128 for p in programs)
    outside = sum(p.consumers == "pingpong" and not p.persistent for p in programs)
    assert 0 < gmem + wide + outside <= 40, (gmem, wide, outside)  # 20%


#: Programs of SEED: run in warp roles (persistent with a TMA-store epilogue, a cluster of
#: two, cooperative asked for, persistent on ping-pong consumers asked for) / refused
#: (transposing copies TMA cannot load, no TMA pipeline, ping-pong asked for beside a
#: shared tile both warpgroups would use). Program 7 takes 10+ s to emulate: left to the
#: long mode.
RUN_IN_ROLES, REFUSED = (0, 2, 4, 13), (3, 8, 14, 18)


@pytest.mark.parametrize("index", RUN_IN_ROLES + REFUSED)
def test_seeded_programs_run_their_roles_right_or_are_refused_cleanly(index):
    """Each against numpy, its roles in an interleaving drawn per program: none wrong,
    none internal; a run goes through TMA + wgmma in warp roles, a refusal is a
    `SynthesisError` naming what is missing."""
    program = make_specialized_program(SEED, index)
    verdict = fuzz_program(program, SEED, index)
    where = f"python -m tegula.fuzz --seed {SEED} --specialized {index}\n{verdict.detail}"
    assert not verdict.failed, where
    status, reason, paths = verdict.targets["sm_90a"]
    if index in RUN_IN_ROLES:
        assert status == "pass" and {"warp roles", "TMA", "wgmma", "mbarrier"} <= paths, where
    else:
        assert status == "rejected" and reason.startswith("SynthesisError"), where


def test_ordinary_pipelines_ask_for_roles_without_changing_the_programs():
    """`build_options` draws from a stream of its own: switched off, every program is the
    same but for the two options; on, some sm_90a pipelines ask for the producer (or for
    one role), none that states its roles."""
    drawn = 0
    for index in range(300):
        p = make_program(2, index)
        q = make_program(2, index, Switches(warp_specialize=False))
        assert replace(p, warp_specialize=None, consumers=None) == q
        if p.warp_specialize is not None:
            pipeline = next(s for s in p.body if isinstance(s, Gemm) and s.stages > 1)
            assert not pipeline.roles
            drawn += 1
    assert drawn >= 3, drawn


def test_the_options_reach_sm_90a_builds_only_and_the_printed_source_names_them():
    p = replace(make_specialized_program(SEED, 0), consumers="cooperative")
    assert build_options(p, "sm_90a") == {"warp_specialize": True, "consumers": "cooperative"}
    assert build_options(p, "sm_80") == build_options(p, "sm_90") == {}
    assert "# sm_90a launch options: warp_specialize=True, consumers='cooperative'" in \
        kernel_source(p)
    assert build_options(replace(p, warp_specialize=None, consumers=None), "sm_90a") == {}


def test_the_shrinker_drops_options_that_do_not_matter():
    """A failure that does not depend on the roles shrinks to a program without them."""
    program = make_specialized_program(SEED, 1)
    assert program.consumers is not None or program.warp_specialize

    def run(p):  # "fails" while the program has a pipeline, whatever its options
        from tegula.fuzz.runner import Verdict
        found = any(isinstance(s, Gemm) and s.stages >= 2 for s in p.body)
        return Verdict("mismatch", "pipeline") if found else Verdict("pass")
    small, verdict, _ = shrink(program, run, run(program), budget_s=10)
    assert verdict.status == "mismatch"
    assert small.warp_specialize is None and small.consumers is None


def test_the_long_mode_runs_every_other_one_under_a_stall_order(monkeypatch):
    """A role held after each named-barrier arrive while the others run ahead (the
    emulator's stall orders, which find a role lapping another) for odd indices; the
    order a program ran under is what its reproducing command repeats."""
    import tegula.fuzz.__main__ as cli
    from tegula.fuzz.runner import Tally, Verdict
    seen = []
    monkeypatch.setattr(cli, "make_specialized_program", lambda seed, index, sw: index)
    monkeypatch.setattr(cli, "fuzz_program", lambda program, seed, index, features, targets,
                        order: seen.append(order) or Verdict("pass"))
    args = cli._parse(["--seed", "3"])
    for index in range(4):
        cli._run_specialized(args, Switches(), index, Tally(), {})
    assert seen == ["random", "stall", "random", "stall-reversed"]
    assert args.role_order == "random"


def test_the_sample_finds_an_injected_early_release(early_release_lowering):
    """A lowering whose consumers release each stage before their wgmma read it (a bug
    one-role builds cannot have) is found by the warp-specialized programs above under a
    stall order (the long mode's every other one), judged as the fuzzer judges them: a
    race the emulator names, not a silent pass. (Programs whose K loop never wraps the
    ring cannot show it.)"""
    found = [index for index in RUN_IN_ROLES
             if fuzz_program(make_specialized_program(SEED, index), SEED, index,
                             targets=("sm_90a",), role_order="stall-reversed").status
             == "internal"]
    assert early_release_lowering and any(early_release_lowering)
    assert found, "no warp-specialized program exposed the early release"


def test_a_failure_is_reported_with_the_command_that_reproduces_it(capsys):
    import tegula.fuzz.__main__ as cli
    from tegula.fuzz.runner import Verdict
    args = cli._parse(["--seed", "3", "--no-shrink", "--role-order", "stall"])
    program = make_specialized_program(3, 5)
    cli._report_failure(args, Switches(), 5, program, Verdict("mismatch", "mismatch", "x"),
                        {}, "--specialized")
    out = capsys.readouterr().out
    assert "=== warp-specialized program 5 (seed 3)" in out
    assert "reproduce: python -m tegula.fuzz --seed 3 --specialized 5 --role-order stall" in out
