"""Arguments are checked before any work, and bad ones are one line (issue 42, points 12, 13, 15):
no traceback, no GPU lookup or stall first, no silent acceptance."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from mlagen.cli import cli


def _run(args, env=None):
    start = time.monotonic()
    result = CliRunner().invoke(cli, args, env=env)
    seconds = time.monotonic() - start
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert seconds < 5.0, f"{args}: {seconds:.1f} s before the answer"
    return result


@pytest.mark.parametrize("args, match", [
    (["tune", "--shape", "D1", "--arch", "sm_42"], "--arch sm_42: unknown target"),
    (["variants", "--arch", "sm_42"], "--arch sm_42: unknown target"),
    (["build", "--arch", "sm_42"], "--arch sm_42: unknown target"),
])
def test_an_unknown_target_is_one_line(args, match):
    result = _run(args)
    assert result.exit_code == 1 and match in result.output, result.output


@pytest.mark.parametrize("args", [
    ["tune", "--shape", "D1", "--timeout", "-1"],
    ["tune", "--shape", "D1", "--timeout", "nan"],
    ["tune", "--shape", "D1", "--timeout", "inf"],
    ["tune", "--shape", "D1", "--iters", "0"],
    ["tune", "--shape", "D1", "--top", "0"],
    ["tune", "--shape", "D1", "--max-trials", "0"],
    ["tune", "--shape", "D1", "--budget", "nan"],
    ["bench", "--iters", "0"],
    ["bench", "--rounds", "0"],
    ["bench", "--warmup", "-1"],
    ["variants", "mla_prefill_sm90", "--limit", "322000000"],
    ["variants", "mla_prefill_sm90", "--limit", "1000000"],
])
def test_out_of_range_numbers_are_refused_before_any_work(args):
    result = _run(args)
    assert result.exit_code == 2, result.output
    assert "Invalid value" in result.output


def test_db_import_of_a_device_is_one_line():
    result = _run(["db", "--db", "/nonexistent/t.sqlite", "import", "/dev/zero"])
    assert result.exit_code == 1 and "/dev/zero: not a regular file" in result.output


def test_build_with_an_unusable_cache_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    result = _run(["build", "mla_prefill_sm80"], env={"MLAGEN_CACHE_DIR": str(tmp_path / "file")})
    assert result.exit_code == 1
    assert result.output.count("cannot be used as a directory") == 1, result.output
    result = _run(["build", "mla_prefill_sm80", "--out", str(tmp_path / "file" / "sub")])
    assert result.exit_code == 1 and "--out" in result.output, result.output


@pytest.mark.parametrize("shape, family", [("sq=4096,h=64,topk=512,skv=32768,d=512", "mla_sparse_prefill"),
                                           ("D1", "mla_prefill"), ("S1", "mla_sparse_prefill")])
def test_tune_without_a_spec_takes_the_family_of_its_shapes(monkeypatch, shape, family):
    """Issue 38 point 6: without SPEC, the shape says the family (a sparse description is not
    read as dense), and the spec chosen serves it."""
    from mlagen import families
    from mlagen import spec as spec_mod
    from mlagen import tune

    seen = {}

    def stand_in(config, progress=None, bar=None):
        seen["spec"] = spec_mod.load(config.spec)
        seen["shapes"] = config.shapes
        return []

    monkeypatch.setattr(tune, "tune", stand_in)
    result = _run(["tune", "--shape", shape, "--arch", "sm_90a"])
    assert result.exit_code == 0, result.output
    s = seen["spec"]
    assert s.family == family and "sm_90a" in s.targets
    fam = families.get(s.family, s.path)
    assert all(fam.refuses(s, sh) is None for sh in seen["shapes"])


@pytest.mark.parametrize("name", ["mla_sparse_prefill_sm90", "mla_sparse_prefill_sm90_h16", "mla_prefill_sm80"])
def test_build_spec_builds_defaults_the_spec_serves(name):
    """Issue 38 point 6: `mlagen build SPEC` builds, per specialisation, a variant that fits (not
    a default it then prunes); a specialisation no variant serves is left out."""
    from mlagen import arch, resources
    from mlagen import spec as spec_mod
    from mlagen.cli import _build_variants

    s = spec_mod.load(name)
    target = s.targets[0]
    built = _build_variants(s, [target], (), False, 2000)
    assert built
    for v in built:
        verdict = resources.check(v, arch.target(target))
        assert verdict.ok, (v.symbol, verdict.reasons)


@pytest.mark.parametrize("shape", ["b=2000000000,q=1,h=1", "q=100000000000000000000000000,h=1",
                                   "sq=4096,h=64,topk=512,skv=99999999999,d=512"])
def test_a_huge_shape_is_refused_at_once(shape):
    """Issue 42 point 13: no MemoryError after seconds of allocation."""
    result = _run(["tune", "--shape", shape])
    assert result.exit_code == 1 and "is too large" in result.output, result.output
