"""Hardening III: what an artifact may reach, nonsense arguments, writers that lose nothing, no hang on
an error path, typed errors, settings read when a key is first decided. One test per example of each
class, and per surface its rule covers."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from buildkit import H200
from conftest import python_env

from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.errors import ArtifactError
from flytune_build.runtime.warming import binder

SPEC = {"format": 1, "kernel": "pkg.k:kernel", "signature": {"x": "*fp16", "BLOCK": "constexpr"},
        "constexprs": {"BLOCK": 16}, "attrs": {}, "options": {}}


def with_options(options, config=None):
    config = config or Config({"BLOCK": 16}, num_warps=16)
    return Artifact("pkg.k", {"n": 1}, H200, config, {"specialization": {**SPEC, "options": options}}).to_json()


# -- 1. artifact data becomes launch keyword arguments, nothing else ---------------------------------------
@pytest.mark.parametrize("options, rule", [
    ({"ptx_options": "--injected-by-an-artifact"}, "not a compile option a specialization may record"),
    ({"ir_override": "/tmp/fifo"}, "not a compile option a specialization may record"),
    ({"extern_libs": "libdevice"}, "not a compile option a specialization may record"),
    ({"num_warps": 64}, "comes from the config, never from a specialization"),
    ({"maxnreg": 255}, "comes from the config, never from a specialization"),
    ({"enable_fp_fusion": "yes"}, "takes true or false"),
    ({"default_dot_input_precision": "--x"}, "takes one of tf32"),
    ({"schedule_hint": "attention,--mllvm=-x"}, "takes comma-separated hint names"),
])
def test_a_specialization_option_outside_the_closed_set_never_reaches_the_compiler(options, rule):
    """Read, the artifact's config serves (releases before the closed set recorded any scalar launch
    keyword); checked closed, as the warm-up checks it before anything is compiled, it is refused, naming
    it; the build says so, as a warning."""
    from flytune_build.core import specialization, verification
    from flytune_build.core.codec import Fields

    (name,) = options
    art = Artifact.from_json(with_options(options), file="a.json")
    assert art.provenance["specialization"]["options"] == options
    with pytest.raises(ArtifactError) as e:
        specialization.check(art.provenance["specialization"], Fields("a.json", ArtifactError),
                             config_kwargs=art.config.kwargs)
    assert e.value.field == f"provenance.specialization.options.{name}" and rule in e.value.rule
    found = verification.check([art], lambda a: "a.json")
    assert found.errors == [] and len(found.warnings) == 1
    assert f"a.json: Field `provenance.specialization.options.{name}`" in found.warnings[0]
    assert rule in found.warnings[0] and "does not compile it ahead" in found.warnings[0]


def test_a_specialization_option_contradicting_the_config_is_refused_closed_and_an_agreeing_one_kept():
    from flytune_build.core import specialization
    from flytune_build.core.codec import Fields

    config = Config({"BLOCK": 16, "waves_per_eu": 2})
    art = Artifact.from_json(with_options({"waves_per_eu": 3}, config), file="a.json")
    with pytest.raises(ArtifactError, match="the config decides") as e:
        specialization.check(art.provenance["specialization"], Fields("a.json", ArtifactError),
                             config_kwargs=art.config.kwargs)
    assert e.value.field == "provenance.specialization.options.waves_per_eu"
    art = Artifact.from_json(with_options({"waves_per_eu": 2, "enable_fp_fusion": False}, config), file="a.json")
    assert art.provenance["specialization"]["options"] == {"waves_per_eu": 2, "enable_fp_fusion": False}
    assert specialization.option_problems(art.provenance["specialization"], art.config.kwargs) == []


def _scale():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, BLOCK: tl.constexpr):
        tl.store(x + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float16))
    return binder.compilable(kernel)


@pytest.mark.parametrize("options", [{"ptx_options": "--x"}, {"ir_override": "/dev/zero"}, {"num_warps": 64},
                                     {"debug": [1]}])
def test_compile_inputs_build_options_from_the_config_and_the_closed_set_only(options):
    """`compile_inputs` meets a document that skipped the reader (a caller's own dict): it checks again."""
    jit = _scale()
    spec = {**SPEC, "kernel": "x:y", "options": options}
    with pytest.raises(binder.Mismatch, match="compile option"):
        binder.compile_inputs(spec, jit, Config({"BLOCK": 16}, num_warps=16))
    _, _, _, built = binder.compile_inputs({**spec, "options": {"enable_fp_fusion": False}}, jit,
                                           Config({"BLOCK": 16}, num_warps=16))
    assert built == {"num_warps": 16, "num_stages": 3, "enable_fp_fusion": False}


def _site(tmp_path):
    from test_warmup import make_site

    return make_site(tmp_path)


def _edit_installed_specializations(site, edit):
    """Rewrite the installed bundle's recorded specializations with `edit`, the manifest's hash along (a
    bundle made by a hostile build: consistent, and hostile)."""
    from flytune_build.core import codec

    bundle = site / "fixpkg" / "_flytune"
    prov = bundle / "fixpkg.add.provenance.json"
    doc = json.loads(prov.read_bytes())
    for entry in doc["provenance"].values():
        edit(entry["specialization"])
    data = codec.canonical(doc) + (b"\n" if prov.read_bytes().endswith(b"\n") else b"")
    prov.write_bytes(data)
    manifest = json.loads((bundle / "manifest.json").read_bytes())
    manifest["kernels"]["fixpkg.add"]["provenance_sha256"] = hashlib.sha256(data).hexdigest()
    (bundle / "manifest.json").write_bytes(codec.canonical(manifest) + b"\n")


def _warmup_json(site, tmp_path, **env):
    env = python_env(PYTHONPATH=site, TRITON_INTERPRET=0, TRITON_CACHE_DIR=tmp_path / "triton-cache",
                     FLYTUNE_DEVICE="cuda:sm_90:132:NVIDIA H200", **env)
    return subprocess.run([sys.executable, "-m", "flytune_build.cli", "warmup", "--json"], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("option", ["ir_override", "ptx_options", "num_warps"])
def test_a_bundle_whose_specialization_names_a_path_or_a_config_option_is_not_warmed(tmp_path, option):
    """`ir_override` naming a FIFO made the warm-up open it and hang; `ptx_options` reached ptxas's command
    line; `num_warps: 64` compiled what the config never asked for. The warm-up refuses each, naming it."""
    site = _site(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    value = {"ir_override": str(fifo), "ptx_options": "--injected-by-an-artifact", "num_warps": 64}[option]
    _edit_installed_specializations(site, lambda spec: spec["options"].update({option: value}))
    r = _warmup_json(site, tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["units"] == [] and doc["output"] == ""
    notes = [n for n in doc["notes"] if "fixpkg.add" in n]
    assert len(notes) == 2   # each artifact served here (two keys), named
    assert all(f"specialization.options.{option}" in n and "that artifact not warmed" in n for n in notes), notes


def test_warmup_json_stays_json_when_a_compile_fails_and_prints(tmp_path):
    """ptxas refusing an option (here the user's own PTXAS_OPTIONS) makes Triton print the kernel's whole
    PTX to stdout: it lands, clipped, in the report's `output` field, and stdout is one JSON document."""
    site = _site(tmp_path)
    r = _warmup_json(site, tmp_path, PTXAS_OPTIONS="--not-a-ptxas-option")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and not doc["ok"] and doc["counts"]["failed"] == 2
    assert "PTXAS" in doc["units"][0]["note"] and "Unknown option" in doc["output"]
    assert len(doc["output"]) <= 4096 + 12288 + 64


def test_clip_keeps_the_head_and_tail_of_a_long_output(tmp_path):
    from flytune_build.cli.warmup import clip

    with open(tmp_path / "out", "w+b") as f:
        f.write(b"first\n" + b"x" * 100_000 + b"\nlast\xff")
        text = clip(f)
    assert text.startswith("first\n") and text.endswith("last\ufffd") and "bytes left out" in text
    assert len(text) < 17_000


# -- 2. nonsense arguments: refused before anything runs ------------------------------------------------
def cli(*args):
    from flytune_build.cli.main import main

    return main([str(a) for a in args])


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "soon"])
def test_job_timeout_that_is_no_time_limit_is_a_usage_error(value, capsys):
    """`nan` meant no timeout (a hanging setup hung the fleet); `-1` failed every job."""
    with pytest.raises(SystemExit) as e:
        cli("tune", "--executor", "local", f"--job-timeout={value}")
    assert e.value.code == 2 and "--job-timeout: must be a finite number of seconds above 0" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-2", "x"])
def test_warmup_workers_that_is_no_count_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli("warmup", f"--workers={value}")
    assert e.value.code == 2 and "--workers: must be an integer of at least 1" in capsys.readouterr().err


def test_the_api_refuses_a_time_limit_that_is_none(tmp_path):
    import flytune_build as ft

    for bad in (float("nan"), float("inf"), -1, 0):
        with pytest.raises(ft.UsageError, match="must be a finite number of seconds above 0") as e:
            ft.tune(tmp_path, executor="local", job_timeout=bad)
        assert e.value.field == "job_timeout"
    with pytest.raises(ft.ArgumentTypeError):
        ft.tune(tmp_path, executor="local", job_timeout="10")


def _artifact_dir(path, n):
    path.mkdir(parents=True)
    Artifact("pkg.k", {"n": n}, H200, Config({"BLOCK": 16})).save(path)
    return path


@pytest.mark.parametrize("call", ["merge", "fmt"])
def test_a_bare_string_where_a_list_of_paths_goes_is_refused_and_nothing_is_touched(tmp_path, monkeypatch, call):
    """`merge("AB", "OUT")` merged directories A and B; `fmt("AB")` rewrote both."""
    import flytune_build as ft

    monkeypatch.chdir(tmp_path)
    a, b = _artifact_dir(tmp_path / "A", 1), _artifact_dir(tmp_path / "B", 2)
    (a / "stray.json").write_bytes(b'{"not": "canonical"}')  # fmt would have reported or rewritten
    before = {p: p.read_bytes() for p in (*a.iterdir(), *b.iterdir())}
    for bad in ("AB", b"AB", Path("AB"), 7, [tmp_path / "A", 7]):
        with pytest.raises(ft.ArgumentTypeError) as e:
            ft.merge(bad, "OUT") if call == "merge" else ft.fmt(bad)
        assert isinstance(e.value, TypeError) and e.value.field.startswith("dirs" if call == "merge" else "paths")
        if bad == "AB":
            assert "must be a list of paths, not one str ('AB'); write ['AB'] for one" in str(e.value)
    assert not (tmp_path / "OUT").exists()
    assert {p: p.read_bytes() for p in (*a.iterdir(), *b.iterdir())} == before


@pytest.mark.parametrize("call", [
    lambda ft: ft.merge(["A"], ["OUT"]),
    lambda ft: ft.verify(["A", "B"]),
    lambda ft: ft.inspect(["A"]),
    lambda ft: ft.diff(["A"], "B"),
    lambda ft: ft.tune(["proj"]),
    lambda ft: ft.tune(".", plan=["a.toml"]),
    lambda ft: ft.warmup(["dist-a", "dist-b"]),
    lambda ft: ft.warmup(workers=0),
    lambda ft: ft.warmup(processes="x"),
    lambda ft: ft.tune(".", min_improvement="abc"),
    lambda ft: ft.tune(".", min_improvement=5000),
    lambda ft: ft.tune(".", ranking="bogus"),   # before: the whole search ran, then every artifact was refused
    lambda ft: ft.tune(".", output=""),         # before: the default output, silently
    lambda ft: ft.tune(""),
    lambda ft: ft.verify(""),                   # before: the current directory, as "" never means on the CLI
    lambda ft: ft.verify(".", strict="yes"),
    lambda ft: ft.inspect(""),
    lambda ft: ft.diff("", "."),
    lambda ft: ft.fmt([""]),
    lambda ft: ft.merge([""], "OUT"),
])
def test_every_public_function_refuses_an_argument_of_the_wrong_shape(call):
    import flytune_build as ft

    with pytest.raises(ft.UsageError):
        call(ft)


def test_merge_of_no_directory_is_refused_and_makes_no_output(tmp_path):
    """It made an empty output directory and called that a merge."""
    import flytune_build as ft

    with pytest.raises(ft.UsageError, match="dirs.*at least one artifact directory"):
        ft.merge([], tmp_path / "OUT")
    assert not (tmp_path / "OUT").exists()


def test_reset_to_zero_as_one_name_is_that_name_not_its_characters():
    import triton
    import triton.language as tl

    import flytune_build as ft

    @triton.jit
    def kernel(out, n, BLOCK: tl.constexpr):
        tl.store(out + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float32))

    k = ft.autotune([Config({"BLOCK": 16})], ["n"], reset_to_zero="out", name="t.rz")(kernel)
    assert k.reset_to_zero == ("out",)


# -- 3. writers that move or lose nothing -----------------------------------------------------------------
def _tree(d):
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() and not p.is_symlink() else "link" if p.is_symlink()
                                     else "dir") for p in sorted(d.rglob("*"))}


