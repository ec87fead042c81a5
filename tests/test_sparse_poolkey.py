"""The sparse shape class names the KV pool's size (a power-of-two bucket of the rows the indices
address): whether the gathered rows stay in L2 decides which schedule wins (docs/benchmarks.md,
2026-12-02: a record tuned on M1, s_kv 8192, ran 3-5% slower than the default on M2-M4). Keys
written before hold no pool size; they parse, and serve every pool size after a key of the call's
own bucket."""

from __future__ import annotations

import math

import pytest

from mlagen import db
from mlagen.families.mla_sparse_prefill import FAMILY, problem as sp_problem

Key = sp_problem.ProblemKey


@pytest.mark.parametrize("text, key", [
    ("d512/h64/k512/s8192/flat", Key(512, 64, 512, "flat", "bf16", 8192)),
    ("d576/h128/k2048/s65536/paged/fp8_v32", Key(576, 128, 2048, "paged", "fp8_v32", 65536)),
    ("d576/h1/k1/s1/flat", Key(576, 1, 1, "flat", "bf16", 1)),
    # Keys written before the pool's size was part of them (the shipped h100.json record, users' databases).
    ("d576/h128/k2048/flat/fp8_v32", Key(576, 128, 2048, "flat", "fp8_v32", 0)),
    ("d512/h64/k512/flat", Key(512, 64, 512)),
])
def test_key_text_round_trip(text, key):
    assert Key.parse(text) == key and str(key) == text
    assert FAMILY.problem_distance(text, text) == 0
    assert FAMILY.problem_specialization(text) == {"d_qk": key.d_qk, "paged": key.layout == "paged",
                                                   "kv_format": key.kv_format}


@pytest.mark.parametrize("text", [
    "d512/h64/k512/s0/flat", "d512/h64/k512/s6000/flat", "d512/h64/k512/s08192/flat", "d512/h64/k512/s+8192/flat",
    "d512/h64/k512/s/flat", "d512/h64/k512/sx/flat", "d512/h64/k512/s8192/s8192/flat", "d512/h64/k512/flat/s8192",
    "d512/h64/s8192/k512/flat", "d512/h64/k512/s8192/flat/bf16", "d512/h64/k512/s8192", "d512/h64/k512/s\u0668/flat",
    "d512/h64/k512/s8192/flat/fp8_v32/x",
])
def test_bad_keys_name_the_form(text):
    with pytest.raises(ValueError) as err:
        Key.parse(text)
    message = str(err.value)
    assert "\n" not in message and message.startswith(repr(text))
    assert "/s<pool rows, a power of two>" in message and "'d576/h128/k2048/s8192/flat'" in message


def test_distance_ranks_same_bucket_then_neighbour_then_old_key():
    call = Key(512, 64, 512, "flat", "bf16", 8192)
    same, near, far = (Key(512, 64, 512, "flat", "bf16", n) for n in (8192, 16384, 65536))
    old = Key(512, 64, 512)
    d = call.distance
    assert d(same) == 0 < d(near) < d(old) < d(Key(512, 128, 512, "flat", "bf16", 8192)) == 1
    assert d(near) == sp_problem.POOL_STEP == near.distance(call) < 1   # less than one head / topk step
    assert d(far) == 3 * sp_problem.POOL_STEP and d(old) == sp_problem.POOL_UNKNOWN == old.distance(call)
    assert old.distance(old) == 0
    # Still no record across d_qk, layout or format, whatever the pool.
    assert d(Key(512, 64, 512, "paged", "bf16", 8192)) == d(Key(576, 64, 512, "flat", "bf16", 8192)) == math.inf


def _best(problem: str, symbol: str, updated: float) -> db.Best:
    key = db.RecordKey(family="mla_sparse_prefill", spec="mla_sparse_prefill_sm90", problem=problem, dtypes="bf16",
                       device="NVIDIA H200", sm_count=132, driver="13.0", compiler="nvrtc 13.0",
                       source_hash="0123456789abcdef")
    return db.Best(key=key, variant={"block_n": 64}, symbol=symbol, time_ms=1.0, tflops=600.0, run_id="r",
                   updated=updated)


