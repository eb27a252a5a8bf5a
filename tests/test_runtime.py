import json
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from conftest import python_env
from kernels import (
    ADD_CONFIGS,
    grid,
    make_accumulate,
    make_add,
    make_iadd,
    nearest,
    pow2,
)

import flytune_build as ft
from flytune_build import Config, FlytuneWarning, reset_stats
from flytune_build.core.artifact import Artifact
from flytune_build.core.device import INTERPRETER, DeviceIdentity
from flytune_build.core.errors import (
    ArtifactExecutionError,
    DeclarationError,
    SearchError,
)
from flytune_build.runtime.serving import autotuner
from flytune_build.runtime.searching import bench, selection
from flytune_build.core import installed

N = 100


def tensors(n=N, dtype=torch.float32):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, generator=g, dtype=dtype), torch.randn(n, generator=g, dtype=dtype), torch.empty(n, dtype=dtype)


def add(k, n=N, dtype=torch.float32):
    x, y, out = tensors(n, dtype)
    k[grid(n)](x, y, out, n)
    assert torch.equal(out, x + y)
    return out


def artifact_dir(tmp_path, monkeypatch, kernel, key, config, dev=INTERPRETER):
    d = tmp_path / "artifacts"
    Artifact(kernel, key, dev, Config.coerce(config)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    return d


def calls(k):
    return ft.stats()[k.name]["calls"]


# -- tiers ------------------------------------------------------------------------------------------
def test_heuristic_default_serves_with_zero_search():
    k = make_add("t.heur", default=lambda a: Config({"BLOCK": 32}))
    add(k)
    add(k)
    s = ft.stats()["t.heur"]
    assert s["calls"] == {"scratch": 0, "offline": 0, "heuristic": 2, "search": 0} and s["searches"] == 0


def test_switch_off_without_default_uses_first_config_with_one_warning():
    k = make_add("t.first")
    with pytest.warns(FlytuneWarning, match="first config") as rec:
        add(k)
        add(k, n=50)
    assert len([w for w in rec if "first config" in str(w.message)]) == 1
    assert k.decision(*tensors(), N).config == ADD_CONFIGS[0]
    assert calls(k)["heuristic"] == 2 and ft.stats()["t.first"]["searches"] == 0


def test_search_only_when_no_tier_answers_then_scratch_serves(monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    k = make_add("t.search")
    add(k)
    add(k)
    assert calls(k) == {"scratch": 1, "offline": 0, "heuristic": 0, "search": 1}
    assert ft.stats()["t.search"]["searches"] == 1
    winner = k.decision(*tensors(), N).config
    k.reset()  # a new process: the scratch file answers
    add(k)
    assert calls(k)["scratch"] == 1 and ft.stats()["t.search"]["searches"] == 0
    assert k.decision(*tensors(), N).config == winner
    expected = min(ADD_CONFIGS, key=lambda c: bench.synthetic_ms("t.search", {"x": "float32", "n": N}, c))
    assert winner == expected


def test_force_search_emits_artifact_that_offline_tier_serves(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    monkeypatch.setenv("FLYTUNE_EMIT_DIR", str(tmp_path / "emit"))
    k = make_add("t.emit", default=lambda a: Config({"BLOCK": 16}))
    add(k)
    assert ft.stats()["t.emit"]["searches"] == 1
    (path,) = (tmp_path / "emit").iterdir()
    art = Artifact.load(path, canonical=True)
    assert art.kernel == "t.emit" and art.key == {"x": "float32", "n": N} and art.device == INTERPRETER
    assert art.provenance["ranking"] == "synthetic" and len(art.provenance["candidates"]) == len(ADD_CONFIGS)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "emit"))
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "fresh-cache"))
    autotuner.reset_stats()
    add(k)
    d = k.decision(*tensors(), N)
    assert d.tier == "offline" and d.level == "exact" and d.config == art.config
    assert ft.stats()["t.emit"]["searches"] == 0


@pytest.mark.parametrize("kind", ["ported", "adopted"])
def test_an_emit_dir_that_cannot_be_written_is_said_and_the_searched_winner_still_serves(tmp_path, monkeypatch,
                                                                                        kind):
    """FLYTUNE_EMIT_DIR a file: a ported kernel searched in full, then raised OutputError, at every call
    (three calls, three searches); an adopted one raised once, then emitted nothing and said nothing."""
    from test_triton_adapter import make

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    monkeypatch.setenv("FLYTUNE_EMIT_DIR", str(tmp_path / "afile"))
    if kind == "ported":
        k = make_add("t.emitfile", default=lambda a: Config({"BLOCK": 16}))
    else:
        k = make()
        ft.triton.adopt(k, name="t.emitfile")
    with pytest.warns(FlytuneWarning, match=r"kernel t.emitfile: the searched winner for key .* was not saved to "
                                            r"FLYTUNE_EMIT_DIR=.*afile \(.*afile is not a directory\)"):
        add(k)
    for _ in range(2):
        add(k)
    assert ft.stats()["t.emitfile"]["searches"] == 1 and (tmp_path / "afile").read_text() == "x"


def test_offline_tier_beats_heuristic_and_never_writes_scratch(tmp_path, monkeypatch):
    k = make_add("t.offline", default=lambda a: Config({"BLOCK": 16}))
    artifact_dir(tmp_path, monkeypatch, "t.offline", {"x": "float32", "n": N}, Config({"BLOCK": 64}, num_warps=2))
    add(k)
    add(k, n=N + 1)  # untuned shape
    assert calls(k) == {"scratch": 0, "offline": 1, "heuristic": 1, "search": 0}
    assert ft.stats()["t.offline"]["offline_levels"] == {"exact": 1}
    assert not (tmp_path / "scratch-cache").exists()


