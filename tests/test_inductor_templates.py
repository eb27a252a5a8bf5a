"""GEMM template choices (max-autotune's select_algorithm): the lookup key against Inductor's own, serving
through Inductor's own template lookup, strict, the user's own table and handler, a torch without the
hooks, the harvest's selection, and GEMM artifacts through the build's rules and every reader.

A CPU lowers a matmul through the same `InductorChoices` a GPU does (with ATen's template only): there
Inductor's own `LookupTableChoices` keys a lowering, finds the shipped entry and builds the one choice,
once it is told a CPU tensor's device name (`_get_device_key` answers None off CUDA, by design: the
`cpu_lookup` fixture). The harvest's side (Inductor's feedback after benchmarking) needs a GPU to happen:
it is driven here with Inductor's feedback arguments as select_algorithm passes them.
"""
from __future__ import annotations

import contextvars
import json
import os
import threading
import warnings

import pytest

import flytune_build as ft
from flytune_build.core import gemm, inductor, verification
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import DeviceIdentity
from flytune_build.core.errors import FlytuneWarning, TierMissError

torch = pytest.importorskip("torch")
lookup_table = pytest.importorskip("torch._inductor.lookup_table")

from test_inductor import SHIPPED, bundle_dir, load_kernel, lookup_key  # noqa: E402,F401 - bundle_dir: the fixture

