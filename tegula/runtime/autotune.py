"""Autotuning: time a few configurations of a kernel on the real arguments, keep the fastest.

    tuner = Autotuner("matmul")
    config = tuner.select(configs, dims=(M, N, K), run=lambda cfg: launch(cfg), extra="f16")

A configuration (`Config`) is a dict of constexprs plus an optional `threads` override, as
in `{"BM": 128, "BN": 256, "BK": 32, "STAGES": 3, "threads": 256}`. `select` runs each
candidate once (which compiles it: a candidate that fails to compile, to launch or to fit
the GPU's resources is skipped and the reason recorded), times the survivors with `timer`
(default: CUDA events, warm-up then the median of several runs), and returns the fastest.

Winners are cached per (kernel name, shape bucket, extra key, GPU name), where the shape
bucket rounds every dimension up to a power of two: shapes in one bucket share tile
choices, so a model's many slightly different shapes tune once. The cache lives in memory
and on disk (`<tegula cache dir>/autotune/<name>.json`, written atomically and merged with
what other processes wrote, through the cubin cache's `PrivateDir`: private directories,
no symlinks followed), so a later process reuses the winner without measuring. A cached
winner that is no longer among the candidates (the code changed) is re-tuned. The file is
read distrustfully: a record of any other form (wrong types, unknown format, deep
nesting, an unreadable or oversized file) is dropped — a cache miss, never an error.

`TEGULA_AUTOTUNE=0` turns measuring off: the first candidate (after ranking) is used, and
nothing is read from or written to the disk cache — for debugging a kernel, not for speed.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from tegula.runtime.cache import PrivateDir, default_cache_dir

#: A timer takes a callable that launches the candidate once and returns seconds per launch.
Timer = Callable[[Callable[[], None]], float]
#: A ranker predicts a candidate's seconds (lower first); None when it cannot say.
Ranker = Callable[["Config"], "float | None"]

_FORMAT = 1  # bump when the on-disk record's meaning changes


@dataclass(frozen=True)
class Config:
    """One candidate: constexpr values and an optional thread-count override."""

    constexprs: tuple[tuple[str, Any], ...]
    threads: int | None = None

    @staticmethod
    def of(spec: Config | Mapping[str, Any]) -> Config:
        """A Config from a dict like `{"BM": 128, "threads": 256}` (or a Config)."""
        if isinstance(spec, Config):
            return spec
        values = dict(spec)
        threads = values.pop("threads", None)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
            raise TypeError(f"a config's threads must be an int, got {threads!r}")
        return Config(tuple(sorted(values.items())), threads)

    @property
    def kwargs(self) -> dict[str, Any]:
        """The constexprs as keyword arguments."""
        return dict(self.constexprs)

    def as_dict(self) -> dict[str, Any]:
        """The dict form (`threads` included when set): what the disk cache stores."""
        d = dict(self.constexprs)
        if self.threads is not None:
            d["threads"] = self.threads
        return d

    @property
    def key(self) -> str:
        """A stable, readable name, e.g. "BK=32,BM=128,BN=256,STAGES=3,threads=256"."""
        return ",".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                        for k, v in sorted(self.as_dict().items()))

    def __str__(self) -> str:
        return self.key


@dataclass
class Trial:
    """One candidate's outcome: seconds per launch, or why it was skipped."""

    config: Config
    seconds: float | None = None
    error: str | None = None
    predicted: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {"config": self.config.as_dict(), "seconds": self.seconds, "error": self.error,
                "predicted": self.predicted}


@dataclass
class TuneRecord:
    """The outcome of tuning one key: the winner, every trial, and where it came from
    ("measured" in this process, "disk" from an earlier one, "default" when tuning is off
    or only one candidate exists)."""

    key: str
    best: Config
    trials: list[Trial] = field(default_factory=list)
    source: str = "measured"
    when: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"best": self.best.as_dict(), "trials": [t.as_json() for t in self.trials],
                "when": self.when, "format": _FORMAT}


class AutotuneError(RuntimeError):
    """No candidate ran: raised with every candidate's reason."""


def next_power_of_two(x: int) -> int:
    """The smallest power of two ≥ x (0 stays 0: empty dims are their own bucket)."""
    x = int(x)
    return 0 if x <= 0 else 1 << (x - 1).bit_length()