def test_scratch_beats_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    k = make_add("t.order")
    add(k)
    searched = k.decision(*tensors(), N).config
    other = next(c for c in ADD_CONFIGS if c != searched)
    artifact_dir(tmp_path, monkeypatch, "t.order", {"x": "float32", "n": N}, other)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
    add(k)
    assert k.decision(*tensors(), N).tier == "scratch" and k.decision(*tensors(), N).config == searched


def test_other_device_falls_back_to_heuristic_with_one_warning(tmp_path, monkeypatch):
    k = make_add("t.otherdev", default=lambda a: Config({"BLOCK": 16}))
    h200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
    artifact_dir(tmp_path, monkeypatch, "t.otherdev", {"x": "float32", "n": N}, Config({"BLOCK": 64}), dev=h200)
    with pytest.warns(FlytuneWarning, match="no artifact matches this device") as rec:
        add(k)
        add(k, n=N + 1)
    assert len(rec) == 1
    assert calls(k)["heuristic"] == 2


def test_match_levels_and_accepted_levels(tmp_path, monkeypatch):
    tuned = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
    k = make_add("t.levels", default=lambda a: Config({"BLOCK": 16}))
    artifact_dir(tmp_path, monkeypatch, "t.levels", {"x": "float32", "n": N}, Config({"BLOCK": 64}), dev=tuned)
    monkeypatch.setenv("FLYTUNE_DEVICE", "cuda:sm_90:132:NVIDIA H200 NVL")
    reset_stats()
    idx = k.offline_index()
    assert [h.level for h in idx.hits.values()] == ["arch_units"]
    monkeypatch.setenv("FLYTUNE_DEVICE", "cuda:sm_90:16:NVIDIA H200")  # a MIG slice: not accepted by default
    autotuner.reset_stats()
    assert not k.offline_index() and k.offline_index().other_devices


@pytest.mark.parametrize("config,reason", [
    ({"kwargs": {"BLOCK": 64, "UNROLL": 2}}, "binds to no parameter"),
    ({"kwargs": {"BLOCK": 64, "kpack": 2}}, "a compiler option of Triton's hip backend, which none of the kernel's "
                                            "declared configs sets"),
    ({"kwargs": {"BLOCK": 64, "n": 3}}, "overrides a key parameter"),
    ({"kwargs": {"BLOCK": "64"}}, "must be int like the declared configs"),
    ({"kwargs": {}}, "does not set BLOCK"),
])
def test_invalid_artifact_falls_back_with_its_reason(tmp_path, monkeypatch, config, reason):
    k = make_add("t.invalid", default=lambda a: Config({"BLOCK": 16}))
    d = tmp_path / "a"
    d.mkdir()
    doc = Artifact("t.invalid", {"x": "float32", "n": N}, INTERPRETER, Config({"BLOCK": 64})).to_json()
    doc["config"] = {**doc["config"], **config}
    name = Artifact.from_json(doc).filename
    (d / name).write_text(json.dumps(doc))
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    with pytest.warns(FlytuneWarning, match=reason):
        add(k)
    assert calls(k)["heuristic"] == 1
    assert any(reason in r for r in ft.stats()["t.invalid"]["fallbacks"])


@triton.jit
def _probe(x, out, n, BLOCK: tl.constexpr, S: tl.constexpr = 1, EVEN: tl.constexpr = False):
    tl.store(out, BLOCK + tl.load(x) * 0)   # writes the BLOCK it was launched with


@pytest.mark.parametrize("configs, served", [
    # EVEN set by one declared config only: an artifact may leave it to the kernel's default, as the others do
    ([Config({"BLOCK": 16}), Config({"BLOCK": 32, "EVEN": True}), Config({"BLOCK": 64})], Config({"BLOCK": 64})),
    # S declared 1 in one config and 0.5 in another, in either order: both types are S's
    ([Config({"BLOCK": 16, "S": 1}), Config({"BLOCK": 64, "S": 0.5})], Config({"BLOCK": 64, "S": 0.5})),
    ([Config({"BLOCK": 64, "S": 0.5}), Config({"BLOCK": 16, "S": 1})], Config({"BLOCK": 16, "S": 1})),
    ([Config({"BLOCK": 16, "S": None}), Config({"BLOCK": 64, "S": 8})], Config({"BLOCK": 16, "S": None})),
])
def test_an_artifact_of_a_declared_config_is_served_whatever_the_others_set(tmp_path, monkeypatch, configs, served):
    """Every tuned parameter was required and its type was the last declared config's: flytune's own
    searched winner ({"BLOCK": 64}, beside a config setting EVEN) was refused by the scratch and offline
    tiers, and the searches ran again in every process."""
    k = ft.autotune(configs, ["n"], name="t.partial")(_probe)
    artifact_dir(tmp_path, monkeypatch, "t.partial", {"n": 101}, served)
    x, out = torch.zeros(4), torch.zeros(1)
    k[(1,)](x, out, 101)
    assert calls(k)["offline"] == 1 and out.item() == served.kwargs["BLOCK"]
    assert not ft.stats()["t.partial"]["fallbacks"]