H200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
M, K, N = 64, 128, 256  # a CPU decomposes smaller matmuls into pointwise code: this one is lowered as mm
KEY = f"((torch.float32, [{M}, {K}], [{K}, 1]), (torch.float32, [{K}, {N}], [{N}, 1]))+mm"
MM_HASH = "d9" * 32
TRITON_MM = {"EVEN_K": True, "USE_FAST_ACCUM": False, "ACC_TYPE": "tl.float32", "num_stages": 3, "num_warps": 4,
             "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "hint_override": None, "GROUP_M": 8}


@pytest.fixture
def cpu_lookup(monkeypatch):
    """Inductor's template lookup keys a CPU lowering as it keys a GPU's (its device name aside)."""
    monkeypatch.setattr(lookup_table.LookupTableChoices, "_get_device_key", staticmethod(lambda device: "NVIDIA H200"))


def gemm_artifact(key: str = KEY, config: Config | None = None, dev: DeviceIdentity = H200, kernel="mylib.block"):
    config = config or gemm.config_of("aten::mm", {})
    return Artifact(kernel, {inductor.AXIS: key}, dev, config, {"inductor": {"name": "mm", "mode": "max-autotune"}})


@pytest.fixture
def gemm_dir(tmp_path, monkeypatch):
    """An artifact directory holding the mm's ATen choice for an H200, served as FLYTUNE_ARTIFACT_DIR."""
    d = tmp_path / "artifacts"
    gemm_artifact().save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    ft.reset_stats()
    return d


def compile_mm():
    """torch.compile of one matmul on the CPU, every cache off: Inductor lowers it here, in this thread."""
    torch._dynamo.reset()
    x, y = torch.randn(M, K), torch.randn(K, N)
    with torch._inductor.config.patch(force_disable_caches=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        out = torch.compile(lambda a, b: (a @ b).relu())(x, y)
    torch.testing.assert_close(out, (x @ y).relu())


def lowerings(fn, *inputs, monkeypatch) -> list:
    """(KernelInputs, op) of each matmul Inductor lowers compiling `fn`, each with what `probe` read of it
    while Inductor's graph was live."""
    from torch._inductor.choices import InductorChoices

    seen = []
    original = InductorChoices._finalize_template_configs

    def probe(self, template_choices, kernel_inputs, templates, op_name, *rest):
        from flytune_build.runtime.inductor import templates as t

        ours = t.key_of(kernel_inputs, op_name)
        theirs = lookup_table.LookupTableChoices().make_lookup_key(kernel_inputs, op_name, include_device=False)
        device = lookup_table.LookupTableChoices().make_lookup_key(kernel_inputs, op_name, include_device=True)
        plain = lookup_table.LookupTableChoices._generate_kernel_inputs_key(kernel_inputs) + "+" + op_name
        seen.append((op_name, ours, theirs, device, plain))
        return original(self, template_choices, kernel_inputs, templates, op_name, *rest)

    monkeypatch.setattr(InductorChoices, "_finalize_template_configs", probe)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        torch.compile(fn)(*inputs)
    return seen


# -- the hooks and the key, against the installed torch ----------------------------------------------------------
def test_every_private_gemm_hook_flytune_uses_is_in_the_installed_torch():
    """Fails the day PyTorch renames or drops one: flytune then serves the kernels and says GEMM choices are not."""
    from flytune_build.runtime.inductor import missing_gemm

    assert missing_gemm() == []


def test_flytunes_gemm_key_is_the_one_inductors_lookup_computes(cpu_lookup, monkeypatch):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(K, N)

        def forward(self, x, y, b):
            return self.fc(x).relu() @ y, torch.bmm(b, b.transpose(1, 2)).relu()

    seen = lowerings(Block(), torch.randn(M, K), torch.randn(N, M), torch.randn(4, M, K), monkeypatch=monkeypatch)
    assert {op for op, *_ in seen} >= {"mm", "addmm", "bmm"}
    for op, ours, theirs, device, plain in seen:
        assert ours == theirs == plain, (op, ours, theirs)
        assert device == f"NVIDIA H200+{ours}"  # the device form is tried first; flytune's device is the artifact's
        assert gemm.key_problems(ours, "key") == [] and gemm.is_key(ours) and gemm.op_of(ours) == op
    assert any("+alpha=1&beta=1+addmm" in ours for _, ours, *_ in seen)


def test_every_template_inductor_registers_is_one_the_build_knows():
    import torch._inductor.kernel.bmm  # noqa: F401 - each registers its templates' heuristics on import
    import torch._inductor.kernel.mm  # noqa: F401
    import torch._inductor.kernel.mm_plus_mm  # noqa: F401
    from torch._inductor.template_heuristics import registry

    registered = {name for name, *_ in registry._TEMPLATE_HEURISTIC_REGISTRY} - {"mm-ah"}
    assert registered and registered <= set(gemm.TEMPLATES), sorted(registered - set(gemm.TEMPLATES))


def test_a_triton_templates_kwargs_from_the_installed_torch_pass_the_build_rules(monkeypatch):
    """Every config Inductor's CUDA heuristic offers a matmul, as a table entry, meets core.gemm's rules."""
    from torch._inductor.kernel.mm import mm_template
    from torch._inductor.template_heuristics.registry import get_template_heuristic

    found = []
    from torch._inductor.choices import InductorChoices

    original = InductorChoices._finalize_template_configs

    def probe(self, template_choices, kernel_inputs, templates, op_name, *rest):
        with torch._inductor.config.patch(max_autotune=True):
            heuristic = get_template_heuristic(mm_template.uid, "cuda", op_name)
            found.extend(p.to_kwargs() for p in heuristic.get_template_configs(kernel_inputs, op_name))
        return original(self, template_choices, kernel_inputs, templates, op_name, *rest)

    monkeypatch.setattr(InductorChoices, "_finalize_template_configs", probe)
    compile_mm()
    assert found
    for kwargs in found:
        config = gemm.config_of(mm_template.uid, kwargs, mm_template.src_hash)
        assert gemm.problems(KEY, config, "key") == [], kwargs
        entry = {"template_id": "triton::mm", "template_hash": mm_template.src_hash, **kwargs}
        assert gemm.table_entry(config) == entry


# -- serving -----------------------------------------------------------------------------------------------------
def test_a_served_matmul_gets_the_shipped_choice_through_inductors_own_lookup(gemm_dir, cpu_lookup):
    from torch._inductor.virtualized import V

    from flytune_build import inductor as fti

    handler = V.choices
    events = []
    with ft.on_decision(events.append), fti.serve() as serving:
        compile_mm()
    assert serving.stats()["gemm"] == {"offline": 1, "autotune": 0, "single": 0}
    assert [(e["tier"], e["kind"], e["key"][inductor.AXIS], e["config"]) for e in events] == [
        ("offline", "gemm", KEY, {"template_id": "aten::mm"})]
    assert ft.stats()["torch.compile"]["gemm"] == {"offline": 1, "autotune": 0, "single": 0}
    # Inductor's own table and handler are as they were: never written
    assert torch._inductor.config.lookup_table.table is None and V.choices is handler


def test_the_users_own_lookup_table_answers_first_and_stays_as_it_was(gemm_dir, cpu_lookup):
    from torch._inductor.virtualized import V

    from flytune_build import inductor as fti

    class Users(lookup_table.LookupTableChoices):
        def _get_lookup_table(self):  # what Inductor's own reads where CUDA is available (a CPU reads none)
            return torch._inductor.config.lookup_table.table

    mine = {KEY: [{"template_id": "aten::mm"}]}
    users = Users()
    with torch._inductor.config.patch({"lookup_table.table": mine}), V.set_choices_handler(users):
        with fti.serve() as serving:
            compile_mm()
        assert torch._inductor.config.lookup_table.table is mine and mine == {KEY: [{"template_id": "aten::mm"}]}
        assert V.choices is users
    assert serving.stats()["gemm"] == {"offline": 0, "autotune": 0, "single": 0}  # the user's table chose


def test_a_compile_in_a_thread_that_opened_no_serving_is_inductors_own(gemm_dir, cpu_lookup):
    from flytune_build import inductor as fti

    with fti.serve() as serving:
        t = threading.Thread(target=compile_mm)  # a plain thread: outside the serving's context
        t.start()
        t.join()
    assert serving.stats()["gemm"] == {"offline": 0, "autotune": 0, "single": 0}


class FakeInputs:
    """A matmul lowering's inputs as flytune reads them (KernelInputs' dtypes, size hints, strides, scalars)."""

    def __init__(self, shapes=((M, K), (K, N)), scalars=None):
        self.shapes = shapes
        self._scalars = scalars or {}

    def dtypes(self):
        return tuple(torch.float32 for _ in self.shapes)

    def shapes_hinted(self):
        return self.shapes

    def strides_hinted(self):
        return tuple((s[1], 1) for s in self.shapes)

    def device(self):
        return torch.device("cpu")


def lower(serving, n: int):
    """One matmul lowering as Inductor drives it: its finalize call makes `n` choices, then one select among
    them (each choice carrying the KernelTemplateChoice it was made from): what the select was handed."""
    made = [object() for _ in range(n)]
    assert serving.finalize(lambda handler, *a, **kw: made, None, {}, FakeInputs(), [], "mm") == made
    choices = [_Choice(f"c{i}") for i in range(n)]
    for choice, ktc in zip(choices, made):
        choice.annotations["ktc"] = ktc
    return serving.select(lambda cache, name, handed, *a, **kw: handed, None, "mm", choices)


@pytest.mark.parametrize("mode", ["strict", "bundle"])
def test_strict_fails_naming_a_gemm_choice_inductor_would_benchmark(mode, bundle_dir, monkeypatch):  # noqa: F811
    from flytune_build import inductor as fti

    monkeypatch.setenv("FLYTUNE_AUTOTUNE", mode)
    with fti.serve() as serving:
        with pytest.raises(TierMissError, match=rf"{mode}: Inductor GEMM choice mm float32 \[64, 128\] "
                                                r"\[128, 256\].*benchmark 2"):
            lower(serving, 2)
        assert len(lower(serving, 1)) == 1  # one choice: nothing to benchmark
    assert serving.stats()["gemm"] == {"offline": 0, "autotune": 0, "single": 1}


def test_a_benchmarked_gemm_choice_is_counted_and_said_once_on_close(bundle_dir):  # noqa: F811
    from flytune_build import inductor as fti

    serving = fti.serve().open()
    assert len(lower(serving, 2)) == 2
    with pytest.warns(FlytuneWarning, match=r"0 GEMM choice\(s\) served, 1 benchmarked by Inductor \(not served "
                                            r"from the bundle: mm float32 \[64, 128\] \[128, 256\]\)"):
        serving.close()
    assert ft.stats()["torch.compile"]["gemm_autotuned"] == ["mm float32 [64, 128] [128, 256]"]


def test_a_select_of_no_matmul_lowered_here_is_inductors_and_uncounted(bundle_dir):  # noqa: F811
    from flytune_build import inductor as fti

    with fti.serve() as serving:
        handed = [_Choice("conv_a"), _Choice("conv_b")]  # a convolution's select: no finalize made these
        assert serving.select(lambda cache, name, c, *a, **kw: c, None, "convolution", handed) == handed
    assert serving.stats()["gemm"] == {"offline": 0, "autotune": 0, "single": 0}


def test_a_torch_without_the_gemm_hooks_serves_the_kernels_and_says_so_once(bundle_dir, monkeypatch):  # noqa: F811
    from flytune_build.runtime import inductor as rt

    monkeypatch.setattr(rt, "GEMM_HOOKS", rt.GEMM_HOOKS + (("torch._inductor.lookup_table", "NoSuchChoices"),))
    gemm_artifact().save(bundle_dir)
    with pytest.warns(FlytuneWarning, match=r"lacks torch._inductor.lookup_table.NoSuchChoices: the bundle's 1 GEMM "
                                            r"choice\(s\) for this device are not served .*torch 2.10"):
        serving = rt.serve()
    with serving:
        k = load_kernel()
        serving.before_precompile(k)  # the kernels are served as before
        assert [(c.kwargs, c.num_warps) for c in k.configs] == [({"XBLOCK": 512}, 8)]
        assert serving.finalize(lambda handler, *a, **kw: ["a", "b"], None, {}, FakeInputs(), [], "mm") == ["a", "b"]
    assert serving.gemm == {} and serving.stats()["gemm"] == {"offline": 0, "autotune": 0, "single": 0}
    with rt.Recording() as rec:
        assert not rec.gemm and rec.notes[0].startswith("this torch lacks torch._inductor.lookup_table.NoSuchChoices")


def test_a_directory_gemm_artifact_inductor_would_not_look_up_is_refused_with_a_warning(tmp_path, monkeypatch):
    from flytune_build import inductor as fti

    d = tmp_path / "artifacts"
    gemm_artifact(config=gemm.config_of("triton::nope", {})).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    with pytest.warns(FlytuneWarning, match="config.kwargs.template_id.*not a template Inductor looks up"):
        serving = fti.serve()
    assert serving.gemm == {}


# -- the build's rules and every reader --------------------------------------------------------------------------
@pytest.mark.parametrize("key,config,field,rule", [
    ("NVIDIA H200+" + KEY, None, f"key.{inductor.AXIS}", "holds a device"),
    ("((torch.float32, [64, 128], [128, 1]))+mm", None, f"key.{inductor.AXIS}", "must be the key Inductor"),
    (KEY.replace("+mm", "+conv"), None, f"key.{inductor.AXIS}", "names op 'conv'"),
    (KEY.replace("+mm", "+beta=1&alpha=1+addmm"), None, f"key.{inductor.AXIS}", "unsorted"),
    (KEY.replace("[128, 1]", "[128]"), None, f"key.{inductor.AXIS}", "2 size(s) but 1 stride(s)"),
    (KEY, Config({"BLOCK_M": 64}), "config.kwargs.template_id", "is required"),
    (KEY, gemm.config_of("triton::mmm", {}), "config.kwargs.template_id", "not a template Inductor looks up"),
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "evil": 1}), "config.kwargs.evil", "not a kwarg of triton::mm"),
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "BLOCK_M": 48}), "config.kwargs.BLOCK_M", "a power of two"),
    (KEY, gemm.config_of("aten::mm", {"BLOCK_M": 64}), "config.kwargs.BLOCK_M", "not a kwarg of aten::mm"),
    (KEY, gemm.config_of("decompose_k", {"k_split": 4, "splits": 2}), "config.kwargs.splits", "takes k_split"),
    (KEY, Config({"template_id": "aten::mm"}, num_warps=8), "config", "does not take"),
    (KEY, gemm.config_of("aten::mm", {}, "not-a-hash"), "config.kwargs.template_hash", "sha256"),
    # Inductor writes a Triton template's kwargs into the kernel's source: no text but a Triton type
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "ACC_TYPE": "tl.float32\rimport os\rdef f():"}),
     "config.kwargs.ACC_TYPE", "writes it into the kernel's source"),
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "FOO": "1 + 1"}), "config.kwargs.FOO", "a Triton type"),
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "GROUP_M": -3}), "config.kwargs.GROUP_M", "from 0 to"),
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "hint_override": "tl.float32"}), "config.kwargs.hint_override",
     "whole number"),
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "BLOCK_M": 2**40}), "config.kwargs.BLOCK_M", "at most"),
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "BLOCK_K": 256}), "config.kwargs.EVEN_K", "read past K"),
    # what Inductor derives from the call itself: its lookup merges an entry over its own first config
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "EVEN_K": 1}), "config.kwargs.EVEN_K", "true or false"),
    (KEY, gemm.config_of("triton::mm", {**{k: v for k, v in TRITON_MM.items() if k != "EVEN_K"}, "BLOCK_K": 256}),
     "config.kwargs.EVEN_K", "is not set"),
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "ACC_TYPE": "tl.float16"}), "config.kwargs.ACC_TYPE",
     "accumulates torch.float32 inputs in tl.float32"),
    (KEY, gemm.config_of("triton::mm", {**TRITON_MM, "ALLOW_TF32": False}), "config.kwargs.ALLOW_TF32",
     "passed by Inductor itself"),
    (KEY, gemm.config_of("decompose_k", {"k_split": "4"}), "config.kwargs.k_split", "whole number"),
    (KEY, gemm.config_of("decompose_k", {"k_split": 7}), "config.kwargs.k_split", "does not divide the key's K (128)"),
    (KEY.replace("[64, 128]", "[٦٤, 128]"), None, f"key.{inductor.AXIS}", "must be the key Inductor"),
    (KEY.replace("+mm", "+alpha=1\n+mm"), None, f"key.{inductor.AXIS}", "must be the key Inductor"),
])
def test_the_build_refuses_a_gemm_artifact_inductor_would_not_serve_as_written(key, config, field, rule):
    art = gemm_artifact(key, config)
    found = verification.check([art], lambda a: a.filename)
    assert [(e.file, e.field, type(e).__name__) for e in found.errors] == [(art.filename, field, "ArtifactError")]
    assert rule in str(found.errors[0])


