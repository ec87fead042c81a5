"""mlagen.cache: atomic files, the content-addressed store, and the cross-process lock."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import stat
import time
from pathlib import Path

import pytest

from mlagen import cache

OLD, NEW = b"A" * (1 << 20), b"B" * (1 << 20)


def test_atomic_write_creates_parents_and_leaves_no_temporaries(tmp_path):
    path = tmp_path / "a" / "b" / "file.bin"
    cache.atomic_write(path, b"one")
    cache.atomic_write(path, b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(path.parent) == ["file.bin"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"])
def test_atomic_write_gives_the_umask_permissions(tmp_path, umask, mode):
    # Exports and bench reports are for people and other tools: not the temporary file's 0600.
    old = os.umask(umask)
    try:
        cache.atomic_write(tmp_path / "out.json", b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out.json").stat().st_mode) == mode


def test_atomic_write_failure_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "file.bin"
    cache.atomic_write(path, b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(cache.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        cache.atomic_write(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file.bin"]  # the temporary was removed


def _writer(path: str, rounds: int) -> None:
    for i in range(rounds):
        cache.atomic_write(path, NEW if i % 2 else OLD)


def test_readers_see_the_old_or_the_new_file(tmp_path):
    path = tmp_path / "file.bin"
    cache.atomic_write(path, OLD)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_writer, args=(str(path), 200))
    proc.start()
    seen = set()
    while proc.is_alive() or not seen:
        data = path.read_bytes()
        assert data in (OLD, NEW), f"torn read: {len(data)} bytes"
        seen.add(data[:1])
    proc.join()
    assert proc.exitcode == 0
    assert os.listdir(tmp_path) == ["file.bin"]


# --- DiskCache ------------------------------------------------------------------------------


def test_disk_cache_round_trip(tmp_path):
    c = cache.DiskCache(tmp_path)
    key = "ab" + "0" * 38
    assert c.get(key) is None
    c.put(key, {"kernel.bin": b"\x7fELF", "meta.json": b"{}"})
    assert c.entry_dir(key) == tmp_path / "ab" / key
    assert c.get(key) == {"kernel.bin": b"\x7fELF", "meta.json": b"{}"}


def test_entry_carries_checksums_and_fails_them_when_damaged(tmp_path, caplog):
    c = cache.DiskCache(tmp_path)
    c.put("k0", {"kernel.bin": b"\x7fELF" * 100, "meta.json": b"{}"})
    d = c.entry_dir("k0")
    assert sorted(p.name for p in d.iterdir()) == ["SHA256SUMS", "kernel.bin", "meta.json"]
    (d / "kernel.bin").write_bytes(b"\x7fELF")  # truncated
    assert c.get("k0") is None and d.is_dir()  # without the lock, only treated as absent
    with caplog.at_level("WARNING", logger="mlagen"):
        assert c.get("k0", discard_corrupt=True) is None
    assert not d.exists()
    [msg] = [r.getMessage() for r in caplog.records]
    assert str(d) in msg and "kernel.bin does not match its checksum" in msg


@pytest.mark.parametrize("umask, mode", [(0o022, 0o755), (0o077, 0o700), (0o002, 0o775)], ids=["022", "077", "002"])
def test_entry_directories_get_the_umask_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        cache.DiskCache(tmp_path / "c").put("abc", {"f": b"x"})
    finally:
        os.umask(old)
    entry = cache.DiskCache(tmp_path / "c").entry_dir("abc")
    assert stat.S_IMODE(entry.stat().st_mode) == mode
    assert stat.S_IMODE((entry / "f").stat().st_mode) == mode & 0o666


def test_put_keeps_the_first_entry(tmp_path):
    c = cache.DiskCache(tmp_path)
    c.put("k1", {"a": b"first"})
    c.put("k1", {"a": b"second", "b": b"extra"})
    assert c.get("k1") == {"a": b"first"}
    assert [p.name for p in (tmp_path / "k1").iterdir()] == ["k1"]  # no temporary directories left


def test_put_fills_an_empty_entry_directory(tmp_path):
    c = cache.DiskCache(tmp_path)
    c.entry_dir("k2").mkdir(parents=True)
    c.put("k2", {"a": b"x"})
    assert c.get("k2") == {"a": b"x"}


def test_clear(tmp_path):
    c = cache.DiskCache(tmp_path)
    for key in ("aa1", "aa2", "bb1"):
        c.put(key, {"f": key.encode()})
    with c.lock("aa1"):
        pass
    assert c.clear() == 3
    assert all(c.get(k) is None for k in ("aa1", "aa2", "bb1"))
    assert (tmp_path / "locks").is_dir()
    assert cache.DiskCache(tmp_path / "missing").clear() == 0


def test_lock_file_lives_under_locks(tmp_path):
    c = cache.DiskCache(tmp_path)
    with c.lock("abc"):
        assert (tmp_path / "locks" / "abc.lock").exists()


# --- file_lock ------------------------------------------------------------------------------


def _increment(lock: str, counter: str, n: int, barrier=None, locked: bool = True) -> None:
    if barrier is not None:
        barrier.wait()
    for _ in range(n):
        with cache.file_lock(lock) if locked else contextlib.nullcontext():
            value = int(Path(counter).read_text() or 0)
            time.sleep(0.0005)  # widen the window between read and write
            Path(counter).write_text(str(value + 1))  # not atomic: only the lock makes this safe


def _race(tmp_path, locked: bool) -> int:
    counter = tmp_path / "counter"
    counter.write_text("0")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_increment, args=(str(tmp_path / "l" / "x.lock"), str(counter), 100, barrier, locked))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    return int(counter.read_text() or 0)


def test_file_lock_excludes_other_processes(tmp_path):
    assert _race(tmp_path, locked=True) == 200


def test_file_lock_is_released_on_error(tmp_path):
    lock = tmp_path / "x.lock"
    with pytest.raises(RuntimeError):
        with cache.file_lock(lock):
            raise RuntimeError("boom")
    ctx = multiprocessing.get_context("spawn")
    counter = tmp_path / "counter"
    counter.write_text("0")
    p = ctx.Process(target=_increment, args=(str(lock), str(counter), 1))
    p.start()
    p.join(timeout=60)
    assert p.exitcode == 0 and counter.read_text() == "1"