def test_an_artifact_must_still_set_what_every_declared_config_sets(tmp_path, monkeypatch):
    k = ft.autotune([Config({"BLOCK": 16, "S": 2}), Config({"BLOCK": 32, "S": 2, "EVEN": True})], ["n"],
                    name="t.partial_unset")(_probe)
    artifact_dir(tmp_path, monkeypatch, "t.partial_unset", {"n": 101}, Config({"BLOCK": 32}))
    with pytest.warns(FlytuneWarning, match="does not set S"):
        k[(1,)](torch.zeros(4), torch.zeros(1), 101)
    assert calls(k)["offline"] == 0


def test_artifact_overriding_a_caller_argument_is_rejected(tmp_path, monkeypatch):
    k = make_add("t.caller", key=("n",), default=lambda a: Config({"BLOCK": 16}))
    d = tmp_path / "a"
    d.mkdir()
    doc = Artifact("t.caller", {"n": N}, INTERPRETER, Config({"BLOCK": 64})).to_json()
    doc["config"]["kwargs"]["x"] = 1
    (d / Artifact.from_json(doc).filename).write_text(json.dumps(doc))
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    with pytest.warns(FlytuneWarning, match="overrides an argument the caller passed"):
        add(k)


def test_key_axes_mismatch_is_a_fallback_reason(tmp_path, monkeypatch):
    k = make_add("t.axes", default=lambda a: Config({"BLOCK": 16}))
    artifact_dir(tmp_path, monkeypatch, "t.axes", {"n": N}, Config({"BLOCK": 64}))
    with pytest.warns(FlytuneWarning, match="key axes"):
        add(k)
    assert calls(k)["heuristic"] == 1


def test_accepted_artifact_failure_is_not_masked(tmp_path, monkeypatch):
    k = make_add("t.loud", default=lambda a: Config({"BLOCK": 16}))
    # BLOCK=48 binds and has the right type, but tl.arange needs a power of two: the launch fails
    artifact_dir(tmp_path, monkeypatch, "t.loud", {"x": "float32", "n": N}, Config({"BLOCK": 48}))
    x, y, out = tensors()
    with pytest.raises(ArtifactExecutionError) as e:
        k[grid(N)](x, y, out, N)
    assert "t.loud-" in str(e.value) and "BLOCK=48" in str(e.value)
    with pytest.raises(ArtifactExecutionError):
        k[grid(N)](x, y, out, N)  # never retried with the default
    assert calls(k)["heuristic"] == 0


@pytest.mark.parametrize("call, error", [
    (lambda k, x, out: k[(1,)](x, out, 100, num_warps=8), TypeError),           # a keyword the config sets
    (lambda k, x, out: k[(1,)](x, out, 100, 5, 6), TypeError),                  # more arguments than parameters
    (lambda k, x, out: k[(1,)](x, out, n=100, BLOCK=64), TypeError),            # the tuned constexpr itself
    (lambda k, x, out: k[(1,)](x, out, 2 ** 70), (OverflowError, ValueError)),  # no launch passes it
])
def test_a_callers_mistake_on_an_offline_key_is_the_callers_error_not_the_artifacts(tmp_path, monkeypatch, call,
                                                                                   error):
    """It was an ArtifactExecutionError naming the accepted artifact, which is sound: the same mistake on a
    heuristic key is Triton's own error, and now so is it on an offline key, noted as the call's."""
    artifact_dir(tmp_path, monkeypatch, "t.mistake", {"n": 100}, Config({"BLOCK": 64}))
    k = ft.autotune([Config({"BLOCK": b}) for b in (16, 32, 64)], [ft.nearest("n")], name="t.mistake")(_probe)
    x, out = torch.zeros(4), torch.zeros(1)
    k[(1,)](x, out, 100)
    assert calls(k)["offline"] == 1 and out.item() == 64
    with pytest.raises(error) as e:
        call(k, x, out)
    assert not isinstance(e.value, ArtifactExecutionError)
    assert any("the call's own error, not the accepted artifact t.mistake-" in n for n in e.value.__notes__)


def test_corrupt_shard_or_artifact_file_is_ignored_with_warning(tmp_path, monkeypatch):
    k = make_add("t.corrupt", default=lambda a: Config({"BLOCK": 16}))
    d = artifact_dir(tmp_path, monkeypatch, "t.corrupt", {"x": "float32", "n": N}, Config({"BLOCK": 64}))
    (f,) = d.iterdir()
    f.write_bytes(f.read_bytes()[:30])
    with pytest.warns(FlytuneWarning, match="not valid JSON"):
        add(k)
    assert calls(k)["heuristic"] == 1


# -- semantics under search -------------------------------------------------------------------------
@pytest.mark.parametrize("tier", ["search", "scratch", "offline"])
def test_in_place_kernel_gives_reference_result_on_every_tier(tmp_path, monkeypatch, tier):
    k = make_iadd(f"t.iadd_{tier}")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "")
    if tier == "offline":
        artifact_dir(tmp_path, monkeypatch, k.name, {"n": N}, Config({"BLOCK": 32}))
    if tier == "scratch":
        x, y, _ = tensors()
        k[grid(N)](x, y, N)
        k.reset()
    x, y, _ = tensors()
    ref = x + y
    k[grid(N)](x, y, N)
    assert torch.equal(x, ref)
    assert k.decision(x, y, N).first_tier == tier