def test_merge_into_a_symlink_to_an_input_writes_through_and_keeps_the_link(tmp_path):
    """It replaced the link with a new directory, moved A's other files into it and left a temporary
    symlink behind."""
    import flytune_build as ft

    a, b = _artifact_dir(tmp_path / "A", 1), _artifact_dir(tmp_path / "B", 2)
    (a / "notes.txt").write_text("mine")
    (a / "sub").mkdir()
    link = tmp_path / "L"
    link.symlink_to(a)
    b_before = _tree(b)
    union = sorted({p.name for p in (*a.glob("*.json"), *b.glob("*.json"))})
    report = ft.merge([a, b], link)
    assert report.ok and link.is_symlink() and os.readlink(link) == str(a)
    assert sorted(p.name for p in a.iterdir()) == sorted([*union, "notes.txt", "sub"]) and len(union) == 2
    assert (a / "notes.txt").read_text() == "mine" and _tree(b) == b_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A", "B", "L"]  # no temporary left behind


def test_merge_into_a_symlink_to_an_empty_directory_fills_it_and_a_dangling_one_is_refused(tmp_path):
    import flytune_build as ft

    a = _artifact_dir(tmp_path / "A", 1)
    (tmp_path / "X").mkdir()
    (tmp_path / "L").symlink_to(tmp_path / "X")
    assert ft.merge([a], tmp_path / "L").ok
    assert (tmp_path / "L").is_symlink()
    assert [p.name for p in (tmp_path / "X").iterdir()] == [p.name for p in a.iterdir()]
    (tmp_path / "D").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ft.InputError, match="symbolic link to no directory") as e:
        ft.merge([a], tmp_path / "D")
    assert e.value.file == str(tmp_path / "D") and not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A", "D", "L", "X"]


