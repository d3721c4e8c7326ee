"""The autotuner's selection and caching logic, with a fake timer (no GPU needed)."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tegula.runtime.autotune import (AutotuneError, Autotuner, Config, next_power_of_two,
                                     shape_bucket)

CONFIGS = [{"BM": 64, "BN": 64}, {"BM": 128, "BN": 128}, {"BM": 128, "BN": 256, "threads": 256}]


class FakeGPU:
    """Runs and times candidates from a table of seconds; counts what it was asked."""

    def __init__(self, seconds: dict[str, float], failing: dict[str, str] | None = None):
        self.seconds = seconds
        self.failing = failing or {}
        self.runs: list[str] = []
        self.timed: list[str] = []
        self._current = ""

    def run(self, config: Config) -> None:
        self.runs.append(config.key)
        if config.key in self.failing:
            raise RuntimeError(self.failing[config.key])
        self._current = config.key

    def timer(self, fn) -> float:
        fn()
        self.timed.append(self._current)
        return self.seconds[self._current]


def keys(*specs: dict) -> list[str]:
    return [Config.of(s).key for s in specs]


def tuner_with(tmp_path, fake: FakeGPU, name: str = "gemm") -> Autotuner:
    return Autotuner(name, timer=fake.timer, cache_dir=tmp_path)


def test_picks_the_fastest_and_records_every_trial(tmp_path):
    k64, k128, k256 = keys(*CONFIGS)
    fake = FakeGPU({k64: 3e-3, k128: 1e-3, k256: 2e-3})
    tuner = tuner_with(tmp_path, fake)
    best = tuner.select(CONFIGS, (4096, 4096, 4096), fake.run, extra="f16", device_name="H100")
    assert best == Config.of(CONFIGS[1]) and best.kwargs == {"BM": 128, "BN": 128}
    record = tuner.last
    assert record.source == "measured" and [t.seconds for t in record.trials] == [3e-3, 1e-3, 2e-3]
    assert record.key == "4096x4096x4096|f16|H100"
    assert "BM=128,BN=128" in tuner.report()


def test_threads_travel_with_the_config():
    config = Config.of({"BN": 256, "BM": 128, "threads": 256})
    assert config.threads == 256 and config.kwargs == {"BM": 128, "BN": 256}
    assert config.key == "BM=128,BN=256,threads=256"
    assert Config.of(config.as_dict()) == config
    with pytest.raises(TypeError):
        Config.of({"BM": 64, "threads": "many"})


def test_failing_candidates_are_skipped_with_their_reason(tmp_path):
    k64, k128, k256 = keys(*CONFIGS)
    fake = FakeGPU({k64: 3e-3, k256: 2e-3}, failing={k128: "too many resources requested"})
    tuner = tuner_with(tmp_path, fake)
    assert tuner.select(CONFIGS, (256, 256), fake.run) == Config.of(CONFIGS[2])
    skipped = [t for t in tuner.last.trials if t.error]
    assert len(skipped) == 1 and "too many resources" in skipped[0].error
    assert skipped[0].error.startswith("RuntimeError")
    assert k128 not in fake.timed


def test_no_candidate_running_raises_with_every_reason(tmp_path):
    failing = {k: f"broken {i}" for i, k in enumerate(keys(*CONFIGS))}
    fake = FakeGPU({}, failing)
    with pytest.raises(AutotuneError) as info:
        tuner_with(tmp_path, fake).select(CONFIGS, (64,), fake.run)
    assert all(f"broken {i}" in str(info.value) for i in range(3))


def test_a_bad_timing_skips_the_candidate(tmp_path):
    k64, k128, k256 = keys(*CONFIGS)
    fake = FakeGPU({k64: float("nan"), k128: 0.0, k256: 5e-3})
    tuner = tuner_with(tmp_path, fake)
    assert tuner.select(CONFIGS, (64,), fake.run) == Config.of(CONFIGS[2])


def test_winners_are_cached_per_power_of_two_bucket(tmp_path):
    k64, k128, k256 = keys(*CONFIGS)
    fake = FakeGPU({k64: 3e-3, k128: 1e-3, k256: 2e-3})
    tuner = tuner_with(tmp_path, fake)
    tuner.select(CONFIGS, (3000, 4000, 4096), fake.run)
    runs = len(fake.runs)
    assert tuner.select(CONFIGS, (2049, 4096, 4095), fake.run) == Config.of(CONFIGS[1])
    assert len(fake.runs) == runs  # same bucket (4096, 4096, 4096): nothing measured
    tuner.select(CONFIGS, (4097, 4096, 4096), fake.run)
    assert len(fake.runs) > runs    # next bucket: measured again
    assert set(tuner.records) == {"4096x4096x4096||", "8192x4096x4096||"}


def test_extra_key_and_gpu_name_separate_records(tmp_path):
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    tuner = tuner_with(tmp_path, fake)
    for extra, gpu in (("f16", "H100"), ("bf16", "H100"), ("f16", "H200")):
        tuner.select(CONFIGS, (128,), fake.run, extra=extra, device_name=gpu)
    assert len(tuner.records) == 3


def test_winners_persist_on_disk_for_later_processes(tmp_path):
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    tuner_with(tmp_path, fake).select(CONFIGS, (1000, 1000), fake.run, extra="f16")
    saved = json.loads((tmp_path / "autotune" / "gemm.json").read_text())
    assert saved["1024x1024|f16|"]["best"] == {"BM": 128, "BN": 128}
    assert len(saved["1024x1024|f16|"]["trials"]) == 3

    later = FakeGPU({})  # a new process: nothing may run
    tuner = tuner_with(tmp_path, later)
    assert tuner.select(CONFIGS, (1024, 1000), later.run, extra="f16") == Config.of(CONFIGS[1])
    assert later.runs == [] and tuner.last.source == "disk"


def test_processes_merge_their_records_in_one_file(tmp_path):
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    first, second = tuner_with(tmp_path, fake), tuner_with(tmp_path, fake)
    first.select(CONFIGS, (64,), fake.run)
    second._load_disk()  # second read the file before first's next write
    second.select(CONFIGS, (512,), fake.run)
    first.select(CONFIGS, (4096,), fake.run)
    saved = json.loads((tmp_path / "autotune" / "gemm.json").read_text())
    assert set(saved) == {"64||", "512||", "4096||"}


def test_a_cached_winner_no_longer_offered_is_tuned_again(tmp_path):
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    tuner_with(tmp_path, fake).select(CONFIGS, (64,), fake.run)
    fresh = tuner_with(tmp_path, fake)
    fake.runs.clear()
    remaining = [CONFIGS[0], CONFIGS[2]]
    assert fresh.select(remaining, (64,), fake.run) == Config.of(CONFIGS[2])
    assert fake.runs  # measured again


def test_a_corrupt_cache_file_is_a_miss(tmp_path):
    path = tmp_path / "autotune" / "gemm.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    assert tuner_with(tmp_path, fake).select(CONFIGS, (64,), fake.run) == Config.of(CONFIGS[1])
    assert json.loads(path.read_text())["64||"]["best"] == {"BM": 128, "BN": 128}


def test_memory_only_tuner_writes_nothing(tmp_path):
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    Autotuner("gemm", timer=fake.timer, cache_dir=tmp_path, persist=False).select(
        CONFIGS, (64,), fake.run)
    assert not (tmp_path / "autotune").exists()


def test_tuning_off_uses_the_first_candidate_unmeasured(tmp_path, monkeypatch):
    monkeypatch.setenv("TEGULA_AUTOTUNE", "0")
    fake = FakeGPU({})
    tuner = tuner_with(tmp_path, fake)
    assert tuner.select(CONFIGS, (64,), fake.run) == Config.of(CONFIGS[0])
    assert fake.runs == [] and tuner.last.source == "default"
    assert not (tmp_path / "autotune").exists()


def test_a_single_candidate_is_not_measured(tmp_path):
    fake = FakeGPU({})
    assert tuner_with(tmp_path, fake).select(CONFIGS[:1], (64,), fake.run) == \
        Config.of(CONFIGS[0])
    assert fake.runs == []


def test_duplicates_are_timed_once_and_empty_lists_refused(tmp_path):
    k64, k128, _ = keys(*CONFIGS)
    fake = FakeGPU({k64: 3e-3, k128: 1e-3})
    tuner = tuner_with(tmp_path, fake)
    tuner.select([CONFIGS[0], CONFIGS[1], dict(CONFIGS[0])], (64,), fake.run)
    assert sorted(fake.timed) == sorted([k64, k128])
    with pytest.raises(ValueError):
        tuner.select([], (64,), fake.run)


def test_rank_orders_and_top_k_prunes(tmp_path):
    k64, k128, k256 = keys(*CONFIGS)
    fake = FakeGPU({k64: 3e-3, k128: 1e-3, k256: 2e-3})
    predicted = {k64: 1.0, k128: 3.0, k256: 2.0}
    tuner = tuner_with(tmp_path, fake)
    best = tuner.select(CONFIGS, (64,), fake.run, rank=lambda c: predicted[c.key], top_k=2)
    assert fake.timed == [k64, k256]          # the model's two best, in its order
    assert best == Config.of(CONFIGS[2])      # the faster of those two when measured


def test_a_failing_ranker_leaves_candidates_unranked(tmp_path):
    k64, k128, k256 = keys(*CONFIGS)
    fake = FakeGPU({k64: 3e-3, k128: 1e-3, k256: 2e-3})

    def rank(config: Config) -> float | None:
        if config.key == k128:
            raise RuntimeError("cannot model this")
        return {k64: 2.0}.get(config.key)

    tuner_with(tmp_path, fake).select(CONFIGS, (64,), fake.run, rank=rank)
    assert fake.timed == [k64, k128, k256]    # ranked first, then the rest in order


def test_buckets_round_up_to_powers_of_two():
    assert [next_power_of_two(x) for x in (0, 1, 2, 3, 4, 5, 4096, 4097, 11008)] == \
        [0, 1, 2, 4, 4, 8, 4096, 8192, 16384]
    assert shape_bucket((16, 11008, 14336)) == (16, 16384, 16384)


def test_lookup_is_memory_only_and_checks_the_candidates(tmp_path):
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    configs = tuple(Config.of(c) for c in CONFIGS)
    tuner = tuner_with(tmp_path, fake)
    assert tuner.lookup(configs, (64,)) is None             # nothing tuned yet
    tuner.select(configs, (64,), fake.run)
    assert tuner.lookup(configs, (60,)) == configs[1]       # same bucket
    assert tuner.lookup(configs[::2], (64,)) is None        # winner no longer offered
    assert tuner_with(tmp_path, fake).lookup(configs, (64,)) is None  # disk not consulted


def test_l2_emptier_names_bad_modes_and_does_nothing_without_a_gpu():
    from tegula.runtime.autotune import l2_emptier
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="'clean' or 'dirty'"):
        l2_emptier(torch, "flush")
    if not torch.cuda.is_available():
        assert l2_emptier(torch)() is None


# --------------------------------------------------------------------------------------
# Malformed records on disk are cache misses
# --------------------------------------------------------------------------------------

GOOD = {"best": {"BM": 128, "BN": 128}, "trials": [], "when": "", "format": 1}


def _disk_file(tmp_path, text: str | bytes):
    path = tmp_path / "autotune" / "gemm.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _tunes_from_scratch(tmp_path) -> None:
    """A tuner that finds nothing usable measures, picks the fastest and stores it."""
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    assert tuner_with(tmp_path, fake).select(CONFIGS, (64,), fake.run) == Config.of(CONFIGS[1])
    assert fake.timed, "a malformed record was taken for a winner"
    stored = json.loads((tmp_path / "autotune" / "gemm.json").read_text())
    assert stored["64||"]["best"] == {"BM": 128, "BN": 128}


@pytest.mark.parametrize("record", [
    dict(GOOD, format=True),                       # True == 1 in Python, not in the format
    dict(GOOD, format=2),
    dict(GOOD, best=[["BM", 128]]),
    dict(GOOD, best={"BM": {"nested": 1}}),
    dict(GOOD, best={"BM": 128, "threads": "256"}),
    dict(GOOD, best={"BM": 128, "threads": True}),
    dict(GOOD, best={"BM": 128, "threads": -1}),
    dict(GOOD, when=["not", "a", "string"]),
    {k: v for k, v in GOOD.items() if k != "best"},
    [GOOD], "string", 7, None,
])
def test_a_malformed_record_is_a_miss(tmp_path, record):
    _disk_file(tmp_path, json.dumps({"64||": record}))
    _tunes_from_scratch(tmp_path)


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,                                    # RecursionError
    '{"64||": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001,             # deep inside a record
    '{"64||": {"best": {"BM": ' + "9" * 5000 + "}, \"format\": 1}}",  # int too long to parse
    b'{"64||": "\xff\xfe"}',                                          # not UTF-8
    "[1, 2, 3]", "null", "",
])
def test_a_malformed_file_is_a_miss(tmp_path, text):
    _disk_file(tmp_path, text)
    _tunes_from_scratch(tmp_path)


def test_a_record_with_bad_trials_keeps_its_winner(tmp_path):
    _disk_file(tmp_path, json.dumps({"64||": dict(GOOD, trials=[{"config": [[[]]]}, 5])}))
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    assert tuner_with(tmp_path, fake).select(CONFIGS, (64,), fake.run) == Config.of(CONFIGS[1])
    assert not fake.timed and not fake.runs


def test_an_oversized_or_symlinked_file_is_not_read(tmp_path):
    outside = tmp_path / "planted.json"
    outside.write_text(json.dumps({"64||": dict(GOOD, best={"BM": 64, "BN": 64})}))
    (tmp_path / "autotune").mkdir()
    (tmp_path / "autotune" / "gemm.json").symlink_to(outside)
    with pytest.warns(Warning, match="symbolic link"):
        _tunes_from_scratch(tmp_path)
    assert json.loads(outside.read_text())["64||"]["best"] == {"BM": 64, "BN": 64}
    _disk_file(tmp_path, json.dumps({"64||": GOOD, "pad": "x" * (9 << 20)}))
    _tunes_from_scratch(tmp_path)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)
RECORDISH = st.fixed_dictionaries(
    {}, optional={"best": JSON | st.dictionaries(st.sampled_from(["BM", "BN", "threads"]), JSON),
                  "format": st.sampled_from([1, 1.0, True, "1"]) | JSON,
                  "when": JSON, "trials": JSON})


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(JSON, st.dictionaries(st.just("64||"), JSON | RECORDISH)))
def test_arbitrary_json_never_escapes_as_an_error(tmp_path, data):
    _disk_file(tmp_path, json.dumps(data))
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    tuner = tuner_with(tmp_path, fake)
    best = tuner.select(CONFIGS, (64,), fake.run)
    # Either a well-formed record naming an offered candidate, or measured afresh.
    assert best in [Config.of(c) for c in CONFIGS]
    if fake.timed:
        assert best == Config.of(CONFIGS[1])
    else:
        assert isinstance(data["64||"]["best"], dict) and data["64||"]["format"] == 1


def test_the_tuning_file_lives_in_private_directories(tmp_path):
    import os
    import stat
    fake = FakeGPU(dict(zip(keys(*CONFIGS), (3e-3, 1e-3, 2e-3))))
    old = os.umask(0)
    try:
        Autotuner("gemm", timer=fake.timer, cache_dir=tmp_path / "c").select(
            CONFIGS, (64,), fake.run)
    finally:
        os.umask(old)
    for path in (tmp_path / "c", tmp_path / "c" / "autotune"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "c" / "autotune" / "gemm.json").stat().st_mode) == 0o600


def test_timer_spin_covers_twice_the_launchs_host_time_within_bounds():
    """The spin before each timed launch (`cuda_event_timer(cover_launch=True)`): twice
    the host time plus the slack, in 2 GHz cycles, capped; nothing without a host time or
    without torch.cuda._sleep."""
    from types import SimpleNamespace

    from tegula.runtime.autotune import (COVER_SLACK_SECONDS, MAX_COVER_SECONDS,
                                         _gpu_spinner)
    spins = []
    fake = SimpleNamespace(cuda=SimpleNamespace(_sleep=spins.append))
    _gpu_spinner(fake, 40e-6)()
    _gpu_spinner(fake, 1.0)()
    assert spins == [int((80e-6 + COVER_SLACK_SECONDS) * 2e9), int(MAX_COVER_SECONDS * 2e9)]
    for host in (0.0, float("inf")):
        assert _gpu_spinner(fake, host)() is None
    assert _gpu_spinner(SimpleNamespace(cuda=SimpleNamespace()), 40e-6)() is None
    assert len(spins) == 2