@pytest.mark.parametrize("tier", ["search", "scratch", "offline"])
def test_atomic_accumulate_gives_reference_result_on_every_tier(tmp_path, monkeypatch, tier):
    k = make_accumulate(f"t.acc_{tier}")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "")
    if tier == "offline":
        artifact_dir(tmp_path, monkeypatch, k.name, {"n": N}, Config({"BLOCK": 32}))
    x = torch.arange(N, dtype=torch.float32)
    if tier == "scratch":
        k[grid(N)](x, torch.zeros(1), N)
        k.reset()
    total = torch.zeros(1)
    k[grid(N)](x, total, N)
    assert total.item() == pytest.approx(x.sum().item())
    assert k.decision(x, total, N).first_tier == tier


def test_search_restores_caller_inputs_even_when_candidates_fail(monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    bad = [Config({"BLOCK": 48}), Config({"BLOCK": 32})]
    from kernels import _iadd

    k = ft.autotune(bad, ["n"], name="t.partial", restore_value=["x"])(_iadd)
    x, y, _ = tensors()
    ref = x + y
    k[grid(N)](x, y, N)
    assert torch.equal(x, ref)
    assert k.decision(x, y, N).config == bad[1]


def test_all_candidates_failing_raises_with_every_error(monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    from kernels import _add

    k = ft.autotune([Config({"BLOCK": 48}), Config({"BLOCK": 24})], ["n"], name="t.allfail")(_add)
    x, y, out = tensors()
    with pytest.raises(SearchError) as e:
        k[grid(N)](x, y, out, N)
    assert "BLOCK=48" in str(e.value) and "BLOCK=24" in str(e.value)


def test_user_do_bench_is_used(monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    seen = []

    def do_bench(fn):
        fn()
        seen.append(1)
        return float(len(seen))  # the first candidate is fastest, distinctly

    k = make_add("t.dobench", do_bench=do_bench)
    add(k)
    assert len(seen) == len(ADD_CONFIGS) and k.decision(*tensors(), N).config == ADD_CONFIGS[0]


def test_near_ties_are_retimed_and_broken_by_declared_order():
    cands = [bench.Candidate(Config({"BLOCK": b}), t) for b, t in ((16, 1.02), (32, 1.00), (64, 1.5))]
    rounds = []
    winner = selection.pick(cands, lambda c, _: rounds.append(c.config.kwargs["BLOCK"]) or 1.0).winner
    assert winner.config.kwargs["BLOCK"] == 16  # both tie at 1.0 after re-timing: declared order decides
    assert sorted(set(rounds)) == [16, 32] and len(rounds) == 2 * selection.MEASURED.rounds


def test_print_autotuning(monkeypatch, capsys):
    monkeypatch.setenv("FLYTUNE_PRINT_AUTOTUNING", "1")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    k = make_add("t.print")
    add(k)
    err = capsys.readouterr().err
    assert "t.print key={'x': 'float32', 'n': 100} tier=search" in err and "search took" in err
    assert err.count("BLOCK=") >= len(ADD_CONFIGS)


def test_on_decision_sees_every_decision_once_with_the_search_details(monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    searched = make_add("t.ev_search")
    heuristic = make_add("t.ev_heur", default=lambda a: Config({"BLOCK": 16}))
    seen = []
    with ft.on_decision(seen.append):
        add(searched)
        add(searched)  # a hit decides nothing
        add(heuristic)
    add(heuristic, n=N + 1)  # unregistered on leaving the block
    assert [(e["kernel"], e["tier"]) for e in seen] == [("t.ev_search", "search"), ("t.ev_heur", "heuristic")]
    search, heur = seen
    config = searched.decision(*tensors(), N).config
    assert search["key"] == {"x": "float32", "n": N} and search["config"] == config
    assert search["winner"].config == config and search["winner"] in search["candidates"]
    assert len(search["candidates"]) == len(ADD_CONFIGS) and search["seconds"] >= 0
    assert search["artifact"].config == config and search["artifact"].key == search["key"]
    assert search["artifact"].provenance["ranking"] == "synthetic"
    assert heur["config"] == Config({"BLOCK": 16}) and "artifact" not in heur


def test_on_decision_handle_unregisters_once():
    seen = []
    unsubscribe = ft.on_decision(seen.append)
    add(make_add("t.ev_handle", default=lambda a: Config({"BLOCK": 16})))
    unsubscribe()
    unsubscribe()  # harmless
    add(make_add("t.ev_handle2", default=lambda a: Config({"BLOCK": 16})))
    assert [e["kernel"] for e in seen] == ["t.ev_handle"]
    with pytest.raises(TypeError):
        ft.on_decision(None)


# -- key axes -----------------------------------------------------------------------------------------
def test_pow2_bucket_covers_every_runtime_shape(tmp_path, monkeypatch):
    k = make_add("t.pow2", key=("x", pow2("n")), default=lambda a: Config({"BLOCK": 16}))
    artifact_dir(tmp_path, monkeypatch, "t.pow2", {"x": "float32", "n": 128}, Config({"BLOCK": 64}))
    for n in (65, 100, 128):
        add(k, n=n)
    add(k, n=129)
    assert calls(k) == {"scratch": 0, "offline": 3, "heuristic": 1, "search": 0}


def test_nearest_snaps_to_tuned_values(tmp_path, monkeypatch):
    k = make_add("t.nearest", key=("x", nearest("n")), default=lambda a: Config({"BLOCK": 16}))
    d = tmp_path / "a"
    for n, b in ((64, 32), (256, 64)):
        Artifact("t.nearest", {"x": "float32", "n": n}, INTERPRETER, Config({"BLOCK": b})).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    for n, block in ((10, 32), (100, 32), (160, 32), (161, 64), (999, 64)):
        add(k, n=n)
        assert k.decision(*tensors(n), n).config.kwargs["BLOCK"] == block
    assert calls(k)["offline"] == 5


def test_nearest_snaps_infinities_to_the_ends_and_nan_to_nothing():
    """inf snapped to the smallest tuned value (every distance a tie at inf), NaN to a tuned value."""
    from flytune_build.core.key import Axis, bucket

    axis, tuned = nearest("n"), [64, 256, 1024]
    assert isinstance(axis, Axis)
    assert bucket(float("inf"), axis, tuned) == 1024 and bucket(float("-inf"), axis, tuned) == 64
    assert bucket(1e300, axis, tuned) == 1024 and bucket(2 ** 70, axis, tuned) == 1024
    nan = float("nan")
    assert bucket(nan, axis, tuned) is nan


def test_dtype_is_part_of_the_key(tmp_path, monkeypatch):
    k = make_add("t.dtype", default=lambda a: Config({"BLOCK": 16}))
    artifact_dir(tmp_path, monkeypatch, "t.dtype", {"x": "float16", "n": N}, Config({"BLOCK": 64}))
    add(k, dtype=torch.float32)
    add(k, dtype=torch.float16)
    assert calls(k)["offline"] == 1 and calls(k)["heuristic"] == 1


@triton.jit
def _scaled_probe(x, out, alpha, BLOCK: tl.constexpr):
    tl.store(out, BLOCK + alpha * 0 + tl.load(x) * 0)   # writes the BLOCK it was launched with


def test_a_numpy_scalar_keys_as_the_number_it_holds(tmp_path, monkeypatch):
    """It keyed as its dtype (`float64`): every value shared one decision, the heuristic's, and no tuned
    value was served."""
    np = pytest.importorskip("numpy")
    d = tmp_path / "a"
    Artifact("t.np", {"alpha": 0.5}, INTERPRETER, Config({"BLOCK": 64})).save(d)
    Artifact("t.np", {"alpha": 2.0}, INTERPRETER, Config({"BLOCK": 16})).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    k = ft.autotune([Config({"BLOCK": b}) for b in (16, 32, 64)], ["alpha"], name="t.np",
                    default=lambda a: Config({"BLOCK": 32}))(_scaled_probe)
    x = torch.zeros(4)
    for alpha, block in ((np.float64(0.5), 64), (np.float64(2.0), 16), (0.5, 64), (np.float64(0.5), 64)):
        out = torch.zeros(1)
        k[(1,)](x, out, alpha)
        assert out.item() == block and k.decision(x, out, alpha).key == {"alpha": float(alpha)}
    assert calls(k) == {"scratch": 0, "offline": 4, "heuristic": 0, "search": 0}
    from flytune_build.core.key import raw

    assert raw(np.bool_(True)) is True and raw(np.bool_(False)) is False and raw(np.int64(7)) == 7
    assert raw(torch.tensor(3)) == torch.int64 and raw(np.zeros(3)) == np.dtype("float64")   # tensors: dtypes


def test_keyword_arguments_reach_the_key(tmp_path, monkeypatch):
    k = make_add("t.kw", default=lambda a: Config({"BLOCK": 16}))
    artifact_dir(tmp_path, monkeypatch, "t.kw", {"x": "float32", "n": N}, Config({"BLOCK": 64}))
    x, y, out = tensors()
    k[grid(N)](x, y, out=out, n=N)
    assert torch.equal(out, x + y) and calls(k)["offline"] == 1


@pytest.mark.parametrize("kw,field", [
    (dict(key=["x", "size"]), "key[1]"),
    (dict(key=["x"], reset_to_zero=["outt"]), "reset_to_zero[0]"),
    (dict(key=["x"], restore_value=["y", "z"]), "restore_value[1]"),
    (dict(key=["x", "x"]), "key[1]"),
])
def test_unknown_names_are_errors_at_decoration(kw, field):
    from kernels import _add

    with pytest.raises(DeclarationError) as e:
        ft.autotune(ADD_CONFIGS, name="t.bad", **kw)(_add)
    assert e.value.field == field


def test_declared_config_binding_to_nothing_is_a_decoration_error():
    from kernels import _add

    with pytest.raises(DeclarationError, match="binds to no parameter"):
        ft.autotune([Config({"BLOKC": 16})], ["n"], name="t.badcfg")(_add)


@pytest.mark.parametrize("returned, message", [
    (None, "Field `default` returned NoneType, which is no config"),
    ({}, "Field `default` returned .*, which leaves BLOCK unset: a parameter of kernel t.badheur with no default"),
])
def test_a_default_that_returns_no_usable_config_is_named(returned, message):
    """None was blamed on `configs`; {} reached the launch as Triton's TypeError, naming no `default`."""
    k = ft.autotune([Config({"BLOCK": 16}), Config({"BLOCK": 32})], ["n"], name="t.badheur",
                    default=lambda a: returned)(_probe)
    with pytest.raises(DeclarationError, match=message):
        k[(1,)](torch.zeros(4), torch.zeros(1), 100)


def test_a_default_may_leave_what_the_kernel_defaults_or_a_heuristics_wrapper_sets():
    @triton.heuristics({"BLOCK": lambda a: 16})
    @triton.jit
    def probe(x, out, n, BLOCK: tl.constexpr, S: tl.constexpr = 1):
        tl.store(out, BLOCK + tl.load(x) * 0)

    k = ft.autotune([Config({"S": 1}), Config({"S": 2})], ["n"], name="t.heurwrap", default=lambda a: {})(probe)
    out = torch.zeros(1)
    k[(1,)](torch.zeros(4), out, 100)
    assert out.item() == 16 and calls(k)["heuristic"] == 1


def test_triton_config_is_accepted():
    import triton
    from kernels import _add

    k = ft.autotune([triton.Config({"BLOCK": 32}, num_warps=2)], ["n"], name="t.tritoncfg")(_add)
    assert k.configs == [Config({"BLOCK": 32}, num_warps=2)]
    assert k.name == "t.tritoncfg"
    add(k)


def test_default_name_is_module_and_function():
    from kernels import _add

    assert ft.autotune(ADD_CONFIGS, ["n"])(_add).name == "kernels._add"


# -- the scratch cache -------------------------------------------------------------------------------
def test_corrupt_scratch_cache_warns_once_and_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    k = make_add("t.scratchbad")
    path = k._scratch.path
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"format": 1, "entries": {')
    with pytest.warns(FlytuneWarning, match="replaced on the next write"):
        add(k)
    doc = json.loads(path.read_text())
    assert len(doc["entries"]) == 1 and ft.stats()["t.scratchbad"]["searches"] == 1


@pytest.mark.parametrize("value, what", [(5, "an integer"), ("x", "a string"), ({"config": None}, "null")])
def test_a_scratch_entry_that_is_no_config_is_named_once_and_the_next_tier_serves(tmp_path, monkeypatch, value,
                                                                                   what):
    """An entry `5` was "must be an object, not null", the scratch file named twice."""
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    k = make_add("t.scratchentry")
    add(k)   # searched: its winner in the scratch cache
    doc = json.loads(k._scratch.path.read_text())
    doc["entries"] = {address: value for address in doc["entries"]}
    k._scratch.path.write_text(json.dumps(doc))
    k.reset()
    with pytest.warns(FlytuneWarning) as rec:
        add(k)
    (said,) = [str(w.message) for w in rec if "scratch entry ignored" in str(w.message)]
    assert said.count(str(k._scratch.path)) == 1 and f"must be an object, not {what}" in said, said
    assert calls(k)["scratch"] == 0 and ft.stats()["t.scratchentry"]["searches"] == 1   # searched again


def test_scratch_key_changes_with_layout_and_space():
    k = make_add("t.skey")
    x, y, out = tensors()
    bound = dict(x=x, y=y, out=out, n=N)
    base = k.scratch_key(bound, {"x": "float32", "n": N})
    xs = torch.randn(2 * N)[::2]
    assert k.scratch_key({**bound, "x": xs}, {"x": "float32", "n": N}) != base
    k2 = make_add("t.skey", default=None)
    k2.space_hash = "0" * 64
    assert k2.scratch_key(bound, {"x": "float32", "n": N}) != base


WRITER = r"""
import os, sys
from flytune_build.runtime.serving.scratch import ScratchCache
c = ScratchCache("t.concurrent")
w = int(sys.argv[1])
for i in range(int(sys.argv[2])):
    c.put(f"{w}-{i}", {"config": {"kwargs": {"BLOCK": i}}, "time_ms": 1.0})
"""


def test_concurrent_writers_lose_nothing(tmp_path):
    env = python_env(FLYTUNE_CACHE_DIR=tmp_path / "cc")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), "25"], env=env) for w in range(8)]
    assert all(p.wait(120) == 0 for p in procs)
    doc = json.loads((tmp_path / "cc" / "t.concurrent.json").read_text())
    assert len(doc["entries"]) == 8 * 25


def _dist(site, name, version, group_line):
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[console_scripts]\n{name} = {name}.cli:main\n\n{group_line}")


@pytest.mark.parametrize("first,second,expected", [
    ("[flytune.bundles]\nfixpkg = fixpkg._flytune\n", "", ["fixpkg._flytune"]),
    ("", "[flytune.bundles]\nfixpkg = fixpkg._old\n", []),  # shadowed by a copy without a bundle
    ("[flytune.bundles]\nfixpkg = fixpkg._new\n", "[flytune.bundles]\nfixpkg = fixpkg._old\n", ["fixpkg._new"]),
])
def test_bundle_entry_points_match_importlib_metadata(tmp_path, monkeypatch, first, second, expected):
    from importlib.metadata import entry_points

    from flytune_build.core.installed import entry_points as bundle_entry_points

    _dist(tmp_path / "a", "fixpkg", "2.0", first)
    _dist(tmp_path / "b", "fixpkg", "1.0", second)
    _dist(tmp_path / "a", "other_pkg", "1.0", "[flytune.bundles]\nother = other_pkg._flytune\n")
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    ours = sorted(ep.value for dist, ep in bundle_entry_points() if ep.name == "fixpkg" and dist == "fixpkg")
    theirs = sorted(ep.value for ep in entry_points(group="flytune.bundles") if ep.name == "fixpkg")
    assert ours == theirs == expected
    assert [(d, ep.value) for d, ep in bundle_entry_points() if ep.name == "other"] == [("other_pkg", "other_pkg._flytune")]


def test_index_prefers_the_first_source_then_the_best_level(tmp_path):
    """Per key: an earlier source beats a later one; within a source, exact beats arch_units,
    whatever the order of the rows; the declared axis order need not be the shard's (sorted) one."""
    import hashlib

    from flytune_build.core import bundle
    from flytune_build.core.target import Target
    from flytune_build.runtime.serving import offline

    h200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
    nvl = DeviceIdentity("cuda", "sm_90", "NVIDIA H200 NVL", 132)  # arch_units against an H200

    def art(n, block, dev):
        return Artifact("t.rank", {"x": "float16", "n": n}, dev, Config({"BLOCK": block}))

    in_bundle = [art(1, 11, nvl), art(1, 12, h200), art(2, 21, h200), art(2, 22, nvl), art(3, 31, nvl)]
    data = bundle.shard_bytes("t.rank", in_bundle)
    info = bundle.ShardInfo("t.rank", "t.rank.json", hashlib.sha256(data).hexdigest(), 5, ("n", "x"),
                            "t.rank.provenance.json", "0" * 64)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "t.rank.json").write_bytes(data)
    manifest = bundle.Manifest("t", (Target("sm_90"),), None, {}, {"t.rank": info}, "none")
    sxm = DeviceIdentity("cuda", "sm_90", "NVIDIA H200 SXM", 132)
    tie = sorted([art(5, 51, nvl), art(5, 52, sxm)], key=lambda a: a.filename)  # one level: the first file wins
    in_dir = [art(2, 99, nvl), art(4, 41, h200), *tie]
    for a in in_dir:
        a.save(tmp_path / "d")
    tier = offline.OfflineTier()
    tier._sources = [installed.Source("dir", tmp_path / "d"), installed.Source("bundle", tmp_path / "b", manifest)]
    idx = tier.index("t.rank", ("x", "n"), h200)  # declared order: x, then n
    got = {key: (idx.hit(key).config["kwargs"]["BLOCK"], idx.hit(key).level,
                 "dir" if idx.hit(key).origin.startswith(str(tmp_path / "d")) else idx.hit(key).origin)
           for key in idx.entries}
    assert got == {("float16", 1): (12, "exact", "bundle"), ("float16", 2): (99, "arch_units", "dir"),
                   ("float16", 3): (31, "arch_units", "bundle"), ("float16", 4): (41, "exact", "dir"),
                   ("float16", 5): (tie[0].config.kwargs["BLOCK"], "arch_units", "dir")}
    assert idx.hit(("float16", 1)).artifact == art(1, 12, h200).filename  # named from its shard row
    assert idx.tuned("n", ("x", "n")) == [1, 2, 3, 4, 5] and len(idx) == 5


