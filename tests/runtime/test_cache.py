"""Disk cache: hits and misses, corrupt entries rebuilt, concurrent processes safe."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from tegula.runtime.cache import DiskCache, cache_key, default_cache_dir


def test_key_depends_on_every_input():
    base = cache_key("src", ("-O3",), "nvrtc-13.0", "sm_90a")
    assert base == cache_key("src", ["-O3"], "nvrtc-13.0", "sm_90a")
    assert base != cache_key("src2", ("-O3",), "nvrtc-13.0", "sm_90a")
    assert base != cache_key("src", (), "nvrtc-13.0", "sm_90a")
    assert base != cache_key("src", ("-O3",), "nvrtc-13.1", "sm_90a")
    assert base != cache_key("src", ("-O3",), "nvrtc-13.0", "sm_80")


def test_default_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TEGULA_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    assert DiskCache().root == tmp_path / "c"
    monkeypatch.delenv("TEGULA_CACHE_DIR")
    assert default_cache_dir().parts[-2:] == (".cache", "tegula")


def test_miss_then_hit(tmp_path):
    cache = DiskCache(tmp_path)
    calls = []

    def build():
        calls.append(1)
        return b"\x7fELF cubin bytes"

    key = cache_key("s", (), "v", "sm_90a")
    assert cache.get_or_build(key, build) == b"\x7fELF cubin bytes"
    assert cache.get_or_build(key, build) == b"\x7fELF cubin bytes"
    assert DiskCache(tmp_path).get_or_build(key, build) == b"\x7fELF cubin bytes"
    assert len(calls) == 1
    assert (cache.hits, cache.misses) == (1, 1)
    # No temporary files are left behind.
    assert [p.name for p in cache.path(key).parent.iterdir()] == [f"{key}.cubin"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "empty"])
def test_corrupt_entry_is_rebuilt(tmp_path, damage):
    cache = DiskCache(tmp_path)
    key = cache_key("s", (), "v", "sm_90a")
    cache.put(key, b"good payload" * 10)
    path = cache.path(key)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-5]
    elif damage == "flip":
        data[-1] ^= 0xFF
    elif damage == "magic":
        data[0:8] = b"XXXXXXXX"
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    assert cache.get(key) is None
    assert not path.exists()
    assert cache.get_or_build(key, lambda: b"rebuilt") == b"rebuilt"
    assert cache.get(key) == b"rebuilt"
    assert cache.rebuilt == 1


def test_unwritable_cache_still_builds(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = DiskCache(blocker)
    assert cache.get_or_build("ab" * 32, lambda: b"x") == b"x"


def _worker(root: str, key: str, barrier, results) -> None:
    """Build the same key as the other processes, at the same moment, many times."""
    cache = DiskCache(root)
    barrier.wait()
    payload = (key * 4000).encode()  # large enough that a torn write would be visible
    got = []
    for _ in range(20):
        got.append(cache.get_or_build(key, lambda: (time.sleep(0.001), payload)[1]) == payload)
        # Readers interleave with writers replacing the same entry.
        cache.put(key, payload)
    results.put(all(got) and cache.rebuilt == 0)


def test_concurrent_processes_share_a_key(tmp_path):
    # fork is quick; spawn (macOS, Windows) exercises the same code, only slower.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    key = cache_key("shared", (), "v", "sm_90a")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), key, barrier, results))
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert [results.get(timeout=5) for _ in procs] == [True] * 4
    assert DiskCache(tmp_path).get(key) == (key * 4000).encode()
    leftovers = [n for n in os.listdir(DiskCache(tmp_path).path(key).parent) if n.endswith(".tmp")]
    assert leftovers == []
