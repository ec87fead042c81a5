"""mlagen.knobs: every environment variable, declared once, typed, read when used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlagen import knobs

NAMES = ("MLAGEN_OUT_DIR", "MLAGEN_CACHE_DIR", "MLAGEN_TUNING_DB", "MLAGEN_NO_TUNED", "MLAGEN_NO_SHIPPED",
         "MLAGEN_FAMILY", "MLAGEN_COMPILE_WORKERS", "MLAGEN_LOG", "MLAGEN_NVRTC_LIBRARY", "MLAGEN_CHECK_SEQLENS",
         "MLAGEN_RECORD_SHAPES", "MLAGEN_HEAD_GROUP", "MLAGEN_SEQ_ORDER", "MLAGEN_STAGING_MB", "MLAGEN_PLANS", "MLAGEN_HIP_CLANG", "MLAGEN_HIP_COMPILER", "MLAGEN_PEERS_DIR")


@pytest.fixture
def clean_env(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_every_knob_is_declared_once():
    assert tuple(k.name for k in knobs.ALL) == NAMES
    assert all(k.doc for k in knobs.ALL)


def test_knob_names_match_the_readme():
    readme = Path(__file__).resolve().parent.parent / "README.md"
    if not readme.exists():
        pytest.skip("no README.md")
    text = readme.read_text()
    for name in NAMES:
        assert f"`{name}`" in text, f"{name} is not documented in README.md"


def test_defaults(clean_env):
    assert knobs.out_dir() == Path("out")
    assert knobs.cache_dir() == Path("out") / "cache"
    assert knobs.tuning_db() == Path("out") / "tuning.sqlite"
    assert knobs.no_tuned() is False
    assert knobs.no_shipped() is False
    assert knobs.forced_family() is None
    assert knobs.compile_workers() == max(1, os.cpu_count() or 1)
    assert knobs.log_level() == "WARNING"
    assert knobs.hip_clang() is None and knobs.hip_compiler() == "auto"
    assert knobs.head_group() is None
    assert knobs.staging_bytes() == 512 << 20


def test_hip_compiler_choice(clean_env):
    clean_env.setenv("MLAGEN_HIP_COMPILER", "Clang")
    assert knobs.hip_compiler() == "clang"
    clean_env.setenv("MLAGEN_HIP_COMPILER", "nvcc")
    with pytest.raises(ValueError, match="MLAGEN_HIP_COMPILER='nvcc': expected auto, hiprtc or clang"):
        knobs.hip_compiler()


def test_out_dir_moves_cache_and_db(clean_env, tmp_path):
    clean_env.setenv("MLAGEN_OUT_DIR", str(tmp_path))
    assert knobs.out_dir() == tmp_path
    assert knobs.cache_dir() == tmp_path / "cache"
    assert knobs.tuning_db() == tmp_path / "tuning.sqlite"


def test_explicit_cache_and_db(clean_env, tmp_path):
    clean_env.setenv("MLAGEN_OUT_DIR", str(tmp_path / "o"))
    clean_env.setenv("MLAGEN_CACHE_DIR", str(tmp_path / "c"))
    clean_env.setenv("MLAGEN_TUNING_DB", str(tmp_path / "t.sqlite"))
    assert knobs.cache_dir() == tmp_path / "c"
    assert knobs.tuning_db() == tmp_path / "t.sqlite"


def test_empty_value_means_default(clean_env):
    clean_env.setenv("MLAGEN_OUT_DIR", "")
    clean_env.setenv("MLAGEN_NO_TUNED", "")
    assert knobs.out_dir() == Path("out")
    assert knobs.no_tuned() is False


def test_values_are_read_when_used(clean_env):
    clean_env.setenv("MLAGEN_FAMILY", "mla_prefill_sm80")
    assert knobs.forced_family() == "mla_prefill_sm80"
    clean_env.setenv("MLAGEN_FAMILY", "mla_prefill_sm90")
    assert knobs.forced_family() == "mla_prefill_sm90"


@pytest.mark.parametrize("value, expected", [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
@pytest.mark.parametrize("name, read", [("MLAGEN_NO_TUNED", knobs.no_tuned), ("MLAGEN_NO_SHIPPED", knobs.no_shipped)])
def test_flags(clean_env, name, read, value, expected):
    clean_env.setenv(name, value)
    assert read() is expected


@pytest.mark.parametrize("name, read", [("MLAGEN_NO_TUNED", knobs.no_tuned), ("MLAGEN_NO_SHIPPED", knobs.no_shipped)])
def test_bad_flag_names_the_variable(clean_env, name, read):
    clean_env.setenv(name, "maybe")
    with pytest.raises(ValueError, match=f"{name}='maybe': expected 0 or 1"):
        read()


def test_compile_workers(clean_env):
    clean_env.setenv("MLAGEN_COMPILE_WORKERS", "3")
    assert knobs.compile_workers() == 3


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_bad_compile_workers_names_the_variable(clean_env, value):
    clean_env.setenv("MLAGEN_COMPILE_WORKERS", value)
    with pytest.raises(ValueError, match="MLAGEN_COMPILE_WORKERS=.*positive integer"):
        knobs.compile_workers()


@pytest.mark.parametrize("value, expected", [("debug", "DEBUG"), ("Info", "INFO"), ("warning", "WARNING")])
def test_log_level(clean_env, value, expected):
    clean_env.setenv("MLAGEN_LOG", value)
    assert knobs.log_level() == expected


def test_bad_log_level_names_the_variable(clean_env):
    clean_env.setenv("MLAGEN_LOG", "loud")
    with pytest.raises(ValueError, match="MLAGEN_LOG='loud'"):
        knobs.log_level()


def test_peers_dir(clean_env, tmp_path):
    clean_env.setenv("MLAGEN_PEERS_DIR", str(tmp_path / "p"))
    assert knobs.peers_dir() == tmp_path / "p"
    clean_env.delenv("MLAGEN_PEERS_DIR")
    repo = Path(knobs.__file__).resolve().parent.parent
    found = knobs.peers_dir()
    for candidate in (repo.parent / "shared" / "peers", repo / "shared" / "peers"):
        if candidate.is_dir():
            assert found == candidate
            break
    else:
        assert found is None


def test_head_group(clean_env):
    clean_env.setenv("MLAGEN_HEAD_GROUP", "3")
    assert knobs.head_group() == 3
    for bad in ("0", "-2", "four"):
        clean_env.setenv("MLAGEN_HEAD_GROUP", bad)
        with pytest.raises(ValueError, match=f"MLAGEN_HEAD_GROUP='{bad}': expected a positive integer"):
            knobs.head_group()


def test_path_knobs_expand_the_home_directory(monkeypatch, tmp_path):
    """Issue 42 point 15: MLAGEN_OUT_DIR=~/x means the home directory's x, not a directory named ~."""
    from mlagen import knobs

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MLAGEN_OUT_DIR", "~/out")
    monkeypatch.setenv("MLAGEN_TUNING_DB", "~/t.sqlite")
    monkeypatch.delenv("MLAGEN_CACHE_DIR", raising=False)
    assert knobs.out_dir() == tmp_path / "out" and knobs.cache_dir() == tmp_path / "out" / "cache"
    assert knobs.tuning_db() == tmp_path / "t.sqlite"


def test_a_library_that_is_not_nvrtc_is_refused(monkeypatch, tmp_path):
    from mlagen import knobs

    other = tmp_path / "libz.so.1"
    other.write_bytes(b"\x7fELF")
    monkeypatch.setenv("MLAGEN_NVRTC_LIBRARY", str(other))
    with pytest.raises(ValueError, match="MLAGEN_NVRTC_LIBRARY=.*not an NVRTC library"):
        knobs.nvrtc_library()


def test_info_says_which_values_are_invalid_and_survives_a_bad_log_level(monkeypatch):
    from click.testing import CliRunner

    from mlagen.cli import cli

    monkeypatch.setenv("MLAGEN_NO_TUNED", "maybe")
    monkeypatch.setenv("MLAGEN_LOG", "loud")
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 0, result.output
    assert "INVALID: MLAGEN_NO_TUNED='maybe': expected 0 or 1" in result.output
    assert "INVALID: MLAGEN_LOG='loud'" in result.output
    assert CliRunner().invoke(cli, ["specs"]).exit_code == 1  # other commands refuse the bad level
