"""mlagen.spec: the packaged specs load, and every malformed spec is rejected with a message that
names the file, the key path and what is allowed."""

from __future__ import annotations

import copy
import pickle
import re

import pytest
import yaml

from mlagen import arch, paths, spec
from mlagen.errors import SpecError

SPEC80 = paths.specs_dir() / "mla_prefill_sm80.yaml"
SPEC90 = paths.specs_dir() / "mla_prefill_sm90.yaml"


def data80():
    return yaml.safe_load(SPEC80.read_text())


def data90():
    return yaml.safe_load(SPEC90.read_text())


def fails(data, path, key, *fragments):
    """Validate ``data``; the SpecError must start with '<path>: <key>: ' and contain ``fragments``."""
    with pytest.raises(SpecError) as info:
        spec.from_dict(data, path)
    err = info.value
    text = str(err)
    assert text.startswith(f"{path}: {key}: "), text
    assert err.path == str(path) and err.key == key
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    return text


# --- the packaged specs ---------------------------------------------------------------------


def test_packaged_specs_are_available():
    assert [p.name for p in spec.available()] == ["mla_prefill_gfx942.yaml", "mla_prefill_gfx942_fp8.yaml",
                                                  "mla_prefill_gfx950.yaml",
                                                  "mla_prefill_gfx950_fp8.yaml", "mla_prefill_sm80.yaml",
                                                  "mla_prefill_sm90.yaml", "mla_prefill_sm90_fp8.yaml",
                                                  "mla_sparse_prefill_sm80.yaml",
                                                  "mla_sparse_prefill_sm90.yaml",
                                                  "mla_sparse_prefill_sm90_h16.yaml"]


def test_sm80_spec_loads():
    s = spec.load("mla_prefill_sm80")
    assert (s.name, s.family, s.abi, s.priority, s.template) == (
        "mla_prefill_sm80", "mla_prefill", "simt", 10, "mla_prefill_sm80.cu.j2")
    assert s.targets == ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a")
    assert dict(s.problem) == {"d_nope": 128, "d_rope": 64, "d_v": 128, "dtype": "bf16"}
    assert s.specialize == (("mask", ("causal", "none")),)
    assert s.axes == ("mask", "block_m", "block_n", "warps", "stages", "swizzle", "q_in_regs")
    assert s.tunable("block_n").values == (32, 64, 96, 128)
    assert s.tunable("q_in_regs").default is True
    assert [k for k, _ in s.resources] == ["threads", "smem_bytes", "registers"]
    assert len(s.text_hash) == 16
    assert s.schedule is None
    with pytest.raises(KeyError):
        s.tunable("nope")


def test_sm90_spec_loads():
    s = spec.load("mla_prefill_sm90")
    assert (s.name, s.abi, s.targets) == ("mla_prefill_sm90", "tma", ("sm_90a",))
    assert s.priority > spec.load("mla_prefill_sm80").priority
    assert set(s.schedule) == {"roles", "pipelines", "consumer_order", "intra_warpgroup_overlap", "scheduler",
                               "cluster", "epilogue", "swizzle"}


def test_every_target_of_the_packaged_specs_is_known():
    for p in spec.available():
        for t in spec.load(p).targets:
            assert t in arch.TARGETS


def test_load_by_name_and_by_path_agree():
    by_name, by_path = spec.load("mla_prefill_sm80"), spec.load(SPEC80)
    assert by_name == by_path and hash(by_name) == hash(by_path)
    assert spec.load("mla_prefill_sm80") == spec.load("mla_prefill_sm80")  # equality is by content
    assert by_name != spec.load("mla_prefill_sm90")


def test_text_hash_follows_the_text(tmp_path):
    text = SPEC80.read_text()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = tmp_path / "a" / "mla_prefill_sm80.yaml"
    a.write_text(text)
    b = tmp_path / "b" / "mla_prefill_sm80.yaml"
    b.write_text(text + "# a comment changes the hash\n")
    assert spec.load(a).text_hash == spec.load(SPEC80).text_hash
    assert spec.load(b).text_hash != spec.load(a).text_hash


