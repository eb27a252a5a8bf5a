"""Every feature real libraries' `@triton.autotune` kernels use can be tuned, shipped and served:
config pre_hooks, `@triton.heuristics` over `@triton.autotune`, `prune_configs_by` with a perf model,
keyword-passed key arguments, optional tensor arguments, `reset_to_zero`, Triton's whole decorator
signature, for `flytune_build.autotune` kernels and adopted ones alike. Kernels: tests/feature_kernels.py."""
import inspect
import os
import subprocess
import sys
import warnings

import feature_kernels as fk
import pytest
import torch
import triton
from buildkit import tune_pyproject
from conftest import ROOT, counting_bench, flytune, python_env

import flytune_build as ft
from flytune_build import Config, FlytuneWarning
from flytune_build import triton as adapter
from flytune_build.core.artifact import Artifact
from flytune_build.core.device import INTERPRETER, parse_spec
from flytune_build.core.errors import ArtifactExecutionError, TierMissError
from flytune_build.runtime.serving import autotuner, registry

from flytune_build.runtime.searching import bench
H200 = "cuda:sm_90:132:NVIDIA H200"


def arts_dir(tmp_path, monkeypatch, *arts):
    d = tmp_path / "arts"
    for a in arts:
        a.save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    return d


def search_synthetic(monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")


# -- 1. config pre_hooks ------------------------------------------------------------------------------
def test_pre_hook_runs_before_every_candidate_and_every_served_launch(tmp_path, monkeypatch):
    search_synthetic(monkeypatch)
    k = fk.ported_scale("t.hook")
    fk.HOOK_CALLS.clear()
    assert fk.scale(k, 100)  # a search: each candidate ran with its descriptors set by its hook
    winner = k.decision(None, None, 100, 2.0).config.kwargs["BLOCK"]
    assert fk.HOOK_CALLS == [16, 32, 64, winner]
    art = Artifact("t.hook", {"n": 100}, INTERPRETER, Config({"BLOCK": 64}))
    assert "pre_hook" not in art.to_json()["config"]  # the artifact holds the config's data only
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "fresh-cache"))  # a new machine: the bundle serves
    arts_dir(tmp_path, monkeypatch, art)
    fk.HOOK_CALLS.clear()
    assert fk.scale(k, 100) and fk.scale(k, 100)
    assert fk.HOOK_CALLS == [64, 64] and k.decision(None, None, 100, 2.0).tier == "offline"


def test_heuristic_default_gets_the_declared_configs_hook():
    k = fk.ported_scale("t.hookdefault", default=lambda args: {"kwargs": {"BLOCK": 32}, "num_warps": 4,
                                                                 "num_stages": 3, "num_ctas": 1, "maxnreg": None})
    fk.HOOK_CALLS.clear()
    assert fk.scale(k, 100) and fk.HOOK_CALLS == [32]


def test_artifact_matching_no_declared_config_of_a_hooked_kernel_is_refused(tmp_path, monkeypatch):
    arts_dir(tmp_path, monkeypatch, Artifact("t.nohook", {"n": 100}, INTERPRETER, Config({"BLOCK": 128})))
    own = triton.Config({"BLOCK": 16}, pre_hook=fk.set_descriptor_blocks)  # a heuristic with its own hook
    k = fk.ported_scale("t.nohook", default=lambda args: own)
    with pytest.warns(FlytuneWarning, match="matches none of kernel t.nohook's declared configs, which carry "
                                            "pre_hooks") as rec:
        assert fk.scale(k, 100) and fk.scale(k, 100)
    assert len([w for w in rec if "matches none" in str(w.message)]) == 1   # once (a stray warning of another
    assert k.decision(None, None, 100, 2.0).tier == "heuristic"             # cause, a GC's ResourceWarning, aside)


def test_adopt_serves_the_declared_config_with_its_pre_hook(tmp_path, monkeypatch):
    arts_dir(tmp_path, monkeypatch, Artifact("t.ahook", {"n": 100}, INTERPRETER, Config({"BLOCK": 64})),
             Artifact("t.ahook", {"n": 200}, INTERPRETER, Config({"BLOCK": 128})))  # matches no declared config
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "auto")  # an untuned key searches (=0 never searches)
    do_bench, seen = counting_bench()
    k = fk.triton_scale(do_bench=do_bench)
    with pytest.warns(FlytuneWarning, match="rejected: .*matches none of kernel t.ahook's declared configs"):
        assert adapter.adopt(k, name="t.ahook") == 1
    fk.HOOK_CALLS.clear()
    assert fk.scale(k, 100) and seen == [] and fk.HOOK_CALLS == [64]
    assert k.best_config.pre_hook is fk.set_descriptor_blocks
    assert fk.scale(k, 200) and len(seen) == len(fk.BLOCKS)  # refused: Triton searches, hooks and all


def test_recording_captures_a_winner_whose_config_has_a_pre_hook(monkeypatch):
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    k = fk.triton_scale()
    with adapter.recording(k, name="t.rhook") as got:
        assert fk.scale(k, 100)
    (art,) = got
    assert art.key == {"n": 100} and art.config.kwargs["BLOCK"] in fk.BLOCKS
    assert art.provenance["ranking"] == "synthetic" and len(art.provenance["candidates"]) == 3


# -- 2. synthetic ranking reaches Triton's own search; 3. re-tuning an adopted kernel searches ---------
def test_recording_ranks_synthetically_without_a_driver(monkeypatch):
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    k = fk.add_bias_kernel()  # no do_bench: Triton's own benchmarker needs a GPU driver
    with adapter.recording(k, name="t.synth") as got:
        assert fk.add_bias(k, 100, True)
    (art,) = got
    expected = min((Config.coerce(c) for c in k.fn.configs), key=lambda c: bench.synthetic_ms("t.synth", art.key, c))
    assert art.config == expected and art.provenance["ranking"] == "synthetic"
    times = [c["time_ms"] for c in art.provenance["candidates"]]
    assert times == [bench.synthetic_ms("t.synth", art.key, Config.coerce(c)) for c in k.fn.configs]
    assert "_bench" not in vars(k.fn) and "do_bench" not in vars(k.fn)  # Triton's own again


def test_recording_measures_on_the_wall_clock_under_the_interpreter():
    k = fk.add_bias_kernel()
    with adapter.recording(k, name="t.wall") as got:
        assert fk.add_bias(k, 100, False)
    (art,) = got
    assert art.provenance["ranking"] == "measured" and all(c["time_ms"] > 0 for c in art.provenance["candidates"])


def test_retuning_an_adopted_kernel_searches_and_restores_the_seeded_cache(tmp_path, monkeypatch):
    arts_dir(tmp_path, monkeypatch, Artifact("t.retune", {"n": 100, "x": "float32", "bias": "float32",
                                                          "out": "float32"}, INTERPRETER, Config({"BLOCK": 64})))
    k = fk.add_bias_kernel(cache_results=True)
    k.fn.cache_results = True  # as on a GPU (Triton turns its disk cache off under the interpreter)
    assert adapter.adopt(k, name="t.retune") == 1
    assert fk.add_bias(k, 100, True)  # the bundled config enters Triton's cache on the key's first call
    seeded = dict(k.fn.cache)
    assert len(seeded) == 1
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    with adapter.recording(k, name="t.retune") as got:
        assert k.fn.cache == {} and k.fn.cache_results is False  # nothing answers but a search
        assert fk.add_bias(k, 100, True)
    assert len(got) == 1 and len(got[0].provenance["candidates"]) == 6
    assert k.fn.cache == seeded and all(k.fn.cache[t] is v for t, v in seeded.items())
    assert k.fn.cache_results is True


# -- 4. an egg-info left in the project root does not hide the installed bundle -----------------------
def test_egg_info_in_the_project_root_does_not_hide_the_installed_bundle(tmp_path, monkeypatch):
    from flytune_build.core.installed import entry_points as bundle_entry_points

    site, root = tmp_path / "site", tmp_path / "project"
    info = site / "eggpkg-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eggpkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[flytune.bundles]\neggpkg = eggpkg._flytune\n")
    egg = root / "eggpkg.egg-info"
    egg.mkdir(parents=True)
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: eggpkg\nVersion: 1.0\n")
    (egg / "SOURCES.txt").write_text("eggpkg/__init__.py\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(root))  # python run from the project root
    assert [(d, ep.value) for d, ep in bundle_entry_points() if ep.name == "eggpkg"] == [("eggpkg", "eggpkg._flytune")]
    (egg / "entry_points.txt").write_text("[flytune.bundles]\neggpkg = eggpkg._old\n")  # one that declares a bundle
    assert [ep.value for d, ep in bundle_entry_points() if ep.name == "eggpkg"] == ["eggpkg._old"]


# -- 5. adopted kernels in verify --deep --execute; 11. heuristics over autotune, dotted plan entries ----
ADOPTING_PACKAGE = '''
import torch, triton, triton.language as tl
import flytune_build.triton

@triton.heuristics({"HAS_BIAS": lambda args: args["bias"] is not None})
@triton.autotune([triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)], key=["n"])
@triton.jit
def add_bias(x, bias, out, n, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n)
    if HAS_BIAS:
        v += tl.load(bias + offs, mask=offs < n)
    tl.store(out + offs, v, mask=offs < n)

def call(n, with_bias):
    x, out = torch.randn(n), torch.empty(n)
    bias = torch.randn(n) if with_bias else None
    add_bias[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, bias, out, n)
    return x, bias, out

def setup(n, bias):
    return lambda: call(n, bias)

def validate(key):
    x, bias, out = call(key["n"], key["bias"] is not None)
    assert torch.equal(out, x + bias if bias is not None else x)

flytune_build.triton.adopt(add_bias, name="adoptpkg.add_bias", validate=validate)
'''


def adopting_project(tmp_path, entries):
    proj = tmp_path / "adoptproj"
    (proj / "adoptpkg").mkdir(parents=True)
    (proj / "adoptpkg" / "__init__.py").write_text(ADOPTING_PACKAGE)
    (proj / "pyproject.toml").write_text(tune_pyproject("adoptpkg", f"entries = {entries}", output=None))
    return proj


def test_flytune_tune_ships_both_variants_of_an_optional_tensor_and_deep_execute_checks_them(tmp_path):
    """`autotuner = "module:attr.fn"` (the Autotuner under @triton.heuristics), synthetic ranking with no
    driver, `bias=None` and a tensor tuned as two variants of one key, then verify --deep --execute."""
    entries = ('[{ kernel = "adoptpkg.add_bias", setup = "adoptpkg:setup", autotuner = "adoptpkg:add_bias.fn", '
               'shapes = [{ n = 100, bias = true }, { n = 100, bias = false }] }]')
    proj = adopting_project(tmp_path, entries)
    r = flytune("tune", "--project", proj, "--allow-ci", "--no-progress", "--ranking", "synthetic",
                TRITON_INTERPRET=1, FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert r.returncode == 0, r.stdout + r.stderr
    arts = sorted((Artifact.load(p) for p in (proj / "artifacts").glob("*.json")), key=lambda a: str(a.key["bias"]))
    assert [a.key["bias"] for a in arts] == [None, "float32"] and {a.key_axes() for a in arts} == \
        {("bias", "n", "out", "x")}
    assert all(a.provenance["ranking"] == "synthetic" for a in arts)
    r = flytune("verify", "--deep", "--execute", proj, PYTHONPATH=f"{proj}{os.pathsep}{ROOT}", TRITON_INTERPRET=1,
                FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert r.returncode == 0 and "2 artifact(s)" in r.stdout, r.stdout + r.stderr
    Artifact("adoptpkg.add_bias", {**arts[0].key, "n": 50}, INTERPRETER, Config({"BLOCK": 24})).save(
        proj / "artifacts")  # 24 is no power of two: it cannot launch
    r = flytune("verify", "--deep", "--execute", proj, PYTHONPATH=f"{proj}{os.pathsep}{ROOT}", TRITON_INTERPRET=1,
                FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert r.returncode == 1 and "Field `config` failed when executed on interpreter" in r.stdout, r.stdout


def test_adopt_unwraps_heuristics_and_serves_both_optional_tensor_variants(tmp_path, monkeypatch):
    key = {"n": 100, "x": "float32", "out": "float32"}
    arts_dir(tmp_path, monkeypatch, Artifact("t.opt", {**key, "bias": "float32"}, INTERPRETER, Config({"BLOCK": 64})),
             Artifact("t.opt", {**key, "bias": None}, INTERPRETER, Config({"BLOCK": 32}, num_warps=2)))
    do_bench, seen = counting_bench()
    k = fk.add_bias_kernel(do_bench=do_bench)
    assert isinstance(k, triton.runtime.autotuner.Heuristics) and adapter.adopt(k, name="t.opt") == 2
    assert fk.add_bias(k, 100, True) and k.fn.best_config.kwargs == {"BLOCK": 64}
    assert fk.add_bias(k, 100, False) and k.fn.best_config.kwargs == {"BLOCK": 32} and seen == []
    assert registry.kernel("t.opt").public is k


# -- 6. both variants of an optional tensor build into one bundle ------------------------------------------
def test_null_axis_builds_and_verifies(tmp_path):
    from buildkit import make_project, pip_wheel

    key = {"n": 100, "x": "float32", "y": "float32", "out": "float32"}
    arts = [Artifact("fixpkg.add", {**key, "bias": bias}, dev, Config({"BLOCK": block}), {"triton": "3.6.0"})
            for bias, block in ((None, 32), ("float16", 64)) for dev in (INTERPRETER, parse_spec(H200))]
    proj = make_project(tmp_path / "p", artifacts=arts)
    built = pip_wheel(proj, tmp_path / "dist")
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    r = flytune("verify", wheel)
    assert r.returncode == 0 and "4 artifact(s)" in r.stdout, r.stdout + r.stderr


# -- 7. prune_configs_by with a perf model and a keyword argument; 8. keyword key arguments hit the memo --
def test_perf_model_and_early_prune_see_each_argument_once(monkeypatch):
    search_synthetic(monkeypatch)
    fk.SEEN["perf_model"].clear()
    fk.SEEN["early_config_prune"].clear()
    k = fk.ported_matmul("t.perf", top_k=2)
    assert fk.matmul(k, K=16)
    (early,) = fk.SEEN["early_config_prune"]
    assert early[1] == ["ACTIVATION"] and "ACTIVATION" not in early[0] and early[2] == "Config"
    assert len(fk.SEEN["perf_model"]) == 4  # the four configs with BLOCK_K <= K
    d = k.decision(*[None] * 3, 32, 32, 16, *[None] * 6, ACTIVATION="relu")
    assert len(d.search.candidates) == 2


def test_keyword_key_arguments_hit_the_memo(monkeypatch):
    k = fk.ported_matmul("t.kwkey", default=lambda a: Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}))
    seen = []
    with ft.on_decision(seen.append):
        for _ in range(4):
            assert fk.matmul(k, activation="relu")
        assert fk.matmul(k, activation="none")
    assert [e["key"]["ACTIVATION"] for e in seen] == ["relu", "none"]
    assert ft.stats()["t.kwkey"]["calls"]["heuristic"] == 5


# -- 9. adopted kernels report and warn like ported ones ------------------------------------------------
def test_adopted_kernel_reports_decisions_and_stats(tmp_path, monkeypatch, capsys):
    arts_dir(tmp_path, monkeypatch, Artifact("t.rep", {"n": 100, "x": "float32", "total": "float32"}, INTERPRETER,
                                             Config({"BLOCK": 32})))
    monkeypatch.setenv("FLYTUNE_PRINT_AUTOTUNING", "1")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "auto")  # an untuned key searches (=0 never searches)
    do_bench, seen = counting_bench()
    k = fk.triton_total(do_bench=do_bench)
    adapter.adopt(k, name="t.rep")
    events = []
    with ft.on_decision(events.append):
        assert fk.total(k, 100) and fk.total(k, 100) and fk.total(k, 100)
        assert fk.total(k, 77) and fk.total(k, 77)  # untuned: Triton searches (reset_to_zero between candidates)
    assert [(e["tier"], e["key"]["n"]) for e in events] == [("offline", 100), ("search", 77)]
    s = ft.stats()["t.rep"]
    assert s["calls"] == {"scratch": 1, "offline": 3, "heuristic": 0, "search": 1} and s["searches"] == 1
    assert s["offline_levels"] == {"exact": 3}
    err = capsys.readouterr().err
    assert err.count("[flytune] t.rep") == 2 and "tier=offline level=exact" in err


def test_adopted_kernel_warns_once_on_another_device(tmp_path, monkeypatch):
    arts_dir(tmp_path, monkeypatch, Artifact("t.dev", {"n": 100, "x": "float32", "total": "float32"}, INTERPRETER,
                                             Config({"BLOCK": 32})))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200)
    autotuner.reset_stats()
    with pytest.warns(FlytuneWarning, match=r"kernel t.dev: no artifact matches this device \(cuda:sm_90:132:NVIDIA "
                                            r"H200\); bundled for: interpreter") as rec:
        assert adapter.adopt(fk.triton_total(), name="t.dev") == 0
    assert len(rec) == 1 and list(ft.stats()["t.dev"]["fallbacks"].values()) == [1]


