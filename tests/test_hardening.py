"""Hostile inputs, concurrency and corruption: typed errors only, nothing lost, nothing trusted blindly."""
import ast
import json
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from buildkit import artifact, install_fake_dist, make_project
from conftest import ROOT, python_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flytune_build import FlytuneWarning, pipeline
from flytune_build.core import project
from flytune_build.core.artifact import Artifact
from flytune_build.core.bundle import Manifest
from flytune_build.core.config import Config
from flytune_build.core.errors import FlytuneError
from flytune_build.runtime.serving import autotuner


# -- the manifest corpus --------------------------------------------------------------------------------
def good_manifest(tmp_path):
    import io
    proj = make_project(tmp_path / "p")
    state = pipeline.run(proj, out=io.StringIO())
    return json.loads(state.files["fixpkg/_flytune/manifest.json"]), state


def mutate(doc, path, value):
    d = json.loads(json.dumps(doc))
    cur = d
    parts = path.split("/")
    for p in parts[:-1]:
        cur = cur[p]
    if value is DEL:
        del cur[parts[-1]]
    else:
        cur[parts[-1]] = value
    return json.dumps(d).encode()


DEL = object()
MANIFEST_CASES = [
    ("truncated", lambda d: json.dumps(d).encode()[:20], None, "not valid JSON"),
    ("not-utf8", lambda d: b'{"format": "\xc3"}', None, "UTF-8"),
    ("duplicate", lambda d: b'{"format": 1, "format": 1}', "format", "duplicate JSON key"),
    ("infinity", lambda d: json.dumps(d).replace('"format": 1', '"format": Infinity').encode(), None, "non-finite"),
    ("version", lambda d: mutate(d, "format", 2), "format", "unknown manifest format 2"),
    ("version-string", lambda d: mutate(d, "format", "1"), "format", "unknown manifest format"),
    ("unknown-field", lambda d: mutate(d, "signed_by", "me"), "signed_by", "not a known field"),
    ("package-traversal", lambda d: mutate(d, "package", "../etc"), "package", "dotted package name"),
    ("shard-traversal", lambda d: mutate(d, "kernels/fixpkg.add/shard", "../../evil.json"),
     "kernels.fixpkg.add.shard", "plain file name"),
    ("shard-absolute", lambda d: mutate(d, "kernels/fixpkg.add/shard", "/etc/passwd"), "kernels.fixpkg.add.shard",
     "plain file name"),
    ("sha-short", lambda d: mutate(d, "kernels/fixpkg.add/sha256", "abc"), "kernels.fixpkg.add.sha256", "sha256"),
    ("count-negative", lambda d: mutate(d, "kernels/fixpkg.add/artifacts", -1), "kernels.fixpkg.add.artifacts",
     ">= 0"),
    ("kernel-odd-name", lambda d: mutate(d, "kernels", {"a b": d["kernels"]["fixpkg.add"]}), "kernels.a b",
     "dotted Python name"),
    ("targets-wrong", lambda d: mutate(d, "targets", [{"arch": "sm_90", "accept": ["always"]}]), "targets[0].accept[0]",
     "must be one of"),
    ("coverage-wrong", lambda d: mutate(d, "coverage", "most"), "coverage", "must be \"all\""),
    ("toolchain-missing", lambda d: mutate(d, "toolchain", DEL), "toolchain", "is required"),
    ("deep-nesting", lambda d: b'{"format":' + b"[" * 50000 + b"]" * 50000 + b"}", None, "not valid JSON"),
    ("huge-number", lambda d: json.dumps(d).replace('"format": 1', '"format": 1' + "0" * 6000).encode(), None,
     "not valid JSON"),
]


