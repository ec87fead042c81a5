"""mlagen.build: prune with the resource model, then render and compile in worker processes;
failures come back as data, in input order."""

from __future__ import annotations

import json

import pytest
import yaml

from mlagen import build, paths
from mlagen import spec as spec_mod
from mlagen import variant

S80 = spec_mod.load("mla_prefill_sm80")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path / "cache"))  # workers inherit it


def test_build_many_in_workers(tmp_path):
    ok1 = variant.make(S80, {"block_n": 32})
    pruned = variant.make(S80, {"block_n": 128, "stages": 3})          # 302 KB of shared memory
    ok2 = variant.make(S80, {"block_n": 32, "mask": "none", "swizzle": "xor"})
    seen = []
    results = build.build_many([ok1, pruned, ok2], ["sm_80"], jobs=2, out_dir=tmp_path / "out",
                               progress=lambda r, done, total: seen.append((r.variant.symbol, r.status, done, total)))
    assert [(r.variant, r.target, r.status) for r in results] == [
        (ok1, "sm_80", "ok"), (pruned, "sm_80", "pruned"), (ok2, "sm_80", "ok")]
    assert [s[2:] for s in seen] == [(1, 3), (2, 3), (3, 3)]
    assert seen[0][:2] == (pruned.symbol, "pruned")  # pruned results are reported first
    assert {s[0] for s in seen} == {ok1.symbol, pruned.symbol, ok2.symbol}

    p = results[1]
    assert not p.ok and p.binary is None and p.artifact is None and p.report is None
    assert len(p.reasons) == 1 and "needs 302.0 KB of shared memory" in p.reasons[0]
    assert p.estimate.smem_bytes == 309248

    for r in (results[0], results[2]):
        assert r.ok and r.reasons == ()
        assert r.binary.data[:4] == b"\x7fELF" and r.binary.symbol == r.variant.symbol
        assert r.report == r.binary.resources and r.report.registers > 0
        assert r.estimate.threads == 256 and r.seconds > 0
        cubin = tmp_path / "out" / "sm_80" / f"{r.variant.symbol}.sm_80.cubin"
        assert r.artifact == str(cubin)
        assert cubin.read_bytes() == r.binary.data
        meta = json.loads(cubin.with_suffix(".json").read_text())
        assert (meta["symbol"], meta["target"], meta["key"]) == (r.variant.symbol, "sm_80", r.binary.key)
    assert sorted(p.name for p in (tmp_path / "out" / "sm_80").iterdir()) == sorted(
        f"{v.symbol}.sm_80.{ext}" for v in (ok1, ok2) for ext in ("cubin", "json"))
    assert (tmp_path / "cache").is_dir()  # the workers used the cache named by the environment


def test_build_many_serial_targets_and_no_artifacts(tmp_path):
    v = variant.make(S80, {"block_n": 32, "stages": 3})
    results = build.build_many([v], ["sm_80", "sm_86"], jobs=1)
    assert [(r.target, r.status) for r in results] == [("sm_80", "ok"), ("sm_86", "pruned")]
    assert results[0].artifact is None and results[0].binary is not None
    assert "sm_86 allows 99.0 KB" in results[1].reasons[0]


def test_compile_error_is_a_result(tmp_path):
    # A spec kept outside the package, with a template (beside it) that does not compile.
    (tmp_path / "broken.cu.j2").write_text(
        'extern "C" __global__ void {{ symbol | cpp_ident }}(int* p) { *p = no_such_name; }\n')
    d = yaml.safe_load((paths.specs_dir() / "mla_prefill_sm80.yaml").read_text())
    d["name"], d["template"] = "broken_sm80", "broken.cu.j2"
    spec_path = tmp_path / "broken_sm80.yaml"
    spec_path.write_text(yaml.safe_dump(d))
    s = spec_mod.load(spec_path)
    good = variant.default(S80).with_values(block_n=32)
    results = build.build_many([variant.default(s), good], ["sm_80"], jobs=2)
    assert [r.status for r in results] == ["compile_error", "ok"]
    bad = results[0]
    assert not bad.ok and bad.binary is None and bad.estimate is not None
    assert "NVRTC failed to compile" in bad.reasons[0] and "no_such_name" in bad.reasons[0]
    assert "rendered source: " in bad.reasons[0]