def test_unknown_spec_name_lists_the_known_ones():
    with pytest.raises(SpecError, match="no spec of that name; known: mla_prefill_gfx942, mla_prefill_gfx942_fp8, mla_prefill_gfx950, "
                       "mla_prefill_gfx950_fp8, "
                       "mla_prefill_sm80, mla_prefill_sm90"):
        spec.load("mla_prefill_sm70")


def test_missing_spec_file(tmp_path):
    with pytest.raises(SpecError, match="no such spec file"):
        spec.load(tmp_path / "missing.yaml")


def test_spec_error_pickles():
    err = SpecError("a.yaml", "tune.block_n", "96 is not one of [32, 64]")
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.path, back.key, back.message) == (
        SpecError, str(err), "a.yaml", "tune.block_n", "96 is not one of [32, 64]")


def test_template_beside_the_spec(tmp_path):
    (tmp_path / "mine.cu.j2").write_text((paths.templates_dir() / "mla_prefill_sm80.cu.j2").read_text())
    d = data80()
    d["template"] = "mine.cu.j2"
    d["name"] = "mine"
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(d))
    s = spec.load(p)
    assert spec.template_path(s.template, s.path) == tmp_path / "mine.cu.j2"
    assert spec.template_path("mla_prefill_sm80.cu.j2", p) == paths.templates_dir() / "mla_prefill_sm80.cu.j2"


# --- YAML-level errors ----------------------------------------------------------------------


def test_duplicate_top_level_key(tmp_path):
    p = tmp_path / "dup.yaml"
    text = SPEC80.read_text()
    p.write_text(text + "name: again\n")
    line = len(text.splitlines()) + 1
    with pytest.raises(SpecError) as info:
        spec.load(p)
    assert str(info.value) == f"{p}: line {line}: invalid YAML: duplicate key 'name'"


def test_duplicate_nested_key(tmp_path):
    p = tmp_path / "dup.yaml"
    text = SPEC80.read_text().replace(
        "  block_m: {values: [64, 128], default: 128, abbr: m, doc: query rows per CTA}\n",
        "  block_m: {values: [64, 128], default: 128, abbr: m, doc: query rows per CTA}\n"
        "  block_m: {values: [64], default: 64, abbr: mm}\n")
    assert text != SPEC80.read_text()
    p.write_text(text)
    with pytest.raises(SpecError, match=r"dup.yaml: line \d+: invalid YAML: duplicate key 'block_m'"):
        spec.load(p)