@pytest.mark.parametrize("case,make,field,rule", MANIFEST_CASES, ids=[c[0] for c in MANIFEST_CASES])
def test_malformed_manifest(tmp_path, case, make, field, rule):
    doc, _ = good_manifest(tmp_path)
    with pytest.raises(FlytuneError) as e:
        Manifest.from_bytes(make(doc), file="manifest.json")
    assert e.value.file == "manifest.json" and rule in e.value.rule, e.value
    if field:
        assert e.value.field == field, e.value


def test_corpus_totals_at_least_fifty():
    from test_artifact import CORPUS
    from test_build_malformed import CASES
    from test_project import BAD
    assert len(CORPUS) + len(CASES) + len(BAD) + len(MANIFEST_CASES) >= 50


def test_malformed_wheels_exit_1_without_traceback(tmp_path):
    bad = tmp_path / "x-1.0-py3-none-any.whl"
    bad.write_bytes(b"PK\x03\x04 not a zip")
    for p in (bad,):
        r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "verify", str(p)], capture_output=True,
                           text=True, env=python_env())
        assert r.returncode == 1 and "not a readable zip archive" in r.stdout and "Traceback" not in r.stderr


# -- property-based fuzzing: only the project's typed error escapes -------------------------------------------
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=20)
GOOD_ARTIFACT = artifact(100, 32).to_json()


def near_miss(doc):
    """Documents one mutation away from a valid one, where the parser's rules live."""
    return st.sampled_from(sorted(_paths(doc))).flatmap(
        lambda path: json_values.map(lambda v: _set(doc, path, v)))


def _paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


def _set(doc, path, value):
    d = json.loads(json.dumps(doc))
    cur = d
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return d


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_fuzz_artifact_bytes(data):
    try:
        Artifact.from_bytes(data, file="f.json", check_name=False)
    except FlytuneError:
        pass


@FUZZ
@given(near_miss(GOOD_ARTIFACT))
def test_fuzz_artifact_near_miss(doc):
    try:
        Artifact.from_bytes(json.dumps(doc).encode(), file="f.json", check_name=False)
    except FlytuneError:
        pass


TABLE = {"package": "p", "sources": ["artifacts"], "targets": ["sm_90", {"arch": "interpreter", "accept": ["exact"]}],
         "coverage": "all", "triton": ">=3", "strict": True,
         "tune": {"entries": [{"kernel": "a.b", "setup": "m:f", "shapes": [{"N": 1}]}]}}


@FUZZ
@given(near_miss(TABLE) | json_values)
def test_fuzz_tool_table(table):
    root = Path("/nonexistent-flytune-root")
    try:
        project.parse(table, root=root, file="pyproject.toml")
    except FlytuneError:
        pass


def _assert_entry_check_agrees(raw: bytes) -> None:
    """The manifest reads the same with its fast entry check as with the field-by-field one alone."""
    from unittest import mock

    from flytune_build.core import bundle

    def read():
        try:
            return ("ok", Manifest.from_bytes(raw, file="manifest.json"))
        except FlytuneError as e:
            return ("error", e.field, e.rule)

    fast = read()
    with mock.patch.object(bundle, "_plain_entry", lambda name, info: None):
        assert read() == fast


FUZZ_MANIFEST = {"format": 1, "package": "p", "targets": ["sm_90"], "coverage": "all",
                 "toolchain": {"triton": None, "tuned_with": {}},
                 "kernels": {"p.k": {"shard": "p.k.json", "sha256": "0" * 64, "artifacts": 1, "axes": ["n"],
                                     "provenance": "p.k.provenance.json", "provenance_sha256": "0" * 64}}}


@FUZZ
@given(st.data())
def test_manifest_fast_entry_check_agrees_with_the_field_check(data):
    doc = FUZZ_MANIFEST
    entry = doc["kernels"]["p.k"]
    bad = data.draw(near_miss(entry) | json_values)
    name = data.draw(st.sampled_from(["fixpkg.add", "a b", "x" * 201, "ok.name"]))
    raw = json.dumps(dict(doc, kernels={name: bad, "fixpkg.other": entry})).encode()
    _assert_entry_check_agrees(raw)


