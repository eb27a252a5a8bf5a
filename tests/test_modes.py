"""FLYTUNE_AUTOTUNE=0|1|strict mean the same for ported `flytune_build.autotune` kernels and adopted
`@triton.autotune` kernels (`runtime.serving.kernel.ORDER`): never search (the first config after pruning),
always search and emit, must hit; the interpreter gives adopted kernels a working fallback; and
`verify --deep --execute` fails when it executed nothing, saying in `--json` what ran."""
import json
import os

import feature_kernels as fk
import pytest
import triton
from conftest import ROOT, counting_bench, flytune

import flytune_build as ft
from flytune_build import Config, FlytuneWarning
from flytune_build import triton as adapter
from flytune_build.core.artifact import Artifact
from flytune_build.core.device import INTERPRETER
from flytune_build.core.errors import TierMissError
from flytune_build.runtime.serving import autotuner

KINDS = ("ported", "adopted")
NAME = "m.total"


def make(kind, **kw):
    """The same kernel (`fk._total`, an atomic sum) as a ported kernel or an adopted one."""
    configs = [triton.Config({"BLOCK": b}) for b in fk.BLOCKS]
    if kind == "ported":
        return ft.autotune(configs, key=["n"], reset_to_zero=["total"], name=NAME, **kw)(fk._total)
    k = triton.autotune(configs, key=["n"], reset_to_zero=["total"], **kw)(fk._total)
    adapter.adopt(k, name=NAME)
    return k


def bundle(tmp_path, monkeypatch, kind, n=100, block=64):
    key = {"n": n} if kind == "ported" else {"n": n, "x": "float32", "total": "float32"}
    d = tmp_path / "bundle"
    Artifact(NAME, key, INTERPRETER, Config({"BLOCK": block})).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    return key


def served(k, kind) -> Config:
    return k.decision(None, None, 77).config if kind == "ported" else Config.coerce(k.best_config)


def stats():
    return ft.stats()[NAME]


@pytest.mark.parametrize("kind", KINDS)
def test_never_search_serves_the_first_config_with_one_warning(kind):
    do_bench, seen = counting_bench()
    k = make(kind, do_bench=do_bench)
    with pytest.warns(FlytuneWarning, match="FLYTUNE_AUTOTUNE=0 and no heuristic default: using the first config"):
        assert fk.total(k, 77) and fk.total(k, 77)
    assert seen == [] and served(k, kind) == Config({"BLOCK": 16})
    assert stats()["calls"]["heuristic"] == 2 and stats()["searches"] == 0


def _drop_16_and_zero(configs, nargs, **kwargs):
    return [triton.Config(dict(c.kwargs), pre_hook=fk._zero_total) for c in configs if c.kwargs["BLOCK"] != 16]


@pytest.mark.parametrize("kind", KINDS)
def test_never_search_takes_the_first_config_after_pruning_with_its_hook(kind):
    """The pruner drops BLOCK=16 and attaches the hook that zeroes the accumulator: the first config
    left is served, hook and all (the sum starts from garbage otherwise), as Triton launches one config."""
    configs = [triton.Config({"BLOCK": b}) for b in fk.BLOCKS]
    rules = {"early_config_prune": _drop_16_and_zero}
    if kind == "ported":
        k = ft.autotune(configs, key=["n"], name=NAME, prune_configs_by=rules)(fk._total)
    else:
        k = triton.autotune(configs, key=["n"], prune_configs_by=rules)(fk._total)
        adapter.adopt(k, name=NAME)
    with pytest.warns(FlytuneWarning, match="using the first config"):
        assert fk.dirty_total(k, 77) and fk.dirty_total(k, 77)
    assert served(k, kind) == Config({"BLOCK": 32}) and stats()["calls"]["heuristic"] == 2