def test_failing_launch_of_an_adopted_artifact_names_it(tmp_path, monkeypatch):
    arts_dir(tmp_path, monkeypatch, Artifact("t.afail", {"n": 100, "x": "float32", "total": "float32"}, INTERPRETER,
                                             Config({"BLOCK": 24})))
    k = fk.triton_total()
    assert adapter.adopt(k, name="t.afail") == 1
    with pytest.raises(ArtifactExecutionError, match=r"t\.afail-[0-9a-f]{16}\.json .*failed to compile or launch"):
        fk.total(k, 100)


# -- 10. coverage knows the planned kernels -------------------------------------------------------------
def test_coverage_all_fails_on_a_planned_kernel_without_artifacts(tmp_path):
    from buildkit import artifact, make_project

    extra = ('[tool.flytune.tune]\nentries = [{ kernel = "fixpkg.add", setup = "fixpkg:add", shapes = [{ n = 1 }] },'
             ' { kernel = "fixpkg.other", setup = "fixpkg:add", shapes = [{ n = 1 }] }]\n')
    proj = make_project(tmp_path / "p", extra=extra, artifacts=[artifact()])
    r = flytune("verify", proj)
    assert r.returncode == 1 and "kernel fixpkg.other has no artifact for target interpreter" in r.stdout, r.stdout