@FUZZ
@given(st.data())
def test_fuzz_manifest(data):
    doc = FUZZ_MANIFEST
    raw = data.draw(near_miss(doc).map(lambda d: json.dumps(d).encode()) | st.binary(max_size=200))
    try:
        Manifest.from_bytes(raw, file="manifest.json")
    except FlytuneError:
        pass


# -- concurrency and crashes ----------------------------------------------------------------------------------
WRITER = r"""
import sys
from flytune_build.runtime.serving import scratch
from flytune_build.runtime.serving.scratch import ScratchCache
scratch.LOCK_TIMEOUT = 600   # the merge under contention is tested here, not the give-up (a busy machine waits long)
c = ScratchCache("t.many")
w = int(sys.argv[1])
for i in range(100):
    c.put(f"{w}-{i}", {"config": {"kwargs": {"BLOCK": i}}, "time_ms": 1.0})
"""


def test_sixteen_processes_writing_one_scratch_cache_lose_nothing(tmp_path):
    env = python_env(FLYTUNE_CACHE_DIR=tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w)], env=env) for w in range(16)]
    assert all(p.wait(300) == 0 for p in procs)
    doc = json.loads((tmp_path / "t.many.json").read_text())
    assert doc["format"] == 1 and len(doc["entries"]) == 1600


KILLED = r"""
import os, sys, time
from flytune_build.core import fsutil
from flytune_build.runtime.serving.scratch import ScratchCache
real = os.fsync
def stall(fd):
    print("writing", flush=True)
    time.sleep(60)
os.fsync = stall
ScratchCache("t.kill").put("new", {"config": {"kwargs": {}}, "time_ms": 2.0})
"""