@pytest.mark.parametrize("epilogue,field", [
    ({"winner": -1, "unfused": 0}, "provenance.inductor.epilogue.winner"),
    ({"winner": 0, "unfused": "1"}, "provenance.inductor.epilogue.unfused"),
    ({"winner": 0}, "provenance.inductor.epilogue"),
    ([0, 1], "provenance.inductor.epilogue"),
])
def test_a_malformed_epilogue_record_names_its_field(epilogue, field, tmp_path):
    art = gemm_artifact()
    art = Artifact(art.kernel, art.key, art.device, art.config,
                   {"inductor": {"name": "mm", "mode": "max-autotune", "epilogue": epilogue}})
    art.save(tmp_path)
    errors = ft.verify(str(tmp_path)).errors
    assert len(errors) == 1 and field in str(errors[0]), errors


def test_a_gemm_artifact_round_trips_and_every_reader_reads_it(tmp_path, capsys):
    from flytune_build.cli.main import main
    from flytune_build.runtime.searching.bench import Candidate
    from flytune_build.runtime.inductor import recording

    winner = gemm.config_of("triton::mm", TRITON_MM, MM_HASH)
    rec = recording.Record("mm", KEY, "", "gemm", [Candidate(gemm.config_of("aten::mm", {}), 0.012),
                                                    Candidate(winner, 0.010)], winner, {"winner": 1})
    rec.unshipped = [{"name": "cutlass_gemm_0", "time_ms": 0.011}]
    (art,) = recording.artifacts([rec], "mylib.block", "max-autotune-no-cudagraphs", H200)
    old, new = tmp_path / "old", tmp_path / "new"
    art.save(old)
    Artifact("mylib.block", {inductor.AXIS: lookup_key()}, H200, SHIPPED, {"inductor": {"name": "k"}}).save(old)
    back = Artifact.load(art.save(new), canonical=True)
    assert back.config == winner and back.key == {inductor.AXIS: KEY} and inductor.is_gemm(back.key)
    assert back.provenance["inductor"] == {"name": "mm", "mode": "max-autotune-no-cudagraphs",
                                           "unshipped": [{"name": "cutlass_gemm_0", "time_ms": 0.011}]}
    assert gemm.table_entry(back.config) == {"template_id": "triton::mm", "template_hash": MM_HASH, **TRITON_MM}
    assert not ft.verify(str(old)).errors and not ft.verify(str(new)).errors
    assert main(["verify", str(old)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(old), "--json"]) == 0
    assert "mylib.block" in json.dumps(json.loads(capsys.readouterr().out))
    assert main(["diff", str(new), str(old)]) == 0
    assert main(["report", str(new), str(old), "--output", str(tmp_path / "r.html")]) == 0
    assert "triton::mm" in (tmp_path / "r.html").read_text()
    assert main(["merge", str(old), str(new), "--output", str(tmp_path / "merged")]) == 0
    assert sorted(p.name for p in (tmp_path / "merged").glob("*.json")) == sorted(p.name for p in old.glob("*.json"))


