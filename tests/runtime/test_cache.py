"""Disk cache: hits and misses, corrupt entries rebuilt, concurrent processes safe, and
nothing on disk trusted (private directories, keys bound to payloads, no symlinks)."""
from __future__ import annotations

import multiprocessing as mp
import os
import stat
import time
import warnings

import pytest

from tegula.runtime import cache as cache_module
from tegula.runtime.cache import CacheWarning, DiskCache, cache_key, default_cache_dir


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


def test_keys_must_be_digests(tmp_path):
    with pytest.raises(ValueError, match="hex digest"):
        DiskCache(tmp_path).get("../../etc/passwd")


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


# --------------------------------------------------------------------------------------
# Trust nothing on disk
# --------------------------------------------------------------------------------------

KEY = cache_key("kernel A", (), "v", "sm_90a")
OTHER = cache_key("kernel B", (), "v", "sm_90a")


@pytest.fixture(autouse=True)
def _fresh_warnings():
    """Each test sees the cache's once-only warnings afresh."""
    cache_module._WARNED.clear()
    yield
    cache_module._WARNED.clear()


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _builds(cache: DiskCache, key: str, times: int) -> list[int]:
    calls: list[int] = []
    for _ in range(times):
        assert cache.get_or_build(key, lambda: (calls.append(1), b"fresh cubin")[1]) == \
            b"fresh cubin"
    return calls


def test_directories_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)  # the most permissive umask: mkdir would give 0777
    try:
        cache = DiskCache(tmp_path / "home" / "tegula")
        cache.put(KEY, b"payload")
    finally:
        os.umask(old)
    entry = cache.path(KEY)
    for directory in (cache.root, cache.root / "cubin", entry.parent):
        assert _mode(directory) == 0o700, directory
    assert _mode(entry) == 0o600
    assert cache.get(KEY) == b"payload"


@pytest.mark.parametrize("where", ["root", "cubin", "shard"])
def test_a_group_or_world_writable_directory_is_refused_with_one_warning(tmp_path, where):
    cache = DiskCache(tmp_path / "c")
    cache.put(KEY, b"planted by anyone")
    directory = {"root": cache.root, "cubin": cache.root / "cubin",
                 "shard": cache.path(KEY).parent}[where]
    directory.chmod(0o777 if where == "shard" else 0o770)
    with pytest.warns(CacheWarning, match="writable by group or others"):
        assert cache.get(KEY) is None          # the entry is not read...
    with warnings.catch_warnings():
        warnings.simplefilter("error")         # ...and the warning is not repeated
        assert _builds(cache, KEY, 2) == [1, 1]  # compiled each time, never cached
    assert cache.path(KEY).read_bytes().endswith(b"planted by anyone")  # left alone


def test_a_directory_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path / "c")
    cache.put(KEY, b"cubin")
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 1)
    with pytest.warns(CacheWarning, match="owned by uid"):
        assert _builds(cache, KEY, 1) == [1]
    monkeypatch.setattr(os, "getuid", lambda: real_uid)
    assert cache.get(KEY) == b"cubin"


def test_another_keys_valid_entry_is_not_loaded(tmp_path):
    cache = DiskCache(tmp_path / "c")
    cache.put(KEY, b"cubin of kernel A")
    cache.put(OTHER, b"cubin of kernel B")
    other_path = cache.path(OTHER)
    # A whole, well-formed entry of kernel B copied under kernel A's key.
    cache.path(KEY).write_bytes(other_path.read_bytes())
    assert cache.get(KEY) is None
    assert cache.rebuilt == 1 and not cache.path(KEY).exists()
    assert cache.get_or_build(KEY, lambda: b"rebuilt A") == b"rebuilt A"
    assert cache.get(OTHER) == b"cubin of kernel B"


def test_a_symlinked_entry_is_not_followed(tmp_path):
    cache = DiskCache(tmp_path / "c")
    cache.put(KEY, b"genuine")
    outside = tmp_path / "elsewhere.cubin"
    outside.write_bytes(cache.path(KEY).read_bytes())  # a valid entry for this very key
    cache.path(KEY).unlink()
    cache.path(KEY).symlink_to(outside)
    with pytest.warns(CacheWarning, match="symbolic link"):
        assert cache.get(KEY) is None
    assert _builds(cache, KEY, 1) == [1]
    # The rebuilt entry replaced the link itself; the link's target was not written.
    assert not cache.path(KEY).is_symlink() and cache.get(KEY) == b"fresh cubin"
    assert outside.read_bytes().endswith(b"genuine")


@pytest.mark.parametrize("which", ["shard", "cubin"])
def test_a_symlinked_directory_is_not_followed(tmp_path, which):
    cache = DiskCache(tmp_path / "c")
    cache.put(KEY, b"genuine")
    directory = cache.path(KEY).parent if which == "shard" else cache.root / "cubin"
    outside = tmp_path / "elsewhere"
    directory.rename(outside)
    directory.symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in outside.rglob("*"))
    with pytest.warns(CacheWarning, match="symbolic link"):
        assert _builds(cache, KEY, 2) == [1, 1]
    assert sorted(p.name for p in outside.rglob("*")) == before  # nothing written through it
