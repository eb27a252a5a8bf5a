import json

import pytest

from flytune_build.core import codec
from flytune_build.core.artifact import Artifact, load_dir
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER, DeviceIdentity
from flytune_build.core.errors import ArtifactError

H200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)


def make(**over):
    fields = dict(kernel="pkg.rmsnorm", key={"N": 4096, "x": "float16"}, device=H200,
                  config=Config({"BLOCK": 1024}, num_warps=8),
                  provenance={"triton": "3.6.0", "ranking": "measured",
                              "candidates": [{"config": Config({"BLOCK": 1024}).to_json(), "time_ms": 0.5}]})
    fields.update(over)
    return Artifact(**fields)


def doc(**over):
    d = make().to_json()
    d.update(over)
    return d


def test_round_trip_is_canonical_and_named_by_content_address(tmp_path):
    a = make()
    path = a.save(tmp_path)
    assert path.name == a.filename == f"pkg.rmsnorm-{a.address[:16]}.json"
    data = path.read_bytes()
    assert data == codec.canonical(json.loads(data)) + b"\n"
    b = Artifact.load(path, canonical=True)
    assert b == a and b.provenance == a.provenance


def test_provenance_never_enters_the_identity():
    a = make()
    b = make(provenance={"triton": "3.7.0", "created": "2027-01-01T00:00:00Z"})
    assert a.address == b.address and a.filename == b.filename


def test_identity_changes_with_key_device_and_kernel():
    base = make().address
    assert make(key={"N": 8192, "x": "float16"}).address != base
    assert make(device=INTERPRETER).address != base
    assert make(kernel="pkg.softmax").address != base


def test_config_is_not_identity_so_conflicts_are_detectable():
    assert make(config=Config({"BLOCK": 512})).address == make().address


def test_renamed_file_is_caught(tmp_path):
    a = make()
    (tmp_path / "pkg.rmsnorm-0000000000000000.json").write_bytes(a.to_bytes())
    with pytest.raises(ArtifactError) as e:
        Artifact.load(tmp_path / "pkg.rmsnorm-0000000000000000.json")
    assert e.value.field == "<file name>" and "content address" in e.value.rule


def test_hand_edited_identity_is_caught(tmp_path):
    a = make()
    d = a.to_json()
    d["key"]["N"] = 2048
    (tmp_path / a.filename).write_bytes(codec.canonical(d) + b"\n")
    with pytest.raises(ArtifactError, match="content address"):
        Artifact.load(tmp_path / a.filename)


def test_non_canonical_bytes_are_caught_only_when_asked(tmp_path):
    a = make()
    (tmp_path / a.filename).write_text(json.dumps(a.to_json(), indent=2))
    assert Artifact.load(tmp_path / a.filename) == a
    with pytest.raises(ArtifactError, match="canonical form"):
        Artifact.load(tmp_path / a.filename, canonical=True)


def test_load_dir_sorted(tmp_path):
    for n in (1024, 2048, 4096):
        make(key={"N": n, "x": "float16"}).save(tmp_path)
    names = [a.filename for a in load_dir(tmp_path)]
    assert names == sorted(names) and len(names) == 3


# -- the malformed corpus: each case names the exact field and the rule -----------------------------
def raw(text):
    return text.encode() if isinstance(text, str) else text


GOOD = make().to_json()


def with_(path, value):
    d = json.loads(json.dumps(GOOD))
    cur = d
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur[p]
    if value is _DELETE:
        del cur[parts[-1]]
    else:
        cur[parts[-1]] = value
    return json.dumps(d).encode()


_DELETE = object()

