"""On-disk cache of compiled cubins, safe under concurrent processes and distrustful of
what it finds on disk.

Layout: `$TEGULA_CACHE_DIR` (default `~/.cache/tegula`)/`cubin/<k[:2]>/<k>.cubin`, where the
key `k` is a SHA-256 of the generated source, the compile options, the compiler's version
and the target (`cache_key`). Each entry is a small header — magic, payload length and a
SHA-256 of the key *and* the payload — followed by the cubin. A truncated or corrupted
file, or a valid entry of another key copied under this one, fails the check: `get`
returns None, removes it, and the caller rebuilds it.

A cubin read from the cache is loaded into the user's process, so the cache is code and
`PrivateDir` trusts nothing it has not made itself:

* directories it creates are mode 0700 whatever the umask;
* a cache directory (the root or any directory under it) owned by another user, or
  writable by group or others, is refused: a warning (once per directory and reason) and
  compilation without the cache;
* every path component below the root is opened relative to its parent's descriptor
  with `O_NOFOLLOW`, so a symlink planted as an entry or a shard directory is never
  followed (a warning, and a cache miss); entries must be regular files of this user.

Every rejection is a cache miss plus at most one warning, never an exception.

Writers never expose a partial file: they write a uniquely named temporary file in the same
directory and rename it over the entry, which is atomic on POSIX. Two processes that miss
on the same key both compile and both replace; either result is a whole, valid entry, so
no lock is needed (the cost is, at worst, one duplicate compile).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
import struct
import warnings
from pathlib import Path
from typing import Callable, Sequence

MAGIC = b"TGCUBIN2"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256(magic, key, payload)
_KEY = re.compile(r"[0-9a-f]{16,128}")

#: Flags for opening a path component without following a symlink (0 where the platform
#: lacks them: `PrivateDir` then refuses to cache, see `_supported`).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class CacheWarning(UserWarning):
    """A cache directory or entry tegula refused to use (it compiles without it)."""


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, CacheWarning, stacklevel=3)


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


def _supported() -> bool:
    return bool(_NOFOLLOW and _DIRECTORY and os.open in os.supports_dir_fd
                and hasattr(os, "getuid"))


def _distrust(st: os.stat_result) -> str | None:
    """Why a directory with these stats must not hold code, or None when it may."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


