"""`mlagen check` as CI runs it (issue 42, points 6, 7, 8): exact spec scopes, an update that
never weakens or deletes expectations it could not re-measure, and no green run that checked
nothing. The builds are stand-ins (measure what the check decides, not NVRTC)."""

from __future__ import annotations

import json
import types

import pytest
from click.testing import CliRunner

from mlagen import check
from mlagen.cli import cli

# The newest committed expectations stand for the local NVRTC (the builds are stand-ins too).
NVRTC = "{}.{}".format(*max(check.expectation_files()))


@pytest.fixture(autouse=True)
def local_nvrtc(monkeypatch):
    monkeypatch.setattr(check, "NvrtcCompiler", lambda: types.SimpleNamespace(version=lambda: NVRTC))


@pytest.fixture
def expectations(tmp_path, monkeypatch):
    """A copy of the committed expectations as the local NVRTC's file, in a temporary directory."""
    src, _ = check.choose_expectations(NVRTC)
    path = tmp_path / f"nvrtc-{NVRTC}.json"
    path.write_text(src.read_text())
    monkeypatch.setattr(check, "EXPECTATIONS_DIR", tmp_path)
    return path


def _stand_in_builds(monkeypatch, status="ok"):
    """build_many answers ``status`` for every kernel, measured as its committed expectation (so
    a correct run changes nothing)."""
    committed = check.read_expectations(check.choose_expectations(NVRTC)[0])

    def build_many(variants, targets, jobs=None):
        return [types.SimpleNamespace(status=status, key=f"{v.symbol}@{targets[0]}",
                                      reasons=["stand-in compile error"] if status != "ok" else []) for v in variants]

    def measure(result):
        return committed.get(result.key, {"status": "ok"}) if result.status == "ok" else {"status": result.status}

    monkeypatch.setattr(check, "build_many", build_many)
    monkeypatch.setattr(check, "measure", measure)


def test_a_spec_scope_is_its_own_kernels_not_a_prefix():
    """Point 6: mla_prefill_sm90 does not own mla_prefill_sm90_fp8's kernels."""
    names = ["mla_prefill_sm90", "mla_prefill_sm90_fp8", "mla_prefill_sm80"]
    assert check.spec_of("mla_prefill_sm90_fp8_causal_c2@sm_90a".split("@")[0], names) == "mla_prefill_sm90_fp8"
    assert not check._in_scope("mla_prefill_sm90_fp8_causal_c2@sm_90a", ["mla_prefill_sm90"], None, names)
    assert check._in_scope("mla_prefill_sm90_causal_c2@sm_90a", ["mla_prefill_sm90"], None, names)


def test_check_and_update_of_one_spec_leave_its_prefix_siblings_alone(expectations, monkeypatch):
    """Point 6: no false "no longer built" for the _fp8 kernels, and --update keeps them."""
    _stand_in_builds(monkeypatch)
    before = json.loads(expectations.read_text())["kernels"]
    fp8 = [k for k in before if k.startswith("mla_prefill_sm90_fp8_")]
    assert fp8
    result = CliRunner().invoke(cli, ["check", "--spec", "mla_prefill_sm90"])
    assert result.exit_code == 0, result.output
    assert "no longer built" not in result.output
    result = CliRunner().invoke(cli, ["check", "--update", "--spec", "mla_prefill_sm90"])
    assert result.exit_code == 0, result.output
    assert json.loads(expectations.read_text())["kernels"] == before


def test_update_never_writes_compile_errors_over_expectations(expectations, monkeypatch):
    """Point 7: a run where nothing compiles (a broken cache, a broken NVRTC) changes no
    expectation, deletes none, and fails."""
    _stand_in_builds(monkeypatch, status="compile_error")
    before = expectations.read_text()
    result = CliRunner().invoke(cli, ["check", "--update", "--spec", "mla_prefill_sm80"])
    assert result.exit_code == 1, result.output
    assert "expectation kept" in result.output and "not changed" in result.output
    assert expectations.read_text() == before


@pytest.mark.parametrize("value", ["file", "/dev/null", "/proc/x"])
def test_an_unusable_cache_dir_is_one_error_before_any_build(expectations, monkeypatch, tmp_path, value):
    """Point 7: MLAGEN_CACHE_DIR on a file, /dev/null or /proc/x is named once; nothing is built."""
    if value == "file":
        value = str(tmp_path / "file")
        (tmp_path / "file").write_text("")
    monkeypatch.setenv("MLAGEN_CACHE_DIR", value)
    monkeypatch.setattr(check, "build_many", lambda *a, **k: pytest.fail("built with an unusable cache"))
    before = expectations.read_text()
    for args in (["check", "--spec", "mla_prefill_sm80"], ["check", "--update", "--spec", "mla_prefill_sm80"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, result.output
        assert f"{value}: cannot be used as a directory" in result.output and "MLAGEN_CACHE_DIR" in result.output
    assert expectations.read_text() == before


@pytest.mark.parametrize("args, match", [
    (["--arch", "sm_42"], "unknown target(s) sm_42"),
    (["--arch", "gfx942"], "nothing to check"),
    (["--spec", "mla_prefill_gfx942"], "nothing to check"),
    (["--spec", "mla_prefill_sm80", "--arch", "gfx950"], "--arch gfx950: no selected spec targets it"),
    (["--spec", "no_such_spec"], "unknown spec(s) no_such_spec"),
])
def test_a_check_that_would_check_nothing_fails(monkeypatch, args, match):
    """Point 8: no "0 of 0 kernels as expected" with exit 0."""
    monkeypatch.setattr(check, "build_many", lambda *a, **k: pytest.fail("nothing should be built"))
    result = CliRunner().invoke(cli, ["check", *args])
    assert result.exit_code == 1, result.output
    assert match in result.output


@pytest.mark.parametrize("command", [["check"], ["build"], ["tune", "--shape", "D1"]])
@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_jobs_must_be_positive(command, jobs):
    result = CliRunner().invoke(cli, [*command, "-j", jobs])
    assert result.exit_code == 2 and "-j" in result.output