CORPUS = [
    # (id, bytes, field, rule fragment)
    ("truncated", json.dumps(GOOD)[:40].encode(), None, "not valid JSON"),
    ("non-utf8", b'{"format": 1, "kernel": "\xff\xfe"}', None, "not valid UTF-8"),
    ("duplicate-key", b'{"format": 1, "format": 1}', "format", "duplicate JSON key"),
    ("nan", json.dumps(GOOD).replace('"time_ms": 0.5', '"time_ms": NaN').encode(), None, "non-finite"),
    ("infinity", json.dumps(GOOD).replace('"time_ms": 0.5', '"time_ms": Infinity').encode(), None, "non-finite"),
    ("overflow-float", json.dumps(GOOD).replace('"time_ms": 0.5', '"time_ms": 1e999').encode(), None, "non-finite"),
    ("huge-int", with_("key.N", 0).replace(b'"N": 0', b'"N": 1' + b"0" * 5000), None, "not valid JSON"),
    ("deep-nesting", b"[" * 100000 + b"]" * 100000, None, "not valid JSON"),
    ("not-object", b"[1, 2]", "<document>", "must be an object"),
    ("missing-format", with_("format", _DELETE), "format", "is required"),
    ("unknown-version", with_("format", 2), "format", "unknown format version 2"),
    ("format-string", with_("format", "1"), "format", "must be an integer"),
    ("unknown-top-field", with_("extra", 1), "extra", "not a known field"),
    ("kernel-not-dotted-name", with_("kernel", "pkg/rmsnorm"), "kernel", "dotted Python name"),
    ("kernel-wrong-type", with_("kernel", 3), "kernel", "must be a string"),
    ("key-not-object", with_("key", ["N"]), "key", "must be an object"),
    ("key-value-object", with_("key.N", {"a": 1}), "key.N", "JSON scalar"),
    ("key-huge-int", with_("key.N", 2 ** 70), "key.N", "64 bits"),
    ("key-odd-axis", with_("key", {"N-1": 3}), "key", "identifier"),
    ("device-missing-units", with_("device.units", _DELETE), "device.units", "is required"),
    ("device-bad-backend", with_("device.backend", "metal"), "device.backend", "must be one of"),
    ("device-bad-arch", with_("device.arch", "hopper"), "device.arch", "arch such as"),
    ("device-arch-backend-mismatch", with_("device.arch", "gfx942"), "device.arch", "not a cuda arch"),
    ("device-units-negative", with_("device.units", -1), "device.units", ">= 0"),
    ("device-units-bool", with_("device.units", True), "device.units", "must be an integer"),
    ("device-unknown-field", with_("device.vendor", "nv"), "device.vendor", "not a known field"),
    ("config-num-warps-string", with_("config.num_warps", "8"), "config.num_warps", "must be an integer"),
    ("config-num-warps-float", with_("config.num_warps", 8.0), "config.num_warps", "must be an integer"),
    ("config-num-stages-negative", with_("config.num_stages", -1), "config.num_stages", ">= 0"),
    ("config-unknown-option", with_("config.num_threads", 4), "config.num_threads", "not a known field"),
    ("config-missing-kwargs", with_("config.kwargs", _DELETE), "config.kwargs", "is required"),
    ("config-kwarg-list", with_("config.kwargs.BLOCK", [1024]), "config.kwargs.BLOCK", "JSON scalar"),
    ("config-kwarg-shadows-option", with_("config.kwargs.num_warps", 4), "config.kwargs.num_warps",
     "compiler option"),
    ("config-maxnreg-string", with_("config.maxnreg", "128"), "config.maxnreg", "must be an integer"),
    ("provenance-unknown-field", with_("provenance.note", "x"), "provenance.note", "not a known field"),
    ("provenance-bad-ranking", with_("provenance.ranking", "guess"), "provenance.ranking", "must be one of"),
    ("provenance-candidate-time-string", with_("provenance.candidates", [{"config": GOOD["config"], "time_ms": "1"}]),
     "provenance.candidates[0].time_ms", "must be a number"),
    ("provenance-space-hash", with_("provenance.space_hash", "abc"), "provenance.space_hash", "sha256"),
]


@pytest.mark.parametrize("case,data,field,rule", CORPUS, ids=[c[0] for c in CORPUS])
def test_malformed_artifact_names_field_and_rule(case, data, field, rule):
    with pytest.raises(ArtifactError) as e:
        Artifact.from_bytes(raw(data), file=f"{case}.json", check_name=False)
    err = e.value
    assert err.file == f"{case}.json"
    assert rule in err.rule, err
    if field is not None:
        assert err.field == field, err
    assert f"{case}.json" in str(err)


def test_oversized_file_is_refused(tmp_path):
    p = tmp_path / "big.json"
    p.write_bytes(b" " * (codec.MAX_DOCUMENT_BYTES + 10))
    with pytest.raises(ArtifactError, match="cap"):
        Artifact.load(p)


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 25


def _tuned(n, times=(0.0123, 1e-05, None, 2, 1.5e+20)):
    cands = [{"config": Config({"BLOCK": b, "MODE": "fast", "EVEN": True}, num_warps=w, maxnreg=128 if w == 8 else None)
              .to_json(), "time_ms": t} for b, w, t in zip((16, 32, 64, 128, 256), (1, 2, 4, 8, 4), times)]
    return Artifact("fixpkg.add", {"x": "float32", "n": n}, INTERPRETER, Config({"BLOCK": 32}),
                    {"triton": "3.6.0", "ranking": "measured", "created": "2026-12-02T00:00:00Z", "candidates": cands})