def test_merge_cli_through_a_symlinked_output(tmp_path, capsys):
    a, b = _artifact_dir(tmp_path / "A", 1), _artifact_dir(tmp_path / "B", 2)
    (tmp_path / "L").symlink_to(a)
    assert cli("merge", a, b, "--output", tmp_path / "L") == 0
    assert (tmp_path / "L").is_symlink() and len(list(a.glob("*.json"))) == 2


def _changed_after_read(monkeypatch, module, attr, path, data):
    """Make `module.attr` (a reader) return what it read, then change `path` as another writer would."""
    original = getattr(module, attr)

    def read_then_change(*args, **kwargs):
        out = original(*args, **kwargs)
        Path(path).write_bytes(data)
        return out
    monkeypatch.setattr(module, attr, read_then_change)


@pytest.mark.parametrize("misnamed", [False, True])
def test_fmt_neither_replaces_nor_removes_a_file_changed_after_it_was_read(tmp_path, monkeypatch, misnamed):
    import flytune_build as ft
    from flytune_build.store import canonical

    d = tmp_path / "d"
    d.mkdir()
    art = Artifact("pkg.k", {"n": 1}, H200, Config({"BLOCK": 16}))
    path = d / ("old-name.json" if misnamed else art.filename)
    path.write_text(json.dumps(art.to_json(), indent=1))  # not canonical: fmt replaces (or removes) it
    change = b'{"edited": "by someone else"}'
    _changed_after_read(monkeypatch, canonical.artifactdir, "read_all", path, change)
    report = ft.fmt([d])
    assert not report.ok and path.read_bytes() == change
    (e,) = report.errors
    assert isinstance(e, ft.OutputError) and e.file == str(path) and "changed after it was read" in e.rule
    assert sorted(p.name for p in d.iterdir()) == [path.name]  # nothing written, nothing lost


