"""Atomic files and a content-addressed on-disk store, safe with several processes at once.

Writers build an entry in a private temporary directory and publish it with one ``rename``; a
reader therefore sees a complete entry or none. Builders take an exclusive lock per key and look
again once they hold it, so concurrent processes compile a given key once.

Every entry carries a ``SHA256SUMS`` file (``sha256sum -c`` reads it). An entry that does not
match it (a truncated binary, a garbled file, one missing) is treated as absent: the builder,
holding the key's lock, discards it with a warning naming the path and builds it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from . import knobs
from .errors import CacheError
from .fsutil import atomic_write, umask as _umask  # noqa: F401 (atomic_write: the one file writer)

log = logging.getLogger("mlagen")

CHECKSUMS = "SHA256SUMS"


def usable_dir(path: Path | str, what: str) -> Path:
    """``path`` as a directory this process can write (created if needed), or CacheError naming
    ``what`` (the variable or option that set it) and why not, once, before any work starts, so a
    broken cache is one line instead of an error per kernel."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():
            raise NotADirectoryError(20, "not a directory")
        fd, probe = tempfile.mkstemp(dir=path, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = "not a directory" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror or exc
        raise CacheError(f"{path}: cannot be used as a directory ({reason}); it is {what}") from None
    return path


def check_build_dirs() -> None:
    """The compile cache and the rendered-source directory are usable, or one CacheError naming
    the variable (what builds and checks call before compiling anything)."""
    usable_dir(knobs.cache_dir(), f"the compile cache (${knobs.CACHE_DIR.name}, default <${knobs.OUT_DIR.name}>/cache)")
    usable_dir(knobs.out_dir() / "src", f"where rendered sources go (<${knobs.OUT_DIR.name}>/src)")


def _make_dir(path: Path) -> None:
    """``path`` as a directory; a file in its place (a stray write, a crash) is removed first."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        if path.is_dir() or not (path.is_symlink() or path.exists()):
            raise
        log.warning("compile cache: %s is not a directory: removed, recreating it", path)
        path.unlink()
        path.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def file_lock(path: Path | str) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if needed) for the block. A directory
    in the lock's place holds no lock: it is removed (the lock file is recreated)."""
    path = Path(path)
    _make_dir(path.parent)
    if path.is_dir() and not path.is_symlink():
        log.warning("lock %s is a directory: removed, recreating it as a file", path)
        shutil.rmtree(path, ignore_errors=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _checksums(files: dict[str, bytes]) -> bytes:
    return "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(files.items())).encode()


def _verify(files: dict[str, bytes]) -> str | None:
    """What is wrong with an entry's files, checked against its SHA256SUMS; None if nothing."""
    sums = files.get(CHECKSUMS)
    if sums is None:
        return f"no {CHECKSUMS}"
    expected = {}
    try:
        for line in sums.decode().splitlines():
            digest, name = line.split("  ", 1)
            expected[name] = digest
    except (UnicodeDecodeError, ValueError):
        return f"{CHECKSUMS} is garbled"
    for name, digest in expected.items():
        if name not in files:
            return f"{name} is missing"
        if hashlib.sha256(files[name]).hexdigest() != digest:
            return f"{name} does not match its checksum"
    extra = set(files) - set(expected) - {CHECKSUMS}
    if extra:
        return f"unexpected file(s) {', '.join(sorted(extra))}"
    return None


class DiskCache:
    """Entries are directories of named files under ``root/<key[:2]>/<key>``."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str, discard_corrupt: bool = False) -> dict[str, bytes] | None:
        """The entry's files, or None if there is none or it fails its checksums. With
        ``discard_corrupt`` (only while holding the key's lock) a corrupt entry is removed."""
        d = self.entry_dir(key)
        if not d.is_dir():
            if discard_corrupt and (d.is_symlink() or d.exists()):  # a file where the entry belongs
                self._corrupt(d, "not a directory", True)
            return None
        try:
            files = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
        except FileNotFoundError:  # evicted while reading
            return None
        except OSError as exc:
            return self._corrupt(d, f"unreadable ({exc})", discard_corrupt)
        problem = _verify(files)
        if problem:
            return self._corrupt(d, problem, discard_corrupt)
        files.pop(CHECKSUMS)
        return files

    def discard(self, key: str, why: str) -> None:
        """Remove an entry its reader found unusable (call while holding the key's lock)."""
        self._corrupt(self.entry_dir(key), why, True)

    def _corrupt(self, d: Path, problem: str, discard: bool) -> None:
        if discard:
            log.warning("compile cache entry %s is corrupt (%s): discarded, rebuilding it", d, problem)
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    d.unlink()
        return None

    def put(self, key: str, files: dict[str, bytes]) -> None:
        """Publish an entry atomically; if another process published it first, keep theirs."""
        final = self.entry_dir(key)
        _make_dir(final.parent)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{key}."))
        try:
            for name, data in files.items():
                (tmp / name).write_bytes(data)
            (tmp / CHECKSUMS).write_bytes(_checksums(files))
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would make the entry private
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        with file_lock(self.root / "locks" / f"{key}.lock"):
            yield

    def clear(self) -> int:
        """Remove every entry; returns how many were removed."""
        n = 0
        if self.root.is_dir():
            for sub in self.root.iterdir():
                if sub.is_dir() and sub.name != "locks":
                    for entry in sub.iterdir():
                        shutil.rmtree(entry, ignore_errors=True)
                        n += 1
        return n