def test_provenance_is_kept_as_the_bytes_read(tmp_path):
    import pickle

    from flytune_build.core.artifact import Provenance
    from flytune_build.pipeline import reader

    a = _tuned(100)
    data = a.to_bytes()
    b = reader.read(data, file=tmp_path / a.filename)
    assert isinstance(b.provenance, Provenance)
    assert reader.read_tuned(data) is not None  # the form `flytune tune` writes takes the fast path
    assert b.provenance.raw == codec.canonical(dict(a.provenance))
    assert b.provenance["triton"] == "3.6.0" and b.provenance.get("cuda") is None
    assert b.provenance == a.provenance and dict(b.provenance) == dict(a.provenance)
    assert b.to_bytes() == data and b == a
    c = pickle.loads(pickle.dumps(b))
    assert c.provenance.raw == b.provenance.raw and c.provenance == a.provenance and c.address == a.address
    # the strict reading keeps the plain dict
    assert type(Artifact.from_bytes(data, file=tmp_path / a.filename).provenance) is dict
    assert type(Artifact.from_bytes(data, file=tmp_path / a.filename, canonical=True).provenance) is dict


def test_provenance_file_joined_from_bytes_equals_the_encoded_one(tmp_path):
    from flytune_build.core import bundle
    from flytune_build.pipeline import reader

    arts = [_tuned(n) for n in (1, 2, 3)] + [_tuned(4, times=(None,))]
    read = [reader.read(a.to_bytes(), file=tmp_path / a.filename) for a in arts[:2]]
    mixed = read + arts[2:] + [Artifact("fixpkg.add", {"x": "f", "n": 9}, INTERPRETER, Config({}))]
    expected = codec.canonical({"format": 1, "kernel": "fixpkg.add",
                                "provenance": {a.address: dict(a.provenance) for a in arts}}) + b"\n"
    assert bundle.provenance_bytes("fixpkg.add", mixed) == expected


def test_every_sample_artifact_takes_the_fast_path():
    from pathlib import Path

    from flytune_build.pipeline.reader import read_tuned

    files = sorted(Path(__file__).resolve().parent.parent.glob("sample_pkg/artifacts/*/*.json"))
    assert len(files) >= 20
    for f in files:  # real H200 timings and interpreter ones
        assert read_tuned(f.read_bytes()) is not None, f


def test_integer_pattern_matches_exactly_its_range():
    import re

    from flytune_build.core.options import integer_pattern

    for lo, hi in [(0, 0), (0, 9), (0, 16), (1, 16), (1, 64), (1, 1024), (7, 7), (9, 10), (10, 99), (99, 1000),
                   (123, 4567), (1, 100_000)]:
        r = re.compile(f"(?:{integer_pattern(lo, hi)})")
        for n in range(min(hi, 5000) + 20):
            assert bool(r.fullmatch(str(n))) == (lo <= n <= hi), (lo, hi, n)
        assert not any(r.fullmatch(s) for s in ("", "-1", "00", "01", "007", " 1", "1.0"))


@pytest.mark.parametrize("name", ["num_warps", "num_stages", "num_ctas", "maxnreg"])
def test_every_reading_of_a_config_takes_its_range_from_the_option_table(tmp_path, name):
    """Config(), the artifact check, the quick candidate check and the build's fast reader agree
    at each edge of each option's range."""
    from flytune_build.core.options import BY_NAME
    from flytune_build.pipeline import reader

    option = BY_NAME[name]
    edges = {option.minimum: True, option.maximum: True, option.minimum - 1: False, option.maximum + 1: False,
             None: option.nullable}
    for value, ok in edges.items():
        cand = dict(Config({"BLOCK": 16}).to_json(), **{name: value})
        art = _tuned(1)
        data = codec.canonical(dict(art.to_json(), provenance=dict(
            art.provenance, candidates=[{"config": cand, "time_ms": 0.5}]))) + b"\n"
        assert (reader.read_tuned(data) is not None) == ok, (name, value)
        outcomes = [_accepts(name, Config, {"BLOCK": 16}, **{name: value}),
                    _accepts(name, Config.from_json, cand, codec.Fields("f", ArtifactError)),
                    _accepts(name, reader.read, data, check_name=False),
                    _accepts(name, Artifact.from_bytes, data, canonical=True)]
        assert outcomes == [ok] * 4, (name, value, outcomes)


def _accepts(name, read, *args, **kwargs) -> bool:
    try:
        read(*args, **kwargs)
        return True
    except (ArtifactError, ValueError) as e:
        assert e.field.endswith(name), e
        return False