def test_a_file_changed_between_the_check_and_its_removal_is_put_back(tmp_path):
    from flytune_build.core import fsutil
    from flytune_build.core.errors import OutputError

    path = tmp_path / "a.json"
    path.write_bytes(b"new")
    with pytest.raises(OutputError, match="changed after it was read"):
        fsutil.remove_unchanged(path, b"old")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["a.json"]
    fsutil.remove_unchanged(path, b"new")
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_upgrade_never_removes_a_source_changed_after_it_was_read(tmp_path, monkeypatch):
    from test_compat import mixed_directory

    from flytune_build.store import upgrade as upgrade_mod

    d = mixed_directory(tmp_path)
    before = _tree(d)
    victim = next(p for p in sorted(d.glob("compatpkg.cumsum-*.json")) if upgrade_needed(p))
    change = victim.read_bytes().replace(b'"flytune"', b'"flytune" ', 1)
    _changed_after_read(monkeypatch, upgrade_mod.artifactdir, "read_all", victim, change)
    report = upgrade_mod.upgrade(d)
    assert not report.ok and report.actions == []
    (e,) = report.errors
    assert e.file == str(victim) and "changed after it was read" in e.rule
    assert _tree(d) == {**before, victim.name: change}  # nothing written, the change kept


def upgrade_needed(path):
    return b'"cu_seqlens"' not in path.read_bytes()


def test_bundle_into_a_source_directory_twice_does_not_collect_its_own_output(tmp_path, capsys):
    """`flytune bundle --output fixpkg` with `sources = ["fixpkg"]`: the second run read `fixpkg/_flytune/`
    as artifacts and the project no longer built."""
    from buildkit import artifact, pyproject

    proj = tmp_path / "p"
    (proj / "fixpkg" / "tuned").mkdir(parents=True)
    (proj / "pyproject.toml").write_text(pyproject().replace('sources = ["artifacts"]', 'sources = ["fixpkg"]'))
    (proj / "fixpkg" / "__init__.py").write_text("")
    for a in (artifact(100, 32), artifact(100, 64, dev=H200)):
        a.save(proj / "fixpkg" / "tuned")
    assert cli("bundle", "--output", proj / "fixpkg", "--project", proj) == 0
    first = _tree(proj / "fixpkg" / "_flytune")
    assert cli("bundle", "--output", proj / "fixpkg", "--project", proj) == 0
    assert _tree(proj / "fixpkg" / "_flytune") == first and len(first) == 3
    from flytune_build.core import artifactdir

    assert artifactdir.read_all(proj / "fixpkg", recursive=True).files[0][0].parent.name == "tuned"
    assert len(artifactdir.read_all(proj / "fixpkg", recursive=True).files) == 2