@pytest.mark.parametrize("kind", KINDS)
def test_always_search_searches_a_bundled_key_and_emits_what_the_offline_tier_serves(tmp_path, monkeypatch, kind):
    key = bundle(tmp_path, monkeypatch, kind)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_EMIT_DIR", str(tmp_path / "emit"))
    do_bench, seen = counting_bench()
    k = make(kind, do_bench=do_bench)
    assert fk.total(k, 100)
    assert seen and stats()["searches"] == 1 and stats()["calls"]["offline"] == 0
    (art,) = [Artifact.load(p) for p in (tmp_path / "emit").glob("*.json")]
    assert art.kernel == NAME and art.key == key and len(art.provenance["candidates"]) == len(fk.BLOCKS)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")  # a new process on the emitted directory: no search
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "emit"))
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "fresh-cache"))
    autotuner.reset_stats()
    seen.clear()
    k = make(kind, do_bench=do_bench)
    assert fk.total(k, 100) and seen == [] and stats()["calls"]["offline"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_strict_raises_the_same_error_for_both_kinds_before_anything_is_timed(tmp_path, monkeypatch, kind):
    bundle(tmp_path, monkeypatch, kind)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    do_bench, seen = counting_bench()
    k = make(kind, do_bench=do_bench)
    assert fk.total(k, 100)
    with pytest.raises(TierMissError, match=r"kernel m.total: Field `key` has no tuned config for key \{'n': 77.*\} on "
                                            r"device interpreter: FLYTUNE_AUTOTUNE=strict forbids falling back to "
                                            r"a search"):
        fk.total(k, 77)
    assert seen == []


@pytest.mark.parametrize("kind", KINDS)
def test_the_mode_binds_when_a_key_is_decided_not_when_the_kernel_was_adopted(tmp_path, monkeypatch, kind):
    bundle(tmp_path, monkeypatch, kind)
    do_bench, seen = counting_bench()
    k = make(kind, do_bench=do_bench)
    assert fk.total(k, 100) and seen == [] and stats()["calls"]["offline"] == 1
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "fresh-cache"))
    ft.reset_stats()  # the decisions go; the next call decides under FLYTUNE_AUTOTUNE=1
    assert fk.total(k, 100) and seen and stats()["searches"] == 1


def test_an_adopted_kernel_on_the_interpreter_falls_back_to_its_first_config(monkeypatch):
    """Triton's search needs a driver the interpreter does not have ("0 active drivers"): with no
    `do_bench` of its own, an untuned key is served the first config, launched as Triton launches one."""
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "auto")
    k = make("adopted")
    with pytest.warns(FlytuneWarning, match="the interpreter cannot time Triton's search"):
        assert fk.total(k, 77) and fk.total(k, 77)
    assert k.best_config.kwargs == {"BLOCK": 16} and stats()["calls"]["heuristic"] == 2


def test_always_search_on_the_interpreter_times_an_adopted_kernel_on_the_wall_clock(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_EMIT_DIR", str(tmp_path / "emit"))
    k = make("adopted")
    assert fk.total(k, 77)
    (art,) = [Artifact.load(p) for p in (tmp_path / "emit").glob("*.json")]
    assert art.provenance["ranking"] == "measured" and all(c["time_ms"] > 0 for c in art.provenance["candidates"])
    assert "do_bench" not in vars(k) and stats()["searches"] == 1  # Triton's own timer again after the search


def test_verify_execute_that_ran_nothing_fails_and_says_why(tmp_path):
    from buildkit import make_project

    proj = make_project(tmp_path / "p")  # fixpkg.add declares no validate; one artifact is for an H200
    r = flytune("verify", "--deep", "--execute", "--json", proj, PYTHONPATH=f"{proj}{os.pathsep}{ROOT}",
                TRITON_INTERPRET=1)
    assert r.returncode == 1, r.stdout + r.stderr
    (report,) = json.loads(r.stdout)["reports"]
    assert [(x["executed"], x["skipped"]) for x in sorted(report["execution"], key=lambda x: x["device"])] == [
        (False, "tuned for cuda:sm_90:132:NVIDIA H200, not this device (interpreter)"),
        (False, "kernel fixpkg.add declares no `validate`")]
    (err,) = [e for e in report["errors"] if "--execute ran no artifact" in e["rule"]]
    assert "1 artifact(s) skipped: kernel fixpkg.add declares no `validate`" in err["rule"]


def test_verify_execute_json_says_what_ran():
    sample = ROOT / "sample_pkg"
    r = flytune("verify", "--deep", "--execute", "--json", sample, PYTHONPATH=f"{sample}{os.pathsep}{ROOT}",
                TRITON_INTERPRET=1)
    assert r.returncode == 0, r.stdout + r.stderr
    (report,) = json.loads(r.stdout)["reports"]
    ran = [x for x in report["execution"] if x["executed"]]
    assert ran and all(x["ok"] and x["device"] == "interpreter" for x in ran)
    assert all(x["skipped"].startswith("tuned for ") for x in report["execution"] if not x["executed"])