def test_warnings_point_at_the_callers_line():
    """Whichever path inside flytune_build and triton raised it, a warning names the launching line."""
    import warnings

    import triton
    from kernels import _add

    k = ft.autotune([triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], ["n"], name="t.where")(_add)
    x, y, out = tensors(N, torch.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k[grid(N)](x, y, out, N); line = sys._getframe().f_lineno  # noqa: E702
    (w,) = [w for w in seen if issubclass(w.category, FlytuneWarning)]
    assert "using the first config" in str(w.message)
    assert (w.filename, w.lineno) == (__file__, line)


def test_a_first_call_error_is_not_raised_during_the_memo_miss():
    """A decision's error reads as itself: not "during handling of" the lookup that missed."""
    from kernels import _add

    k = ft.autotune([Config({"BLOCK": 32})], ["n"], name="t.unchained")(_add)
    x, y, out = tensors(N, torch.float32)
    for call in (lambda: k[grid(N)](x, y, out), lambda: k[grid(N)](x, y, out=out)):
        with pytest.raises(DeclarationError, match="key parameter") as e:
            call()
        assert e.value.__context__ is None


def test_a_backends_launch_keyword_in_the_declared_configs_is_tuned_and_served(tmp_path, monkeypatch):
    """ROCm kernels tune `waves_per_eu` beside their block sizes: a declared config may set it (it binds
    to no parameter: Triton's HIP backend takes it at launch, the interpreter ignores it), and an
    artifact of such a kernel carries it and is served."""
    from kernels import _add

    declared = [Config({"BLOCK": 32, "waves_per_eu": 2}), Config({"BLOCK": 64, "waves_per_eu": 0})]
    k = ft.autotune(declared, ["x", "n"], name="t.waves", default=lambda a: declared[0])(_add)
    artifact_dir(tmp_path, monkeypatch, "t.waves", {"x": "float32", "n": N}, declared[1])
    add(k)
    assert calls(k)["offline"] == 1 and k.decision(*tensors(), N).config == declared[1]
    with pytest.raises(DeclarationError, match="binds to no parameter"):
        ft.autotune([Config({"BLOCK": 16, "wavse_per_eu": 2})], ["n"], name="t.typo")(_add)


def test_forcing_launches_its_config_and_a_reset_inside_it_is_kept():
    """`forcing` (what `verify --execute` runs each artifact under) serves one config for every key, and
    restores the decisions it set aside, unless the kernel was reset inside it."""
    k = make_add("t.forcing", default=lambda a: Config({"BLOCK": 16}))
    add(k)
    assert k.decision(*tensors(), N).config == Config({"BLOCK": 16})
    with k.forcing(Config({"BLOCK": 64})) as forced:
        add(k)
        add(k, n=50)
        assert forced.calls == 2
    assert k.decision(*tensors(), N).config == Config({"BLOCK": 16})  # set aside, restored
    with k.forcing(Config({"BLOCK": 64})):
        k.reset()
        add(k)
    assert k.decision(*tensors(), N) is None  # the reset holds after the block
    add(k)
    assert calls(k)["heuristic"] == 1


@pytest.mark.parametrize("how", ["method", "launch"])
def test_warmup_compiles_without_launching_or_searching(tmp_path, monkeypatch, how):
    """`kernel.warmup(...)` and `kernel[grid](..., warmup=True)` are Triton's compile-only calls: a key a
    tier decides compiles its config; a key only a search could decide compiles every candidate (as
    `triton.autotune`'s warmup does), and nothing is timed, searched or launched."""
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "auto")  # where a real call would search
    k = make_add(f"t.warm{how}")
    artifact_dir(tmp_path, monkeypatch, k.name, {"x": "float32", "n": N}, Config({"BLOCK": 64}))
    x, y, out = tensors(N, torch.float32)
    out.fill_(-1)

    def warm(n, *tensors_or_dtypes):
        if how == "method":
            return k.warmup(*tensors_or_dtypes, n, grid=grid(n))
        return k[grid(n)](*tensors_or_dtypes, n, warmup=True)

    decided = warm(N, x, y, out)
    assert (decided if how == "method" else [decided]) == [None]  # the interpreter compiles nothing to return
    assert k.decision(x, y, out, N).tier == "offline"
    everything = warm(50, torch.float32, torch.float32, torch.float32)  # dtypes stand for tensors, as in Triton
    assert len(everything) == len(ADD_CONFIGS)
    assert k.decision(x, y, out, 50) is None
    assert ft.stats()[k.name]["searches"] == 0 and ft.stats()[k.name]["calls"]["search"] == 0
    assert torch.all(out == -1)  # launched nothing