# -- 4. no hang on an error path ------------------------------------------------------------------------
def _big_project(root):
    """A project whose bundle is larger than a pipe's buffer: the child that builds it blocks writing its
    answer until someone reads it."""
    from buildkit import artifact, make_project

    return make_project(root, artifacts=[artifact(n, 32) for n in range(1, 700)] + [artifact(100, 64, dev=H200)])


@pytest.mark.parametrize("how", ["SOURCE_DATE_EPOCH=1e9", "output under a file"])
def test_a_wrapped_build_that_fails_ends_the_backend_process(tmp_path, how):
    """setuptools' build failed, the hook raised, and the process never exited: its forked bundle build
    blocked writing its pipe while the interpreter waited for it at exit."""
    proj = _big_project(tmp_path / "p")
    (proj / "afile").write_text("")
    extra = {"SOURCE_DATE_EPOCH": "1e9"} if how.startswith("SOURCE") else {}
    out = "dist" if extra else "afile/dist"
    r = subprocess.run([sys.executable, "-c", f"from flytune_build import backend; backend.build_wheel({out!r})"],
                       cwd=proj, capture_output=True, text=True, env=python_env(**extra), timeout=120)
    assert r.returncode != 0 and ("1e9" in r.stderr or "Not a directory" in r.stderr)
    assert not list(proj.glob("dist/*.whl")) and not list(tmp_path.glob(".flytune-wheel-*"))


def test_the_bundle_child_is_reaped_after_a_successful_build_too(tmp_path):
    from flytune_build.pipeline import process, run

    proj = _big_project(tmp_path / "p")
    from flytune_build.core import project as project_mod

    pending = process.BackgroundBundle(project_mod.load(proj), run)
    proc = pending._proc
    state = pending.result()
    assert len(state.files) == 3 and proc is not None and pending._proc is None
    pending.close()  # idempotent


FORKS = '''
import os, time

def forks_then_exits(n):
    pid = os.fork()
    if pid == 0:  # keeps every inherited descriptor, the worker's protocol pipe among them
        time.sleep(600)
        os._exit(0)
    with open(os.environ["FLEET_TEST_LOG"], "a") as fh:
        fh.write(f"grandchild {pid}\\n")
    return lambda: os._exit(3)
'''


def test_a_fleet_worker_that_dies_while_its_forked_child_holds_its_pipe_is_noticed(tmp_path):
    """The worker died but a child its setup forked kept its stdout open: it was noticed only when that
    child exited (forever without --job-timeout). Here the child sleeps 600 s; the run ends long before."""
    import signal

    from test_fleet import add_entry, env_for, flytune, make_project

    entry = '{ kernel = "fleetpkg.forks", setup = "fleetpkg.forks:forks_then_exits", shapes = [{ n = 1 }] },'
    proj = make_project(tmp_path / "p", "\n".join([add_entry(100), entry]))
    (proj / "fleetpkg" / "forks.py").write_text(FORKS)
    try:
        r = flytune(proj, "--output", tmp_path / "out", "--executor", "local", "--workers", "1",
                    env=env_for(tmp_path), timeout=300)
        assert r.returncode == 1, r.stdout + r.stderr[-3000:]
        assert "1 tuned, 0 resumed, 1 failed" in r.stdout
        (failed,) = [line for line in r.stdout.splitlines() if line.startswith("failed:")]
        assert "its worker exited with status 3 (both attempts)" in failed
    finally:
        for line in (tmp_path / "calls.log").read_text().splitlines() if (tmp_path / "calls.log").exists() else ():
            if line.startswith("grandchild "):
                try:
                    os.kill(int(line.split()[1]), signal.SIGKILL)
                except ProcessLookupError:
                    pass


# -- 5. typed errors, never an untyped one ----------------------------------------------------------------
VLLM = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 3}}


@pytest.mark.parametrize("name, device", [
    (b"E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8\xff.json", None),
    (b"E=8,N=14336,device_name=NVIDIA_H200\xff.json", "cuda:sm_90:132:NVIDIA H200"),
])
def test_importing_a_file_name_that_is_no_utf8_is_a_typed_error(tmp_path, capsys, name, device):
    """`flytune import --format vllm` of such a name: `UnicodeEncodeError` from the CLI's catch-all."""
    path = os.fsdecode(os.fsencode(tmp_path) + b"/" + name)
    Path(path).write_text(json.dumps(VLLM))
    args = ["import", "--format", "vllm", "--kernel", "mylib.moe", "--output", tmp_path / "out", path]
    assert cli(*args, *(["--device", device] if device else [])) == 1
    err = capsys.readouterr().err
    assert "Field `<file name>` is not valid UTF-8" in err and "\\udcff" in err and "UnicodeEncodeError" not in err
    assert not (tmp_path / "out").exists()


def test_the_cli_prints_a_path_that_is_no_utf8_on_a_strict_utf8_stream(tmp_path):
    """Every line the CLI prints may quote a path: on a UTF-8 stream (which refuses lone surrogates) it is
    written with escapes, never a UnicodeEncodeError."""
    (tmp_path / "E=8,N=14336,device_name=NVIDIA_H200.json").write_text(json.dumps(VLLM))
    out = os.fsencode(tmp_path) + b"/out\xff"
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "import", "--format", "vllm", "--kernel",
                        "mylib.moe", "--output", out, "E=8,N=14336,device_name=NVIDIA_H200.json"], capture_output=True,
                       env=python_env(PYTHONIOENCODING="utf-8", LC_ALL="C.UTF-8"), cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and b"imported 1 artifact(s) of mylib.moe" in r.stdout and b"out\\udcff" in r.stdout
    assert len(list(Path(os.fsdecode(out)).iterdir())) == 1


def test_an_artifact_dir_too_long_to_look_up_is_a_warning_and_ignored(tmp_path, monkeypatch):
    """ENAMETOOLONG from a kernel call (and `inspect --installed`), when FLYTUNE_ARTIFACT_DIR named it."""
    import torch
    from kernels import grid, make_add

    from flytune_build import FlytuneWarning
    from flytune_build.core import settings

    long = str(tmp_path / ("x" * 300))
    good = tmp_path / "arts"
    good.mkdir()
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", os.pathsep.join([long, str(good)]))
    assert settings.current().artifact_dirs == (good,)
    k = make_add("t.longdir", default=lambda a: Config({"BLOCK": 16}))
    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    with pytest.warns(FlytuneWarning, match="cannot look up .*ignored"):   # said by the reader, once
        k[grid(100)](x, y, out, 100)
    assert torch.equal(out, x + y) and k.decision(x, y, out, 100).tier == "heuristic"
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "inspect", "--installed"], capture_output=True,
                       text=True, env=python_env(FLYTUNE_ARTIFACT_DIR=long, TRITON_INTERPRET=1), timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "OSError" not in r.stderr
    assert "cannot look up (File name too long); ignored" in r.stderr


@pytest.mark.parametrize("block", [3, 2 ** 40, -16, 128])
def test_a_scratch_entry_outside_the_declared_configs_is_a_miss_with_one_warning(block, recwarn):
    """A config that passes the bind check but is none of the declared ones (the scratch key holds the
    declared space's hash): an interpreter error (`BLOCK` 3), an int32 range error (2**40), an output left
    unwritten without a word (-16), or a config no search could have picked (128)."""
    import torch
    from kernels import grid, make_add

    from flytune_build import FlytuneWarning
    from flytune_build.runtime.serving.scratch import ScratchCache

    name = f"t.scratch{abs(block) % 1000}"
    k = make_add(name, default=lambda a: Config({"BLOCK": 16}))
    x, y, out = torch.randn(100), torch.randn(100), torch.zeros(100)
    key = k.scratch_key(dict(zip(k.arg_names, (x, y, out, 100))), {"x": "float32", "n": 100})
    ScratchCache(name).put(key, {"config": {"kwargs": {"BLOCK": block}}, "time_ms": 1.0})
    for _ in range(2):
        k[grid(100)](x, y, out, 100)
    assert torch.equal(out, x + y) and k.decision(x, y, out, 100).tier == "heuristic"
    warned = [str(w.message) for w in recwarn if issubclass(w.category, FlytuneWarning)]
    assert len(warned) == 1 and "is none of the kernel's declared configs" in warned[0]


def test_a_scratch_entry_early_config_prune_made_for_the_call_is_served():
    import torch
    from kernels import ADD_CONFIGS, _add, grid

    import flytune_build as ft
    from flytune_build.runtime.serving.scratch import ScratchCache

    made = Config({"BLOCK": 128})
    k = ft.autotune(ADD_CONFIGS, ["x", "n"], name="t.madescratch",
                    prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: [made]})(_add)
    x, y, out = torch.randn(100), torch.randn(100), torch.zeros(100)
    key = k.scratch_key(dict(zip(k.arg_names, (x, y, out, 100))), {"x": "float32", "n": 100})
    ScratchCache("t.madescratch").put(key, {"config": made.to_json(), "time_ms": 1.0})
    k[grid(100)](x, y, out, 100)
    d = k.decision(x, y, out, 100)
    assert torch.equal(out, x + y) and d.tier == "scratch" and d.config == made


# -- 6. settings are read when a key is first decided, not when a kernel is defined ---------------------
MYLIB = '''
import triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config
from flytune_build.runtime.adapters import triton_autotune

@triton.jit
def _add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

ported = ft.autotune([Config({"BLOCK": 16}), Config({"BLOCK": 32})], ["n"], name="mylib.ported")(_add)
adopted = triton.autotune([triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])(_add)
triton_autotune.adopt(adopted, name="mylib.adopted")
'''

AFTER_IMPORT = '''
import json, os, sys, warnings
import torch, triton
import mylib
import flytune_build as ft
os.environ.update(json.loads(sys.argv[1]))  # set after `import mylib`, before the first kernel call
warnings.simplefilter("ignore")
out = {}
for name, k in (("ported", mylib.ported), ("adopted", mylib.adopted)):
    x, y, o = torch.randn(100), torch.randn(100), torch.empty(100)
    try:
        k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, y, o, 100)
        assert torch.equal(o, x + y)
        out[name] = (k.best_config.kwargs if name == "adopted" else k.decision(x, y, o, 100).config.kwargs)["BLOCK"]
    except ft.TierMissError:
        out[name] = "TierMissError"
print(json.dumps(out))
'''


def _after_import(tmp_path, **env):
    (tmp_path / "mylib.py").write_text(MYLIB)
    r = subprocess.run([sys.executable, "-c", AFTER_IMPORT, json.dumps({k: str(v) for k, v in env.items()})],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=python_env(PYTHONPATH=tmp_path, TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0,
                                      FLYTUNE_CACHE_DIR=tmp_path / "cache"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_strict_set_after_import_takes_effect_for_ported_and_adopted_kernels(tmp_path):
    assert _after_import(tmp_path) == {"ported": 16, "adopted": 16}  # FLYTUNE_AUTOTUNE=0: the first config
    assert _after_import(tmp_path, FLYTUNE_AUTOTUNE="strict") == {"ported": "TierMissError",
                                                                 "adopted": "TierMissError"}


def test_an_artifact_dir_set_after_import_serves_ported_and_adopted_kernels(tmp_path):
    from flytune_build.core.device import INTERPRETER

    arts = tmp_path / "arts"
    Artifact("mylib.ported", {"n": 100}, INTERPRETER, Config({"BLOCK": 32})).save(arts)
    Artifact("mylib.adopted", {"n": 100, "x": "float32", "y": "float32", "out": "float32"}, INTERPRETER,
             Config({"BLOCK": 32})).save(arts)
    assert _after_import(tmp_path, FLYTUNE_ARTIFACT_DIR=arts, FLYTUNE_AUTOTUNE="strict") == {"ported": 32,
                                                                                           "adopted": 32}


AFTER_IMPORT_TWICE = AFTER_IMPORT.replace("for name, k in", "for name, k in 2 * ").replace(
    "    except ft.TierMissError:\n        out[name] = \"TierMissError\"",
    "    except ft.FlytuneError as e:\n        out.setdefault(name + '_errors', []).append(type(e).__name__)")


def test_an_invalid_setting_set_after_import_is_refused_by_every_call_not_only_the_first(tmp_path):
    """The first decision raised SettingsError; the next ones quietly kept the settings the import read,
    so an artifact directory set with it was never served."""
    from flytune_build.core.device import INTERPRETER

    arts = tmp_path / "arts"
    Artifact("mylib.ported", {"n": 100}, INTERPRETER, Config({"BLOCK": 32})).save(arts)
    (tmp_path / "mylib.py").write_text(MYLIB)
    env = {"FLYTUNE_ARTIFACT_DIR": str(arts), "FLYTUNE_PRINT_AUTOTUNING": "true"}
    r = subprocess.run([sys.executable, "-c", AFTER_IMPORT_TWICE, json.dumps(env)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env=python_env(PYTHONPATH=tmp_path, TRITON_INTERPRET=1,
                                                                 FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "c"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {"ported_errors": ["SettingsError"] * 2,
                                                     "adopted_errors": ["SettingsError"] * 2}


def test_an_adopted_kernel_reads_its_offline_tier_again_after_the_device_changes(tmp_path, monkeypatch):
    """After FLYTUNE_DEVICE changed and reset_stats(), the adopted kernel served the artifacts of the device
    it was adopted on; a ported kernel raised TierMissError, as both now do."""
    import torch
    import triton
    from test_triton_adapter import make

    import flytune_build as ft
    from flytune_build.core.device import INTERPRETER
    from flytune_build.runtime.adapters import triton_autotune

    arts = tmp_path / "arts"
    Artifact("t.devadopted", {"n": 100, "x": "float32", "y": "float32", "out": "float32"}, INTERPRETER,
             Config({"BLOCK": 64})).save(arts)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(arts))
    k = make()
    assert triton_autotune.adopt(k, name="t.devadopted") == 1
    monkeypatch.setenv("FLYTUNE_DEVICE", "cuda:sm_90:132:NVIDIA H200")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    ft.reset_stats()
    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    with pytest.warns(ft.FlytuneWarning, match="no artifact matches this device"), pytest.raises(ft.TierMissError):
        k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, y, out, 100)


class _SqliteLikeCache:
    """What FlagGems' LibTuner keeps as `cache`: a mapping-ish object backed by a database, no dict."""

    def __init__(self):
        self._rows = {}

    def __contains__(self, key):
        return key in self._rows

    def __getitem__(self, key):
        return self._rows[key]

    def __setitem__(self, key, value):
        self._rows[key] = value

    def get(self, key, default=None):
        return self._rows.get(key, default)


def test_adopting_an_autotuner_whose_cache_is_no_dict_falls_back_with_one_warning(recwarn):
    import torch
    import triton
    from test_triton_adapter import make

    import flytune_build as ft
    from flytune_build.runtime.serving import registry
    from flytune_build.runtime.adapters import triton_autotune

    k = make()
    k.cache = _SqliteLikeCache()
    assert triton_autotune.adopt(k, name="t.sqlitecache") == 0
    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    for _ in range(2):
        k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, y, out, 100)
        assert torch.equal(out, x + y)
    warned = [str(w.message) for w in recwarn if issubclass(w.category, ft.FlytuneWarning)]
    assert len(warned) == 1 and "_SqliteLikeCache, not a dict" in warned[0]
    assert registry.kernel("t.sqlitecache") is not None and "t.sqlitecache" in ft.stats()
    ft.reset_stats()
    with pytest.raises(ft.DeclarationError, match="not a dict"):
        with triton_autotune.recording(k, name="t.sqlitecache"):
            pass


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("member", ["RECORD", "entry_points.txt", "METADATA", "direct_url.json"])
def test_a_fifo_among_a_distributions_metadata_is_refused_never_read(tmp_path, member):
    """Every metadata file of an installed distribution is read as a capped regular file: a FIFO named
    RECORD (or entry_points.txt, METADATA, direct_url.json) is a warning and that distribution is
    skipped; `inspect --installed`, `verify` and a kernel call end."""
    import subprocess
    import sys

    info = tmp_path / "site" / "evil-1.0.dist-info"
    info.mkdir(parents=True)
    files = {"METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
             "entry_points.txt": "[flytune.bundles]\nevil = evil._flytune\n", "RECORD": "", "direct_url.json": "{}"}
    for name, text in files.items():
        if name == member:
            os.mkfifo(info / name)
        else:
            (info / name).write_text(text)
    code = ("from flytune_build.cli.main import main; import sys; "
            "sys.exit(10 * main(['inspect', '--installed']) + main(['verify', 'evil']))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
           "FLYTUNE_AUTOTUNE": "0", "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode in (0, 1), r.stderr[-2000:]   # inspect --installed ends with 0; verify ends, 0 or 1
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_init_skips_a_fifo_named_like_a_module_and_ends(tmp_path):
    import subprocess
    import sys

    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    os.mkfifo(tmp_path / "mypkg" / "k.py")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mypkg"\nversion = "0.1"\n')
    code = "from flytune_build.pipeline import scaffold; import sys; print(scaffold.find_kernels(__import__('pathlib').Path(sys.argv[1]), 'mypkg'))"
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "mypkg")], capture_output=True, text=True,
                       timeout=60, env={**os.environ})
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr[-2000:]