def shape_bucket(dims: Iterable[int]) -> tuple[int, ...]:
    """Every dimension rounded up to a power of two."""
    return tuple(next_power_of_two(d) for d in dims)


def tuning_enabled() -> bool:
    """False when `$TEGULA_AUTOTUNE` is 0/false/off/no."""
    return os.environ.get("TEGULA_AUTOTUNE", "1").strip().lower() not in ("0", "false", "off",
                                                                         "no")


def cuda_event_timer(warmup: int = 2, reps: int = 7, max_seconds: float = 0.2,
                     flush_l2: bool = True, cover_launch: bool = True) -> Timer:
    """A timer with torch CUDA events on the current stream: `warmup` launches, then the
    median of up to `reps` single-launch timings (fewer when a launch is slow, so one
    candidate costs at most about `max_seconds`).

    With `flush_l2`, L2 is emptied before each timed launch by reading a buffer twice its
    size, as the benchmarks do: otherwise a problem that fits in L2 (32 MB on a 50 MB
    H200 L2) is timed on cached inputs, and the ranking favours configurations that are
    not the fastest from DRAM.

    With `cover_launch`, the GPU is kept busy (a spin kernel, `torch.cuda._sleep`) for
    about twice the host time of one call of `fn` before the start event, so the launch
    is queued when the GPU reaches it. Otherwise each sample, the GPU idle after the
    previous one's synchronization, times the host's launch as well whenever it takes
    longer than the flush: the library's first-call launch path takes tens of µs in
    Python per kernel, so a plan of two launches (split K and its sum) read slower than
    one launch that is slower on the GPU (W4A16's tuner picked unsplit configs)."""

    def timer(fn: Callable[[], None]) -> float:
        import torch

        empty_l2 = l2_emptier(torch) if flush_l2 else (lambda: None)
        host = math.inf
        for _ in range(warmup):
            began = time.perf_counter()
            fn()
            host = min(host, time.perf_counter() - began)
        cover = _gpu_spinner(torch, host if cover_launch and warmup else 0.0)
        samples: list[float] = []
        count = reps
        while len(samples) < count:
            empty_l2()
            cover()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
            if len(samples) == 1:  # a slow launch: fewer repetitions
                count = 1 + min(reps - 1, int(max_seconds / max(samples[0], 1e-7)))
        return statistics.median(samples)

    return timer


#: The spin before a timed launch covers twice the launch's host time plus this, at most
#: MAX_COVER_SECONDS (a host call slower than that is not a launch worth hiding).
COVER_SLACK_SECONDS, MAX_COVER_SECONDS = 20e-6, 2e-3


def _gpu_spinner(torch: Any, host_seconds: float) -> Callable[[], Any]:
    """A function that enqueues a GPU spin of 2 · host_seconds + COVER_SLACK_SECONDS
    (at most MAX_COVER_SECONDS; nothing for 0, or without `torch.cuda._sleep`). The spin
    counts clock cycles: 2 GHz is above the boost clocks of the GPUs tuned on, so the
    spin is at least that long."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if not host_seconds or not math.isfinite(host_seconds) or sleep is None:
        return lambda: None
    seconds = min(2 * host_seconds + COVER_SLACK_SECONDS, MAX_COVER_SECONDS)
    cycles = int(seconds * 2e9)
    return lambda: sleep(cycles)


def l2_emptier(torch: Any, mode: str = "clean",
               nbytes: int | None = None) -> Callable[[], Any]:
    """A function that empties L2 of useful lines before a timed run, by touching a scratch
    buffer of `nbytes` (default twice the L2 size): "clean" reads it, so L2 holds only
    clean lines afterwards; "dirty" zeroes it, as triton.testing.do_bench does, leaving
    L2 full of dirty lines the next kernel must write back first. Where the buffer cannot
    be had (memory nearly full) it does nothing."""
    if mode not in ("clean", "dirty"):
        raise ValueError(f"L2 emptying mode must be 'clean' or 'dirty', got {mode!r}")
    try:
        if nbytes is None:
            device = torch.cuda.current_device()
            nbytes = max(2 * torch.cuda.get_device_properties(device).L2_cache_size, 1 << 20)
        buffer = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
    except (RuntimeError, AttributeError, AssertionError):  # no GPU, or out of memory
        return lambda: None
    return buffer.max if mode == "clean" else buffer.zero_


def describe_error(e: BaseException) -> str:
    """One line naming an exception: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


