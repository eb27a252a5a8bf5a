"""Artifacts and wheels earlier releases wrote keep serving under this one (tests/data/compat/).

The corpus was made by the project's first release (commit 7f53f58): its `flytune tune` tuned
tests/data/compat/src (a ported kernel and an fla-style cumsum adopted through @triton.heuristics over
@triton.autotune, called with `cu_seqlens=None, scale=None`), and its backend built the wheel. That
release wrote no null key axes; this one writes `cu_seqlens: null, scale: null`.

`releases/<commit>/` holds what later releases wrote from the same project and plan, each with its own
`flytune tune` (synthetic and measured ranking) and its own backend (a wheel of each directory): the
provenance they recorded changed many times (measurement, selection under the fixed band and under the
sequential test, specialization, host/worker), and every test below that takes `release` runs over them.
"""
import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from buildkit import pip_wheel
from conftest import ROOT, python_env
from flytune_build.core import verification
from flytune_build.core.artifact import Artifact, load_dir
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER

CORPUS = Path(__file__).parent / "data" / "compat"
FIRST_RELEASE_DIR = CORPUS / "src" / "artifacts" / "interpreter"
FIRST_RELEASE_WHEEL = CORPUS / "wheels" / "compatpkg-1.0-py3-none-any.whl"

# Later releases, oldest first (tests/data/compat/README.md: what each changed, and the commands), and
# what each wrote into a measured `compatpkg.add` artifact's provenance beyond the first release's fields
# (`host`/`worker` since 040536a; the sequential test's `confidence`, `noise`, `resolved` since 040536a,
# in a measured run's record only).
FIXED_BAND = {"band", "band_ms", "fastest", "finalists", "round_fraction", "rule", "why", "winner"}
SEQUENTIAL = FIXED_BAND | {"confidence", "noise", "resolved"}
LATER_RELEASES = {
    "2b2006b": (set(), None),                                                # after the core/ runtime/ split
    "062c083": ({"measurement", "selection", "specialization"}, FIXED_BAND),  # first measurement/selection
    "8f1a9c2": ({"measurement", "selection", "specialization"}, FIXED_BAND),  # adopted kernels' specialization
    "832d21a": ({"measurement", "selection", "specialization"}, FIXED_BAND),  # the band's 2% cap
    "7d522ae": ({"measurement", "selection", "specialization"}, FIXED_BAND),  # placements, floor 1.5%
    "040536a": ({"host", "worker", "measurement", "selection", "specialization"}, SEQUENTIAL),  # sequential test
}
RELEASES = [pytest.param((c, r), id=f"{c}-{r}") for c in LATER_RELEASES for r in ("synthetic", "measured")]


def release_dir(release) -> Path:
    commit, ranking = release
    return CORPUS / "releases" / commit / ranking


def release_wheel(release) -> Path:
    commit, ranking = release
    return CORPUS / "releases" / commit / "wheels" / ranking / "compatpkg-1.0-py3-none-any.whl"

# Every tuned shape served from the installed bundle under FLYTUNE_AUTOTUNE=strict: a search raises.
SERVE = '''
import json, torch, flytune_build as ft
from flytune_build.triton import adopt
import compatpkg
seeded = adopt(compatpkg.cumsum_kernel, "compatpkg.cumsum")
for B, H in {shapes}:
    s = torch.randn(B, 40, H)
    torch.testing.assert_close(compatpkg.cumsum(s, cu_seqlens=None, scale=None), s.cumsum(1))
for B in {varlen}:  # B sequences of 40 packed into one, as fla's varlen calls pass them
    s = torch.randn(1, 40 * B, 2)
    cu = torch.arange(0, 40 * B + 1, 40, dtype=torch.int32)
    want = torch.cat([c.cumsum(1) for c in s.split(40, 1)], 1)
    torch.testing.assert_close(compatpkg.cumsum(s, cu_seqlens=cu, scale=None), want)
for n in (100, 1000):
    x, y = torch.randn(n), torch.randn(n)
    torch.testing.assert_close(compatpkg.add(x, y), x + y)
print(json.dumps({{"seeded": seeded, "stats": ft.stats()}}, default=str))
'''


