"""Every file mlagen writes goes through one safe writer (issue 42, point 10): device nodes and
other non-regular files are refused, a symbolic link keeps pointing at the file it names."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from mlagen import check, db, fsutil
from mlagen.cli import cli
from mlagen.errors import OutputError


def test_a_device_node_is_refused_not_replaced(tmp_path):
    with pytest.raises(OutputError, match="not a regular file"):
        fsutil.atomic_write("/dev/null", b"x")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="not a regular file"):
        fsutil.atomic_write(fifo, b"x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(OutputError, match="a directory"):
        fsutil.atomic_write(tmp_path, b"x")


def test_a_symlink_is_followed_and_kept(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    fsutil.atomic_write(link, b"new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "sub" / "made.json")
    fsutil.atomic_write(dangling, b"made")
    assert dangling.is_symlink() and (tmp_path / "sub" / "made.json").read_text() == "made"


def test_junit_onto_a_device_is_one_error(monkeypatch, tmp_path):
    report = check.Report("13.5", tmp_path / "e.json", "", [])
    with pytest.raises(OutputError):
        check.write_junit("/dev/full" if os.path.exists("/dev/full") else "/dev/null", report)


def test_export_force_onto_a_symlink_keeps_the_link(tmp_path):
    tdb = db.TuningDB(tmp_path / "t.sqlite")
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    result = CliRunner().invoke(cli, ["db", "--db", str(tdb.path), "export", str(link), "--force"])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and '"format": "mlagen-tuning"' in target.read_text()
    result = CliRunner().invoke(cli, ["db", "--db", str(tdb.path), "export", "/dev/null", "--force"])
    assert result.exit_code == 1 and "not a regular file" in result.output


def test_cache_entries_of_the_wrong_kind_heal(tmp_path):
    """Issue 42 point 12: a file where an entry, a shard or a lock belongs is replaced (with a
    warning) instead of failing every build that meets it."""
    from mlagen.cache import DiskCache

    cache = DiskCache(tmp_path)
    key = "ab" + "0" * 38
    entry = cache.entry_dir(key)
    entry.parent.mkdir(parents=True)
    entry.write_text("not an entry")
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / f"{key}.lock").mkdir()
    with cache.lock(key):
        assert cache.get(key, discard_corrupt=True) is None
        cache.put(key, {"kernel.bin": b"x"})
    assert cache.get(key) == {"kernel.bin": b"x"}
    other = "cd" + "0" * 38
    (tmp_path / "cd").write_text("a file where a shard belongs")
    cache.put(other, {"kernel.bin": b"y"})
    assert cache.get(other) == {"kernel.bin": b"y"}