# -- 12. Triton's whole decorator signature --------------------------------------------------------------
def test_autotune_takes_tritons_arguments_in_tritons_order():
    ours = list(inspect.signature(ft.autotune).parameters)
    theirs = list(inspect.signature(triton.autotune).parameters)
    assert ours[:len(theirs)] == theirs


def test_tritons_hooks_and_do_bench_signature_are_honoured(monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    calls = []

    def do_bench(kernel_call, quantiles):
        kernel_call()
        calls.append(("bench", quantiles))
        return [float(len(calls)), 0.0, 0.0]

    def pre_hook(nargs, reset_only=False):
        calls.append(("pre", nargs["BLOCK"], reset_only))
        nargs["total"].zero_()

    def post_hook(nargs, exception):
        calls.append(("post", nargs["BLOCK"], exception))

    autotune_cache_kwargs = {"cache_results": True}  # fla passes **autotune_cache_kwargs
    k = ft.autotune([Config({"BLOCK": b}) for b in fk.BLOCKS], ["n"], None, None, None, pre_hook, post_hook,
                    10, 20, False, do_bench, name="t.hooks", **autotune_cache_kwargs)(fk._total)
    assert fk.total(k, 100)
    assert calls[:3] == [("pre", 16, False), ("post", 16, None), ("bench", (0.5, 0.2, 0.8))]
    assert calls[-1] == ("pre", 16, True) and sum(c[0] == "bench" for c in calls) >= 3  # near-ties re-timed
    assert k.num_warmups == 10 and k.num_reps == 20  # Triton's attribute names; `warmup` is the method


def test_empty_configs_mean_one_default_config_as_in_triton():
    k = ft.autotune([], key=["n"], name="t.empty")(fk._total)
    assert k.configs == [Config()]


# -- strict mode: a tuned kernel must hit -------------------------------------------------------------------
def test_strict_mode_raises_for_a_ported_kernel_that_would_fall_back(tmp_path, monkeypatch):
    arts_dir(tmp_path, monkeypatch, Artifact("t.strict", {"n": 100}, INTERPRETER, Config({"BLOCK": 64})))
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    k = fk.ported_scale("t.strict", default=lambda a: Config({"BLOCK": 16}))
    assert fk.scale(k, 100)
    with pytest.raises(TierMissError, match=r"kernel t.strict: Field `key` has no tuned config for key \{'n': 77\} on "
                                            r"device interpreter.*the heuristic"):
        fk.scale(k, 77)
    assert isinstance(TierMissError("x"), RuntimeError) and ft.TierMissError is TierMissError


def test_strict_mode_raises_for_an_adopted_kernel_before_anything_is_timed(tmp_path, monkeypatch):
    arts_dir(tmp_path, monkeypatch, Artifact("t.astrict", {"n": 100, "x": "float32", "total": "float32"},
                                             INTERPRETER, Config({"BLOCK": 32})))
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    do_bench, seen = counting_bench()
    k = fk.triton_total(do_bench=do_bench)
    adapter.adopt(k, name="t.astrict")
    assert fk.total(k, 100)
    with pytest.raises(TierMissError, match=r"kernel t.astrict: .*'n': 77.*on device interpreter.*a search"):
        fk.total(k, 77)
    assert seen == []


# -- flytune tune: a typo in --kernel, a failing setup ----------------------------------------------------
def test_tune_names_an_unknown_kernel_and_lists_the_known_ones(tmp_path):
    proj = adopting_project(tmp_path, '[{ kernel = "adoptpkg.add_bias", setup = "adoptpkg:setup", '
                                      'autotuner = "adoptpkg:add_bias", shapes = [{ n = 100, bias = true }] }]')
    r = flytune("tune", "--project", proj, "--allow-ci", "--kernel", "adoptpkg.add_bais", TRITON_INTERPRET=1)
    assert r.returncode == 2
    assert "kernel adoptpkg.add_bais: not in the tuning plan (its kernels: adoptpkg.add_bias)" in r.stderr


def test_a_failing_setup_is_that_entrys_failure_and_the_rest_is_tuned(tmp_path):
    entries = ('[{ kernel = "adoptpkg.broken", setup = "adoptpkg:nosuch", shapes = [{ n = 1 }] }, '
               '{ kernel = "adoptpkg.add_bias", setup = "adoptpkg:setup", autotuner = "adoptpkg:add_bias", '
               'shapes = [{ n = 100, bias = true }] }]')
    proj = adopting_project(tmp_path, entries)
    r = flytune("tune", "--project", proj, "--allow-ci", "--no-progress", "--ranking", "synthetic",
                TRITON_INTERPRET=1, FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "adoptpkg:nosuch" in r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("adoptpkg.")}
    assert "failed" in rows["adoptpkg.broken"] and "tuned" in rows["adoptpkg.add_bias"]
    assert len(list((proj / "artifacts").glob("*.json"))) == 1


# -- examples/triton_features: its committed interpreter artifacts serve its kernels -------------------------
def test_example_serves_its_interpreter_plan_with_zero_searches(tmp_path):
    example = ROOT / "examples" / "triton_features"
    r = subprocess.run([sys.executable, ROOT / "benchmarks" / "h200_features.py", "serve",
                        example / "tune" / "interpreter.toml"], capture_output=True, text=True, cwd=tmp_path,
                       env=python_env(PYTHONPATH=f"{example}{os.pathsep}{ROOT}", TRITON_INTERPRET=1,
                                      FLYTUNE_ARTIFACT_DIR=example / "artifacts" / "interpreter",
                                      FLYTUNE_CACHE_DIR=tmp_path / "c"))
    assert r.returncode == 0 and "zero searches" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("deprecated", [{"warmup": 5, "rep": 5}, {"use_cuda_graph": True}])
def test_recording_times_on_the_wall_clock_where_triton_made_the_timer(monkeypatch, deprecated):
    """Triton turns the deprecated `warmup`, `rep`, `use_cuda_graph` into a `do_bench` of its own over
    its GPU benchmarkers: not the kernel's timer, so under the interpreter recording times on the wall
    clock, as it does with no `do_bench`."""
    monkeypatch.setenv("FLYTUNE_RANKING", "measured")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Triton's, for these arguments
        k = fk.triton_total(**deprecated)
    with adapter.recording(k, "t.deprecated") as captured:
        assert fk.total(k, 100)
    (art,) = captured
    assert art.provenance["ranking"] == "measured" and len(art.provenance["candidates"]) == len(fk.BLOCKS)


def test_a_pre_hook_the_pruner_attaches_runs_on_every_tier(tmp_path, monkeypatch):
    """`early_config_prune` may return configs carrying a pre_hook the declared ones lack (gemlite's
    split-K `init_to_zero`): the search launches each with it, and a winner served later from the
    scratch cache or an artifact gets it from the pruner's config with its data for that call."""
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    monkeypatch.setenv("FLYTUNE_EMIT_DIR", str(tmp_path / "arts"))
    k = fk.pruned_total(ft.autotune, name="t.prunehook")
    assert fk.dirty_total(k, 100) and fk.dirty_total(k, 100)  # searched, then the remembered winner
    (art,) = [Artifact.load(p) for p in (tmp_path / "arts").glob("*.json")]
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")  # served, never searched
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "fresh-cache"))  # the offline tier, not scratch
    arts_dir(tmp_path, monkeypatch, art)
    k = fk.pruned_total(ft.autotune, name="t.prunehook")
    assert fk.dirty_total(k, 100)
    assert ft.stats()["t.prunehook"]["calls"]["offline"] == 1


