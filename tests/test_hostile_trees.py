"""Hostile source trees, files, caches and settings: a clear error naming the file, field and rule, or
the next tier serving with one warning; never a traceback, a hang or a half-written file. Anything
that could hang runs in a subprocess under a timeout; the rest under a SIGALRM deadline."""
import errno
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest
from buildkit import H200, artifact, lay_out, make_project
from conftest import ROOT, python_env

from flytune_build import FlytuneWarning, pipeline
from flytune_build.core import fsutil
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER, parse_spec
from flytune_build.core.errors import ArtifactError, DeviceError, ProjectError

TIMEOUT = 120
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def deadline():
    """In-process cases get 60 s: a blocking open of a FIFO is interrupted, not waited on forever."""
    def expire(signum, frame):
        raise TimeoutError("case ran past its 60 s deadline (a hang)")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def child(args, cwd=None, **env):
    r = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=TIMEOUT, check=False,
                       env=python_env(**{"PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", **env}))
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


def backend(proj: Path, hook: str, out: Path):
    """The PEP 517 hook run by a frontend: a process in the project directory."""
    code = f"import sys; import flytune_build.backend as b; print(b.{hook}(sys.argv[1]))"
    return child([sys.executable, "-c", code, str(out)], cwd=proj)


SETUPTOOLS_HANGS = {"loop-exponential-glob", "deep-double-star", "escape-to-root"}  # its find_packages follows
# symlinks (os.walk(followlinks=True)): these trees hang setuptools itself, so they run flytune's bundle step alone


def bundle_step(proj: Path):
    """The pipeline the backend runs beside setuptools, as the backend runs it (errors via or_exit)."""
    code = ("from flytune_build.pipeline import pep517, run; state = pep517.or_exit(run, '.'); "
            "print('ARTIFACTS', len(state.artifacts))")
    return child([sys.executable, "-c", code], cwd=proj)


def flytune(*args, **env):
    return child([sys.executable, "-m", "flytune_build.cli", *map(str, args)], **env)


def table(proj, old, new):
    p = proj / "pyproject.toml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))


def non_strict(proj):
    table(proj, "[tool.flytune]", "[tool.flytune]\nstrict = false")


def wheel_artifacts(out: Path) -> int:
    (whl,) = out.glob("*.whl")
    with zipfile.ZipFile(whl) as zf:
        shard = json.loads(zf.read("fixpkg/_flytune/fixpkg.add.json"))
    return len(shard["artifacts"])


def stray(out: Path) -> list:
    """Anything in the wheel directory, or a staging directory beside it, that is not a finished wheel."""
    here = [p for p in out.iterdir() if not p.name.endswith(".whl")] if out.exists() else []
    return here + list(out.parent.glob(".flytune-wheel-*"))


# -- class 6: bounded, contained source collection ---------------------------------------------------------
def loop_up(p):
    (p / "artifacts" / "loop").symlink_to("..")


def loop_self(p):
    (p / "artifacts" / "self").symlink_to(".")


def loop_mutual(p):
    for a, b in (("a", "b"), ("b", "a")):
        (p / "artifacts" / a).mkdir(exist_ok=True)
    for a, b in (("a", "b"), ("b", "a")):
        (p / "artifacts" / a / "l").symlink_to(f"../{b}")


def loop_exponential(p):
    """Five directories each linking back to the top twice: a naive `**` walks 10^depth paths."""
    top = p / "artifacts"
    for i in range(5):
        d = top / f"d{i}"
        d.mkdir()
        (d / "up").symlink_to("..")
        (d / "top").symlink_to(top)
    table(p, 'sources = ["artifacts"]', 'sources = ["artifacts/**/*.json"]')


def deep_globs(p):
    loop_exponential(p)
    table(p, 'sources = ["artifacts/**/*.json"]', 'sources = ["**/**/**/**/**/**/**/**/**/**/**/*.json"]')


def glob_chars_in_root(p):
    table(p, 'sources = ["artifacts"]', 'sources = ["art*"]')


def hidden_dir_link(p):
    (p / "artifacts" / ".cache").mkdir()
    (p / "artifacts" / ".cache" / "loop").symlink_to("../..")


GOOD_TREES = [  # each builds a wheel holding the two good artifacts, promptly
    ("loop-up", loop_up), ("loop-self", loop_self), ("loop-mutual", loop_mutual),
    ("loop-exponential-glob", loop_exponential), ("deep-double-star", deep_globs),
    ("glob-source", glob_chars_in_root), ("hidden-loop", hidden_dir_link),
]


@pytest.mark.parametrize("case,mutate", GOOD_TREES, ids=[c[0] for c in GOOD_TREES])
def test_looping_or_globbed_tree_builds_promptly(tmp_path, case, mutate):
    proj = make_project(tmp_path / "p[1]*?")  # glob characters in the project's own name
    mutate(proj)
    if case in SETUPTOOLS_HANGS:
        r = bundle_step(proj)
        assert r.returncode == 0 and "ARTIFACTS 2" in r.stdout, r.stderr
        return
    r = backend(proj, "build_wheel", tmp_path / "dist")
    assert r.returncode == 0, r.stderr
    assert wheel_artifacts(tmp_path / "dist") == 2 and not stray(tmp_path / "dist")


def fifo(p, name="artifacts/fifo.json"):
    os.mkfifo(p / name)


def dangling(p):
    (p / "artifacts" / "gone.json").symlink_to("nowhere.json")


def self_link(p):
    (p / "artifacts" / "self.json").symlink_to("self.json")


def too_deep(p):
    d = p / "artifacts"
    for _ in range(70):
        d = d / "d"
    artifact(500, 32).save(d)


def escape_dir(p):
    outside = p.parent / "outside"
    artifact(300, 32).save(outside)
    (p / "artifacts" / "link").symlink_to(outside)


def escape_file(p):
    outside = p.parent / "elsewhere"
    a = artifact(301, 32)
    a.save(outside)
    (p / "artifacts" / a.filename).symlink_to(outside / a.filename)


def escape_root(p):
    (p / "artifacts" / "root").symlink_to("/")


def fifo_glob(p):
    fifo(p)
    table(p, 'sources = ["artifacts"]', 'sources = ["artifacts/*.json"]')


def missing_second_source(p):
    table(p, 'sources = ["artifacts"]', 'sources = ["artifacts", "missing"]')


BAD_TREES = [  # id, mutate, fragments of the error (the source field is named in each)
    ("fifo-walked", fifo, ["artifacts/fifo.json", "a FIFO, not a regular file"]),
    ("fifo-globbed", fifo_glob, ["artifacts/fifo.json", "a FIFO, not a regular file"]),
    ("dangling-link", dangling, ["artifacts/gone.json", "dangling symlink"]),
    ("self-link", self_link, ["artifacts/self.json", "symlink loop"]),
    ("too-deep", too_deep, ["more than 64 directory levels deep"]),
    ("escape-dir", escape_dir, ["artifacts/link", "outside the project root"]),
    ("escape-file", escape_file, ["outside the project root"]),
    ("escape-to-root", escape_root, ["artifacts/root", "outside the project root to '/'"]),
    ("missing-source", missing_second_source, ["'missing', which does not exist"]),
]