class Autotuner:
    """Chooses among configurations of one kernel; see the module docstring.

    `timer` measures seconds per launch (default `cuda_event_timer()`; tests pass a fake);
    `cache_dir` is where `autotune/<name>.json` lives (default: the tegula cache dir);
    `persist=False` keeps winners in memory only.
    """

    def __init__(self, name: str, *, timer: Timer | None = None,
                 cache_dir: str | os.PathLike | None = None, persist: bool = True,
                 progress: bool = False):
        self.name = name
        self.timer = timer
        self.progress = progress  # a progress line on stderr while measuring
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.persist = persist
        self.records: dict[str, TuneRecord] = {}
        self.last: TuneRecord | None = None  # the record of the latest `select` (reports)
        self._disk: dict[str, Any] | None = None  # loaded lazily, once
        self._lock = threading.RLock()

    # -- keys and the disk file ------------------------------------------------------------

    def key(self, dims: Sequence[int], extra: str = "", device_name: str = "") -> str:
        """The cache key: "<bucket dims>|<extra>|<GPU name>"."""
        bucket = "x".join([str(next_power_of_two(d)) for d in dims])
        return f"{bucket}|{extra}|{device_name}"

    @property
    def _root(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else default_cache_dir()

    @property
    def _file_name(self) -> str:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.name)
        return f"{safe or '_'}.json"

    @property
    def path(self) -> Path:
        """The JSON file holding this kernel's winners."""
        return self._root / "autotune" / self._file_name

    def _load_disk(self) -> dict[str, Any]:
        if self._disk is None:
            self._disk = _read_records(self._root, self._file_name)
        return self._disk

    def _store(self, record: TuneRecord) -> None:
        """Merge `record` into the disk file (re-read first: other processes write it too)."""
        if not self.persist:
            return
        try:
            merged = _read_records(self._root, self._file_name)
            merged[record.key] = record.as_json()
            data = json.dumps(merged, indent=1, sort_keys=True).encode("utf-8")
            PrivateDir(self._root).write("autotune", self._file_name, data=data)
            self._disk = merged
        except (OSError, ValueError, TypeError):
            pass  # an unwritable cache must not stop a launch; the winner stays in memory

    # -- selection -------------------------------------------------------------------------

    def cached(self, key: str, candidates: Sequence[Config]) -> TuneRecord | None:
        """The winner recorded for `key`, if it is still one of `candidates`."""
        with self._lock:
            record = self.records.get(key)
            if record is not None and record.best in candidates:
                return record
            if not (self.persist and tuning_enabled()):
                return None
            entry = self._load_disk().get(key)  # well-formed records only (_read_records)
            if entry is None:
                return None
            best = Config.of(entry["best"])
            if best not in candidates:
                return None
            record = TuneRecord(key, best, [], "disk", entry["when"])
            self.records[key] = record
            return record

    def lookup(self, configs: Sequence[Config], dims: Sequence[int], *, extra: str = "",
               device_name: str = "") -> Config | None:
        """The winner already chosen in this process for this key, if it is among
        `configs` (Config objects); None otherwise. The per-launch fast path: no disk, no
        lock, no normalization of the candidates."""
        record = self.records.get(self.key(dims, extra, device_name))
        if record is None or record.best not in configs:
            return None
        self.last = record
        return record.best

    def select(self, configs: Sequence[Config | Mapping[str, Any]], dims: Sequence[int],
               run: Callable[[Config], Any], *, extra: str = "", device_name: str = "",
               rank: Ranker | None = None, top_k: int | None = None,
               check: Callable[[Config], "str | None"] | None = None) -> Config:
        """The best of `configs` for a problem of size `dims`.

        `run(config)` launches the kernel once with that configuration on the real
        arguments (compiling it on first use); it must only write outputs the caller owns.
        `rank` (e.g. the cost model) orders the candidates; `check(config)` gives a reason
        to skip one unmeasured (over the shared-memory or register limits), kept on its
        trial; `top_k` measures only the best ranked of those that pass. Raises
        `AutotuneError` when no candidate runs.
        """
        candidates = _unique(Config.of(c) for c in configs)
        if not candidates:
            raise ValueError(f"autotune {self.name}: no candidate configurations")
        key = self.key(dims, extra, device_name)
        found = self.cached(key, candidates)
        if found is None:
            with self._lock:
                found = self.cached(key, candidates)  # another thread may have tuned it
                if found is None:
                    found = self._tune(key, candidates, run, rank, top_k, check)
        self.last = found
        return found.best

    def _tune(self, key: str, candidates: list[Config], run: Callable[[Config], Any],
              rank: Ranker | None, top_k: int | None,
              check: Callable[[Config], "str | None"] | None = None) -> TuneRecord:
        trials, skipped = _checked(_ranked(candidates, rank, None), check)
        if top_k is not None and top_k > 0:
            trials = trials[:top_k]
        if not trials:
            reasons = "; ".join(f"[{t.config}] {t.error}" for t in skipped)
            raise AutotuneError(f"autotune {self.name} ({key}): every candidate was "
                                f"skipped: {reasons}")
        if len(trials) == 1 or not tuning_enabled():
            # Nothing to compare: use the first (best ranked) candidate unmeasured.
            record = TuneRecord(key, trials[0].config, trials + skipped, "default", _now())
        else:
            record = self._measure(key, trials, run)
            record.trials += skipped
            self._store(record)
        self.records[key] = record
        return record

    def _measure(self, key: str, trials: list[Trial], run: Callable[[Config], Any]) -> TuneRecord:
        """Time every trial; a failure is recorded on the trial and the next one runs."""
        timer = self.timer or cuda_event_timer()
        for done, trial in enumerate(trials):
            if self.progress:
                _show_progress(self.name, key, done, trials)
            try:
                run(trial.config)  # compiles, and surfaces launch/resource errors untimed
                trial.seconds = float(timer(lambda c=trial.config: run(c)))
                if not math.isfinite(trial.seconds) or trial.seconds <= 0:
                    raise ValueError(f"the timer returned {trial.seconds!r}")
            except Exception as e:  # noqa: BLE001 — any failure skips this candidate only
                trial.seconds, trial.error = None, describe_error(e)
        if self.progress:
            _show_progress(self.name, key, len(trials), trials)
        timed = [t for t in trials if t.seconds is not None]
        if not timed:
            reasons = "; ".join(f"[{t.config}] {t.error}" for t in trials)
            raise AutotuneError(f"autotune {self.name} ({key}): no candidate ran: {reasons}")
        best = min(timed, key=lambda t: t.seconds)  # first of equals: ranking breaks ties
        return TuneRecord(key, best.config, trials, "measured", _now())

    def report(self, key: str | None = None) -> str:
        """A short text report of one key's trials (default: every key tuned here)."""
        keys = [key] if key is not None else sorted(self.records)
        lines = []
        for k in keys:
            record = self.records.get(k)
            if record is None:
                continue
            lines.append(f"{self.name} [{k}] -> {record.best} ({record.source})")
            for t in record.trials:
                what = f"{t.seconds * 1e6:10.1f} us" if t.seconds is not None else \
                    f"skipped: {t.error}"
                lines.append(f"    {t.config}: {what}")
        return "\n".join(lines)

    def clear(self, disk: bool = False) -> None:
        """Forget the winners in memory (and, with `disk=True`, this kernel's file)."""
        with self._lock:
            self.records.clear()
            self._disk = None
            if disk:
                PrivateDir(self._root).remove("autotune", self._file_name)