class PrivateDir:
    """Files under `root` read and written without trusting the disk (module docstring).

    Paths are given as components, e.g. `read("cubin", "ab", "ab12….cubin")`; each is a
    plain name (no separators). `read` returns None and `write` does nothing where a
    directory or the entry is refused; both warn at most once per directory and reason.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def _refuse(self, where: str, why: str) -> None:
        _warn_once(f"tegula cache: {where} {why}; compiling without the cache there (make "
                   f"it a directory of yours with mode 700, or set TEGULA_CACHE_DIR to one)")

    def _open_root(self, create: bool) -> int | None:
        """A descriptor of the root directory, checked; None when absent or refused."""
        if not _supported():
            self._refuse(str(self.root), "cannot be opened safely on this platform "
                         "(no O_NOFOLLOW / dir_fd)")
            return None
        created = False
        if create:
            try:
                self.root.parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(self.root, 0o700)
                created = True
            except FileExistsError:
                pass  # made earlier, or by another process: checked like any other
            except OSError:
                return None  # unwritable: no caching, as before (no warning needed)
        try:
            fd = os.open(self.root, os.O_RDONLY | _DIRECTORY)
        except OSError:
            return None
        return self._checked(fd, str(self.root), created)

    def _checked(self, fd: int, where: str, created: bool) -> int | None:
        """`fd` when the directory is trustworthy (made 0700 first if we created it)."""
        try:
            if created:
                os.fchmod(fd, 0o700)  # the umask may have taken bits mkdir's mode gave
            why = _distrust(os.fstat(fd))
        except OSError as e:
            why = f"cannot be checked ({e.strerror})"
        if why is not None:
            os.close(fd)
            self._refuse(where, why)
            return None
        return fd

    def _open_dirs(self, dirs: Sequence[str], create: bool) -> int | None:
        """A descriptor of root/dirs…, each component opened without following symlinks
        and checked (created 0700 when `create`); None when absent or refused."""
        fd = self._open_root(create)
        where = str(self.root)
        for name in dirs:
            if fd is None:
                return None
            where = os.path.join(where, name)
            parent, fd, created = fd, None, False
            try:
                if create:
                    try:
                        os.mkdir(name, 0o700, dir_fd=parent)
                        created = True
                    except FileExistsError:
                        pass
                fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=parent)
            except FileNotFoundError:
                pass
            except OSError:
                self._refuse(where, self._why_unopenable(name, parent))
            finally:
                os.close(parent)
            if fd is not None:
                fd = self._checked(fd, where, created)
        return fd

    @staticmethod
    def _why_unopenable(name: str, parent: int) -> str:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError as e:
            return f"cannot be opened ({e.strerror})"
        return "is a symbolic link (not followed)" if stat.S_ISLNK(st.st_mode) \
            else "is not a directory"

    def read(self, *parts: str, limit: int = 1 << 30) -> bytes | None:
        """The bytes of root/parts…, or None (absent, refused, or larger than `limit`)."""
        fd = self._open_dirs(parts[:-1], create=False)
        if fd is None:
            return None
        where = os.path.join(self.root, *parts)
        try:
            try:
                f = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError:
                self._refuse(where, self._why_unopenable(parts[-1], fd))
                return None
            with os.fdopen(f, "rb") as file:
                st = os.fstat(file.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                    self._refuse(where, "is not a regular file of this user")
                    return None
                if st.st_size > limit:
                    return None
                return file.read(limit + 1)
        except OSError:
            return None
        finally:
            os.close(fd)

    def write(self, *parts: str, data: bytes) -> None:
        """Store root/parts… atomically (a temporary file in the same directory, renamed
        over the entry; a symlink there is replaced, never followed). Does nothing where
        a directory is refused; raises OSError when the disk fails."""
        fd = self._open_dirs(parts[:-1], create=True)
        if fd is None:
            return
        name = parts[-1]
        tmp = f".{name[:16]}.{secrets.token_hex(8)}.tmp"
        try:
            f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600,
                        dir_fd=fd)
            try:
                with os.fdopen(f, "wb") as file:
                    file.write(data)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except FileNotFoundError:
                    pass
                raise
        finally:
            os.close(fd)

    def remove(self, *parts: str) -> None:
        """Remove root/parts… if present (a symlink is removed, not its target)."""
        fd = self._open_dirs(parts[:-1], create=False)
        if fd is None:
            return
        try:
            os.unlink(parts[-1], dir_fd=fd)
        except OSError:
            pass  # absent, or another process already replaced or removed it
        finally:
            os.close(fd)


class DiskCache:
    """Cubins by key under `root` (default `default_cache_dir()`, read at construction)."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.dir = PrivateDir(self.root)
        self.hits = 0
        self.misses = 0
        self.rebuilt = 0  # corrupt or mismatched entries found and replaced

    @staticmethod
    def _parts(key: str) -> tuple[str, str, str]:
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"a cache key is a lower-case hex digest, got {key!r}")
        return "cubin", key[:2], f"{key}.cubin"

    def path(self, key: str) -> Path:
        return self.root.joinpath(*self._parts(key))

    def get(self, key: str) -> bytes | None:
        """The cached payload, or None if absent, refused or not this key's (a corrupt or
        mismatched file is removed)."""
        parts = self._parts(key)
        data = self.dir.read(*parts)
        if data is None:
            return None
        payload = _unwrap(key, data)
        if payload is None:
            self.rebuilt += 1
            self.dir.remove(*parts)
        return payload

    def put(self, key: str, payload: bytes) -> None:
        """Store atomically (temporary file in the same directory, then a rename)."""
        self.dir.write(*self._parts(key), data=_wrap(key, payload))

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


def _digest(key: str, payload: bytes) -> bytes:
    """The checksum binding an entry's payload to its key: a valid entry of another key
    copied under this one does not match."""
    h = hashlib.sha256(MAGIC)
    h.update(key.encode("ascii"))
    h.update(b"\0")
    h.update(payload)
    return h.digest()


def _wrap(key: str, payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, len(payload), _digest(key, payload)) + payload


def _unwrap(key: str, data: bytes) -> bytes | None:
    """The payload of `key`'s entry, or None when its header, length or checksum is wrong."""
    if len(data) < _HEADER.size:
        return None
    magic, length, digest = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if magic != MAGIC or length != len(payload) or _digest(key, payload) != digest:
        return None
    return payload