def test_everything_pruned_compiles_nothing(tmp_path):
    v = variant.make(S80, {"block_n": 128, "stages": 3})
    results = build.build_many([v, v.with_values(mask="none")], ["sm_80"], jobs=4, out_dir=tmp_path / "out")
    assert [r.status for r in results] == ["pruned", "pruned"]
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "cache").exists()


def test_spec_built_in_memory_is_the_one_compiled(tmp_path):
    # The variant's own spec goes to the workers, not its file name: this spec exists only here.
    d = yaml.safe_load((paths.specs_dir() / "mla_prefill_sm80.yaml").read_text())
    d["tune"]["block_n"]["values"] = [32, 48]
    d["tune"]["block_n"]["default"] = 48
    s = spec_mod.from_dict(d, paths.specs_dir() / "mla_prefill_sm80.yaml")
    vs = [variant.default(s), variant.default(s, mask="none")]
    results = build.build_many(vs, ["sm_80"], jobs=2)
    assert [r.status for r in results] == ["ok", "ok"], [r.reasons for r in results]
    assert all("_n48_" in r.binary.symbol and r.binary.symbol.encode() in r.binary.data for r in results)


class _SpillingCompiler:
    """Stands in for NVRTC: every kernel comes back spilling (as under a compiler that spills)."""

    def compile(self, source, target):
        from mlagen.compiler import Binary, KernelResources

        return Binary(b"\x7fELF", target, source.symbol, "k", KernelResources(registers=168, spill_stores=4,
                                                                             spill_loads=4), "nvrtc 13.9")


def test_a_kernel_that_spills_is_rejected_after_compiling(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "for_target", lambda target: _SpillingCompiler())
    v = variant.make(S80, {"block_n": 32})
    [r] = build.build_many([v], ["sm_80"], jobs=1, out_dir=tmp_path / "out")
    assert (r.status, r.ok, r.artifact) == ("pruned", False, None)
    assert r.reasons == ("spills registers under nvrtc 13.9 (4 bytes spill stores, 4 bytes spill loads, "
                         "168 registers): rejected after compiling",)
    assert r.report.spill_stores == 4  # the report is kept, for the build table and the tuner's record
    assert not (tmp_path / "out").exists()


def test_prefetch_compiles_guesses_once_into_the_cache_and_cancels_the_unstarted(tmp_path):
    """Prefetch: a guess lands in the compile cache, so the build that asks for it later finds it
    there; a guess the resource model rejects is never queued; cancel() drops what has not
    started, and a cancelled guess may be queued again."""
    import concurrent.futures as cf
    import threading
    import time

    ok1 = variant.make(S80, {"block_n": 32})
    ok2 = variant.make(S80, {"block_n": 32, "mask": "none"})
    pruned = variant.make(S80, {"block_n": 128, "stages": 3})   # 302 KB of shared memory
    pool = build.compile_pool(1)
    try:
        prefetch = build.Prefetch(pool, "sm_80")
        done, event = [], threading.Event()

        def compiled(v):
            done.append(v)
            event.set()

        prefetch([ok1, pruned], on_compiled=compiled)
        assert event.wait(120) and done == [ok1] and prefetch.compiled == {pruned: False, ok1: True}
        prefetch([ok1], on_compiled=done.append)          # done already: told at once, not compiled again
        assert done == [ok1, ok1] and not prefetch.pending
        (hit,) = build.build_many([ok1], ["sm_80"], pool=pool)
        assert hit.ok and hit.binary.from_cache
    finally:
        pool.shutdown(cancel_futures=True)

    # A one-thread pool kept busy: the guess waits in the queue and can be cancelled.
    with cf.ThreadPoolExecutor(1) as busy:
        blocker = busy.submit(time.sleep, 0.5)
        prefetch = build.Prefetch(busy, "sm_80")
        prefetch([ok2], on_compiled=done.append)
        assert prefetch.cancel() == 1 and not prefetch.pending and ok2 not in prefetch.compiled
        blocker.result()
        prefetch([ok2])                                    # queued again
        assert ok2 in prefetch.pending or prefetch.compiled.get(ok2)
        prefetch.cancel()