def serve(site: Path, shapes, varlen=()) -> dict:
    code = textwrap.dedent(SERVE.format(shapes=list(shapes), varlen=list(varlen)))
    r = subprocess.run([sys.executable, "-c", code], cwd="/",
                       capture_output=True, text=True, timeout=300,
                       env=python_env(PYTHONPATH=f"{site}:{ROOT}", FLYTUNE_AUTOTUNE="strict", TRITON_INTERPRET=1))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def assert_offline(stats: dict, cumsum_calls: int) -> None:
    """Every call of both kernels served from the bundle: no search, no scratch entry, no fallback."""
    assert stats["compatpkg.cumsum"]["calls"] == {"scratch": 0, "offline": cumsum_calls, "heuristic": 0, "search": 0}
    assert stats["compatpkg.add"]["calls"] == {"scratch": 0, "offline": 2, "heuristic": 0, "search": 0}
    assert all(k["searches"] == 0 and not k["fallbacks"] for k in stats.values())


def install(wheel: Path, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(into)
    return into


def test_first_release_artifacts_verify_as_they_are():
    arts = load_dir(FIRST_RELEASE_DIR, canonical=True)
    assert {a.kernel for a in arts} == {"compatpkg.add", "compatpkg.cumsum"}
    assert all(None not in a.key.values() for a in arts)  # written before null axes
    found = verification.check(arts, lambda a: a.filename)
    assert not found.errors and not found.warnings
    assert [a.address for a in found.bundled(arts)] == [a.address for a in arts]  # alone: bundled as they are


@pytest.mark.parametrize("release", RELEASES)
def test_later_release_artifacts_and_wheels_verify_as_they_are(release):
    """Each later release's directory reads canonically with every provenance record it wrote, verifies
    clean (no warning either), and its own backend's wheel verifies and holds that directory."""
    import flytune_build as ft

    commit, ranking = release
    arts = load_dir(release_dir(release), canonical=True)
    assert sorted(a.kernel for a in arts) == ["compatpkg.add"] * 2 + ["compatpkg.cumsum"] * 2
    found = verification.check(arts, lambda a: a.filename)
    assert not found.errors and not found.warnings
    assert [a.address for a in found.bundled(arts)] == [a.address for a in arts]
    extra, selection = LATER_RELEASES[commit]
    first = {"candidates", "created", "cuda", "flytune", "hip", "ranking", "space_hash", "torch", "triton"}
    for a in arts:
        if a.kernel == "compatpkg.add":
            assert set(a.provenance) == first | extra
            if selection == SEQUENTIAL and ranking == "synthetic":
                selection = FIXED_BAND  # a synthetic ranking has no rounds to test: one record, as before
            assert set(a.provenance.get("selection", ())) == (selection or set())
            assert a.provenance.get("measurement", {}).get("timer") in \
                (None, "cpu-time" if ranking == "measured" else "synthetic")
    for path in (release_dir(release), release_wheel(release)):
        report = ft.verify(str(path), strict=True)
        assert report.ok and not report.errors and not report.warnings, (path, report.errors, report.warnings)
        assert sorted(a.address for a in report.artifacts) == sorted(a.address for a in arts)


@pytest.mark.parametrize("release", RELEASES)
def test_later_release_wheel_serves_with_zero_search(release, tmp_path):
    out = serve(install(release_wheel(release), tmp_path / "site"), [(2, 2), (2, 4)])
    assert out["seeded"] == 2
    assert_offline(out["stats"], 2)


def test_first_release_wheel_serves_with_zero_search(tmp_path):
    out = serve(install(FIRST_RELEASE_WHEEL, tmp_path / "site"), [(2, 2), (2, 4)])
    assert out["seeded"] == 2
    assert_offline(out["stats"], 2)


def retune(project: Path, B: int, varlen: bool = False) -> Artifact:
    """This release's `recording` of one new cumsum shape, written into the first release's directory;
    `varlen`: B sequences packed into one, with `cu_seqlens` a tensor (`scale` None)."""
    call = (f"compatpkg.cumsum(torch.randn(1, {40 * B}, 2), cu_seqlens=torch.arange(0, {40 * B + 1}, 40, "
            f"dtype=torch.int32), scale=None)") if varlen else \
        f"compatpkg.cumsum(torch.randn({B}, 40, 2), cu_seqlens=None, scale=None)"
    code = f'''
        import sys, torch
        sys.path.insert(0, {str(project)!r})
        from flytune_build.triton import recording
        import compatpkg
        with recording(compatpkg.cumsum_kernel, "compatpkg.cumsum") as got:
            {call}
        print(got[0].save({str(project / "artifacts" / "interpreter")!r}))
    '''
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env=python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0))
    assert r.returncode == 0, r.stderr[-3000:]
    return Artifact.load(r.stdout.strip().splitlines()[-1])