def test_process_killed_mid_write_leaves_previous_file_intact(tmp_path, monkeypatch):
    from flytune_build.runtime.serving.scratch import ScratchCache
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path))
    ScratchCache("t.kill").put("old", {"config": {"kwargs": {}}, "time_ms": 1.0})
    before = (tmp_path / "t.kill.json").read_bytes()
    p = subprocess.Popen([sys.executable, "-c", KILLED], env=python_env(FLYTUNE_CACHE_DIR=tmp_path),
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    assert (tmp_path / "t.kill.json").read_bytes() == before
    ScratchCache("t.kill").put("after", {"config": {"kwargs": {}}, "time_ms": 3.0})  # the lock was released
    assert set(json.loads((tmp_path / "t.kill.json").read_text())["entries"]) == {"old", "after"}


# -- runtime corruption through a discovered bundle ------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate-manifest", "flip-manifest", "flip-shard", "delete-shard"])
def test_corrupt_bundle_warns_once_and_next_tier_serves(tmp_path, monkeypatch, damage):
    import torch
    from kernels import grid, make_add

    from flytune_build import Config

    _, state = good_manifest(tmp_path)
    root = install_fake_dist(tmp_path, monkeypatch, state)
    k = make_add("fixpkg.add", default=lambda a: Config({"BLOCK": 16}))
    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    k[grid(100)](x, y, out, 100)
    assert k.decision(x, y, out, 100).tier == "offline"  # the intact bundle serves
    target = root / ("manifest.json" if "manifest" in damage else "fixpkg.add.json")
    data = bytearray(target.read_bytes())
    if damage.startswith("truncate"):
        data = data[: len(data) // 2]
    elif damage.startswith("flip"):
        data[len(data) // 2] ^= 0x01
    if damage == "delete-shard":
        target.unlink()
    else:
        target.write_bytes(bytes(data))
    autotuner.reset_stats()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for n in (100, 100, 101):
            x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
            k[grid(n)](x, y, out, n)
            assert torch.equal(out, x + y)
    assert k.decision(x, y, out, 100) is not None and autotuner.stats()["fixpkg.add"]["calls"]["offline"] == 0
    assert len([w for w in rec if issubclass(w.category, FlytuneWarning)]) == 1


# -- data only ----------------------------------------------------------------------------------------------
def test_nothing_read_is_executed_or_imported():
    """No pickle/marshal/eval/exec anywhere; imports by name only of what the project itself declares."""
    # the plan's setup functions, --deep's package, `flytune warmup`'s kernels (only under the bundle's package),
    # the compile entry `flytune harvest` is given, the torch modules runtime.inductor.hooks declares in code,
    # and runtime's own modules under the earlier import paths its MOVED constant names
    allowed_import_module = {"tuning/job.py", "audit/execution.py", "runtime/warming/warmup.py", "tuning/harvest.py",
                             "runtime/inductor/hooks.py", "runtime/__init__.py"}
    for path in (ROOT / "flytune_build").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "marshal", "shelve", "dill", "cloudpickle"} & set(names), path
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec", "compile", "__import__"), f"{path}:{node.lineno}"
            if isinstance(node, ast.Attribute) and node.attr == "import_module":
                assert path.relative_to(ROOT / "flytune_build").as_posix() in allowed_import_module, f"{path}:{node.lineno}"
            if isinstance(node, ast.Attribute) and node.attr == "load" and isinstance(node.value, ast.Name) \
                    and node.value.id in ("ep", "entry_point"):
                raise AssertionError(f"{path}:{node.lineno}: entry points are located, never loaded")


# -- the C-speed reading of canonical candidate lists agrees with the field-by-field check ----------------------
_good_configs = st.fixed_dictionaries(
    {"kwargs": st.dictionaries(st.sampled_from(["BLOCK", "B_2", "_x", "EVEN"]),
                               st.integers(-2 ** 63, 2 ** 63) | st.booleans() | st.text(max_size=6), max_size=3),
     "num_warps": st.integers(1, 64), "num_stages": st.integers(0, 16), "num_ctas": st.integers(1, 16),
     "maxnreg": st.none() | st.integers(1, 1024)})
_bad_values = {  # one field at a time, at and past each rule's edge
    "num_warps": [0, 65, -1, True, 4.0, None, "4"], "num_stages": [-1, 17, False], "num_ctas": [0, 17],
    "maxnreg": [0, 1025, 1.5], "extra": [1], "kwargs": [None, [], {"num_warps": 4}, {"maxnreg": 1}, {"1bad": 1},
    {"a-b": 1}, {"": 1}, {"é": 1}, {"B": 1.5}, {"B": None}, {"B": [1]}, {"B": 2 ** 63 + 1}, {"B": -2 ** 63 - 1},
    {"B": "x" * 300}, {"B": "q\"uote"}, {"B": "\n"}, {"B": 10 ** 18}, {"B": 10 ** 19}]}
_configs = _good_configs | st.tuples(_good_configs, st.sampled_from(sorted(_bad_values))).flatmap(
    lambda t: st.sampled_from(_bad_values[t[1]]).map(lambda v: {**t[0], t[1]: v}))
_times = (st.none() | st.integers(-10, 10 ** 20) | st.floats(allow_nan=False, allow_infinity=False)
          | st.sampled_from(["1", True, [], 1e-05, 1.5e+300, 10 ** 16, 0.1 + 0.2]))
_candidates = st.lists(st.fixed_dictionaries({"config": _configs, "time_ms": _times},
                                             optional={"error": st.text(max_size=5)}), max_size=4)


def _both_paths(candidates):
    """(error of the fast canonical read, error of the field-by-field check), each None when accepted."""
    from flytune_build.core import codec
    from flytune_build.pipeline import reader

    doc = dict(GOOD_ARTIFACT, provenance={"triton": "3.6.0", "candidates": candidates})
    data = codec.canonical(doc) + b"\n"
    out = []
    for read in (lambda: reader.read(data, file="f.json", check_name=False),
                 lambda: Artifact.from_json(json.loads(data), file="f.json")):
        try:
            art = read()
            out.append(None)
        except FlytuneError as e:
            out.append((e.field, e.rule))
    if out[0] is None:  # kept as the exact bytes read, and they decode to the same provenance
        assert art.provenance == doc["provenance"]
    return out


@FUZZ
@given(_candidates)
def test_fast_candidate_check_agrees_with_the_field_check(candidates):
    fast, slow = _both_paths(candidates)
    assert fast == slow


@pytest.mark.parametrize("field,value", [(f, v) for f, vs in sorted(_bad_values.items()) for v in vs])
def test_fast_candidate_check_refuses_each_broken_rule(field, value):
    good = {"config": Config({"BLOCK": 16}).to_json(), "time_ms": 0.5}
    bad = {"config": {**Config({"BLOCK": 16}).to_json(), field: value}, "time_ms": 0.25}
    fast, slow = _both_paths([good, bad])
    assert fast == slow


def _strict(data):
    """The reference reading: strict parse, every field checked, then the canonical form."""
    from flytune_build.core import codec
    from flytune_build.core.errors import ArtifactError

    doc = codec.loads(data, file="f.json", error=ArtifactError)
    art = Artifact.from_json(doc, file="f.json")
    if codec.canonical(doc) + b"\n" != data:
        raise ArtifactError("not canonical", file="f.json", field="<document>")
    return art


def _outcome(read, data):
    try:
        return ("ok", read(data).to_json())
    except FlytuneError as e:
        return ("error", e.field)


def _tuned_bytes():
    cands = [{"config": Config({"BLOCK": b, "MODE": "x"}, num_warps=w).to_json(), "time_ms": t}
             for b, w, t in ((16, 1, 0.029343999922275543), (32, 2, 1e-05), (64, 4, None), (128, 8, 3))]
    cands.append({"config": Config({"BLOCK": 256}).to_json(), "error": 'out of resources: "smem" \n\x01é',
                  "time_ms": None})
    a = Artifact("fixpkg.add", {"x": "float32", "n": 7}, GOOD_ARTIFACT_DEVICE, Config({"BLOCK": 32}),
                 {"triton": "3.6.0", "ranking": "measured", "space_hash": "0" * 64, "candidates": cands})
    return a.to_bytes()


GOOD_ARTIFACT_DEVICE = Artifact.from_json(GOOD_ARTIFACT).device


@settings(FUZZ, max_examples=1500)
@given(st.data())
def test_fast_read_agrees_with_the_strict_reading_byte_for_byte(data):
    """Edits to a canonical tuned artifact, at the byte level: the fast path accepts exactly what the
    strict reading accepts, and reads the same artifact."""
    from flytune_build.pipeline import reader

    good = _tuned_bytes()
    assert reader.read_tuned(good) is not None
    pos = data.draw(st.integers(0, len(good) - 1))
    edit = data.draw(st.sampled_from(["replace", "insert", "delete"]))
    byte = data.draw(st.sampled_from(list(b'0123456789.-+e"\\{}[],: nulltruefalse\x00\x7f\xc3\xa9\xed') + [0x80]))
    if edit == "replace":
        bad = good[:pos] + bytes([byte]) + good[pos + 1:]
    elif edit == "insert":
        bad = good[:pos] + bytes([byte]) + good[pos:]
    else:
        bad = good[:pos] + good[pos + 1:]
    fast = _outcome(lambda d: reader.read(d, file="f.json", check_name=False), bad)
    assert (fast[0] == "ok") == (_outcome(_strict, bad)[0] == "ok"), bad
    if fast[0] == "ok":
        assert fast == _outcome(_strict, bad)


FAST_READ_EDITS = [  # (what, old bytes, new bytes): each leaves valid JSON that is not canonical
    ("kwargs-unsorted", b'{"BLOCK":16,"MODE":"x"}', b'{"MODE":"x","BLOCK":16}'),
    ("kwargs-duplicate", b'{"BLOCK":16,"MODE":"x"}', b'{"BLOCK":16,"BLOCK":16,"MODE":"x"}'),
    ("kwargs-minus-zero", b'{"BLOCK":16,"MODE":"x"}', b'{"BLOCK":-0,"MODE":"x"}'),
    ("time-exponent", b'"time_ms":1e-05', b'"time_ms":1e-5'),
    ("time-trailing-zero", b'"time_ms":3}', b'"time_ms":3.10}'),
    ("time-minus-zero", b'"time_ms":3}', b'"time_ms":-0}'),
    ("key-after-provenance", b',"provenance":', b',"zzz":1,"provenance":'),
    ("provenance-field-before-candidates", b'"ranking":"measured"', b'"aaa":1,"ranking":"measured"'),
    ("space", b'"triton":"3.6.0"', b'"triton": "3.6.0"'),
    ("escaped-slash", b'\\"smem', b'\\/smem'),
    ("unicode-escape", b'\\u0001', b'\\u0041'),
]


@pytest.mark.parametrize("what,old,new", FAST_READ_EDITS, ids=[e[0] for e in FAST_READ_EDITS])
def test_fast_read_refuses_what_is_not_canonical(what, old, new):
    from flytune_build.pipeline import reader

    good = _tuned_bytes()
    assert old in good
    bad = good.replace(old, new, 1)
    json.loads(bad)  # still JSON
    assert reader.read_tuned(bad) is None
    with pytest.raises(FlytuneError):
        _strict(bad)
    with pytest.raises(FlytuneError):
        reader.read(bad, file="f.json", check_name=False)


MANIFEST_EDGES = [("artifacts", -1), ("artifacts", 0), ("artifacts", True), ("artifacts", 1.0), ("axes", ["x" * 128]),
                  ("axes", ["x" * 129]), ("axes", [1]), ("axes", "n"), ("sha256", "0" * 63), ("sha256", "0" * 65),
                  ("sha256", "A" * 64), ("shard", "a/b.json"), ("shard", "x" * 252 + ".json"), ("provenance", None),
                  ("provenance_sha256", 0), ("extra", 1)]


@pytest.mark.parametrize("name", ["p.k", "k" * 200, "k" * 201])
@pytest.mark.parametrize("field,value", MANIFEST_EDGES)
def test_manifest_fast_entry_check_at_each_edge(name, field, value):
    entry = dict(FUZZ_MANIFEST["kernels"]["p.k"], **{field: value})
    raw = json.dumps(dict(FUZZ_MANIFEST, kernels={name: entry})).encode()
    _assert_entry_check_agrees(raw)


@pytest.mark.parametrize("where", ["candidate", "band"])
def test_a_number_no_double_holds_is_a_field_error_never_an_overflow(where):
    import re

    from flytune_build.core import serving
    from flytune_build.core.artifact import load_dir
    from flytune_build.core.errors import ArtifactError
    from flytune_build.pipeline import reader

    art = next(iter(load_dir(ROOT / "sample_pkg" / "artifacts" / "sm_90")))
    doc = json.loads(art.to_bytes())
    if where == "candidate":
        doc["provenance"]["candidates"][0]["time_ms"] = 10 ** 400
        field = "provenance.candidates[0].time_ms"
    else:
        doc["provenance"]["selection"]["band"] = 10 ** 400
        field = "provenance.selection.band"
    data = json.dumps(doc).encode()
    for read in (lambda: Artifact.from_bytes(data, file=art.filename), lambda: reader.read(data, file=art.filename)):
        with pytest.raises(ArtifactError, match=re.escape(f"`{field}` must be a finite number")):
            read()
    if where == "candidate":  # read from provenance as it is, unchecked: no time, never an overflow
        assert serving.config_time(doc["provenance"], doc["provenance"]["candidates"][0]["config"]) is None