def _unique(configs: Iterable[Config]) -> list[Config]:
    """Candidates in order, duplicates dropped (a duplicate would be timed twice)."""
    seen: dict[Config, None] = {}
    for c in configs:
        seen.setdefault(c, None)
    return list(seen)


def _checked(trials: list[Trial], check: Callable[[Config], "str | None"] | None
             ) -> tuple[list[Trial], list[Trial]]:
    """(trials that pass `check`, trials skipped with its reason as their error)."""
    if check is None:
        return trials, []
    passed, skipped = [], []
    for t in trials:
        try:
            t.error = check(t.config)
        except Exception as e:  # noqa: BLE001 — a failing check skips this candidate only
            t.error = describe_error(e)
        (skipped if t.error else passed).append(t)
    return passed, skipped


def _show_progress(name: str, key: str, done: int, trials: list[Trial]) -> None:
    """One progress line on stderr, rewritten in place: a bar, the count, the candidate
    being measured and the best so far (a newline when done)."""
    import sys

    width, total = 20, len(trials)
    filled = width * done // max(1, total)
    timed = [t for t in trials[:done] if t.seconds is not None]
    best = min(timed, key=lambda t: t.seconds) if timed else None
    now = f"measuring {trials[done].config}" if done < total else "done"
    so_far = f"; best {best.seconds * 1e6:.1f} us ({best.config})" if best else ""
    line = (f"autotune {name} [{key}] [{'#' * filled}{'.' * (width - filled)}] "
            f"{done}/{total} {now}{so_far}")
    sys.stderr.write("\r" + line + ("\n" if done >= total else ""))
    sys.stderr.flush()