def builds_strict_and_serves_all_three(project: Path, tmp_path: Path) -> None:
    """The project's wheel (its `strict = true` build by this release's backend) holds one axis set for
    the cumsum's three shapes, and serves them all with zero search."""
    r = pip_wheel(project, tmp_path / "dist")  # the project declares strict = true
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp_path / "dist").glob("compatpkg-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shard = json.loads(z.read("compatpkg/_flytune/compatpkg.cumsum.json"))
    assert shard["axes"] == ["B", "H", "IS_VARLEN", "cu_seqlens", "o", "s", "scale"] and len(shard["artifacts"]) == 3

    out = serve(install(wheel, tmp_path / "site"), [(2, 2), (2, 4), (3, 2)])
    assert out["seeded"] == 3
    assert_offline(out["stats"], 3)


def test_retune_into_first_release_directory_builds_strict_and_serves(tmp_path):
    project = tmp_path / "compatpkg"
    shutil.copytree(CORPUS / "src", project)
    new = retune(project, B=3)
    assert new.key["cu_seqlens"] is None and new.key["scale"] is None  # this release's derivation
    arts = load_dir(project / "artifacts" / "interpreter")
    assert not verification.check(arts, lambda a: a.filename).errors

    builds_strict_and_serves_all_three(project, tmp_path)


@pytest.mark.parametrize("release", RELEASES)
def test_retune_into_later_release_directory_builds_strict_and_serves(release, tmp_path):
    """This release's re-tune of a new shape beside what a later release wrote: one axis set, a strict
    build by this release's backend, every old and new shape served with zero search."""
    project = tmp_path / "compatpkg"
    shutil.copytree(CORPUS / "src", project, ignore=shutil.ignore_patterns("artifacts"))
    shutil.copytree(release_dir(release), project / "artifacts" / "interpreter")
    new = retune(project, B=3)
    assert new.key["cu_seqlens"] is None and new.key["scale"] is None
    arts = load_dir(project / "artifacts" / "interpreter")
    assert len(arts) == 5 and not verification.check(arts, lambda a: a.filename).errors

    builds_strict_and_serves_all_three(project, tmp_path)


@pytest.mark.parametrize("release", RELEASES)
def test_upgrade_of_a_later_release_directory(release, tmp_path):
    """Beside a shape this release tuned, `flytune upgrade` rewrites only keys written before null axes
    (2b2006b's cumsum, as the first release's), losslessly; a later release's keys are left as they are."""
    from flytune_build.store.upgrade import upgrade

    d = tmp_path / "artifacts"
    shutil.copytree(release_dir(release), d)
    (old,) = [a for a in load_dir(d) if a.kernel == "compatpkg.cumsum" and a.key["H"] == 2]
    Artifact(old.kernel, {**old.key, "B": 3, "cu_seqlens": None, "scale": None}, old.device, old.config,
             {"flytune": "0.1.0", "ranking": "measured"}).save(d)
    before = load_dir(d)
    report = upgrade(d)
    assert report.ok, report.errors
    assert len(report.actions) == (2 if release[0] == "2b2006b" else 0)
    after = load_dir(d, canonical=True)
    assert not verification.check(after, lambda a: a.filename).errors
    assert {(a.kernel, a.config, json.dumps(dict(a.provenance), sort_keys=True)) for a in after} == \
        {(a.kernel, a.config, json.dumps(dict(a.provenance), sort_keys=True)) for a in before}


def test_varlen_retunes_into_first_release_directory_build_strict_and_serve_both(tmp_path):
    """Re-tunes that pass `cu_seqlens` as a tensor (key `cu_seqlens: int32, scale: null`) beside the
    first release's keys, which lack both axes (it called with None and left None out): one axis set,
    a strict build, and every old and new shape served with zero search."""
    project = tmp_path / "compatpkg"
    shutil.copytree(CORPUS / "src", project)
    new = [retune(project, B=b, varlen=True) for b in (3, 5)]
    assert all(a.key["cu_seqlens"] == "int32" and a.key["scale"] is None and a.key["IS_VARLEN"] for a in new)
    arts = load_dir(project / "artifacts" / "interpreter")
    found = verification.check(arts, lambda a: a.filename)
    assert not found.errors and {a.key_axes() for a in found.bundled(arts) if a.kernel == "compatpkg.cumsum"} == \
        {("B", "H", "IS_VARLEN", "cu_seqlens", "o", "s", "scale")}
    assert any("read as cu_seqlens=None" in w for w in found.warnings)  # on a dtype's evidence alone: said

    r = pip_wheel(project, tmp_path / "dist")  # strict = true
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp_path / "dist").glob("compatpkg-*.whl")
    out = serve(install(wheel, tmp_path / "site"), [(2, 2), (2, 4)], varlen=[3, 5])
    assert out["seeded"] == 4
    assert_offline(out["stats"], 4)


