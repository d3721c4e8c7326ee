"""On-disk cache of compiled cubins, safe under concurrent processes.

Layout: `$TEGULA_CACHE_DIR` (default `~/.cache/tegula`)/`cubin/<k[:2]>/<k>.cubin`, where the
key `k` is a SHA-256 of the generated source, the compile options, the compiler's version
and the target (`cache_key`). Each entry is a small header — magic, payload length and the
payload's SHA-256 — followed by the cubin, so a truncated or corrupted file is detected
(`get` returns None, removes it, and the caller rebuilds it).

Writers never expose a partial file: they write a uniquely named temporary file in the same
directory and `os.replace` it over the entry, which is atomic on POSIX. Two processes that
miss on the same key both compile and both replace; either result is a whole, valid entry,
so no lock is needed (the cost is, at worst, one duplicate compile).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Callable

MAGIC = b"TGCUBIN1"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256(payload)


def default_cache_dir() -> Path:
    """`$TEGULA_CACHE_DIR`, else `~/.cache/tegula`."""
    env = os.environ.get("TEGULA_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tegula"


def cache_key(source: str, options: tuple[str, ...] | list[str], compiler_version: str,
              target: str) -> str:
    """Hex SHA-256 naming one compile: everything that can change the cubin."""
    blob = json.dumps({"source": source, "options": list(options),
                       "compiler": compiler_version, "target": target, "format": 1},
                      sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


class DiskCache:
    """Cubins by key under `root` (default `default_cache_dir()`, read at construction)."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0
        self.rebuilt = 0  # corrupt entries found and replaced

    def path(self, key: str) -> Path:
        return self.root / "cubin" / key[:2] / f"{key}.cubin"

    def get(self, key: str) -> bytes | None:
        """The cached payload, or None if absent or corrupt (a corrupt file is removed)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except OSError:  # absent, or the cache directory is unusable
            return None
        payload = _unwrap(data)
        if payload is None:
            self.rebuilt += 1
            try:
                path.unlink()
            except FileNotFoundError:
                pass  # another process already replaced or removed it
        return payload

    def put(self, key: str, payload: bytes) -> None:
        """Store atomically (temporary file in the same directory, then `os.replace`)."""
        header = _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest())
        write_atomic(self.path(key), header + payload)

    def get_or_build(self, key: str, build: Callable[[], bytes]) -> bytes:
        """The cached payload for `key`, building (and storing) it on a miss."""
        payload = self.get(key)
        if payload is not None:
            self.hits += 1
            return payload
        self.misses += 1
        payload = build()
        try:
            self.put(key, payload)
        except OSError:
            pass  # an unwritable cache must not stop compilation
        return payload


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` through a temporary file in the same directory and `os.replace`, so a
    reader (another process too) sees the old file or the whole new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:16]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _unwrap(data: bytes) -> bytes | None:
    """The payload of an entry, or None when its header, length or checksum is wrong."""
    if len(data) < _HEADER.size:
        return None
    magic, length, digest = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if magic != MAGIC or length != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload
