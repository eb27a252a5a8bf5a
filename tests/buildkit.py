"""Fixture packages built into real wheels by the backend under test."""
import hashlib
import io
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

from flytune_build import pipeline
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER, DeviceIdentity
from flytune_build.dist.wheelfile import encode

ROOT = Path(__file__).resolve().parent.parent
H200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)

KERNEL = '''
import triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config

@ft.autotune([Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)], ["x", "n"],
             default=lambda a: Config({"BLOCK": 16}), name="fixpkg.add")
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

def add(x, y):
    out = x.new_empty(x.shape)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out
'''

TOOL = '''
[tool.flytune]
sources = ["artifacts"]
targets = ["interpreter", {{ arch = "sm_90", name = "NVIDIA H200", units = 132 }}]
triton = ">=3.0,<4"
{extra}
'''


def pyproject(tool=True, extra="", backend="flytune_build.backend"):
    text = f'''
[build-system]
requires = ["setuptools>=70", "flytune-build"]
build-backend = "{backend}"

[project]
name = "fixpkg"
version = "1.0"
dependencies = []

[tool.setuptools.packages.find]
include = ["fixpkg*"]
'''
    return text + (TOOL.format(extra=extra) if tool else "")


def tune_pyproject(name: str, tune: str, output: str | None = "artifacts/{arch}") -> str:
    """The pyproject.toml of a tuning test project: package `name`, the interpreter target, artifacts in
    `artifacts/`, and `tune` (TOML lines) in `[tool.flytune.tune]`, after `output = "<output>"` (none
    where `output` is None: the default output)."""
    head = textwrap.dedent(f'''
        [project]
        name = "{name}"
        version = "1.0"

        [tool.flytune]
        sources = ["artifacts"]
        targets = ["interpreter"]

        [tool.flytune.tune]
        ''')
    return head + (f'output = "{output}"\n' if output is not None else "") + tune + "\n"


def artifact(n=100, block=32, dev=INTERPRETER, kernel="fixpkg.add", triton="3.6.0", key=None):
    return Artifact(kernel, key or {"x": "float32", "n": n}, dev, Config({"BLOCK": block}),
                    {"triton": triton, "ranking": "synthetic"})


def make_project(root: Path, *, tool=True, extra="", artifacts=None, backend="flytune_build.backend"):
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(pyproject(tool, extra, backend))
    (root / "fixpkg").mkdir(exist_ok=True)
    (root / "fixpkg" / "__init__.py").write_text(KERNEL)
    if artifacts is None:
        artifacts = [artifact(100, 32), artifact(100, 64, dev=H200)]
    for a in artifacts:
        a.save(root / "artifacts")
    return root


def spoil_num_warps(project: Path, art: Artifact) -> None:
    """`art`'s file under the project's artifacts rewritten with num_warps 0, which verification refuses."""
    path = project / "artifacts" / art.filename
    path.write_bytes(path.read_bytes().replace(b'"num_warps":4', b'"num_warps":0'))


def pip_wheel(project: Path, out: Path, env=None, isolation=False):
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(project), "-w", str(out)]
    if not isolation:
        cmd.insert(4, "--no-build-isolation")
    return subprocess.run(cmd, capture_output=True, text=True, env=env or dict(os.environ), cwd=project)


def child_venv(path: Path) -> Path:
    """A fresh venv that sees torch/triton from this one through a .pth, and nothing else of ours."""
    venv.EnvBuilder(with_pip=False).create(path)
    py = path / "bin" / "python"
    site = subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    import torch
    parent = Path(torch.__file__).resolve().parent.parent
    Path(site, "parent_site.pth").write_text(str(parent) + "\n")
    return py


def child_install(py: Path, *wheels, editable=None):
    cmd = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index"]
    if editable:
        cmd += ["--no-build-isolation", "-e", str(editable)]
    cmd += [str(w) for w in wheels]
    return subprocess.run(cmd, capture_output=True, text=True)


def run_child(py: Path, code: str, **env):
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    e.update({k: str(v) for k, v in env.items()})
    return subprocess.run([str(py), "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e, cwd="/")


def lay_out(site: Path, state) -> Path:
    """A build's bundle laid out in `site` beside a fixpkg dist-info (METADATA, the entry point, no RECORD),
    as a plain install leaves it; returns `site`."""
    for name, data in state.files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
    info = site / "fixpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fixpkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[flytune.bundles]\nfixpkg = fixpkg._flytune\n")
    return site


def install_fake_dist(tmp_path: Path, monkeypatch, state) -> Path:
    """The build's bundle installed under tmp_path/site, importable by this process (stats reset);
    returns the bundle directory."""
    from flytune_build.runtime.serving import autotuner

    site = lay_out(tmp_path / "site", state)
    monkeypatch.syspath_prepend(str(site))
    autotuner.reset_stats()
    return site / "fixpkg" / "_flytune"


def install(site: Path, root: Path, dist: str, *, ep_value: str | None = None, record: bool = True,
            package_files: bool = True) -> None:
    """Lay out the project's wheel as an installer would: package, bundle, dist-info with RECORD."""
    state = pipeline.run(root, out=io.StringIO())
    files = dict(state.files)
    if package_files:
        for p in (root / state.project.package).glob("*.py"):
            files[f"{state.project.package}/{p.name}"] = p.read_bytes()
    info = f"{dist.replace('-', '_')}-1.0.dist-info"
    name, value = state.entry_point
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n".encode()
    files[f"{info}/entry_points.txt"] = f"[flytune.bundles]\n{name} = {ep_value or value}\n".encode()
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    if record:
        lines = "".join(f"{rel},sha256={encode(hashlib.sha256(d).digest())},{len(d)}\n" for rel, d in files.items())
        (site / info / "RECORD").write_text(lines + f"{info}/RECORD,,\n")