def test_old_and_new_key_of_one_shape_are_one_identity():
    """A re-tune of a shape the first release tuned is that artifact's identity: two configs conflict."""
    (old,) = [a for a in load_dir(FIRST_RELEASE_DIR) if a.kernel == "compatpkg.cumsum" and a.key["H"] == 2]
    new = Artifact(old.kernel, {**old.key, "cu_seqlens": None, "scale": None}, old.device,
                   Config({"BT": 16}, num_warps=1))
    found = verification.check([old, new], lambda a: a.filename)
    assert [e.field for e in found.errors] == ["config"] and "one lacks reading as the other's null" in found.errors[0].rule
    same = new.with_provenance(None)
    found = verification.check([old, Artifact(new.kernel, new.key, new.device, old.config)], lambda a: a.filename)
    assert not found.errors and found.warnings  # the same config twice: kept once
    assert same.address != old.address


@pytest.mark.parametrize("release", RELEASES)
def test_diff_reads_a_first_release_key_as_the_key_with_its_null_axes(release):
    # the first release wrote no null axes; diffed against a later release's tune of the same plan, the
    # same shapes are the same winners (or changed ones), never one removed and one added
    from flytune_build import diff

    for old, new in ((FIRST_RELEASE_WHEEL, release_wheel(release)), (FIRST_RELEASE_DIR, release_dir(release))):
        d = diff(str(old), str(new))
        assert d["added"] == [] and d["removed"] == [] and d["errors"] == [], d
        assert d["unchanged"] + len(d["changed"]) == 4


def test_axes_that_truly_differ_say_who_wrote_which_and_what_to_do():
    prov = {"flytune": "0.1.0", "created": "2026-12-02T10:00:00Z"}
    arts = [Artifact("k.add", {"x": "float32", "n": n}, INTERPRETER, Config({"B": 16}), prov) for n in (1, 2)]
    arts.append(Artifact("k.add", {"x": "float32", "n": 3, "y": "float16"}, INTERPRETER, Config({"B": 16}),
                         {"flytune": "0.2.0", "created": "2026-12-09T10:00:00Z"}))
    found = verification.check(arts, lambda a: a.filename)
    (err,) = found.errors
    assert err.file == arts[2].filename and err.field == "key"
    for part in ("adds ['y']", "written by flytune 0.1.0 on 2026-12-02", "written by flytune 0.2.0 on 2026-12-09",
                 arts[0].filename, "re-tune these shapes with this release"):
        assert part in err.rule, part