@triton.jit
def _scale_alpha(x, out, n, BLOCK: tl.constexpr, ALPHA: tl.constexpr = 2):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * ALPHA, mask=m)


def test_an_artifact_never_sets_a_parameter_no_declared_config_tunes(tmp_path, monkeypatch):
    """ALPHA has a default and is not tuned: an artifact setting it would change what the kernel
    computes. It is refused with one warning; the next tier serves, results as the kernel defines them."""
    k = ft.autotune([Config({"BLOCK": b}) for b in (16, 32)], ["n"], name="t.alpha",
                    default=lambda a: Config({"BLOCK": 16}))(_scale_alpha)
    artifact_dir(tmp_path, monkeypatch, "t.alpha", {"n": 64}, Config({"BLOCK": 16, "ALPHA": 1000}))
    x, out = torch.ones(64), torch.zeros(64)
    with pytest.warns(FlytuneWarning, match="none of its declared configs tunes"):
        k[(4,)](x, out, 64)
    assert out[0].item() == 2.0 and calls(k)["heuristic"] == 1


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_key_json_cannot_write_still_runs(value):
    """A NaN or infinite float key axis has no scratch address: the call runs on the other tiers."""
    k = ft.autotune([Config({"BLOCK": 16})], ["n", "alpha"], name=f"t.nan{value}",
                    default=lambda a: Config({"BLOCK": 16}))(_scale_alpha_f)
    x, out = torch.ones(64), torch.zeros(64)
    k[(4,)](x, out, 64, value)
    assert calls(k)["heuristic"] == 1