def test_a_pruner_attaching_a_pre_hook_is_decided_ahead_with_it(tmp_path, monkeypatch):
    """The pruner reads no argument: a warm-up decides the key from stand-ins, and the config it serves
    carries the pruner's hook, which the first call (a hit) runs on its own tensors."""
    from flytune_build.runtime.warming import binder

    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "fresh-cache"))
    arts_dir(tmp_path, monkeypatch, Artifact("t.prunehook_ahead", {"n": 100}, INTERPRETER, Config({"BLOCK": 32})))
    k = fk.pruned_total(ft.autotune, name="t.prunehook_ahead")
    d = k.prime(x=binder.Pointer(torch.float32, True), total=binder.Pointer(torch.float32, True), n=100)
    assert d is not None and d.tier == "offline" and d.hook is not None
    assert fk.dirty_total(k, 100) and d.calls == 1   # the garbage zeroed by the hook decided ahead


def test_the_examples_pruned_matmul_is_decided_ahead_from_its_recorded_launch(tmp_path):
    """examples/triton_features' matmul (`early_config_prune` reading M, N, K; a perf_model; top_k): the
    warm-up's stand-ins, built from its artifact's recorded specialization, decide its key ahead."""
    example = ROOT / "examples" / "triton_features"
    script = (
        "import glob, json, torch\n"
        "from flytune_build.core.codec import Fields\n"
        "from flytune_build.core.config import Config\n"
        "from flytune_build.core.errors import ArtifactError\n"
        "from flytune_build.runtime.warming import binder\n"
        "from triton_features import kernels\n"
        "(path,) = glob.glob('artifacts/interpreter/triton_features.matmul-*.json')\n"
        "art = json.load(open(path))\n"
        "config = Config.from_json(art['config'], Fields(path, ArtifactError))\n"
        "k = kernels.matmul_kernel\n"
        "named = binder.stand_ins(art['provenance']['specialization'], config, art['key'], exclude=set(k.tuned_kwargs))\n"
        "d = k.prime(**named)\n"
        "assert d is not None and d.tier == 'offline' and d.config == config, d\n"
        "a, b = torch.randn(128, 128), torch.randn(128, 128)\n"
        "c = kernels.matmul(a, b)\n"
        "assert d.calls == 1, d.calls\n"
        "torch.testing.assert_close(c, torch.nn.functional.leaky_relu(a @ b, 0.01), atol=1e-2, rtol=1e-2)\n"
        "print('decided ahead')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=example,
                       env=python_env(PYTHONPATH=f"{example}{os.pathsep}{ROOT}", TRITON_INTERPRET=1,
                                      FLYTUNE_ARTIFACT_DIR=example / "artifacts" / "interpreter",
                                      FLYTUNE_CACHE_DIR=tmp_path / "c"))
    assert r.returncode == 0 and "decided ahead" in r.stdout, r.stdout + r.stderr


