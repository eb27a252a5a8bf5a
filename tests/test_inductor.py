"""Inductor kernels: the lookup key against Inductor's own code, serving through Inductor's own lookup,
strict, another device, a torch without the hooks, and Inductor artifacts through the build's rules.

A CPU cannot run Inductor's Triton kernels, but it can build Inductor's `CachingAutotuner` from a
kernel module as Inductor writes it (tests/data/inductor): that is where Inductor reads its lookup
table and where flytune counts and enforces, so these tests run Inductor's own code, not a copy.
"""
from __future__ import annotations

import importlib.util
import json
import os
import warnings
from pathlib import Path

import pytest

import flytune_build as ft
from flytune_build.core import inductor, verification
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import DeviceIdentity
from flytune_build.core.errors import FlytuneWarning, TierMissError

torch = pytest.importorskip("torch")
heuristics = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
triton = pytest.importorskip("triton")

DATA = Path(__file__).parent / "data" / "inductor"
GELU = DATA / "triton_poi_fused_gelu_0.py"
H200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
A100 = DeviceIdentity("cuda", "sm_80", "NVIDIA A100-SXM4-80GB", 108)
SHIPPED = Config({"XBLOCK": 512}, num_warps=8, num_stages=1)


def load_kernel(path: Path = GELU):
    """Inductor's CachingAutotuner for a generated kernel module, built as Inductor builds it (the
    module's `set_driver_to_gpu()` needs a GPU driver: the one line a CPU leaves out; and the kernel
    is Triton's JITFunction, as on a GPU, not the interpreter's stand-in)."""
    source = path.read_text().replace("triton_helpers.set_driver_to_gpu()", "")
    spec = importlib.util.spec_from_loader(path.stem, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    finally:
        os.environ["TRITON_INTERPRET"] = saved if saved is not None else ""
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
    return getattr(module, path.stem)


def lookup_key(path: Path = GELU) -> str:
    k = load_kernel(path)
    return inductor.lookup_key(str(k.size_hints), k.fn.src)


def shipped_artifact(key: str, config: Config = SHIPPED, dev: DeviceIdentity = H200, kernel="mylib.block"):
    prov = {"torch": torch.__version__, "inductor": {"name": "triton_poi_fused_gelu_0", "mode": "default"}}
    return Artifact(kernel, {inductor.AXIS: key}, dev, config, prov)


@pytest.fixture
def bundle_dir(tmp_path, monkeypatch):
    """An artifact directory holding the gelu kernel's winner for an H200, served as FLYTUNE_ARTIFACT_DIR."""
    d = tmp_path / "artifacts"
    shipped_artifact(lookup_key()).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    ft.reset_stats()
    return d


def test_every_private_hook_flytune_uses_is_in_the_installed_torch():
    """Fails the day PyTorch renames or drops one: flytune then says so and changes nothing."""
    from flytune_build.runtime.inductor import missing

    assert missing() == []


def test_the_lookup_key_is_the_one_inductor_computes_in_the_autotuner_and_in_the_compile_parent():
    from torch._inductor.async_compile import size_hints_regex

    k = load_kernel()
    ours = inductor.lookup_key(k.size_hints, k.fn.src)
    assert ours == heuristics.generate_lookup_hash_from_source_code(str(k.size_hints), k.fn.src)
    # the compile parent hashes the module's text: the size hints as written, the source after @triton.jit
    text = GELU.read_text()
    hints = size_hints_regex.search(text).group(1)
    assert ours == heuristics.generate_lookup_hash_from_source_code(hints, text.split("@triton.jit\n")[1])
    assert ours == inductor.lookup_key(hints, text.split("@triton.jit\n")[1])


def test_without_serving_inductor_keeps_its_own_candidates():
    k = load_kernel()
    assert len(k.configs) > 1  # Inductor would benchmark them: what a served compile avoids


def test_a_served_kernel_gets_the_shipped_config_through_inductors_own_lookup(bundle_dir):
    from flytune_build import inductor as ft_inductor

    with ft_inductor.serve() as serving:
        k = load_kernel()
        assert [(c.kwargs, c.num_warps, c.num_stages) for c in k.configs] == [({"XBLOCK": 512}, 8, 1)]
        serving.before_precompile(k)
    assert [(c.kwargs, c.num_warps) for c in k.configs] == [({"XBLOCK": 512}, 8)]
    assert ft.stats()["torch.compile"]["kernels"] == {"offline": 1, "autotune": 0, "single": 0}
    assert torch._inductor.config.autotune_lookup_table == {}  # closing restores the user's table
    assert len(load_kernel().configs) > 1  # and a compile after it is Inductor's own again


def test_serving_keeps_the_users_own_lookup_entries(bundle_dir):
    from flytune_build import inductor as ft_inductor

    key = lookup_key()
    mine = {key: {"XBLOCK": 128, "num_warps": 2, "num_stages": 1}}
    with torch._inductor.config.patch(autotune_lookup_table=dict(mine)):
        with ft_inductor.serve():
            assert torch._inductor.config.autotune_lookup_table == mine
        assert torch._inductor.config.autotune_lookup_table == mine


def test_a_shipped_config_replaces_candidates_compiled_elsewhere(bundle_dir):
    """A compile worker (or an earlier compile) that made every candidate: only the shipped one stays."""
    from flytune_build import inductor as ft_inductor

    k = load_kernel()
    k.configs = list(k.configs)
    with ft_inductor.serve() as serving:
        serving.before_precompile(k)
    assert [(c.kwargs, c.num_warps) for c in k.configs] == [({"XBLOCK": 512}, 8)]


@pytest.mark.parametrize("mode", ["strict", "bundle"])  # the modes where nothing tuned serving is an error
def test_strict_fails_naming_a_kernel_the_bundle_does_not_hold(mode, tmp_path, monkeypatch):
    from flytune_build import inductor as ft_inductor

    d = tmp_path / "empty"
    d.mkdir()
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", mode)
    with ft_inductor.serve() as serving:
        k = load_kernel()
        with pytest.raises(TierMissError, match=f"FLYTUNE_AUTOTUNE={mode}: .*triton_poi_fused_gelu_0.*would be "
                                                f"autotuned.*unset {mode}"):
            serving.before_precompile(k)


def test_a_miss_autotunes_as_inductor_does_and_closing_says_so_once(tmp_path, monkeypatch):
    from flytune_build import inductor as ft_inductor

    d = tmp_path / "other"
    shipped_artifact("ab" * 32).save(d)  # another kernel's winner: this compile's kernel misses
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    events = []
    with ft.on_decision(events.append):
        serving = ft_inductor.serve().open()
        k = load_kernel()
        serving.before_precompile(k)
        assert len(k.configs) > 1  # Inductor autotunes it, as without flytune
        with pytest.warns(FlytuneWarning, match=r"0 generated kernel\(s\) served from the bundle, 1 autotuned by "
                                                r"Inductor \(not in the bundle: triton_poi_fused_gelu_0\)"):
            serving.close()
    assert [(e["kernel"], e["tier"], e["key"]["name"]) for e in events] == [
        ("torch.compile", "autotune", "triton_poi_fused_gelu_0")]


def test_another_device_is_served_nothing_and_told_what_differs(bundle_dir, monkeypatch):
    from flytune_build import inductor as ft_inductor

    monkeypatch.setenv("FLYTUNE_DEVICE", A100.spec())
    ft.reset_stats()
    serving = ft_inductor.serve().open()
    k = load_kernel()
    assert len(k.configs) > 1
    serving.before_precompile(k)
    with pytest.warns(FlytuneWarning, match="holds Inductor winners for cuda:sm_90.*not for cuda:sm_80"):
        serving.close()
    assert ft.stats()["torch.compile"]["kernels"]["autotune"] == 1


def test_a_torch_without_the_hooks_changes_nothing_and_says_so_once(bundle_dir, monkeypatch):
    from flytune_build.runtime import inductor as rt

    monkeypatch.setattr(rt, "HOOKS", rt.HOOKS + (("torch._inductor.config", "no_such_lookup_table"),))
    with pytest.warns(FlytuneWarning, match="lacks torch._inductor.config.no_such_lookup_table.*torch 2.9"):
        with rt.serve():
            assert torch._inductor.config.autotune_lookup_table == {}
            assert len(load_kernel().configs) > 1
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    with pytest.raises(TierMissError, match="no_such_lookup_table"):
        rt.serve()


def test_where_no_gpu_is_visible_serving_changes_nothing_and_says_so_once(bundle_dir, monkeypatch):
    """A CPU compile generates no Triton kernel to autotune: serve() neither raises nor touches Inductor."""
    from flytune_build import inductor as ft_inductor

    monkeypatch.delenv("FLYTUNE_DEVICE")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(FlytuneWarning, match="no GPU is visible.*nothing is served to torch.compile") as said:
        with ft_inductor.serve() as serving:
            assert torch._inductor.config.autotune_lookup_table == {}
            assert len(load_kernel().configs) > 1
    assert serving.stats()["device"] is None and ft.stats().get("torch.compile") is None
    # the advice that applies: neither FLYTUNE_DEVICE nor TRITON_INTERPRET makes Inductor generate Triton kernels
    (message,) = [str(w.message) for w in said]
    assert "CUDA or ROCm GPU" in message and "FLYTUNE_DEVICE" not in message and "TRITON_INTERPRET" not in message


@pytest.mark.parametrize("mode", ["0", "strict"])
def test_a_malformed_flytune_device_is_the_same_error_for_serve_as_for_a_kernel_call(mode, bundle_dir, monkeypatch):
    from flytune_build import inductor as ft_inductor
    from flytune_build.core.errors import DeviceError
    from flytune_build.runtime import device

    monkeypatch.setenv("FLYTUNE_DEVICE", "cuda:sm_90:lots:NVIDIA H200")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", mode)
    device.reset()
    with pytest.raises(DeviceError, match="FLYTUNE_DEVICE.*units.*ASCII digits") as raised:
        ft_inductor.serve()
    with pytest.raises(DeviceError) as kernel_call:
        device.current()
    assert str(raised.value) == str(kernel_call.value)
    device.reset()


def test_an_artifact_whose_block_sizes_are_not_the_kernels_is_not_served_and_said_so(tmp_path, monkeypatch):
    """The gelu kernel takes XBLOCK: a config of other block names would not compile as the kernel's."""
    from flytune_build import inductor as ft_inductor

    d = tmp_path / "artifacts"
    shipped_artifact(lookup_key(), Config({"YBLOCK": 64, "R0_BLOCK": 8}, num_warps=8, num_stages=1)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    k = load_kernel()
    configs = [(c.kwargs, c.num_warps) for c in k.configs]
    with pytest.warns(FlytuneWarning, match="takes block sizes \\['XBLOCK'\\], the artifact holds "
                                            "\\['R0_BLOCK', 'YBLOCK'\\]: not served"):
        with ft_inductor.serve() as serving:
            serving.before_precompile(k)
    assert [(c.kwargs, c.num_warps) for c in k.configs] == configs
    assert serving.stats()["kernels"] == {"offline": 0, "autotune": 1, "single": 0}


def test_serving_a_compile_entry_no_bundle_holds_says_so(bundle_dir):
    from flytune_build import inductor as ft_inductor

    with pytest.warns(FlytuneWarning, match="no installed bundle holds Inductor winners of 'mylib.blokc' "
                                            "\\(installed: mylib.block\\)"):
        with ft_inductor.serve(("mylib.blokc",)):
            assert torch._inductor.config.autotune_lookup_table == {}


def test_a_harvest_that_autotunes_no_kernel_writes_nothing_and_exits_1(tmp_path, monkeypatch, capsys):
    """A compile whose kernels each had one config (or ran on the CPU): an empty harvest is no success."""
    from flytune_build.cli.main import main
    from flytune_build.runtime import inductor as rt

    (tmp_path / "tiny_entry.py").write_text("import torch\ndef f():\n    return torch.nn.ReLU(), (torch.randn(8),)\n")
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    monkeypatch.setattr(rt, "compile_once", lambda *a, **kw: None)
    assert main(["harvest", "tiny_entry:f", "--project", str(tmp_path), "--output", str(tmp_path / "out"),
                 "--allow-ci"]) == 1
    assert not (tmp_path / "out").exists()
    assert "Inductor autotuned no kernel of this compile" in capsys.readouterr().out


def test_serving_is_only_what_the_user_opened():
    """Importing flytune (or its runtime) never touches Inductor: no table entry, no patched method."""
    import flytune_build.runtime.serving.autotuner  # noqa: F401

    assert torch._inductor.config.autotune_lookup_table == {}
    assert len(load_kernel().configs) > 1


@pytest.mark.parametrize("config,key,field", [
    (Config({"XBLOCK": 512, "NOT_A_BLOCK": 1}), "ab" * 32, "config.kwargs.NOT_A_BLOCK"),
    (Config({"XBLOCK": 500}), "ab" * 32, "config.kwargs.XBLOCK"),
    (Config({"XBLOCK": 512}, maxnreg=128), "ab" * 32, "config"),
    (Config({"XBLOCK": 512}), "not-a-hash", f"key.{inductor.AXIS}"),
])
def test_the_build_refuses_an_inductor_artifact_inductor_would_not_serve_as_written(config, key, field):
    art = shipped_artifact(key, config)
    found = verification.check([art], lambda a: a.filename)
    assert [(e.field, type(e).__name__) for e in found.errors] == [(field, "ArtifactError")]


def test_an_inductor_artifact_round_trips_and_verifies(tmp_path):
    from flytune_build.runtime import recording
    from flytune_build.runtime.searching.bench import Candidate

    rec = recording.Record("triton_poi_fused_gelu_0", lookup_key(), "{'x': 1048576}", "pointwise",
                           [Candidate(Config({"XBLOCK": 1024}, num_warps=4), 0.011), Candidate(SHIPPED, 0.010)],
                           SHIPPED, {"winner": 1})
    (art,) = recording.artifacts([rec], "mylib.block", "aoti", H200)
    path = art.save(tmp_path)
    back = Artifact.load(path, canonical=True)
    assert back.config == SHIPPED and back.key == {inductor.AXIS: lookup_key()}
    assert back.provenance["inductor"]["mode"] == "aoti" and back.provenance["ranking"] == "measured"
    assert [c["time_ms"] for c in back.provenance["candidates"]] == [0.011, 0.010]
    src = ft.verify(str(tmp_path))
    assert not src.errors, src.errors


@pytest.mark.parametrize("entry,message", [
    ("mylib.block", "must be `module:function`"),
    ("no_such_module_xyz:block", "cannot be imported.*install the package"),
    ("os:no_such_function", "module os has no no_such_function"),
    ("os:getcwd", "must return \\(model, example_inputs\\)"),
])
def test_harvest_refuses_an_entry_it_cannot_compile_before_compiling(entry, message):
    with pytest.raises(ft.UsageError, match=message):
        ft.harvest(entry, allow_ci=True)  # CI runs this test: the entry check is what it pins


def test_harvest_is_refused_where_ci_is_set(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(ft.UsageError, match="refusing to harvest where CI is set"):
        ft.harvest("os:getcwd")


def test_flytune_harvest_usage_errors_exit_2(capsys):
    from flytune_build.cli.main import main

    assert main(["harvest", "mylib.block"]) == 2
    assert "module:function" in capsys.readouterr().err


class _Launcher:
    """What Inductor's benchmark hands flytune per candidate: its triton.Config (a CPU compiles none)."""

    def __init__(self, config):
        self.config = config


def _recorded(times_ms: dict, shipped=None):
    """Run Recording.benchmark over the gelu kernel's real candidates, each timed `times_ms[XBLOCK]`
    (a deterministic synthetic ranking: every re-timing gives the same figure)."""
    from flytune_build.runtime import recording

    from flytune_build.runtime.searching import selection
    k = load_kernel()
    launchers = [_Launcher(c) for c in k.configs]
    k.bench = lambda launcher, *a, **kw: times_ms[launcher.config.kwargs["XBLOCK"]]
    k.reset_to_zero_args = lambda *a, **kw: None

    def inductor_benchmark(autotuner, *a, **kw):
        return {lc: autotuner.bench(lc) for lc in launchers}

    rec = recording.Recording(selection.CPU_TIME, shipped)
    timings = rec.benchmark(inductor_benchmark, k)
    chosen = min(timings, key=timings.get).config  # what Inductor then keeps
    (record,) = rec.records.values()
    return chosen, record


def test_harvest_chooses_by_flytunes_tie_rule_and_inductor_keeps_that_winner():
    """Two candidates within the tie band: flytune's rule (the first declared) wins, not whichever was
    faster by noise, so two harvests agree; Inductor is told that winner."""
    chosen, record = _recorded({1024: 0.0101, 512: 0.0100})
    assert chosen.kwargs == {"XBLOCK": 1024} and record.winner == Config({"XBLOCK": 1024}, num_warps=4, num_stages=1)
    assert [c.time_ms for c in record.candidates] == [0.0101, 0.0100]
    assert record.key == lookup_key() and record.heuristic == "pointwise"
    chosen, record = _recorded({1024: 0.0200, 512: 0.0100})  # clearly apart: the faster wins
    assert chosen.kwargs == {"XBLOCK": 512} and record.winner.kwargs == {"XBLOCK": 512}


def test_a_harvest_keeps_the_shipped_winner_unless_beaten_by_the_margin():
    from flytune_build.runtime.searching.selection import Shipped

    held = {lookup_key(): Shipped(Config({"XBLOCK": 512}, num_warps=8, num_stages=1), 0.03)}
    chosen, record = _recorded({1024: 0.0099, 512: 0.0100}, held)  # 1% faster: within the margin
    assert chosen.kwargs == {"XBLOCK": 512} and record.outcome == "kept"
    chosen, record = _recorded({1024: 0.0050, 512: 0.0100}, held)  # twice as fast: replaced
    assert chosen.kwargs == {"XBLOCK": 1024} and record.outcome == "replaced"


def _coordesc(times_ms: dict, shipped=None):
    """Recording.coordesc after Inductor's coordinate descent moved the gelu kernel from XBLOCK 1024 (the
    benchmark's winner) to 2048, each timed `times_ms[XBLOCK]` (deterministic synthetic ranking)."""
    from flytune_build.runtime import recording

    from flytune_build.runtime.searching import selection
    k = load_kernel()
    k.bench = lambda launcher, *a, **kw: times_ms[launcher.config.kwargs["XBLOCK"]]
    k.reset_to_zero_args = lambda *a, **kw: None
    start = _Launcher(triton.Config({"XBLOCK": 1024}, num_warps=4, num_stages=1))
    found = _Launcher(triton.Config({"XBLOCK": 2048}, num_warps=4, num_stages=1))
    rec = recording.Recording(selection.CPU_TIME, shipped)
    kept = rec.coordesc(k, start, found, (), {})
    (record,) = rec.records.values()
    assert record.coordesc and record.winner.kwargs == kept.config.kwargs
    assert kept.config.found_by_coordesc  # else Inductor would descend again from a start flytune kept
    return kept.config.kwargs["XBLOCK"], record


def test_a_coordinate_descent_move_within_the_noise_is_not_taken_so_harvests_agree():
    block, record = _coordesc({1024: 0.0100, 2048: 0.0099})   # 1% apart: a tie, the start stays
    assert block == 1024 and [c.time_ms for c in record.candidates] == [0.0100, 0.0099]
    block, record = _coordesc({1024: 0.0100, 2048: 0.0050})   # clearly faster: the move is taken
    assert block == 2048 and record.selection["winner"] == 1


def test_where_inductor_ran_no_coordinate_descent_nothing_is_recorded_or_marked():
    from flytune_build.runtime import recording

    from flytune_build.runtime.searching import selection
    k = load_kernel()
    start = _Launcher(triton.Config({"XBLOCK": 1024}, num_warps=4, num_stages=1))
    rec = recording.Recording(selection.CPU_TIME)
    assert rec.coordesc(k, start, start, (), {}) is start  # `_should_coordesc_tune` off: the launcher back as is
    assert rec.records == {} and not getattr(start.config, "found_by_coordesc", False)


def test_a_coordinate_descent_move_replaces_a_shipped_winner_only_past_the_margin():
    from flytune_build.runtime.searching.selection import Shipped

    held = {lookup_key(): Shipped(Config({"XBLOCK": 1024}, num_warps=4, num_stages=1), 0.03)}
    block, record = _coordesc({1024: 0.0100, 2048: 0.00975}, held)   # 2.6% faster: within the 3% margin
    assert block == 1024 and record.outcome == "kept"
    block, record = _coordesc({1024: 0.0100, 2048: 0.0050}, held)
    assert block == 2048 and record.outcome == "replaced"


def test_a_directory_artifact_inductor_would_not_serve_as_written_is_refused_with_a_warning(tmp_path, monkeypatch):
    """FLYTUNE_ARTIFACT_DIR is read by no build: serving applies the build's Inductor rule itself."""
    from flytune_build import inductor as ft_inductor

    d = tmp_path / "artifacts"
    shipped_artifact(lookup_key(), Config({"XBLOCK": 512, "EVIL": 1}, num_warps=8, num_stages=1)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    with pytest.warns(FlytuneWarning, match="config.kwargs.EVIL.*not a block size"):
        serving = ft_inductor.serve()
    assert serving.shipped == {}


SUM = DATA / "triton_red_fused_sum_1.py"


@pytest.mark.parametrize("path,shipped", [
    (GELU, Config({"XBLOCK": 512}, num_warps=8, num_stages=1)),
    (SUM, Config({"XBLOCK": 8, "R0_BLOCK": 512}, num_warps=16, num_stages=1)),  # a reduction: R0_BLOCK too
])
def test_pointwise_and_reduction_kernels_are_served_their_shipped_config(path, shipped, tmp_path, monkeypatch):
    from flytune_build import inductor as ft_inductor

    d = tmp_path / "artifacts"
    shipped_artifact(lookup_key(path), shipped).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    assert len(load_kernel(path).configs) > 1
    with ft_inductor.serve() as serving:
        k = load_kernel(path)
        serving.before_precompile(k)
    assert [(c.kwargs, c.num_warps, c.num_stages) for c in k.configs] == [
        (shipped.kwargs, shipped.num_warps, shipped.num_stages)]


def test_a_harvest_entry_that_exits_or_raises_is_a_tune_error_naming_it(tmp_path, monkeypatch, capsys):
    (tmp_path / "exits_entry.py").write_text("import sys\nprint('noise')\ndef f():\n    sys.exit(0)\n")
    (tmp_path / "raises_entry.py").write_text("def f():\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ft.TuneError, match="compile entry exits_entry:f failed: SystemExit"):
        ft.harvest("exits_entry:f", allow_ci=True)
    with pytest.raises(ft.TuneError, match="compile entry raises_entry:f failed: RuntimeError: boom"):
        ft.harvest("raises_entry:f", allow_ci=True)
    assert capsys.readouterr().out == ""  # what the entry printed went to stderr


@pytest.mark.parametrize("kwargs,error", [
    ({"min_improvement": float("nan")}, "UsageError"), ({"min_improvement": "3"}, "ArgumentTypeError"),
    ({"allow_ci": "no"}, "ArgumentTypeError"), ({"output": None}, "ArgumentTypeError"),
])
def test_harvest_refuses_nonsense_arguments(kwargs, error):
    with pytest.raises(ft.FlytuneError) as e:
        ft.harvest("os:getcwd", **kwargs)
    assert type(e.value).__name__ == error


def test_servings_open_and_closed_in_any_order_leave_the_users_table_as_it_was(bundle_dir):
    from flytune_build import inductor as ft_inductor

    key = lookup_key()
    mine = {"ab" * 32: {"XBLOCK": 128, "num_warps": 2, "num_stages": 1}}
    with torch._inductor.config.patch(autotune_lookup_table=dict(mine)):
        s1, s2 = ft_inductor.serve(), ft_inductor.serve("mylib")
        s1.open()
        s2.open()
        s1.close()
        assert key in torch._inductor.config.autotune_lookup_table  # s2 is still open: its winners stay
        s2.close()
        assert torch._inductor.config.autotune_lookup_table == mine


@pytest.mark.parametrize("args,kwargs", [((5,), {}), ((), {"dev": "cuda"})])
def test_serve_refuses_arguments_of_the_wrong_type(args, kwargs):
    from flytune_build import inductor as ft_inductor

    with pytest.raises(ft.ArgumentTypeError):
        ft_inductor.serve(*args, **kwargs)


def test_a_block_size_past_tritons_largest_tensor_is_refused():
    art = shipped_artifact("ab" * 32, Config({"XBLOCK": 1 << 40}))
    found = verification.check([art], lambda a: a.filename)
    assert [e.field for e in found.errors] == ["config.kwargs.XBLOCK"]


def test_an_unreadable_artifact_in_the_directory_is_said_not_served(tmp_path, monkeypatch):
    from flytune_build import inductor as ft_inductor

    d = tmp_path / "artifacts"
    path = shipped_artifact(lookup_key()).save(d)
    doc = json.loads(path.read_text())
    doc["provenance"]["torch"] = ["2.5"]  # not a string: the artifact reader refuses it
    path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    with pytest.warns(FlytuneWarning, match="provenance.torch.*not served to torch.compile"):
        serving = ft_inductor.serve()
    assert serving.shipped == {}


@pytest.mark.parametrize("mode, warned", [("default", True), ("max-autotune-no-cudagraphs", False)])
def test_a_winner_harvested_without_the_coordinate_descent_the_compile_runs_is_served_and_said_so(
        mode, warned, tmp_path, monkeypatch):
    """Inductor's lookup key has no mode: a default-mode winner is served to a max-autotune compile too,
    which would have tuned it further; closing says so once, naming the kernel and the harvest's mode."""
    from flytune_build import inductor as ft_inductor

    d = tmp_path / "artifacts"
    art = shipped_artifact(lookup_key())
    Artifact(art.kernel, art.key, art.device, art.config,
             {**art.provenance, "inductor": {"name": "triton_poi_fused_gelu_0", "mode": mode}}).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    ft.reset_stats()
    serving = ft_inductor.serve().open()
    k = load_kernel()
    k.inductor_meta = {**k.inductor_meta, "coordinate_descent_tuning": True}   # as a max-autotune compile's
    serving.before_precompile(k)
    assert [(c.kwargs, c.num_warps) for c in k.configs] == [({"XBLOCK": 512}, 8)]   # served all the same
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        serving.close()
    said = [str(w.message) for w in rec if issubclass(w.category, FlytuneWarning)]
    expected = ("torch.compile: 1 kernel(s) served from the bundle (triton_poi_fused_gelu_0) were harvested in "
                "mode default, without coordinate descent, and this compile runs it (max-autotune)")
    assert [m for m in said if m.startswith(expected)] == ([said[0]] if warned else []), said


# -- a harvest is a tuning job: the tuning session, the output's shipped winners, files kept byte for byte ------
def _harvest_compile(times_ms: dict, descend_to: int | None = None):
    """A stand-in for runtime.inductor.compile_once (a CPU compiles no Triton kernel): Inductor benchmarks
    the gelu kernel's real candidates, each timed `times_ms[XBLOCK]`, through the recording open in this
    context, as the patched `benchmark_all_configs` hands it over; with `descend_to`, its coordinate
    descent then moves from the winner to that XBLOCK (as the patched `coordinate_descent_tuning` does)."""
    from flytune_build.runtime import inductor as rt

    def compile_once(model, inputs, mode, dynamic=False):
        k = load_kernel()
        launchers = [_Launcher(c) for c in k.configs]
        k.bench = lambda launcher, *a, **kw: times_ms[launcher.config.kwargs["XBLOCK"]]
        k.reset_to_zero_args = lambda *a, **kw: None
        timings = rt.current().benchmark(lambda autotuner, *a, **kw: {lc: autotuner.bench(lc) for lc in launchers}, k)
        start = min(timings, key=timings.get)
        found = start if descend_to is None else _Launcher(triton.Config({"XBLOCK": descend_to}, num_warps=8,
                                                                         num_stages=1))
        rt.current().coordesc(k, start, found, (), {})

    return compile_once


@pytest.fixture
def entry_project(tmp_path):
    """A project folder, not installed, whose package holds a compile entry (`harvestpkg.models:block`)."""
    import sys

    root = tmp_path / "proj"
    (root / "harvestpkg").mkdir(parents=True)
    (root / "harvestpkg" / "__init__.py").write_text("")
    (root / "harvestpkg" / "models.py").write_text(
        "import torch\nNOTCALLABLE = 3\n"
        "def block():\n    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()), (torch.randn(4, 8),)\n")
    yield root
    for name in [m for m in sys.modules if m == "harvestpkg" or m.startswith("harvestpkg.")]:
        del sys.modules[name]


def test_a_harvest_that_keeps_a_winner_leaves_its_file_byte_for_byte(entry_project, tmp_path, monkeypatch):
    """As `flytune tune`: the output's winner is read through ShippedWinners, kept within the margin, and
    its file is not rewritten (same bytes, same modification time); a winner beaten past the margin is."""
    from flytune_build.runtime import inductor as rt

    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    out = tmp_path / "out"
    monkeypatch.setattr(rt, "compile_once", _harvest_compile({1024: 0.0200, 512: 0.0100}))
    first = ft.harvest("harvestpkg.models:block", project=entry_project, output=out, allow_ci=True)
    (path,) = first.written
    assert first.outcomes == {"triton_poi_fused_gelu_0": "new"} and Artifact.load(path).config == SHIPPED
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # a rewrite, even within the same tick, would move it
    before = path.read_bytes()

    monkeypatch.setattr(rt, "compile_once", _harvest_compile({1024: 0.0099, 512: 0.0100}))  # 1%: within 3%
    again = ft.harvest("harvestpkg.models:block", project=entry_project, output=out, allow_ci=True)
    assert again.outcomes["triton_poi_fused_gelu_0"].startswith("kept") and again.written == []
    assert path.read_bytes() == before and path.stat().st_mtime_ns == 1_000_000_000

    monkeypatch.setattr(rt, "compile_once", _harvest_compile({1024: 0.0050, 512: 0.0100}))  # twice as fast
    beaten = ft.harvest("harvestpkg.models:block", project=entry_project, output=out, allow_ci=True)
    assert beaten.outcomes["triton_poi_fused_gelu_0"].startswith("replaced") and beaten.written == [path]
    assert Artifact.load(path).config.kwargs == {"XBLOCK": 1024}


def test_a_harvest_keeps_no_winner_of_another_device(entry_project, tmp_path, monkeypatch):
    from flytune_build.runtime import inductor as rt

    out = tmp_path / "out"
    shipped_artifact(lookup_key(), Config({"XBLOCK": 1024}, num_warps=4, num_stages=1), dev=A100,
                     kernel="harvestpkg.models.block").save(out)
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    monkeypatch.setattr(rt, "compile_once", _harvest_compile({1024: 0.0101, 512: 0.0100}))
    got = ft.harvest("harvestpkg.models:block", project=entry_project, output=out, allow_ci=True)
    assert got.outcomes == {"triton_poi_fused_gelu_0": "new"} and len(list(out.iterdir())) == 2


def test_the_harvests_space_hash_is_the_shared_one():
    from flytune_build.core.config import space_hash
    from flytune_build.runtime.searching.bench import Candidate
    from flytune_build.runtime.inductor import recording

    candidates = [Candidate(Config({"XBLOCK": 1024}, num_warps=4), 0.011), Candidate(SHIPPED, 0.010)]
    rec = recording.Record("triton_poi_fused_gelu_0", lookup_key(), "{'x': 1048576}", "pointwise", candidates,
                           SHIPPED, {"winner": 1})
    (art,) = recording.artifacts([rec], "mylib.block", "default", H200)
    assert art.provenance["space_hash"] == space_hash([c.config for c in candidates])


def _no_cwd_on_path(monkeypatch):
    """sys.path as a console script (`flytune`) has it: the working directory is not on it."""
    import sys

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    return list(sys.path)


@pytest.mark.parametrize("where", ["in the project", "--project"])
def test_flytune_harvest_imports_the_entry_from_a_project_not_installed(where, entry_project, tmp_path, monkeypatch,
                                                                        capsys):
    """A CPU has no Triton kernel for Inductor to autotune: past the import, the advice that applies."""
    import sys

    from flytune_build.cli.main import main

    path = _no_cwd_on_path(monkeypatch)
    monkeypatch.chdir(entry_project if where == "in the project" else tmp_path)
    args = ["--project", str(entry_project)] if where == "--project" else []
    assert main(["harvest", "harvestpkg.models:block", "--allow-ci", *args]) == 1
    err = capsys.readouterr().err
    assert "harvestpkg.models" in sys.modules and "cannot be imported" not in err
    assert "no GPU is visible" in err and "only for a CUDA or ROCm GPU" in err
    assert "FLYTUNE_DEVICE" not in err and "TRITON_INTERPRET" not in err
    assert sys.path == path  # the project root was importable for the harvest only


def test_flytune_harvest_as_a_console_script_runs_from_the_project_folder(entry_project):
    """`flytune` (a console script: the working directory is not on sys.path), no GPU, no interpreter."""
    import subprocess
    import sys

    from conftest import python_env

    env = {k: v for k, v in python_env().items() if k not in ("TRITON_INTERPRET", "FLYTUNE_DEVICE")}
    out = subprocess.run([sys.executable, "-P", "-m", "flytune_build.cli", "harvest", "harvestpkg.models:block",
                          "--allow-ci"], cwd=entry_project, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "cannot be imported" not in out.stderr and "only for a CUDA or ROCm GPU" in out.stderr
    assert "FLYTUNE_DEVICE" not in out.stderr and "TRITON_INTERPRET" not in out.stderr


def test_a_compile_entry_that_is_not_a_function_is_a_usage_error_naming_it(entry_project, monkeypatch, capsys):
    from flytune_build.cli.main import main

    _no_cwd_on_path(monkeypatch)
    monkeypatch.chdir(entry_project)
    assert main(["harvest", "harvestpkg.models:NOTCALLABLE", "--allow-ci"]) == 2
    err = capsys.readouterr().err
    assert "harvestpkg.models:NOTCALLABLE" in err and "int, not a function" in err
    assert "returns (model, example_inputs)" in err and "Traceback" not in err


def test_an_entry_module_the_project_does_not_hold_says_where_it_looked(entry_project):
    with pytest.raises(ft.UsageError, match="cannot be imported from the project root .*--project DIR"):
        ft.harvest("nosuchpkg_xyz.models:block", project=entry_project, allow_ci=True)
    with pytest.raises(ft.UsageError, match="not a directory"):
        ft.harvest("harvestpkg.models:block", project=entry_project / "missing", allow_ci=True)


def test_a_harvest_under_the_interpreter_on_a_gpu_says_to_unset_it(entry_project, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ft.DeviceError, match="TRITON_INTERPRET=1 .* unset TRITON_INTERPRET"):
        ft.harvest("harvestpkg.models:block", project=entry_project, allow_ci=True)


# -- serving where Inductor generates no Triton kernel ----------------------------------------------------------
def test_serving_under_the_interpreter_says_once_why_nothing_is_served(bundle_dir, monkeypatch):
    """TRITON_INTERPRET=1 on a CPU: nothing to serve; one warning with the reason, none suggesting a setting
    that would not help Inductor."""
    from flytune_build import inductor as ft_inductor

    monkeypatch.delenv("FLYTUNE_DEVICE")
    ft.reset_stats()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(2):
            with ft_inductor.serve() as serving:
                assert torch._inductor.config.autotune_lookup_table == {}
    said = [str(w.message) for w in rec if issubclass(w.category, FlytuneWarning)]
    assert len(said) == 1 and "no GPU is visible" in said[0] and "nothing is served" in said[0], said
    assert "FLYTUNE_DEVICE" not in said[0] and "only for a CUDA or ROCm GPU" in said[0]
    assert serving.stats()["kernels"] == {"offline": 0, "autotune": 0, "single": 0}
    assert ft.stats().get("torch.compile") is None


def test_serving_under_the_interpreter_on_a_gpu_says_to_unset_it(bundle_dir, monkeypatch):
    from flytune_build import inductor as ft_inductor

    monkeypatch.delenv("FLYTUNE_DEVICE")
    ft.reset_stats()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.warns(FlytuneWarning, match="TRITON_INTERPRET=1 .* unset TRITON_INTERPRET.*nothing is served"):
        ft_inductor.serve()


def test_a_re_harvest_whose_descent_went_nowhere_keeps_the_file_of_one_whose_descent_was_timed(
        entry_project, tmp_path, monkeypatch):
    """The space hash is of the configs Inductor offered, not of the pair a descent's move was timed as:
    a kept winner's file stays byte for byte whichever moves the descent tried (seen on an H100:
    max-autotune re-harvests rewrote every kept file before)."""
    from flytune_build.runtime import inductor as rt

    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    out = tmp_path / "out"
    times = {1024: 0.0200, 512: 0.0100, 256: 0.0200}
    monkeypatch.setattr(rt, "compile_once", _harvest_compile(times, descend_to=256))  # a move, not taken
    (path,) = ft.harvest("harvestpkg.models:block", project=entry_project, output=out, allow_ci=True).written
    assert Artifact.load(path).provenance["inductor"]["coordesc"] is True
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    before = path.read_bytes()
    monkeypatch.setattr(rt, "compile_once", _harvest_compile(times))  # this time the descent moved nowhere
    again = ft.harvest("harvestpkg.models:block", project=entry_project, output=out, allow_ci=True)
    assert again.outcomes["triton_poi_fused_gelu_0"].startswith("kept") and again.written == []
    assert path.read_bytes() == before and path.stat().st_mtime_ns == 1_000_000_000