def test_candidates_rank_the_call_bucket_first_and_an_old_key_after_its_neighbours(tmp_path):
    database = db.TuningDB(tmp_path / "t.sqlite")
    # The old key is the newest: a tie on distance would have ranked it first.
    for problem, symbol, updated in (("d512/h64/k512/flat", "old", 30.0), ("d512/h64/k512/s8192/flat", "m1", 10.0),
                                     ("d512/h64/k512/s65536/flat", "m4", 20.0),
                                     ("d512/h64/k512/s131072/flat", "far", 25.0)):
        database.set_best(_best(problem, symbol, updated))

    def ranked(problem):
        key = _best(problem, "", 0).key
        return [b.symbol for b in db.candidates(key, FAMILY.problem_distance, database, include_shipped=False)]

    assert ranked("d512/h64/k512/s65536/flat") == ["m4", "far", "old", "m1"]   # M3, M4: M1's record comes last
    assert ranked("d512/h64/k512/s8192/flat") == ["m1", "old", "m4", "far"]
    assert ranked("d512/h64/k512/s16384/flat") == ["m1", "old", "m4", "far"]
    # A call keyed the old way (no pool) ranks the old record first, then the others alike.
    assert ranked("d512/h64/k512/flat")[0] == "old"


def test_the_shipped_sparse_record_keeps_its_old_key_and_serves_every_pool():
    shipped = [b for b in db.shipped_records() if b.key.family == "mla_sparse_prefill"]
    unpooled = [b for b in shipped if not sp_problem.ProblemKey.parse(b.key.problem).pool]
    assert [b.key.problem for b in unpooled] == ["d576/h128/k2048/flat/fp8_v32"]
    for s_kv in (8192, 32768, 131072):
        call = str(sp_problem.problem_key(FAMILY.parse_shape(f"sq=4096,h=128,topk=2048,skv={s_kv},kv=fp8_v32")))
        assert FAMILY.problem_distance(call, unpooled[0].key.problem) == sp_problem.POOL_UNKNOWN
    # The records tuned since the key holds the pool (the H200's d 512 classes) name theirs.
    assert all(b.key.device == "NVIDIA H200" for b in shipped if b not in unpooled)


@pytest.mark.parametrize("id, key", [
    ("S1", "d576/h128/k2048/s8192/flat"), ("S2", "d576/h128/k2048/s32768/flat"),
    ("S3", "d576/h128/k2048/s131072/flat"), ("S4", "d576/h64/k2048/s32768/flat"),
    ("S5", "d576/h16/k2048/s32768/flat"), ("S6", "d576/h128/k1024/s65536/flat"),
    ("M1", "d512/h64/k512/s8192/flat"), ("M2", "d512/h64/k512/s32768/flat"), ("M3", "d512/h64/k512/s65536/flat"),
    ("M4", "d512/h64/k512/s65536/flat"), ("M5", "d512/h128/k1024/s8192/flat"),
    ("M6", "d512/h128/k1024/s32768/flat"), ("M7", "d512/h128/k1024/s65536/flat"),
    ("M8", "d512/h128/k1024/s65536/flat"),
    # Two pools: the raw pool's 131072 rows and the compressed entries, both gathered in one softmax.
    ("V1", "d512/h64/k1024/s262144/flat"), ("V5", "d512/h64/k128/s131072/flat"),
])
def test_benchmark_shape_keys(id, key):
    assert FAMILY.problem_key(FAMILY.shapes()[id]) == key