def test_an_adopted_kernel_gets_the_pre_hook_its_pruner_attaches(tmp_path, monkeypatch):
    """An adopted kernel whose pruner attaches a pre_hook is seeded with the pruner's config for the call
    (its hook with it), and an artifact none of the pruner's hooked configs matches is refused."""
    k = fk.pruned_total(triton.autotune)
    with adapter.recording(k, "t.adoptprune") as captured:
        assert fk.dirty_total(k, 100)
    (art,) = captured
    arts_dir(tmp_path, monkeypatch, art)
    k = fk.pruned_total(triton.autotune)
    assert adapter.adopt(k, name="t.adoptprune") == 1
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    assert fk.dirty_total(k, 100) and fk.dirty_total(k, 100)
    assert ft.stats()["t.adoptprune"]["calls"]["offline"] == 2
    stray = Artifact("t.adoptprune", dict(art.key), INTERPRETER, Config({"BLOCK": 128}))
    (tmp_path / "arts" / art.filename).unlink()
    arts_dir(tmp_path, monkeypatch, stray)
    k = fk.pruned_total(triton.autotune)
    adapter.adopt(k, name="t.adoptprune")
    with pytest.warns(FlytuneWarning, match="none of the configs early_config_prune makes"):
        with pytest.raises(TierMissError):
            fk.dirty_total(k, 100)


