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

log = logging.getLogger("mlagen")

CHECKSUMS = "SHA256SUMS"


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask sets it, briefly,
    for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one. The file gets
    the permissions ``open`` would give it (0666 less the umask), not the temporary file's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def file_lock(path: Path | str) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if needed) for the block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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
            shutil.rmtree(d, ignore_errors=True)
        return None

    def put(self, key: str, files: dict[str, bytes]) -> None:
        """Publish an entry atomically; if another process published it first, keep theirs."""
        final = self.entry_dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
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