def test_one_artifact_whose_specialization_may_not_reach_the_compiler_leaves_the_kernels_others_warmed(tmp_path):
    """An earlier release recorded an option outside the closed set in one artifact's specialization: the
    warm-up leaves that artifact out, naming it, and plans the kernel's other artifacts (before the artifact
    was served at all, the whole kernel stopped there)."""
    from flytune_build.core import codec

    site = _site(tmp_path)
    bundle = site / "fixpkg" / "_flytune"
    prov = bundle / "fixpkg.add.provenance.json"
    doc = json.loads(prov.read_bytes())
    h200 = Artifact("fixpkg.add", {"n": 100, "x": "float32"}, H200, Config({"BLOCK": 16})).address  # served here
    doc["provenance"][h200]["specialization"]["options"]["ptx_version"] = None
    data = codec.canonical(doc) + (b"\n" if prov.read_bytes().endswith(b"\n") else b"")
    prov.write_bytes(data)
    manifest = json.loads((bundle / "manifest.json").read_bytes())
    manifest["kernels"]["fixpkg.add"]["provenance_sha256"] = hashlib.sha256(data).hexdigest()
    (bundle / "manifest.json").write_bytes(codec.canonical(manifest) + b"\n")
    out = json.loads(_warmup_json(site, tmp_path).stdout)
    (note,) = [n for n in out["notes"] if "not warmed" in n]
    assert "specialization.options.ptx_version" in note and "that artifact not warmed (its config is served)" in note
    assert [len(u["keys"]) for u in out["units"]] == [1] and out["units"][0]["status"] == "compiled", out["units"]