@pytest.mark.parametrize("tensor_first", [True, False])
def test_optional_tensor_variants_share_one_axis_set(tensor_first):
    """{cu_seqlens: int32} and {cu_seqlens: null}, as this release writes them, and the first release's
    key without the axis: one kernel, three keys, no rejection."""
    dev, c = INTERPRETER, Config({"BT": 16})
    with_tensor = Artifact("k.cs", {"B": 1, "s": "float32", "cu_seqlens": "int32"}, dev, c)
    null = Artifact("k.cs", {"B": 2, "s": "float32", "cu_seqlens": None}, dev, c)
    old = Artifact("k.cs", {"B": 3, "s": "float32"}, dev, c)
    arts = [with_tensor, null, old] if tensor_first else [old, null, with_tensor]
    found = verification.check(arts, lambda a: a.filename)
    assert not found.errors
    assert {a.key_axes() for a in found.bundled(arts)} == {("B", "cu_seqlens", "s")}


def mixed_directory(tmp_path) -> Path:
    """The first release's directory with one shape this release tuned (its key holds the null axes)."""
    d = tmp_path / "artifacts"
    shutil.copytree(FIRST_RELEASE_DIR, d)
    (old,) = [a for a in load_dir(d) if a.kernel == "compatpkg.cumsum" and a.key["H"] == 2]
    Artifact(old.kernel, {**old.key, "B": 3, "cu_seqlens": None, "scale": None}, old.device, old.config,
             {"flytune": "0.1.0", "ranking": "measured"}).save(d)
    return d


def test_upgrade_rewrites_only_the_old_keys_losslessly(tmp_path):
    from flytune_build.store.upgrade import upgrade

    d = mixed_directory(tmp_path)
    before = {(a.kernel, a.config, json.dumps(dict(a.provenance), sort_keys=True)): a for a in load_dir(d)}
    report = upgrade(d)
    assert report.ok and len(report.actions) == 2  # the two cumsum files of the first release
    after = load_dir(d, canonical=True)
    assert len(after) == 5 and not verification.check(after, lambda a: a.filename).errors
    assert {a.key_axes() for a in after if a.kernel == "compatpkg.cumsum"} == \
        {("B", "H", "IS_VARLEN", "cu_seqlens", "o", "s", "scale")}
    assert {a.address for a in after} == {a.address for a in verification.conformed(list(before.values()))}
    assert {(a.kernel, a.config, json.dumps(dict(a.provenance), sort_keys=True)) for a in after} == set(before)
    assert upgrade(d).actions == []  # once upgraded, nothing to do
    assert (d / "compatpkg.add-265e550ffd965b1d.json").read_bytes() == \
        (FIRST_RELEASE_DIR / "compatpkg.add-265e550ffd965b1d.json").read_bytes()  # untouched kernels keep their bytes


def test_upgrade_reads_every_folder_below_dir_as_the_build_does(tmp_path):
    """A tune's `{arch}` layout: the first release's files in one folder, this release's re-tune (which
    holds the null axes) in another. The build conforms them across folders; so does `upgrade`, which
    rewrites each old file in its own folder, and `flytune verify` of the tree is clean after it."""
    from flytune_build.store.upgrade import upgrade

    d = mixed_directory(tmp_path)
    (new,) = [p for p in d.glob("compatpkg.cumsum-*.json") if "cu_seqlens" in p.read_text()]
    (d / "sm_90").mkdir()
    new.rename(d / "sm_90" / new.name)
    old = d / "interpreter"
    old.mkdir()
    for p in d.glob("*.json"):
        p.rename(old / p.name)
    report = upgrade(d)
    assert report.ok and report.files == 5 and len(report.actions) == 2, report.errors
    assert sorted(p.parent.name for p in d.rglob("*.json")) == ["interpreter"] * 4 + ["sm_90"]
    after = load_dir(old, canonical=True)
    assert {a.key_axes() for a in after if a.kernel == "compatpkg.cumsum"} == \
        {("B", "H", "IS_VARLEN", "cu_seqlens", "o", "s", "scale")}
    assert upgrade(d).actions == []


def test_upgrade_is_all_or_nothing(tmp_path):
    from flytune_build.store.upgrade import upgrade

    d = mixed_directory(tmp_path)
    (old,) = [a for a in load_dir(d) if a.kernel == "compatpkg.cumsum" and a.key["H"] == 4]
    Artifact(old.kernel, {**old.key, "cu_seqlens": None, "scale": None}, old.device, old.config,
             {"flytune": "0.1.0", "ranking": "synthetic"}).save(d)  # that shape re-tuned: same config, other provenance
    files = {p.name: p.read_bytes() for p in d.iterdir()}
    report = upgrade(d)
    (err,) = report.errors
    assert err.file == str(d / old.filename) and "remove the file whose measurement you drop" in err.rule
    assert {p.name: p.read_bytes() for p in d.iterdir()} == files