# -- the harvest's side ------------------------------------------------------------------------------------------
def compile_addmm(selects: list, monkeypatch):
    """An addmm whose bias has stride 0, compiled on the CPU under max-autotune: Inductor benchmarks ATen's
    addmm against bias_addmm there (select_algorithm, its feedback, its profiler re-timing), as a GPU does
    its templates. The selects Inductor benchmarked are added to `selects`."""
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    original = AlgorithmSelectorCache.do_autotuning

    def spy(self, name, *args, **kwargs):
        selects.append(name)
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(AlgorithmSelectorCache, "do_autotuning", spy)
    w, b, x = torch.randn(K, N), torch.randn(N), torch.randn(M, K)
    torch._dynamo.reset()
    options = {"max_autotune": True, "force_disable_caches": True, "max_autotune_gemm_backends": "ATEN"}
    with torch._inductor.config.patch(options), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        out = torch.compile(lambda x: torch.addmm(b.expand(M, N), x, w))(x)
    torch.testing.assert_close(out, torch.addmm(b.expand(M, N), x, w))


def test_a_select_inductor_benchmarked_is_harvested_then_served_with_nothing_benchmarked(tmp_path, monkeypatch,
                                                                                         cpu_lookup):
    from flytune_build import inductor as fti
    from flytune_build.runtime.searching import selection
    from flytune_build.runtime.inductor import recording

    selects = []
    with recording.Recording(selection.CPU_TIME) as rec:
        compile_addmm(selects, monkeypatch)
    assert selects == ["addmm"] and rec.notes == []
    (record,) = rec.records.values()
    assert record.key.endswith("+alpha=1&beta=1+addmm") and gemm.key_problems(record.key, "key") == []
    assert [c.config.kwargs["template_id"] for c in record.candidates] == ["aten::addmm", "aten::bias_addmm"]
    winner = record.selection["winner"]
    assert winner in (0, 1) and record.winner == record.candidates[winner].config
    d = tmp_path / "artifacts"
    for art in recording.artifacts(rec.records.values(), "mylib.block", "max-autotune", H200):
        art.save(d)
    assert not ft.verify(str(d)).errors

    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    ft.reset_stats()
    with fti.serve() as serving:
        compile_addmm(selects, monkeypatch)
    assert selects == ["addmm"]  # the served compile benchmarked nothing
    assert serving.stats()["gemm"] == {"offline": 1, "autotune": 0, "single": 0}



ADDMM_KEY = f"((torch.float32, [{M}, {N}], [0, 1]), (torch.float32, [{M}, {K}], [{K}, 1]), " \
            f"(torch.float32, [{K}, {N}], [{N}, 1]))+alpha=1&beta=1+addmm"


def one_call_per_template(monkeypatch):
    """Inductor asks for a lowering's choices in one call per template (as a GPU's addmm does in part)."""
    from torch._inductor.choices import InductorChoices

    original = InductorChoices.get_template_configs

    def split(self, kernel_inputs, templates, op_name, *rest, **kwargs):
        out = []
        for t in templates or [None]:
            out += original(self, kernel_inputs, [t] if t else [], op_name, *rest, **kwargs)
        return out

    monkeypatch.setattr(InductorChoices, "get_template_configs", split)


def test_a_users_table_answering_one_call_of_a_lowering_decides_it(tmp_path, monkeypatch, cpu_lookup):
    """The user's table holds bias_addmm, the bundle addmm: Inductor asks ATen's addmm and bias_addmm apart;
    the user's table answers its call, flytune serves the other: the user's choice is the one selected."""
    from torch._inductor.virtualized import V

    from flytune_build import inductor as fti

    class Users(lookup_table.LookupTableChoices):
        def _get_lookup_table(self):
            return torch._inductor.config.lookup_table.table

    one_call_per_template(monkeypatch)
    d = tmp_path / "artifacts"
    gemm_artifact(ADDMM_KEY, gemm.config_of("aten::addmm", {})).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    ft.reset_stats()
    selects = []
    mine = {ADDMM_KEY: [{"template_id": "aten::bias_addmm"}]}
    with torch._inductor.config.patch({"lookup_table.table": mine}), V.set_choices_handler(Users()):
        with fti.serve() as serving:
            compile_addmm(selects, monkeypatch)
    assert selects == [] and serving.stats()["gemm"] == {"offline": 0, "autotune": 0, "single": 0}


@pytest.mark.parametrize("shipped", ["aten::addmm", "aten::bias_addmm"])
def test_a_lowering_that_asks_for_its_templates_in_several_calls_benchmarks_nothing(shipped, tmp_path, monkeypatch,
                                                                                      cpu_lookup):
    """Inductor may ask for one lowering's choices in several calls (torch 2.13's addmm: ATen's templates, the
    contiguous one, the Triton ones), each offering some templates: the shipped choice is served in the call
    offering its template whichever it is, and the select drops what the other calls made."""
    from flytune_build import inductor as fti

    one_call_per_template(monkeypatch)
    key = ADDMM_KEY
    d = tmp_path / "artifacts"
    gemm_artifact(key, gemm.config_of(shipped, {})).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    ft.reset_stats()
    selects = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlytuneWarning)  # no "not served", no "benchmarked"
        with fti.serve() as serving:
            compile_addmm(selects, monkeypatch)
    assert selects == []
    assert serving.stats()["gemm"] == {"offline": 1, "autotune": 0, "single": 0}


class _Template:
    def __init__(self, uid, src_hash=MM_HASH):
        self.uid, self.src_hash = uid, src_hash


class _Params:
    def __init__(self, kwargs):
        self.kwargs = kwargs

    def to_kwargs(self):
        return dict(self.kwargs)


class _Ktc:
    def __init__(self, uid, kwargs):
        self.template, self.params = _Template(uid), _Params(kwargs)


class _Choice:
    """A benchmarked choice as select_algorithm hands it to a feedback saver: its KernelTemplateChoice
    in `annotations["ktc"]` (none for CUTLASS and the like, added outside the template lookup)."""

    def __init__(self, name, uid=None, kwargs=None):
        self.name = name
        self.annotations = {"ktc": _Ktc(uid, kwargs or {})} if uid else {}


def _triton(block_m, name=None):
    return _Choice(name or f"triton_mm_{block_m}", "triton::mm", {**TRITON_MM, "BLOCK_M": block_m})


def _selected(times: dict, choices=None, shipped=None, bench=None, key=KEY, rec=None):
    """Inductor's feedback for one select of `choices` (default: triton::mm at BLOCK_M 64 and 128 and
    aten::mm), each timed `times[name]` on every timing: (the choice Inductor then keeps, the record)."""
    from flytune_build.runtime.searching import selection
    from flytune_build.runtime.inductor import recording, templates

    choices = choices or [_triton(64), _triton(128), _Choice("aten_mm", "aten::mm")]
    rec = rec or recording.Recording(selection.CPU_TIME, shipped)
    timings = {c: times[c.name] for c in choices}
    with rec:
        templates.note_keys(rec, [c.annotations["ktc"] for c in choices if c.annotations], FakeInputs(), "mm")
        assert gemm.describe(key) == "mm float32 [64, 128] [128, 256]"
        rec.feedback(timings, "mm", [], choices, bench or (lambda override: {c: times[c.name] for c in override}), {})
    return min(timings, key=timings.get), rec.records.get(key), rec


def test_a_gemm_choice_is_chosen_by_flytunes_tie_rule_and_inductor_keeps_that_winner():
    kept, record, _ = _selected({"triton_mm_64": 0.0101, "triton_mm_128": 0.0100, "aten_mm": 0.02})
    assert kept.name == "triton_mm_64" and record.winner.kwargs["BLOCK_M"] == 64  # within the noise: declared first
    assert [c.time_ms for c in record.candidates] == [0.0101, 0.0100, 0.02] and record.unshipped == []
    kept, record, _ = _selected({"triton_mm_64": 0.0200, "triton_mm_128": 0.0100, "aten_mm": 0.02})
    assert kept.name == "triton_mm_128" and record.winner == gemm.config_of("triton::mm", {**TRITON_MM,
                                                                                          "BLOCK_M": 128}, MM_HASH)


def test_a_harvest_keeps_the_shipped_gemm_choice_unless_beaten_by_the_margin():
    from flytune_build.runtime.searching.selection import Shipped

    held = {KEY: Shipped(gemm.config_of("aten::mm", {}, MM_HASH), 0.03)}
    kept, record, _ = _selected({"triton_mm_64": 0.0099, "triton_mm_128": 0.02, "aten_mm": 0.0100}, shipped=held)
    assert kept.name == "aten_mm" and record.outcome == "kept"
    kept, record, _ = _selected({"triton_mm_64": 0.0050, "triton_mm_128": 0.02, "aten_mm": 0.0100}, shipped=held)
    assert kept.name == "triton_mm_64" and record.outcome == "replaced"


def test_a_choice_no_table_entry_can_name_is_timed_in_provenance_never_chosen():
    choices = [_triton(64), _Choice("cutlass_gemm_0")]
    kept, record, _ = _selected({"triton_mm_64": 0.0100, "cutlass_gemm_0": 0.0050}, choices)
    assert kept.name == "triton_mm_64" and record.unshipped == [{"name": "cutlass_gemm_0", "time_ms": 0.005}]


def test_a_second_select_of_one_key_keeps_the_first_ones_winner():
    _, first, rec = _selected({"triton_mm_64": 0.0100, "triton_mm_128": 0.0200, "aten_mm": 0.02})
    kept, again, _ = _selected({"triton_mm_64": 0.0200, "triton_mm_128": 0.0100, "aten_mm": 0.02}, rec=rec)
    assert kept.name == "triton_mm_64" and again is first


def test_the_choice_inductors_scheduler_built_with_its_epilogue_fused_is_the_one_recorded(tmp_path):
    """max-autotune defers a select to the scheduler (a MultiTemplateBuffer), which may build another choice
    where that one with its epilogue fused beats the winner plus the epilogue as a kernel of its own: a
    served lowering has one choice and fuses its epilogue unbenchmarked, so the built one must ship."""
    from torch._inductor.ir import MultiTemplateBuffer

    from flytune_build.runtime.inductor import recording

    choices = [_triton(64), _triton(128), _Choice("aten_mm", "aten::mm")]
    _, record, rec = _selected({"triton_mm_64": 0.0200, "triton_mm_128": 0.0100, "aten_mm": 0.03}, choices)
    assert record.winner.kwargs["BLOCK_M"] == 128
    with rec:
        rec.built_as(choices[1])  # the selection's own winner: nothing changes
        assert record.winner.kwargs["BLOCK_M"] == 128 and record.epilogue is None
        rec.built_as(_Choice("conv"))  # a choice of no key recorded here
        rec.built_as(choices[0])  # the scheduler fused the epilogue into BLOCK_M 64
        rec.built_as(choices[2])  # a second matmul of the same key: the first build stands
    assert record.winner == gemm.config_of("triton::mm", {**TRITON_MM, "BLOCK_M": 64}, MM_HASH)
    assert record.epilogue == {"winner": 0, "unfused": 1}
    (art,) = recording.artifacts(rec.records.values(), "mylib.block", "max-autotune", H200)
    assert art.provenance["inductor"]["epilogue"] == {"winner": 0, "unfused": 1}
    art.save(tmp_path)
    assert not ft.verify(str(tmp_path)).errors
    edited = Artifact(art.kernel, art.key, art.device, record.candidates[2].config, art.provenance)
    found = verification.check([edited], lambda a: a.filename)
    assert "chose candidate #0" in str(found.errors[0])
    assert hasattr(MultiTemplateBuffer.finalize_as_triton_caller, "__flytune__")  # the scheduler's call reaches it


def test_a_select_of_several_keys_or_of_a_failing_profiler_is_said_in_the_notes():
    from flytune_build.runtime.searching import selection
    from flytune_build.runtime.inductor import recording, templates

    a, b = _triton(64), _Choice("aten_addmm", "aten::addmm")
    rec = recording.Recording(selection.CPU_TIME)
    with rec:
        templates.note_keys(rec, [a.annotations["ktc"]], FakeInputs(), "mm")
        templates.note_keys(rec, [b.annotations["ktc"]], FakeInputs(scalars={"alpha": 1, "beta": 1}), "addmm")
        rec.feedback({a: 0.01, b: 0.02}, "addmm", [], [a, b], None, {})
    assert rec.records == {} and "took its choices from 2 lookup keys" in rec.notes[0]

    def broken(override):
        raise RuntimeError("no profiler here")

    kept, _, rec = _selected({"triton_mm_64": 0.0200, "triton_mm_128": 0.0100, "aten_mm": 0.03}, bench=broken)
    assert kept.name == "triton_mm_128" and "no profiler here" in rec.notes[0]


def test_a_harvest_takes_out_exactly_its_own_feedback_saver_and_records_only_its_own_context():
    from torch._inductor.select_algorithm import (
        add_feedback_saver,
        get_algorithm_selector_cache,
    )

    from flytune_build.runtime.searching import selection
    from flytune_build.runtime.inductor import recording

    def users(*args):
        pass

    add_feedback_saver(users)
    try:
        rec = recording.Recording(selection.CPU_TIME)
        with rec:
            assert rec._saver in get_algorithm_selector_cache().feedback_saver_fns
            choice = _triton(64)
            rec.keys[choice.annotations["ktc"]] = KEY
            contextvars.Context().run(rec.feedback, {choice: 0.01}, "mm", [], [choice], None, {})
        assert rec.records == {}  # another context's select: not this harvest's
        assert rec._saver not in get_algorithm_selector_cache().feedback_saver_fns
        assert users in get_algorithm_selector_cache().feedback_saver_fns
    finally:
        get_algorithm_selector_cache().feedback_saver_fns.remove(users)


def _harvest_gemm(times: dict):
    """A compile (the harvest's) whose one select Inductor timed as `times` says."""
    from flytune_build.runtime.inductor import hooks, templates

    def compile_once(model, inputs, mode, dynamic=False):
        rec = hooks.current()
        choices = [_triton(64), _triton(128), _Choice("aten_mm", "aten::mm")]
        templates.note_keys(rec, [c.annotations["ktc"] for c in choices], FakeInputs(), "mm")
        rec.feedback({c: times[c.name] for c in choices}, "mm", [], choices,
                     lambda override: {c: times[c.name] for c in override}, {})

    return compile_once


def test_a_harvest_writes_gemm_choices_and_leaves_a_kept_ones_file_byte_for_byte(entry_project, tmp_path, monkeypatch):
    from flytune_build.runtime import inductor as rt

    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    out = tmp_path / "out"
    label = "mm float32 [64, 128] [128, 256]"
    monkeypatch.setattr(rt, "compile_once", _harvest_gemm({"triton_mm_64": 0.02, "triton_mm_128": 0.01,
                                                          "aten_mm": 0.03}))
    first = ft.harvest("harvestpkg.models:block", project=entry_project, output=out, mode="max-autotune", allow_ci=True)
    (path,) = first.written
    assert first.outcomes == {label: "new"} and first.gemm_choices == 1
    assert Artifact.load(path).config.kwargs["BLOCK_M"] == 128 and not ft.verify(str(out)).errors
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    before = path.read_bytes()
    monkeypatch.setattr(rt, "compile_once", _harvest_gemm({"triton_mm_64": 0.0099, "triton_mm_128": 0.0100,
                                                          "aten_mm": 0.03}))  # 1% faster: within 3%
    again = ft.harvest("harvestpkg.models:block", project=entry_project, output=out, mode="max-autotune", allow_ci=True)
    assert again.outcomes[label].startswith("kept") and again.written == []
    assert path.read_bytes() == before and path.stat().st_mtime_ns == 1_000_000_000
    assert again.to_json()["kernels"][0]["gemm"] is True


@pytest.fixture
def entry_project(tmp_path):
    import sys

    root = tmp_path / "proj"
    (root / "harvestpkg").mkdir(parents=True)
    (root / "harvestpkg" / "__init__.py").write_text("")
    (root / "harvestpkg" / "models.py").write_text(
        "import torch\ndef block():\n    return torch.nn.Linear(8, 8), (torch.randn(4, 8),)\n")
    yield root
    for name in [m for m in sys.modules if m == "harvestpkg" or m.startswith("harvestpkg.")]:
        del sys.modules[name]


def test_a_gemm_key_is_told_from_a_kernels_lookup_hash():
    assert gemm.is_key(KEY) and gemm.is_key("NVIDIA H200+" + KEY)
    assert not gemm.is_key("ab" * 32) and not gemm.is_key("not-a-hash") and not gemm.is_key(3)
    assert inductor.is_gemm({inductor.AXIS: KEY}) and not inductor.is_gemm({inductor.AXIS: "ab" * 32})


def test_strict_in_a_real_compile_reaches_the_caller_as_a_tier_miss_error(monkeypatch, cpu_lookup, tmp_path):
    """Inductor wraps an error raised while it lowers (InductorError: LoweringException: ...): closing the
    serving it was raised under hands the caller the TierMissError itself, chained to Inductor's."""
    from flytune_build import inductor as fti

    d = tmp_path / "artifacts"
    gemm_artifact().save(d)  # the mm's choice: the addmm compiled below is in no bundle
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    with pytest.raises(TierMissError, match=r"strict: Inductor GEMM choice addmm .*benchmark 2") as raised:
        with fti.serve():
            compile_addmm([], monkeypatch)
    assert type(raised.value.__cause__).__name__ == "InductorError"


def test_the_persistent_tma_templates_own_kwargs_pass_the_build():
    """Inductor's persistent-TMA heuristic adds two lower-case kwargs of its own (`TMATemplateConfigMixin`):
    a harvest on an H100 with `enable_persistent_tma_matmul` writes them, and the build takes them."""
    kw = {**TRITON_MM, "tma_load_for_template_epilogue": True, "transpose_discontiguous_tensor_descriptors_override": None}
    art = gemm_artifact(KEY, gemm.config_of("triton::mm_persistent_tma", kw))
    assert not verification.check([art], lambda a: a.filename).errors


def test_a_shipped_choice_inductor_cannot_build_fails_naming_its_artifact(tmp_path, monkeypatch):
    """Inductor drops a template choice it cannot build (`choice_or_none`: None) without a word: a shipped
    one would reach its select as no choice at all, counted as served. It fails, naming the artifact."""
    from flytune_build import inductor as fti
    from flytune_build.core.errors import ArtifactError
    from flytune_build.runtime.inductor import hooks

    gemm_artifact(config=gemm.config_of("triton::mm", TRITON_MM)).save(tmp_path)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    declined = object()   # the shipped KernelTemplateChoice, which Inductor then drops

    class Template:
        def __init__(self, uid):
            self.uid, self.src_hash = uid, None
    monkeypatch.setattr(hooks, "lookup_choices", lambda table, inputs, templates, op: [declined])
    aten = [object(), object()]
    with fti.serve() as s:
        s.finalize(lambda *a, **k: aten, None, {}, FakeInputs(), [Template("aten::mm")], "mm")   # Inductor's own
        assert s.finalize(lambda *a, **k: 1 / 0, None, {}, FakeInputs(), [Template("triton::mm")], "mm") == [declined]
        choices = []
        for ktc in aten:   # what Inductor's select gets: the shipped choice dropped
            c = _Choice("aten")
            c.annotations["ktc"] = ktc
            choices.append(c)
        with pytest.raises(ArtifactError, match="choice triton::mm cannot be built by Inductor") as e:
            s.select(lambda cache, name, c, *a, **k: c, None, "mm", choices)
    assert e.value.file and e.value.field == "config"   # the artifact that shipped it
    assert s.stats()["gemm"]["offline"] == 0


def test_a_torch_whose_template_changed_says_so_once_not_once_per_matmul(tmp_path, monkeypatch):
    """After a torch upgrade changed the mm template's source (another template_hash), Inductor's lookup takes
    none of the bundle's entries: one warning for the template, then the close summary (before: one per key)."""
    import warnings

    from flytune_build import inductor as fti
    from flytune_build.runtime.inductor import hooks

    shapes = [((M, K), (K, n)) for n in (256, 512, 1024)]
    for (m, k), (_, n) in shapes:
        key = f"((torch.float32, [{m}, {k}], [{k}, 1]), (torch.float32, [{k}, {n}], [{n}, 1]))+mm"
        gemm_artifact(key, gemm.config_of("triton::mm", TRITON_MM, "ab" * 32)).save(tmp_path)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    monkeypatch.setattr(hooks, "lookup_choices", lambda *a: None)   # Inductor's answer to another template_hash
    import flytune_build as ft

    ft.reset_stats()   # the warnings given so far: another test's may have said this template's

    class Template:
        def __init__(self, uid):
            self.uid, self.src_hash = uid, "cd" * 32
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with fti.serve() as s:
            for shape in shapes:
                ktcs = [object(), object()]
                s.finalize(lambda *a, **k: ktcs, None, {}, FakeInputs(shape), [Template("triton::mm")], "mm")
                choices = []
                for ktc in ktcs:
                    c = _Choice("c")
                    c.annotations["ktc"] = ktc
                    choices.append(c)
                s.select(lambda cache, name, c, *a, **k: c, None, "mm", choices)
    texts = [str(w.message) for w in said]
    assert sum("did not take the choice the bundle holds" in t for t in texts) == 1, texts
    assert any("3 benchmarked by Inductor (not served from the bundle" in t for t in texts), texts


def test_two_compile_entries_shipping_other_choices_for_one_matmul_say_which_is_served(tmp_path, monkeypatch):
    import warnings

    from flytune_build import inductor as fti

    gemm_artifact(config=gemm.config_of("aten::mm", {}), kernel="mylib.block").save(tmp_path)
    gemm_artifact(config=gemm.config_of("triton::mm", TRITON_MM), kernel="mylib.mlp").save(tmp_path)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path))
    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        s = fti.serve()
    s.close()
    (served,) = s.gemm.values()
    assert (served.kernel, served.entry["template_id"]) == ("mylib.block", "aten::mm")   # the first by name
    assert any("mylib.mlp-" in str(w.message) and "differs from" in str(w.message) and "which is served" in
               str(w.message) for w in said), [str(w.message) for w in said]