def test_a_pruner_config_top_k_would_cut_is_still_served_and_only_hooked_ones_must_match(tmp_path, monkeypatch):
    """The served config is checked against what `early_config_prune` returns, before `top_k`: a config
    the pruner returns without a hook is served although the perf model would not rank it first."""
    def prune(configs, nargs, **kw):  # hooks only BLOCK=16, as gemlite hooks only its split-K configs
        return [triton.Config(dict(c.kwargs), pre_hook=fk._zero_total if c.kwargs["BLOCK"] == 16 else None)
                for c in configs]

    k = ft.autotune([triton.Config({"BLOCK": b}) for b in fk.BLOCKS], key=["n"], name="t.topk",
                    prune_configs_by={"early_config_prune": prune, "perf_model": lambda BLOCK, **_: BLOCK,
                                      "top_k": 1}, reset_to_zero=["total"])(fk._total)
    arts_dir(tmp_path, monkeypatch, Artifact("t.topk", {"n": 100}, INTERPRETER, Config({"BLOCK": 64})))
    assert fk.total(k, 100)
    assert ft.stats()["t.topk"]["calls"]["offline"] == 1 and not ft.stats()["t.topk"]["fallbacks"]


def test_warmup_runs_no_pre_hook_and_takes_dtypes(tmp_path, monkeypatch):
    """As Triton's: a warm-up changes no tensor, and dtypes may stand for tensors."""
    arts_dir(tmp_path, monkeypatch, Artifact("t.warmhook", {"n": 100}, INTERPRETER, Config({"BLOCK": 32})))
    k = fk.pruned_total(ft.autotune, name="t.warmhook")
    total = torch.full((1,), 7.0)
    assert k.warmup(torch.arange(100, dtype=torch.float32), total, 100, grid=(4,)) == [None]
    assert total.item() == 7.0
    assert k.warmup(torch.float32, torch.float32, 100, grid=(4,)) == [None]


def test_an_adopted_pruned_kernel_counts_its_calls_after_a_stats_reset(tmp_path, monkeypatch):
    arts_dir(tmp_path, monkeypatch, Artifact("t.prunereset", {"n": 100, "x": "float32", "total": "float32"},
                                             INTERPRETER, Config({"BLOCK": 32})))
    k = fk.pruned_total(triton.autotune)
    assert adapter.adopt(k, name="t.prunereset") == 1
    ft.reset_stats()
    assert fk.dirty_total(k, 100) and fk.dirty_total(k, 100)
    assert ft.stats()["t.prunereset"]["calls"]["offline"] == 2


def test_a_thread_seeding_a_key_does_not_hide_another_threads_tuned_key(tmp_path, monkeypatch):
    """Thread A is inside the re-seeded call (its pre_hook blocks); thread B's first call of another
    tuned key is served too, not taken for an untuned key."""
    import threading

    entered, release = threading.Event(), threading.Event()

    def hook(nargs):
        nargs["total"].zero_()
        if nargs["n"] == 100 and threading.current_thread().name == "A":
            entered.set()
            release.wait(20)

    def prune(configs, nargs, **kw):
        return [triton.Config(dict(c.kwargs), pre_hook=hook) for c in configs]

    k = triton.autotune([triton.Config({"BLOCK": b}) for b in fk.BLOCKS], key=["n"],
                        prune_configs_by={"early_config_prune": prune})(fk._total)
    arts_dir(tmp_path, monkeypatch, *[Artifact("t.threads", {"n": n, "x": "float32", "total": "float32"},
                                               INTERPRETER, Config({"BLOCK": 32})) for n in (100, 200)])
    assert adapter.adopt(k, name="t.threads") == 2
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    errors = []
    a = threading.Thread(target=lambda: fk.dirty_total(k, 100) or errors.append("wrong"), name="A")
    a.start()
    assert entered.wait(20)
    try:
        assert fk.dirty_total(k, 200)
    finally:
        release.set()
        a.join(20)
    assert not errors and ft.stats()["t.threads"]["calls"]["offline"] == 2