def test_upgrade_never_folds_two_measurements_into_one_file(tmp_path):
    """Two old files that both conform to one identity and config, with other provenance: upgrading
    would keep one measurement and delete the other, so it refuses, naming both; a hidden file (an
    atomic writer's temporary) is no artifact."""
    from flytune_build.store.upgrade import upgrade

    d = tmp_path / "artifacts"
    c = Config({"BT": 16}, num_warps=1)
    Artifact("k.cs", {"H": 9, "cu_seqlens": None, "scale": None}, INTERPRETER, c, {"flytune": "0.2"}).save(d)
    a = Artifact("k.cs", {"H": 2, "scale": None}, INTERPRETER, c, {"host": "A"}).save(d)
    b = Artifact("k.cs", {"H": 2}, INTERPRETER, c, {"host": "B"}).save(d)
    (d / ".k.cs-tmp.json").write_text("{partial")
    files = {p.name: p.read_bytes() for p in d.iterdir()}
    report = upgrade(d)
    (err,) = report.errors
    assert {Path(err.file).name, *[n for n in (a.name, b.name) if n in err.rule]} == {a.name, b.name}
    assert "remove the file whose measurement you drop" in err.rule
    assert {p.name: p.read_bytes() for p in d.iterdir()} == files


def test_upgrade_command_prints_each_file_and_exits_0_then_1_on_an_invalid_artifact(tmp_path, capsys):
    import argparse

    from flytune_build.cli import upgrade as cli

    d = mixed_directory(tmp_path)
    assert cli.command(argparse.Namespace(dir=str(d))) == 0
    out = capsys.readouterr().out
    assert out.count("upgraded ") == 3 and "flytune: upgraded 2 of 5 artifact(s)" in out
    (d / "broken.json").write_text("{")
    assert cli.command(argparse.Namespace(dir=str(d))) == 1
    assert "broken.json" in capsys.readouterr().err


def test_a_pruned_adopted_kernel_serves_the_first_release_keys_with_zero_search(tmp_path, monkeypatch):
    """A kernel with an `early_config_prune` is seeded on each key's first call, by the call's artifact
    key (which holds `cu_seqlens: null, scale: null`): the first release's keys, which lack them, match."""
    import torch
    import triton

    monkeypatch.syspath_prepend(str(CORPUS / "src"))
    import compatpkg
    from flytune_build import stats
    from flytune_build.triton import adopt

    shutil.copytree(FIRST_RELEASE_DIR, tmp_path / "artifacts")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    pruned = []
    tuner = compatpkg.cumsum_kernel.fn
    kernel = triton.heuristics(compatpkg.cumsum_kernel.values)(
        triton.autotune(tuner.configs, key=list(tuner.keys), do_bench=compatpkg.wall_clock,
                        prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: pruned.append(1) or configs})(
            tuner.fn))
    assert adopt(kernel, "compatpkg.cumsum") == 2
    s = torch.randn(2, 40, 4)
    o = s.new_empty(s.shape)
    kernel[(8,)](s, o, None, None, 40, B=2, H=4)
    torch.testing.assert_close(o, s.cumsum(1))
    assert pruned and stats()["compatpkg.cumsum"]["calls"]["offline"] == 1


def test_the_runtime_modules_keep_their_earlier_import_paths():
    """runtime/ grouped its modules by job; `flytune_build.runtime.<module>` of an earlier release is still
    the module, the same object, however it is imported (a process that did both shares one state)."""
    import importlib

    from flytune_build import runtime

    for name, group in runtime.MOVED.items():
        here = importlib.import_module(f"flytune_build.runtime.{group}.{name}")
        assert importlib.import_module(f"flytune_build.runtime.{name}") is here
    from flytune_build.runtime import autotuner, session  # noqa: I001 - the earlier spelling
    assert autotuner.autotune is importlib.import_module("flytune_build.runtime.serving.autotuner").autotune
    assert session.current is importlib.import_module("flytune_build.runtime.searching.session").current
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("flytune_build.runtime.no_such_module")