@triton.jit
def _scale_alpha_f(x, out, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * alpha, mask=m)


def test_stats_tell_the_default_callback_from_the_first_config():
    """Both serve as the heuristic tier; `first_config` counts the calls no `default` chose."""
    with_default = make_add("t.firstcfg.default", default=lambda a: Config({"BLOCK": 16}))
    without = make_add("t.firstcfg.first")
    add(with_default)
    with pytest.warns(FlytuneWarning, match="first config"):
        add(without)
        add(without, n=50)
    s = ft.stats()
    assert s["t.firstcfg.default"]["calls"]["heuristic"] == 1 and s["t.firstcfg.default"]["first_config"] == 0
    assert s["t.firstcfg.first"]["calls"]["heuristic"] == 2 and s["t.firstcfg.first"]["first_config"] == 2


def test_two_artifacts_of_one_key_with_different_configs_in_a_directory_serve_neither_and_say_so(tmp_path, monkeypatch):
    """`n = 100` and `n = 100.0` are one key to Python: `flytune verify` refuses the pair as a conflict, and
    the runtime serves neither (before: the first file listed, silently)."""
    d = tmp_path / "arts"
    Artifact("t.clash", {"x": "float32", "n": 100}, INTERPRETER, Config({"BLOCK": 16}, num_warps=1)).save(d)
    Artifact("t.clash", {"x": "float32", "n": 100.0}, INTERPRETER, Config({"BLOCK": 64}, num_warps=1)).save(d)
    Artifact("t.clash", {"x": "float32", "n": 200}, INTERPRETER, Config({"BLOCK": 64}, num_warps=1)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
    reset_stats()
    k = make_add("t.clash", default=lambda a: Config({"BLOCK": 32}))
    x = torch.randn(100)
    with pytest.warns(FlytuneWarning, match=r"one key \({'x': 'float32', 'n': 100(\.0)?}\) and different configs: neither "
                                           r"is served"):
        k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, x, torch.empty_like(x), 100)
    assert k.decision(x, x, x, 100).tier == "heuristic" and k.decision(x, x, x, 100).config.kwargs["BLOCK"] == 32
    y = torch.randn(200)
    k[lambda m: (triton.cdiv(200, m["BLOCK"]),)](y, y, torch.empty_like(y), 200)
    assert k.decision(y, y, y, 200).tier == "offline"   # the other keys serve as before
    assert k.decision(y, y, y, 200).config.kwargs["BLOCK"] == 64