def test_check_shapes_of_each_class():
    ids = lambda problem: [s.id for s in FAMILY.check_shapes(problem)]
    assert ids("d512/h64/k512/s8192/flat") == ["M1"]
    assert ids("d512/h64/k512/s32768/flat") == ["M2"]
    assert ids("d512/h64/k512/s65536/flat") == ["M3", "M4"]      # 49152 rows round up to M4's bucket
    assert ids("d512/h128/k1024/s8192/flat") == ["M5"]
    assert ids("d512/h128/k1024/s65536/flat") == ["M7", "M8"]
    assert ids("d512/h64/k512/flat") == ["M1", "M2", "M3", "M4"]  # an old key: every pool size
    assert ids("d576/h128/k2048/s8192/flat") == ["S1"]
    assert ids("d576/h128/k2048/s131072/flat") == ["S3"]
    assert ids("d576/h128/k2048/flat") == ["S1", "S2", "S3"]
    assert ids("d576/h64/k2048/s32768/flat") == ["S4"] and ids("d576/h16/k2048/s32768/flat") == ["S5"]
    assert ids("d576/h128/k1024/s65536/flat") == ["S6"] and ids("d576/h128/k1024/flat") == ["S6"]
    assert ids("d576/h128/k2048/s16384/flat") == []               # no named shape of that pool size
    assert FAMILY.problem_covers("d512/h64/k512/flat", FAMILY.shapes()["M3"])
    assert not FAMILY.problem_covers("d512/h64/k512/s8192/flat", FAMILY.shapes()["M3"])


class _Pool:
    def __init__(self, num_kv):
        self.num_kv = num_kv


def test_a_call_key_counts_the_rows_of_its_layout():
    """:func:`call.kv_layout` (what ``prepare`` maps the cache with) gives the Call its rows from
    the tensor's shape; the key buckets them (flat, paged, a format with scales after each page,
    two pools)."""
    torch = pytest.importorskip("torch")
    from mlagen import operands
    from mlagen.families.mla_sparse_prefill import call as sp_call

    bf16 = operands.get("bf16", 512)

    def key(kv, fmt=bf16, extra=None, heads=64, topk=512):
        _, num_kv, page_size, _, _ = sp_call.kv_layout(kv, fmt)
        c = type("C", (), {"d_qk": fmt.d_qk, "heads": heads, "topk": topk, "num_kv": num_kv, "page_size": page_size,
                           "kv_format": fmt.name, "extra": extra})()
        return str(sp_problem.problem_key(c))

    assert key(torch.zeros(8192, 512, dtype=torch.bfloat16)) == "d512/h64/k512/s8192/flat"
    assert key(torch.zeros(6000, 1, 512, dtype=torch.bfloat16)) == "d512/h64/k512/s8192/flat"
    assert key(torch.zeros(8193, 512, dtype=torch.bfloat16)) == "d512/h64/k512/s16384/flat"
    # A paged pool (pages apart by more than their rows): pages x page size.
    paged = torch.zeros(300, 65, 512, dtype=torch.bfloat16)[:, :64]
    assert key(paged) == "d512/h64/k512/s32768/paged"   # 300 x 64 = 19200 rows
    v4 = operands.get("fp8_v4", 512)
    pages = torch.zeros(3, v4.page_bytes(64), dtype=torch.uint8)   # each page's rows, then its scales
    assert key(pages, v4) == "d512/h64/k512/s256/paged/fp8_v4"     # 3 x 64 = 192 rows
    # Two pools: both pools' rows (one softmax gathers from both).
    assert key(torch.zeros(131072, 512, dtype=torch.bfloat16), extra=_Pool(32768)) == "d512/h64/k512/s262144/flat"
    assert key(torch.zeros(4000, 512, dtype=torch.bfloat16), extra=_Pool(96)) == "d512/h64/k512/s4096/flat"


def test_a_shape_and_its_call_share_the_key():
    """A tuned Shape's class is what dispatch computes for a call on that shape's inputs: a
    quantized cache and V4's raw pool are made as 64-token pages, and counted so."""
    for text, rows in (("sq=8,h=64,topk=64,skv=100,d=512,kv=fp8_v4", 128),
                       ("sq=8,h=64,topk=64,skv=8000", 8000),
                       ("sq=8,h=64,topk=64,skv=100,d=512,window=128,raw=1000", 100 + 1024)):
        shape = FAMILY.parse_shape(text)
        assert sp_problem.pool_rows(shape) == rows
        assert sp_problem.problem_key(shape).pool == sp_problem._pow2_ceil(rows)