def test_a_num_warps_no_power_of_two_reads_as_every_release_wrote_it_and_a_gpu_artifact_is_refused(tmp_path):
    # releases before this one took any num_warps in range: an interpreter artifact, a declared config and a
    # search's record of a candidate (on a GPU such a config fails and is recorded failed) read as written;
    # a GPU artifact whose winner has one is the build's error, as Triton cannot compile it
    import io

    import flytune_build as ft
    from flytune_build import pipeline
    from flytune_build.core.errors import BuildFailure

    doc = json.loads(next(FIRST_RELEASE_DIR.glob("compatpkg.add-*.json")).read_bytes())
    doc["config"]["num_warps"] = 6
    doc.setdefault("provenance", {})["candidates"] = [{"config": {**doc["config"], "num_warps": 12}, "time_ms": None}]
    art = Artifact.from_json(doc)
    assert art.config.num_warps == 6 and Artifact.from_json(json.loads(art.to_bytes())).config == art.config
    assert ft.Config({"BLOCK": 32}, num_warps=6).num_warps == 6
    from buildkit import H200, make_project

    proj = make_project(tmp_path / "p")
    Artifact("fixpkg.add", {"x": "float32", "n": 4096}, H200, Config({"BLOCK": 32}, num_warps=6)).save(
        proj / "artifacts")
    with pytest.raises(BuildFailure, match=r"config.num_warps.*is 6, but Triton's cuda backend compiles only a power"):
        pipeline.run(proj, out=io.StringIO())


def test_a_tune_state_of_an_earlier_fingerprint_form_resumes_where_the_code_is_the_same(tmp_path):
    # 5cc0010 digested a kernel's source as Triton's source hash and a setup as its text; this release
    # digests both as syntax trees: the recorded parts are recognised in their earlier form, never taken
    # for a change of the code
    from flytune_build.tuning import fingerprint

    proj = tmp_path / "compat"
    shutil.copytree(CORPUS / "src", proj)
    code = ("import json, sys; from pathlib import Path; from flytune_build.core.project import load_plan; "
            "from flytune_build.tuning import fingerprint; root = Path(sys.argv[1]); "
            "entries = load_plan(root, root / 'tune' / 'interpreter.toml'); "
            "print(json.dumps([[f, f.earlier] for f in fingerprint.of_plan(root, entries).values()]))")
    r = subprocess.run([sys.executable, "-c", code, str(proj)], capture_output=True, text=True, timeout=300,
                       env=python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, PYTHONPATH=f"{proj}:{ROOT}"))
    assert r.returncode == 0, r.stderr
    current = [fingerprint.Fingerprint(parts, earlier) for parts, earlier in json.loads(r.stdout)]
    assert len(current) == 2 and all(current)
    recorded = [rec["depends"] for rec in json.loads((CORPUS / "states" / "5cc0010.flytune-tune-state").read_bytes())[
        "done"].values()]
    assert len(recorded) == 4
    for depends in recorded:
        now = next(f for f in current if f["space"] == depends["space"])   # the entry it was tuned for
        assert depends["source"] == now.earlier["source"] != now["source"]
        assert depends["setup"] == now.earlier["setup"] != now["setup"]
        # (the toolchain part is this machine's: the one the state was written on had its own)
        assert fingerprint.changed({**depends, "toolchain": now["toolchain"]}, now) is None
        assert fingerprint.changed({**depends, "toolchain": now["toolchain"], "source": "0" * 16}, now) == \
            "kernel source changed"


def test_warmup_takes_the_reserve_an_earlier_release_took_and_says_once_it_does_nothing(recwarn):
    # releases from 22099e0 to d2b06bc took `warmup(reserve_mib=...)`; a call written then still runs
    import warnings

    import flytune_build as ft
    from flytune_build.runtime import warning

    warning.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            ft.warmup(reserve_mib=256)   # every installed bundle (on this CPU, none compiles)
    said = [str(w.message) for w in seen if "reserve_mib" in str(w.message)]
    assert len(said) == 1 and "no longer does anything" in said[0]
