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