def test_duplicate_key_in_a_flow_mapping(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text(SPEC80.read_text().replace("default: 64, abbr: n,", "default: 64, abbr: n, default: 32,"))
    with pytest.raises(SpecError, match="duplicate key 'default'"):
        spec.load(p)


@pytest.mark.parametrize("text", ["name: [unclosed\n", "a: b: c\n", "tune:\n  - x\n y: 1\n"])
def test_invalid_yaml(tmp_path, text):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(SpecError, match=r"bad.yaml: line \d+: invalid YAML: "):
        spec.load(p)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("")
    with pytest.raises(SpecError, match=r"empty.yaml: \(top level\): expected a mapping, got NoneType"):
        spec.load(p)


# --- structural errors of the sm80 spec -----------------------------------------------------


def mutate(fn, base=data80):
    d = base()
    fn(d)
    return d


def _set(path, value):
    def fn(d):
        *parents, last = path
        for p in parents:
            d = d[p]
        d[last] = value
    return fn


def _del(path):
    def fn(d):
        *parents, last = path
        for p in parents:
            d = d[p]
        del d[last]
    return fn


TOP_KEYS = "name, family, abi, priority, description, template, targets, problem, derived, specialize, tune, " \
           "constraints, resources, schedule"

CASES_80 = [
    # (id, mutation, key path, fragments of the message)
    ("unknown top-level key", _set(["bogus"], 1), "bogus", [f"unknown key; allowed: {TOP_KEYS}"]),
    ("missing name", _del(["name"]), "name", ["required key is missing"]),
    ("missing resources", _del(["resources"]), "resources", ["required key is missing"]),
    ("bad name", _set(["name"], "MLA-prefill"), "name", ["'MLA-prefill' must be a lowercase identifier"]),
    ("bad priority", _set(["priority"], "high"), "priority", ["expected an integer, got 'high'"]),
    ("bool priority", _set(["priority"], True), "priority", ["expected an integer, got True"]),
    ("unknown family", _set(["family"], "gemm"), "family", ["'gemm' is not one of ['mla_prefill', 'mla_sparse_prefill']"]),
    ("bad abi", _set(["abi"], "wgmma"), "abi", ["'wgmma' is not one of ['simt', 'simt_fp8', 'tma', 'tma_fp8']"]),
    ("abi not an identifier", _set(["abi"], "S I M T"), "abi", ["must be a lowercase identifier"]),
    ("missing template", _set(["template"], "nope.cu.j2"), "template",
     ["'nope.cu.j2' is not a file under templates/"]),
    ("template is a directory", _set(["template"], "include"), "template", ["'include' is not a file"]),
    ("empty template", _set(["template"], ""), "template", ["expected a non-empty string"]),
    ("bad target", _set(["targets"], ["sm_80", "sm_75"]), "targets[1]",
     ["'sm_75' is not one of ['sm_80', 'sm_86', 'sm_89', 'sm_90a', 'sm_100a', 'gfx942', 'gfx950']"]),
    ("unhashable target", _set(["targets"], [["sm_80"]]), "targets[0]", ["is not one of"]),
    ("targets not a list", _set(["targets"], "sm_80"), "targets", ["expected a list, got str"]),
    ("no targets", _set(["targets"], []), "targets", ["must not be empty"]),
    ("family mismatch d_v", _set(["problem", "d_v"], 256), "problem.d_v",
     ["256: this family implements d_v = 128"]),
    ("family mismatch dtype", _set(["problem", "dtype"], "fp16"), "problem.dtype",
     ["'fp16': the input types are bf16, fp8_e4m3, fp8_e4m3fnuz"]),
    ("family mismatch missing dtype", _del(["problem", "dtype"]), "problem.dtype",
     ["None: the input types are bf16, fp8_e4m3, fp8_e4m3fnuz"]),
    ("problem not scalar", _set(["problem", "d_v"], [128]), "problem.d_v", ["expected a scalar, got list"]),
    ("derived redefines", _set(["derived", "d_v"], "1"), "derived.d_v", ["name already defined"]),
    ("derived unknown name", _set(["derived", "extra"], "bogus * 2"), "derived.extra",
     ["unknown name(s) ['bogus']"]),
    ("derived not an expression", _set(["derived", "extra"], "x.y"), "derived.extra",
     ["Attribute is not allowed"]),
    ("unknown specialisation", _set(["specialize", "window"], [0, 128]), "specialize",
     ["window: this family specialises on mask (values from ['causal', 'none', 'window', 'chunked'])"]),
    ("unknown mask", _set(["specialize", "mask"], ["causal", "sliding"]), "specialize",
     ["mask: this family specialises on mask"]),
    ("duplicate mask values", _set(["specialize", "mask"], ["causal", "causal"]), "specialize.mask",
     ["values must be unique"]),
    ("unknown key in tune.X", _set(["tune", "block_n", "step"], 16), "tune.block_n.step",
     ["unknown key; allowed: values, default, abbr, doc"]),
    ("tune.X missing default", _del(["tune", "block_n", "default"]), "tune.block_n.default",
     ["required key is missing"]),
    ("default not in values", _set(["tune", "block_n", "default"], 48), "tune.block_n.default",
     ["48 is not one of [32, 64, 96, 128]"]),
    ("default of another type", _set(["tune", "q_in_regs", "default"], 1), "tune.q_in_regs.default",
     ["1 is not one of [True, False]"]),
    ("empty values", _set(["tune", "block_n", "values"], []), "tune.block_n.values", ["must not be empty"]),
    ("duplicate values", _set(["tune", "block_n", "values"], [32, 64, 64]), "tune.block_n.values",
     ["values must be unique"]),
    ("float value", _set(["tune", "block_n", "values"], [32, 64.5]), "tune.block_n.values[1]",
     ["expected an int, string or bool, got 64.5"]),
    ("tunable shadows a problem name", _set(["tune", "d_v"], {"values": [1], "default": 1}), "tune.d_v",
     ["name already defined"]),
    ("duplicate abbr", _set(["tune", "warps", "abbr"], "m"), "tune.warps.abbr",
     ["'m' is already used by tune.block_m"]),
    ("bad abbr", _set(["tune", "warps", "abbr"], "W_2"), "tune.warps.abbr", ["must be lowercase letters and digits"]),
    ("constraint with unknown name", _set(["constraints"], [{"require": "bogus > 1", "message": "m"}]),
     "constraints[0].require", ["unknown name(s) ['bogus']; defined: [", "'block_m'"]),
    ("constraint not an expression", _set(["constraints"], [{"require": "__import__('os')", "message": "m"}]),
     "constraints[0].require", ["only these functions may be called"]),
    ("constraint without message", _set(["constraints"], [{"require": "warps > 1"}]),
     "constraints[0].message", ["required key is missing"]),
    ("constraint with extra key", _set(["constraints"], [{"require": "warps > 1", "message": "m", "why": "x"}]),
     "constraints[0].why", ["unknown key; allowed: require, message"]),
    ("resources unknown name", _set(["resources", "threads"], "lanes * 32"), "resources.threads",
     ["unknown name(s) ['lanes']"]),
    ("resources missing key", _del(["resources", "registers"]), "resources.registers", ["required key is missing"]),
    ("resources extra key", _set(["resources", "tmem"], 0), "resources.tmem",
     ["unknown key; allowed: threads, smem_bytes, registers"]),
]


@pytest.mark.parametrize("mutation, key, fragments", [c[1:] for c in CASES_80], ids=[c[0] for c in CASES_80])
def test_sm80_spec_errors(mutation, key, fragments):
    fails(mutate(mutation), SPEC80, key, *fragments)


def test_top_level_must_be_a_mapping():
    fails([1, 2], SPEC80, "(top level)", "expected a mapping, got list")


def test_error_names_the_file_it_was_given(tmp_path):
    d = data80()
    d["tune"]["block_n"]["default"] = 96
    d["tune"]["block_n"]["values"] = [32, 64]
    p = tmp_path / "my_spec.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(SpecError) as info:
        spec.load(p)
    assert str(info.value) == f"{p}: tune.block_n.default: 96 is not one of [32, 64]"


def test_valid_mutations_still_load():
    # The negative cases above must fail for the reason they name, not because the base is broken.
    s = spec.from_dict(data80(), SPEC80)
    assert s.name == "mla_prefill_sm80"
    d = data80()
    d["tune"]["block_n"]["values"] = [32, 64, 96, 128, 160]
    d["constraints"].append({"require": "block_n <= 128 or stages == 2", "message": "too big"})
    s = spec.from_dict(d, SPEC80)
    assert s.tunable("block_n").values[-1] == 160
    assert s.constraints[-1].message == "too big"
    assert s.text_hash == ""  # no text given


# --- the sm90 spec's schedule section -------------------------------------------------------

SCHED_KEYS = "roles, pipelines, consumer_order, intra_warpgroup_overlap, scheduler, cluster, epilogue, swizzle"

CASES_90 = [
    ("no schedule", _del(["schedule"]), "schedule", ["a TMA kernel needs a schedule mapping"]),
    ("schedule not a mapping", _set(["schedule"], ["roles"]), "schedule", ["needs a schedule mapping"]),
    ("missing schedule key", _del(["schedule", "cluster"]), "schedule.cluster", ["required key is missing"]),
    ("unknown schedule key", _set(["schedule", "multicast"], True), "schedule.multicast",
     [f"unknown key; allowed: {SCHED_KEYS}"]),
    ("wrong role names", _set(["schedule", "roles"], {
        "producer": {"warpgroups": 1, "registers": "producer_regs", "tasks": ["load_q", "load_k", "load_v"]},
        "math": {"warpgroups": "consumers", "registers": "consumer_regs",
                 "tasks": ["mma_qk", "softmax", "mma_pv", "store_o"]}}),
     "schedule.roles", ["this kernel has the roles ['producer', 'consumer'] in that order, got ['producer', 'math']"]),
    ("roles out of order", lambda d: d["schedule"].update(
        roles={"consumer": d["schedule"]["roles"]["consumer"], "producer": d["schedule"]["roles"]["producer"]}),
     "schedule.roles", ["in that order, got ['consumer', 'producer']"]),
    ("role tasks not matching", _set(["schedule", "roles", "consumer", "tasks"], ["mma_qk", "softmax", "mma_pv"]),
     "schedule.roles.consumer.tasks", ["the consumer role of this kernel does ['mma_qk', 'softmax', 'mma_pv', 'store_o']"]),
    ("producer does consumer work", _set(["schedule", "roles", "producer", "tasks"], ["load_q", "load_k", "softmax"]),
     "schedule.roles.producer.tasks", ["the producer role of this kernel does ['load_q', 'load_k', 'load_v']"]),
    ("role missing key", _del(["schedule", "roles", "consumer", "registers"]), "schedule.roles.consumer",
     ["expected keys ['warpgroups', 'registers', 'tasks']"]),
    ("role registers unknown name", _set(["schedule", "roles", "producer", "registers"], "loader_regs"),
     "schedule.roles.producer.registers", ["unknown name(s) ['loader_regs']"]),
    ("pipeline naming an unknown role", _set(["schedule", "pipelines", "kv", "producer"], "loader"),
     "schedule.pipelines.kv.producer", ["'loader' is not a role (producer, consumer)"]),
    ("pipeline missing key", _del(["schedule", "pipelines", "q", "stages"]), "schedule.pipelines.q",
     ["expected keys ['stages', 'producer', 'consumer']"]),
    ("extra pipeline", _set(["schedule", "pipelines", "o"], {"stages": 1, "producer": "consumer",
                                                             "consumer": "producer"}),
     "schedule.pipelines", ["this kernel has the pipelines q and kv"]),
    ("pipeline stages unknown name", _set(["schedule", "pipelines", "kv", "stages"], "depth"),
     "schedule.pipelines.kv.stages", ["unknown name(s) ['depth']"]),
    ("swizzle missing an operand", _set(["schedule", "swizzle"], {"q": 128, "k": 128}), "schedule.swizzle",
     ["expected one swizzle per TMA operand: ['q', 'k', 'v']"]),
    ("scheduler not an expression", _set(["schedule", "scheduler"], "a[0]"), "schedule.scheduler",
     ["Subscript is not allowed"]),
]


@pytest.mark.parametrize("mutation, key, fragments", [c[1:] for c in CASES_90], ids=[c[0] for c in CASES_90])
def test_sm90_schedule_errors(mutation, key, fragments):
    fails(mutate(mutation, data90), SPEC90, key, *fragments)


def test_sm90_base_is_valid():
    s = spec.from_dict(data90(), SPEC90)
    assert s.schedule == data90()["schedule"]


def test_simt_spec_needs_no_schedule():
    d = data80()
    assert "schedule" not in d
    spec.from_dict(d, SPEC80)
    d = copy.deepcopy(data90())
    d["abi"] = "simt"
    del d["schedule"]
    spec.from_dict(d, SPEC90)  # the schedule is the TMA launcher's; a simt spec has none


def test_messages_say_what_is_allowed():
    # Every message of the cases above that rejects a value names the allowed ones.
    text = fails(mutate(_set(["tune", "swizzle", "default"], "none")), SPEC80, "tune.swizzle.default")
    assert re.search(r"'none' is not one of \['pad', 'xor'\]", text)


@pytest.mark.parametrize("bomb", ["(10**64)**64 > 0", "'x' * 1000 * 1000 == 'x'", "block_m // (block_m - block_m) > 0"])
def test_an_expression_bomb_names_the_file_and_key(tmp_path, bomb):
    """Issue 38 point 7: an expression that cannot be evaluated fails the load, naming the file
    and the key, not every variant later with a reason that names neither."""
    text = (paths.specs_dir() / "mla_prefill_sm80.yaml").read_text()
    text = re.sub(r"^constraints:\n", f"constraints:\n  - require: \"{bomb}\"\n    message: boom\n", text, count=1,
                  flags=re.MULTILINE)
    path = tmp_path / "mla_prefill_sm80.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        spec.load(path)
    assert str(info.value).startswith(f"{path}: constraints[0].require: "), str(info.value)
