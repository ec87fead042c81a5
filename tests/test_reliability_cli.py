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


@pytest.mark.parametrize("args, match", [
    (["variants", "mla_prefill_sm80", "--limit", "1", "--variant", "block_n=64,block_n=32"],
     "tune.block_n: given twice ('block_n=64' and 'block_n=32')"),
    (["variants", "mla_prefill_sm80", "--limit", "1", "--variant", "block_n=64", "--variant", "block_n=64"],
     "tune.block_n: given twice"),
    (["build", "mla_prefill_sm80", "--variant", "block_n=64,stages=2,block_n=128"], "tune.block_n: given twice"),
    (["tune", "mla_prefill_sm80", "--shape", "D1", "--fixed", "block_n=64,block_n=32"], "tune.block_n: given twice"),
])
def test_a_variant_key_given_twice_is_refused(args, match):
    """Point 15: --variant / --fixed with a repeated name is one line naming it, before any work."""
    result = _run(args)
    assert result.exit_code == 1 and match in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


BAD_SHAPES = [
    ("q=[1,2,,3],h=16", "q=[1,2,,3]: item 2 is empty"),
    ("q=0x10,h=16", "q=0x10: expected a non-negative integer"),
    ("q=1e3,h=16", "q=1e3: expected a non-negative integer"),
    ("q=+5,h=16", "q=+5: expected a non-negative integer"),
    ("q=\u0663,h=16", "'\u0663' is not a decimal integer"),
    ("q=10^26,h=16", "q=10^26: expected a non-negative integer"),
    ("b=+2,q=16,h=16", "b=+2: expected a positive decimal integer"),
    ("q=16,h=10^6", "h=10^6: expected a positive integer, a head count from 1 to 128"),
    ("q=16,h=1000000", "h=1000000: expected a positive integer, a head count from 1 to 128"),
    ("q=16,h=129", "h=129: expected a positive integer, a head count from 1 to 128"),
    ("q=16,h=0", "h=0: expected a positive integer, a head count from 1 to 128"),
    ("sq=1,sq=2,h=128,topk=64,skv=128", "sq is given twice"),
    ("sq=1,h=128,topk=64,skv=128,kv=fp8_v32,kv=bf16", "kv is given twice"),
    ("sq=1,h=128,topk=64,skv=128,sink=7", "sink must be 0 (off) or 1 (on), got '7'"),
    ("sq=1,h=128,topk=64,skv=128,sink=", "sink must be a decimal integer, got ''"),
    ("sq=+5,h=128,topk=64,skv=128", "sq must be a decimal integer, got '+5'"),
    ("sq=1_000,h=128,topk=64,skv=128", "sq must be a decimal integer, got '1_000'"),
    ("sq=\u0663,h=128,topk=64,skv=128", "sq must be a decimal integer"),
    ("sq=1,h=1000000,topk=64,skv=128", "h must be a head count from 1 to 128, got 1000000"),
    ("sq=1,h=0,topk=64,skv=128", "h must be a head count from 1 to 128, got 0"),
]


@pytest.mark.parametrize("shape, match", BAD_SHAPES, ids=[s for s, _ in BAD_SHAPES])
def test_a_bad_shape_is_one_line_naming_the_key(shape, match):
    """Point 15: the shape grammar (tune --shape, bench --shape, workloads) refuses each, one line."""
    from mlagen import shapes
    from mlagen.errors import ShapeError

    with pytest.raises(ShapeError) as info:
        shapes.parse_shape(shape)
    assert match in str(info.value) and "\n" not in str(info.value), str(info.value)
    result = _run(["tune", "--shape", shape])
    assert result.exit_code == 1 and match in result.output, result.output


@pytest.mark.parametrize("shape", ["q=[1,2,3],h=1", "q=16,h=128", "b=2,q=16,k=[16,32],h=64,none",
                                   "sq=1,h=1,topk=64,skv=128,sink=0", "sq=1,h=128,topk=64,skv=128,sink=1"])
def test_the_edges_of_the_shape_grammar_still_read(shape):
    from mlagen import shapes

    assert shapes.parse_shape(shape) is not None


@pytest.mark.parametrize("weight", [".inf", ".nan", "1.0e+400"])
def test_a_workload_weight_must_be_finite(tmp_path, weight):
    """Point 15: `weight: .inf` would give one shape the whole budget and the rest none."""
    from mlagen import shapes
    from mlagen.errors import ShapeError

    path = tmp_path / "w.yaml"
    path.write_text(f"shapes: [{{shape: D1, weight: {weight}}}, {{shape: D3, weight: 1}}]\n")
    with pytest.raises(ShapeError, match=r"shapes\[0\]\.weight: expected a positive number \(finite\)"):
        shapes.load_workload(path)