def _ranked(candidates: list[Config], rank: Ranker | None, top_k: int | None) -> list[Trial]:
    """Trials ordered by `rank` (stable; unranked candidates keep their place after the
    ranked ones), cut to `top_k`. A ranker that fails leaves that candidate unranked."""
    trials = [Trial(c) for c in candidates]
    if rank is not None:
        for t in trials:
            try:
                t.predicted = rank(t.config)
            except Exception:  # noqa: BLE001 — a model that cannot judge just doesn't order
                t.predicted = None
        trials.sort(key=lambda t: (t.predicted is None, t.predicted or 0.0))
    if top_k is not None and top_k > 0:
        trials = trials[:top_k]
    return trials


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


#: A tuning file larger than this is not read (a few hundred records take ~100 KB).
_MAX_FILE_BYTES = 8 << 20
_SCALARS = (str, int, float, bool, type(None))


def _read_records(root: Path, file_name: str) -> dict[str, dict[str, Any]]:
    """The well-formed records of `root/autotune/file_name` by key; {} when the file is
    absent, refused, oversized or not JSON. A malformed record of any kind (deep nesting
    included) is dropped: a cache miss, never an error (the file is written by any
    process of this user, and edited by hand)."""
    data = PrivateDir(root).read("autotune", file_name, limit=_MAX_FILE_BYTES)
    if data is None:
        return {}
    try:
        loaded = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    records = {}
    for key, entry in loaded.items():
        record = _well_formed(entry)
        if record is not None:
            records[key] = record
    return records


def _config_dict(value: Any) -> dict[str, Any] | None:
    """`value` when it is a config's dict form (`Config.as_dict`), else None."""
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, _SCALARS) for k, v in value.items()):
        return None
    threads = value.get("threads")
    if threads is not None and (type(threads) is not int or threads <= 0):
        return None
    return value


def _well_formed(entry: Any) -> dict[str, Any] | None:
    """A record as `TuneRecord.as_json` writes it, rebuilt from checked fields only, or
    None. Trials are informational: malformed ones are dropped, not the record."""
    if not isinstance(entry, dict) or type(entry.get("format")) is not int or \
            entry["format"] != _FORMAT:
        return None
    best = _config_dict(entry.get("best"))
    when = entry.get("when", "")
    if best is None or not isinstance(when, str):
        return None
    trials = entry.get("trials")
    trials = [t for t in trials if _well_formed_trial(t)] if isinstance(trials, list) else []
    return {"best": best, "trials": trials, "when": when, "format": _FORMAT}


def _well_formed_trial(trial: Any) -> bool:
    number = (int, float, type(None))
    return (isinstance(trial, dict) and _config_dict(trial.get("config")) is not None
            and isinstance(trial.get("seconds"), number)
            and isinstance(trial.get("error"), (str, type(None)))
            and isinstance(trial.get("predicted"), number))


__all__ = ["Config", "Trial", "TuneRecord", "Autotuner", "AutotuneError", "shape_bucket",
           "next_power_of_two", "cuda_event_timer", "tuning_enabled", "describe_error"]
