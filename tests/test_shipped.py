"""The tuning records shipped with the package (mlagen/tuned/*.json) stay usable.

A record is used only while its source hash matches the kernel sources, so a change to a spec,
template or header silently retires it; this test makes that visible (re-tune on the device and
re-export with `mlagen db export --best-only`). It also compiles every shipped winner and checks
ptxas reports no spills.
"""

from __future__ import annotations

import pytest

from mlagen import arch, db, resources
from mlagen import spec as spec_mod
from mlagen import variant as variant_mod
from mlagen.build import build_many

RECORDS = db.shipped_records()


def test_there_are_shipped_records():
    assert RECORDS, "mlagen/tuned/ ships no records"


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{r.key.spec}:{r.key.problem}")
def test_record_is_current_and_compiles_without_spills(record):
    spec = spec_mod.load(record.key.spec)
    assert record.key.source_hash == db.source_hash(spec), (
        f"{record.key.spec} changed since {record.origin} was tuned: re-run `mlagen tune` on an H100 and "
        "`mlagen db export --best-only mlagen/tuned/h100.json`")
    from mlagen import families

    family = families.get(spec.family)
    v = variant_mod.make(spec, {**record.variant, **family.problem_specialization(record.key.problem)})
    assert v.symbol == record.symbol
    target = arch.target("sm_90a")
    assert resources.check(v, target).ok
    (built,) = build_many([v], [target.name], jobs=1)
    assert built.ok, built.reasons
    assert not built.report.spills and built.report.stack_bytes == 0