@pytest.mark.parametrize("case,mutate,fragments", BAD_TREES, ids=[c[0] for c in BAD_TREES])
def test_hostile_tree_fails_the_build_naming_it(tmp_path, case, mutate, fragments):
    proj = make_project(tmp_path / "p")
    mutate(proj)
    before = sorted(p.name for p in (proj / "artifacts").iterdir())
    r = bundle_step(proj) if case in SETUPTOOLS_HANGS else backend(proj, "build_wheel", tmp_path / "dist")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Field `tool.flytune.sources[" in r.stderr and "pyproject.toml" in r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, (fragment, r.stderr)
    assert not list((tmp_path / "dist").glob("*.whl")) and not stray(tmp_path / "dist")
    assert sorted(p.name for p in (proj / "artifacts").iterdir()) == before  # nothing touched


@pytest.mark.parametrize("case,mutate,fragments", [c for c in BAD_TREES if c[0] != "too-deep"],
                         ids=[c[0] for c in BAD_TREES if c[0] != "too-deep"])
def test_non_strict_build_drops_only_the_bad_entry(tmp_path, case, mutate, fragments):
    proj = make_project(tmp_path / "p")
    mutate(proj)
    non_strict(proj)
    if case in SETUPTOOLS_HANGS:
        r = bundle_step(proj)
        assert r.returncode == 0 and "ARTIFACTS 2" in r.stdout, r.stderr
    else:
        r = backend(proj, "build_wheel", tmp_path / "dist")
        assert r.returncode == 0, r.stderr
        assert wheel_artifacts(tmp_path / "dist") == 2  # every good artifact kept
    assert "warning: dropped:" in r.stderr and fragments[-1] in r.stderr


def test_walk_is_bounded_in_entries(tmp_path, monkeypatch):
    proj = make_project(tmp_path / "p")
    for i in range(50):
        (proj / "artifacts" / f"x{i}.txt").write_text("")
    monkeypatch.setattr(fsutil, "MAX_ENTRIES", 20)
    with pytest.raises(ProjectError) as e:
        from flytune_build.pipeline import collect
        collect.source_files(proj, ["artifacts"], file="pyproject.toml")
    assert e.value.field == "tool.flytune.sources[0]" and "more than 20 directory entries" in e.value.rule


def test_verify_of_an_sdist_with_a_loop_finishes(tmp_path):
    proj = make_project(tmp_path / "p")
    loop_up(proj)
    (proj / "artifacts" / "x").mkdir()
    (proj / "artifacts" / "x" / "again").symlink_to("../..")
    sdist = tmp_path / "fixpkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(proj, arcname="fixpkg-1.0")
    r = flytune("verify", sdist)
    assert r.returncode == 0 and "(sdist): ok; 2 artifact(s)" in r.stdout, r.stdout


@pytest.mark.parametrize("mode", ["w:xz", "w:bz2", "w:gz"])
def test_verify_of_an_sdist_corrupt_mid_stream_is_a_typed_error(tmp_path, mode):
    proj = make_project(tmp_path / "p")
    sdist = tmp_path / "fixpkg-1.0.tar.gz"  # named .tar.gz whatever compresses it, as hostile files are
    with tarfile.open(sdist, mode) as tf:
        tf.add(proj, arcname="fixpkg-1.0")
    data = bytearray(sdist.read_bytes())
    data[len(data) // 2] ^= 0xFF
    sdist.write_bytes(bytes(data))
    r = flytune("verify", "--json", sdist)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "flytune: error:" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["reports"][0]["errors"], r.stdout


def test_verify_of_an_sdist_names_the_member_not_a_vanished_temporary_path(tmp_path):
    proj = make_project(tmp_path / "p")
    table(proj, "[tool.flytune]", "[tool.flytune]\nstrict = 3")
    sdist = tmp_path / "fixpkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(proj, arcname="fixpkg-1.0")
    r = flytune("verify", sdist)
    assert r.returncode == 1 and f"{sdist}!fixpkg-1.0/pyproject.toml: Field `tool.flytune.strict`" in r.stdout, r.stdout


def test_verify_of_an_sdist_that_unpacks_past_the_cap_is_refused(tmp_path, monkeypatch):
    from flytune_build.audit import source as audit

    proj = make_project(tmp_path / "p")
    sdist = tmp_path / "fixpkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(proj, arcname="fixpkg-1.0")
    monkeypatch.setattr(audit, "MAX_SDIST_BYTES", 1000)
    src = audit.open_source(str(sdist))
    assert not src.ok and "would unpack to more than" in str(src.errors[0])


@pytest.mark.parametrize("kind", ["fifo", "devzero", "escaping"])
def test_verify_of_a_directory_names_the_bad_file(tmp_path, kind):
    d = tmp_path / "arts"
    artifact(100, 32).save(d)
    if kind == "fifo":
        os.mkfifo(d / "x.json")
    elif kind == "devzero":
        (d / "x.json").symlink_to("/dev/zero")
    else:
        artifact(101, 32).save(tmp_path / "out")
        (d / "x.json").symlink_to(tmp_path / "out" / artifact(101, 32).filename)
    r = flytune("verify", d)
    assert r.returncode == 1 and "x.json" in r.stdout and "1 artifact(s)" in r.stdout, r.stdout


# -- the tuning plan and the sdist ---------------------------------------------------------------------------
def plan_project(tmp_path, plan, make_plan):
    proj = make_project(tmp_path / "p")
    make_plan(proj)
    (proj / "pyproject.toml").write_text((proj / "pyproject.toml").read_text()
                                         + f'\n[tool.flytune.tune]\nplan = "{plan}"\n')
    return proj


@pytest.mark.parametrize("plan,make_plan,rule", [
    ("root/proc/self/environ", lambda p: (p / "root").symlink_to("/"), "resolves outside the project root"),
    ("plan.toml", lambda p: (p / "plan.toml").symlink_to("/proc/self/environ"), "resolves outside the project root"),
    ("plan.toml", lambda p: os.mkfifo(p / "plan.toml"), "a FIFO, not a regular file"),
], ids=["through-root-link", "link-to-environ", "fifo"])
def test_sdist_never_packs_a_plan_outside_the_root_or_not_a_file(tmp_path, plan, make_plan, rule):
    from flytune_build.core import project
    from flytune_build.pipeline import pep517 as hooks

    proj = plan_project(tmp_path, plan, make_plan)
    with pytest.raises(ProjectError) as e:
        hooks.sdist_sources(project.load(proj))
    assert e.value.field == "tool.flytune.tune.plan" and rule in e.value.rule
    r = child([sys.executable, "-c", "import sys, flytune_build.backend as b; print(b.build_sdist(sys.argv[1]))",
               str(tmp_path / "dist")], cwd=proj, FLYTUNE_TEST_SECRET="s3cr3t-marker")
    assert r.returncode == 1 and not list((tmp_path / "dist").glob("*.tar.gz")), r.stderr
    assert "s3cr3t-marker" not in r.stdout + r.stderr


KILLED = """
import os, sys, time
from pathlib import Path
from flytune_build.pipeline import pep517 as hooks
def build(tmp, config_settings, metadata_directory):
    (Path(tmp) / "fixpkg-1.0-py3-none-any.whl").write_bytes(b"a bundle-less wheel")
    print("built", flush=True)
    time.sleep(60)
hooks.build_wheel(build, sys.argv[1], None, None)
"""


def test_a_killed_wheel_build_leaves_nothing_in_the_wheel_directory(tmp_path):
    proj = make_project(tmp_path / "p")
    out = tmp_path / "dist"
    p = subprocess.Popen([sys.executable, "-c", KILLED, str(out)], cwd=proj, stdout=subprocess.PIPE, text=True,
                         env=python_env())
    assert p.stdout.readline().strip() == "built"
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    assert list(out.iterdir()) == []  # the bundle-less wheel is beside dist/, never in it
    (left,) = list(tmp_path.glob(".flytune-wheel-*"))
    r = backend(proj, "build_wheel", out)  # the next build removes what the dead one left
    assert r.returncode == 0 and not left.exists() and not stray(out)
    assert wheel_artifacts(out) == 2


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError, lambda: ArtifactError("unreadable", file="x")],
                         ids=["ctrl-c", "any-exception", "flytune-error"])
def test_an_sdist_rewrite_that_fails_or_is_interrupted_leaves_no_sdist(tmp_path, monkeypatch, stop):
    """setuptools' sdist lacks the artifacts until flytune's rewrite adds them: whatever stops the rewrite
    (Ctrl-C, any exception, a typed error), no sdist is left, and the stop goes on as it was."""
    from flytune_build.dist import sdist
    from flytune_build.pipeline import pep517 as hooks

    proj = make_project(tmp_path / "p")
    out = tmp_path / "dist"
    out.mkdir()

    def build(directory, config_settings):
        (Path(directory) / "fixpkg-1.0.tar.gz").write_bytes(b"setuptools' sdist, without the artifacts")
        return "fixpkg-1.0.tar.gz"

    def rewrite(target, extra):
        raise stop()

    monkeypatch.chdir(proj)
    monkeypatch.setattr(sdist, "rewrite", rewrite)
    with pytest.raises(SystemExit if stop not in (KeyboardInterrupt, RuntimeError) else stop):
        hooks.build_sdist(build, str(out), None)
    assert list(out.iterdir()) == []


# -- class 7: conflicts and collisions -----------------------------------------------------------------------
def same_runtime_key(other_config, key_value=256.0):
    def mutate(p):
        (p / "more").mkdir()
        b = Artifact("fixpkg.add", {"x": "float32", "n": key_value}, INTERPRETER, Config({"BLOCK": other_config}),
                     {"triton": "3.6.0", "ranking": "synthetic"})
        b.save(p / "more")
        table(p, 'sources = ["artifacts"]', 'sources = ["artifacts", "more"]')
    return mutate


def kernels(*names):
    """Artifacts of each named kernel for both targets (coverage off: only the names are on trial)."""
    def mutate(p):
        for n in names:
            artifact(kernel=n).save(p / "artifacts")
            artifact(dev=H200, block=64, kernel=n).save(p / "artifacts")
        table(p, 'triton = ">=3.0,<4"', 'triton = ">=3.0,<4"\ncoverage = "none"')
    return mutate


COLLISIONS = [  # id, artifacts (beside the two good ones), error fragments
    ("float-key-conflict", lambda p: (artifact(256, 32).save(p / "artifacts"), same_runtime_key(64)(p)),
     ["conflicts with", "the same identity to the runtime", "'n': 256.0"]),
    ("bool-key-conflict", lambda p: (artifact(key={"x": "float32", "n": 1}).save(p / "artifacts"),
                                     same_runtime_key(64, True)(p)), ["conflicts with", "'n': True"]),
    ("kernel-manifest", kernels("manifest"), ["names kernel 'manifest'", "manifest.json is the bundle's manifest"]),
    ("kernel-MANIFEST", kernels("MANIFEST"), ["names kernel 'MANIFEST'", "differs only in case"]),
    ("kernel-provenance", kernels("x", "x.provenance"), ["names kernel 'x.provenance'", "a file of kernel x"]),
    ("kernel-case", kernels("fixpkg.Add", "fixpkg.add"), ["differs only in case", "Field `kernel`"]),
]


@pytest.mark.parametrize("case,mutate,fragments", COLLISIONS, ids=[c[0] for c in COLLISIONS])
def test_collision_fails_the_build_naming_both(tmp_path, case, mutate, fragments):
    proj = make_project(tmp_path / "p")
    mutate(proj)
    r = backend(proj, "build_wheel", tmp_path / "dist")
    assert r.returncode == 1, r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, (fragment, r.stderr)
    assert not list((tmp_path / "dist").glob("*.whl")) and not stray(tmp_path / "dist")


def test_runtime_equal_duplicate_is_kept_once(tmp_path):
    proj = make_project(tmp_path / "p", artifacts=[artifact(256, 32), artifact(100, 64, dev=H200)])
    same_runtime_key(32)(proj)
    state = pipeline.run(proj, out=io.StringIO())
    assert len(state.artifacts) == 2 and any("duplicates" in w for w in state.warnings)


def test_default_group_is_not_copied_into_every_group():
    from importlib.metadata import Distribution

    from flytune_build.dist.wheel import add_entry_point

    text = add_entry_point("[DEFAULT]\nx = a:b\n[console_scripts]\nc = m:f\n", "flytune.bundles", "p", "p._flytune")

    class Meta(Distribution):
        def read_text(self, name):
            return text if name == "entry_points.txt" else None

        def locate_file(self, path):
            return path

    groups = {}
    for ep in Meta().entry_points:
        groups.setdefault(ep.group, []).append((ep.name, ep.value))
    assert groups["flytune.bundles"] == [("p", "p._flytune")] and groups["console_scripts"] == [("c", "m:f")]


# -- flytune fmt: all or nothing --------------------------------------------------------------------------------
def renamed(a: Artifact, d: Path, name: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(json.dumps(a.to_json(), indent=1).encode())
    return d / name


FMT_CASES = [
    ("same-identity", lambda d: (renamed(artifact(100, 32), d, "a.json"), renamed(artifact(100, 64), d, "b.json")),
     ["a.json", "b.json", "different config"]),
    ("runtime-equal", lambda d: (renamed(artifact(256, 32), d, "a.json"),
                                 renamed(Artifact("fixpkg.add", {"x": "float32", "n": 256.0}, INTERPRETER,
                                                  Config({"BLOCK": 64})), d, "b.json")), ["a.json", "b.json"]),
    ("fifo", lambda d: (renamed(artifact(100, 32), d, "a.json"), os.mkfifo(d / "b.json")), ["b.json", "FIFO"]),
    ("devzero", lambda d: (renamed(artifact(100, 32), d, "a.json"), (d / "b.json").symlink_to("/dev/zero")),
     ["b.json", "character device"]),
    ("invalid", lambda d: (renamed(artifact(100, 32), d, "a.json"), (d / "b.json").write_text("{")), ["b.json"]),
]


@pytest.mark.parametrize("case,make,fragments", FMT_CASES, ids=[c[0] for c in FMT_CASES])
def test_fmt_refuses_and_rewrites_nothing(tmp_path, case, make, fragments):
    d = tmp_path / "arts"
    make(d)
    before = {p.name: (p.read_bytes() if p.is_file() else None) for p in d.iterdir()}
    r = flytune("fmt", d)
    assert r.returncode == 1, r.stdout + r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, (fragment, r.stderr)
    assert "nothing was rewritten" in r.stderr
    assert {p.name: (p.read_bytes() if p.is_file() else None) for p in d.iterdir()} == before


def test_fmt_folds_an_exact_duplicate(tmp_path):
    d = tmp_path / "arts"
    a = artifact(100, 32)
    renamed(a, d, "copy.json")
    a.save(d)
    r = flytune("fmt", d)
    assert r.returncode == 0 and [p.name for p in d.iterdir()] == [a.filename]


# -- class 8: typed errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("units", ["١٣٢", "²", "１３２", "13\u0663", "", "-1", "1_000"])
def test_device_units_must_be_ascii_digits(units):
    with pytest.raises(DeviceError) as e:
        parse_spec(f"cuda:sm_90:{units}:NVIDIA H200")
    assert e.value.file == "FLYTUNE_DEVICE" and e.value.field == "units"


RUN_KERNEL = """
import warnings, torch
from kernels import make_add, grid
import flytune_build as ft
from flytune_build import Config
k = make_add("{name}", default=lambda a: Config({{"BLOCK": 16}}))
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    for n in (100, 100, 101):
        x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
        k[grid(n)](x, y, out, n)
        assert torch.equal(out, x + y)
flytune = [str(w.message) for w in rec if issubclass(w.category, ft.FlytuneWarning)]
print("WARNINGS", len(flytune))
for w in flytune:
    print("W:", w[:300])
print("CALLS", ft.stats()["{name}"]["calls"])
"""


def run_kernel(name="t.hostile", **env):
    r = child([sys.executable, "-c", RUN_KERNEL.format(name=name)], cwd="/", **env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_ten_thousand_bad_artifact_files_are_one_warning(tmp_path):
    d = tmp_path / "arts"
    d.mkdir()
    for i in range(10_000):
        (d / f"t.hostile-{i:016x}.json").write_bytes(b"{")
    out = run_kernel(FLYTUNE_ARTIFACT_DIR=d)
    assert "WARNINGS 1" in out and "10000 artifact files or entries ignored" in out, out
    assert "'heuristic': 3" in out


# -- class 1: unbounded reads ------------------------------------------------------------------------------------
def special(path: Path, kind: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_artifact_named_file_that_is_not_a_file_never_hangs_a_kernel_call(tmp_path, kind):
    d = tmp_path / "arts"
    special(d / "t.hostile-0123456789abcdef.json", kind)
    out = run_kernel(FLYTUNE_ARTIFACT_DIR=d)
    assert "WARNINGS 1" in out and "not a regular file" in out and "'heuristic': 3" in out, out


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_scratch_file_that_is_not_a_file_never_hangs_a_kernel_call(tmp_path, kind):
    special(tmp_path / "cache" / "t.hostile.json", kind)
    out = run_kernel(FLYTUNE_CACHE_DIR=tmp_path / "cache")
    assert "not a regular file" in out and "'heuristic': 3" in out, out


def installed_bundle(tmp_path) -> Path:
    return lay_out(tmp_path / "site", pipeline.run(make_project(tmp_path / "p"), out=io.StringIO()))


@pytest.mark.parametrize("target,kind", [("fixpkg.add.json", "fifo"), ("fixpkg.add.json", "devzero"),
                                         ("manifest.json", "devzero")])
def test_bundle_file_that_is_not_a_file_never_hangs_a_kernel_call(tmp_path, target, kind):
    site = installed_bundle(tmp_path)
    path = site / "fixpkg" / "_flytune" / target
    path.unlink()
    special(path, kind)
    out = run_kernel("fixpkg.add", PYTHONPATH=f"{site}{os.pathsep}{ROOT}{os.pathsep}{TESTS}")
    assert "WARNINGS 1" in out and "'heuristic': 3" in out, out


def test_an_unparseable_entry_points_file_elsewhere_skips_that_distribution_alone(tmp_path, monkeypatch):
    from flytune_build.core import installed
    from flytune_build.runtime import warning

    site = installed_bundle(tmp_path)
    other = site / "other-1.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: other\nVersion: 1.0\n")
    (other / "entry_points.txt").write_bytes(b"[flytune.bundles]\nno equals sign here\n")
    monkeypatch.syspath_prepend(str(site))
    warning.reset()
    with pytest.warns(FlytuneWarning, match="entry_points.txt cannot be parsed"):
        found = installed.entry_points(warning.once)
    assert [(name, ep.value) for name, ep in found] == [("fixpkg", "fixpkg._flytune")]


@pytest.mark.parametrize("kind,rule", [("fifo", "a FIFO"), ("devzero", "a character device"),
                                       ("dir", "a directory"), ("big", "over the 100-byte cap"),
                                       ("missing", "cannot be read")])
def test_read_regular_refuses_all_but_a_capped_regular_file(tmp_path, kind, rule):
    p = tmp_path / "f.json"
    if kind in ("fifo", "devzero"):
        special(p, kind)
    elif kind == "dir":
        p.mkdir()
    elif kind == "big":
        p.write_bytes(b"x" * 101)
    with pytest.raises(ArtifactError) as e:
        fsutil.read_regular(p, ArtifactError, 100)
    assert e.value.file == str(p) and rule in e.value.rule
    (tmp_path / "ok").write_bytes(b"x" * 100)
    assert fsutil.read_regular(tmp_path / "ok", ArtifactError, 100) == b"x" * 100


# -- class 2: cache writes are best effort -----------------------------------------------------------------------
WINNER = {"config": {"kwargs": {"BLOCK": 32}}, "time_ms": 1.0}


def cache_case(tmp_path, monkeypatch, case):
    from flytune_build.runtime.serving import scratch

    if case == "is-a-file":
        (tmp_path / "c").write_text("")
        monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "c"))
    elif case == "under-a-file":
        (tmp_path / "c").write_text("")
        monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "c" / "sub"))
    else:
        monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "c"))
        code = {"read-only": errno.EROFS, "full": errno.ENOSPC}[case]

        def fail(*a, **k):
            raise OSError(code, os.strerror(code))
        monkeypatch.setattr(scratch, "atomic_write", fail)


@pytest.mark.parametrize("case", ["is-a-file", "under-a-file", "read-only", "full"])
def test_unwritable_cache_is_one_warning_and_the_winner_stays_in_memory(tmp_path, monkeypatch, case):
    from flytune_build.runtime import warning
    from flytune_build.runtime.serving.scratch import ScratchCache

    cache_case(tmp_path, monkeypatch, case)
    warning.reset()
    c = ScratchCache("t.cache")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        c.put("k1", WINNER)
        c.put("k2", WINNER)
    assert c.get("k1") == WINNER and c.get("k2") == WINNER
    assert len([w for w in rec if issubclass(w.category, FlytuneWarning)]) == 1
    assert "cannot be written" in str(rec[0].message) and "kept in memory" in str(rec[0].message)


def test_a_search_with_an_unwritable_cache_still_serves_the_call(tmp_path, monkeypatch):
    import torch
    from kernels import grid, make_add

    (tmp_path / "c").write_text("")
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    k = make_add("t.searchcache", do_bench=lambda fn: 1.0)
    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    with pytest.warns(FlytuneWarning, match="cannot be written"):
        k[grid(100)](x, y, out, 100)
    assert torch.equal(out, x + y) and k.decision(x, y, out, 100).tier == "scratch"


HOLDER = """
import sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_stopped_lock_holder_delays_a_write_by_the_timeout_only(tmp_path, monkeypatch):
    import time

    from flytune_build.runtime.serving import scratch


    from flytune_build.runtime import warning
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(scratch, "LOCK_TIMEOUT", 0.5)
    warning.reset()
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "t.locked.json.lock")], stdout=subprocess.PIPE,
                         text=True, env=python_env())
    try:
        assert p.stdout.readline().strip() == "held"
        p.send_signal(signal.SIGSTOP)
        c = scratch.ScratchCache("t.locked")
        start = time.monotonic()
        with pytest.warns(FlytuneWarning, match="cannot be written"):
            c.put("k", WINNER)
        assert time.monotonic() - start < 5 and c.get("k") == WINNER
    finally:
        p.kill()
        p.wait(30)


def test_a_lock_path_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path, monkeypatch):
    from flytune_build.runtime import warning
    from flytune_build.runtime.serving.scratch import ScratchCache

    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "c"))
    (tmp_path / "c").mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (tmp_path / "c" / "t.link.json.lock").symlink_to(precious)
    warning.reset()
    with pytest.warns(FlytuneWarning, match="symlink: refused as a lock file"):
        ScratchCache("t.link").put("k", WINNER)
    assert precious.read_text() == "keep me" and ScratchCache("t.link").get("k") is None


@pytest.mark.parametrize("kwargs,rule", [({"BLOCK": 32, "extra": 1}, "binds to no parameter"),
                                         ({"BLOCK": 32, "n": 7}, "overrides")])
def test_a_scratch_entry_binding_what_it_may_not_is_never_launched(tmp_path, monkeypatch, kwargs, rule):
    import torch
    from kernels import grid, make_add

    from flytune_build.runtime.serving.scratch import ScratchCache

    k = make_add("t.badscratch", default=lambda a: Config({"BLOCK": 16}))
    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    key = k.scratch_key({**dict(zip(k.arg_names, (x, y, out, 100)))}, {"x": "float32", "n": 100})
    ScratchCache("t.badscratch").put(key, {"config": {"kwargs": kwargs}, "time_ms": 1.0})
    with pytest.warns(FlytuneWarning, match=rule):
        k[grid(100)](x, y, out, 100)
    assert torch.equal(out, x + y) and k.decision(x, y, out, 100).tier == "heuristic"


# -- lone UTF-16 surrogates: JSON's `\ud800` parses to a string no UTF-8 text holds -----------------------------
def surrogate_artifact(where: str) -> bytes:
    """A valid artifact's bytes with one string replaced by a lone surrogate escape."""
    a = Artifact("t.hostile", {"x": "float32", "n": 100}, INTERPRETER, Config({"BLOCK": 32}),
                 {"triton": "3.6.0", "ranking": "synthetic", "host": "h"})
    text = a.to_bytes().decode()
    old = {"key": '"x":"float32"', "kwarg": '"BLOCK":32', "provenance": '"host":"h"'}[where]
    new = {"key": '"x":"\\ud800"', "kwarg": '"\\udfff":32', "provenance": '"host":"\\ud83d"'}[where]
    assert old in text
    return text.replace(old, new).encode()


@pytest.mark.parametrize("where", ["key", "kwarg", "provenance"])
def test_a_lone_surrogate_is_a_typed_error_everywhere(tmp_path, where):
    d = tmp_path / "arts"
    d.mkdir()
    (d / "t.hostile-0123456789abcdef.json").write_bytes(surrogate_artifact(where))
    out = run_kernel(FLYTUNE_ARTIFACT_DIR=d)
    assert "WARNINGS 1" in out and "lone UTF-16 surrogate" in out and "'heuristic': 3" in out, out
    for command in (("verify", d), ("inspect", d), ("fmt", d)):
        r = flytune(*command)
        assert r.returncode == 1 and "Traceback" not in r.stderr and "UnicodeEncodeError" not in r.stderr, r.stderr
        assert "lone UTF-16 surrogate" in r.stdout + r.stderr
    (d / "t.hostile-0123456789abcdef.json").write_bytes(surrogate_artifact(where).replace(b"\\ud", b"\\\\ud"))
    assert "lone UTF-16 surrogate" not in flytune("verify", d).stdout  # an escaped backslash: plain text


def test_a_plan_nested_too_deeply_is_a_typed_error(tmp_path):
    proj = plan_project(tmp_path, "plan.toml",
                        lambda p: (p / "plan.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n"))
    for command in (("verify", proj), ("tune", "--project", proj, "--allow-ci")):
        r = flytune(*command)
        assert r.returncode in (1, 2) and "Traceback" not in r.stderr and "RecursionError" not in r.stderr, r.stderr
        assert "plan.toml" in r.stdout + r.stderr and "nested too deeply" in r.stdout + r.stderr


def test_an_integer_past_pythons_digit_limit_is_a_typed_error_naming_the_file(tmp_path):
    """Python reads no integer of more than 4300 digits (a ValueError of its own): in a plan, in an
    artifact, it is the file's error, with the rule in words, never Python's advice to its programmers."""
    huge = "9" * 5000
    proj = plan_project(tmp_path, "plan.toml",
                        lambda p: (p / "plan.toml").write_text(f"[[entries]]\nkernel = 1\nx = {huge}\n"))
    for command in (("verify", proj), ("tune", "--project", proj, "--allow-ci")):
        r = flytune(*command)
        out = r.stdout + r.stderr
        assert r.returncode in (1, 2) and "Traceback" not in out and "set_int_max_str_digits" not in out, out
        assert "plan.toml" in out and "more than 4300 digits" in out, out
    d = tmp_path / "arts"
    d.mkdir()
    (d / "t.hostile-0123456789abcdef.json").write_text(
        json.dumps(artifact(100, 32).to_json()).replace('"n": 100', f'"n": {huge}'))
    r = flytune("verify", d)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "t.hostile-0123456789abcdef.json" in out and "more than 4300 digits" in out, out
    assert "set_int_max_str_digits" not in out


def test_a_source_folder_linked_outside_the_root_is_said_so_not_missing(tmp_path):
    proj = make_project(tmp_path / "proj", artifacts=[artifact(100, 32)])
    outside = tmp_path / "elsewhere"
    (proj / "artifacts").rename(outside)
    (proj / "artifacts").symlink_to(outside)
    r = flytune("verify", proj)
    assert r.returncode == 1 and "resolves outside the project root" in r.stdout, r.stdout
    assert "does not exist" not in r.stdout


def test_an_sdist_leaves_out_what_a_lenient_build_dropped_and_never_a_traceback(tmp_path):
    """strict = false: an artifact over the read cap is dropped by the build with a warning; the sdist
    leaves it out too (its wheel gives the same bundle), with no traceback and no sdist half-made."""
    proj = make_project(tmp_path / "p")
    table(proj, "[tool.flytune]", "[tool.flytune]\nstrict = false")
    (proj / "artifacts" / "big.json").write_bytes(b" " * 5_000_000)
    r = child([sys.executable, "-c", "import sys, flytune_build.backend as b; print(b.build_sdist(sys.argv[1]))",
               str(tmp_path / "dist")], cwd=proj)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "left out of the sdist: artifacts/big.json" in r.stderr
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
    assert not any(n.endswith("big.json") for n in names) and sum(n.endswith(".json") for n in names) == 2


def test_an_atomic_write_whose_new_parent_another_process_removes_makes_it_again(tmp_path, monkeypatch):
    # a tuning run removes the empty output folders it made; a second run that made the same folder
    # meanwhile, and is about to write into it, makes it again rather than failing its write
    import tempfile

    from flytune_build.core import fsutil

    target, real, removed = tmp_path / "out" / "sm_90" / "a.json", tempfile.mkstemp, []

    def racing(*a, **k):
        if not removed:   # the other process's rmdir lands between this write's mkdir and its temporary file
            os.rmdir(target.parent)
            removed.append(True)
        return real(*a, **k)
    monkeypatch.setattr(fsutil.tempfile, "mkstemp", racing)
    fsutil.atomic_write(target, b"{}")
    assert removed and target.read_bytes() == b"{}" and os.listdir(target.parent) == ["a.json"]
