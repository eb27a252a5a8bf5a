"""Bundle ownership and config packs: a bundle serves the kernels of its own package; another
distribution's artifacts for them (a config pack) serve only where the owner accepts the pack or the
user opts in, and only for keys the owner lacks. Real distributions laid out in a site directory
(RECORD included), a real Triton kernel on the interpreter."""
from __future__ import annotations

import hashlib
import importlib
import io
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from buildkit import KERNEL, ROOT, artifact, install

import flytune_build as ft
from flytune_build import FlytuneWarning, pipeline
from flytune_build.cli import render
from flytune_build.core import bundle, installed, serving, settings
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import DeviceIdentity
from flytune_build.core.errors import ProjectError, SettingsError
from flytune_build.core.target import Target
from flytune_build.dist.wheelfile import encode
from flytune_build.runtime.serving import offline

PKG = "ownpkg"
KERNEL_NAME = f"{PKG}.add"


def project(root: Path, name: str, package: str, artifacts, extra: str = "", code: str = "") -> Path:
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text(code)
    (root / "pyproject.toml").write_text(f'''
[project]
name = "{name}"
version = "1.0"

[tool.flytune]
package = "{package}"
sources = ["artifacts"]
targets = ["interpreter"]
coverage = "none"
{extra}
''')
    for a in artifacts:
        a.save(root / "artifacts")
    return root


def owner_project(tmp_path: Path, extra: str = "") -> Path:
    return project(tmp_path / "owner", "ownpkg", PKG, [artifact(100, 32, kernel=KERNEL_NAME)], extra,
                   KERNEL.replace("fixpkg.add", KERNEL_NAME))


def pack_project(tmp_path: Path, blocks=((100, 64), (200, 64))) -> Path:
    return project(tmp_path / "pack", "Vendor_Configs", "vendor_configs",
                   [artifact(n, b, kernel=KERNEL_NAME) for n, b in blocks])


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    sys.modules.pop(PKG, None)
    importlib.invalidate_caches()
    yield site
    sys.modules.pop(PKG, None)


def served(n: int):
    """(tier, BLOCK, pack) of a call of ownpkg.add on n elements, served by this process's tiers now."""
    ft.reset_stats()
    mod = importlib.import_module(PKG)
    x = torch.randn(n)
    assert torch.allclose(mod.add(x, x), 2 * x)
    from flytune_build.runtime.serving import registry

    k = registry.kernel(KERNEL_NAME)
    d = k.decision(x, x, x, n)
    hit = k.offline_index().hit(("float32", n))
    return d.tier, d.config.kwargs["BLOCK"], hit.pack if hit is not None else None


def test_a_pack_the_owner_does_not_accept_serves_nothing(tmp_path, site):
    install(site, owner_project(tmp_path), "ownpkg")
    install(site, pack_project(tmp_path), "Vendor_Configs")
    with pytest.warns(FlytuneWarning, match="a config pack, not accepted"):
        assert served(100) == ("offline", 32, None)
    assert served(200) == ("heuristic", 16, None)


def test_the_owner_accepts_a_pack_by_distribution_name_and_its_own_artifacts_win(tmp_path, site):
    install(site, owner_project(tmp_path, 'packs = ["vendor.configs"]'), "ownpkg")  # any PEP 503 spelling
    install(site, pack_project(tmp_path), "Vendor_Configs")
    assert served(100) == ("offline", 32, None)               # the owner's artifact, not the pack's 64
    assert served(200) == ("offline", 64, "Vendor_Configs")    # the pack fills what the owner lacks


def test_the_user_opts_into_packs_with_flytune_packs(tmp_path, site, monkeypatch):
    install(site, owner_project(tmp_path), "ownpkg")
    install(site, pack_project(tmp_path), "Vendor_Configs")
    for value in ("vendor-configs", "*"):
        monkeypatch.setenv("FLYTUNE_PACKS", value)
        assert served(200) == ("offline", 64, "Vendor_Configs")
        assert served(100) == ("offline", 32, None)
    monkeypatch.setenv("FLYTUNE_PACKS", "other-dist")
    assert served(200)[0] == "heuristic"


def test_owner_wins_at_every_match_level(tmp_path):
    """An owner's artifact served at `arch` beats a pack's `exact` one for the same key."""
    h200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
    other_units = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 114)
    manifests = {}
    for name, dev, block in (("owner", other_units, 1), ("pack", h200, 2)):
        a = Artifact("t.k", {"n": 8}, dev, Config({"BLOCK": block}))
        manifests[name] = (a, bundle.shard_bytes("t.k", [a]))
    tier = offline.OfflineTier()
    sources = []
    for name, package, accept in (("owner", "t", ("exact", "arch_units", "arch")), ("pack", "v", ("exact",))):
        root = tmp_path / name
        root.mkdir()
        data = manifests[name][1]
        (root / "t.k.json").write_bytes(data)
        info = bundle.ShardInfo("t.k", "t.k.json", hashlib.sha256(data).hexdigest(), 1, ("n",),
                                "t.k.provenance.json", "0" * 64)
        m = bundle.Manifest(package, (Target("sm_90", accept=accept),), None, {}, {"t.k": info}, "none",
                            ("pack",) if name == "owner" else ())  # the owner accepts the pack
        sources.append(installed.Source(f"{name} bundle", root, m, name, package))
    tier._sources = sources
    hit = tier.index("t.k", ("n",), h200).hit((8,))
    assert (hit.config["kwargs"]["BLOCK"], hit.level, hit.pack) == (1, "arch", None)
    tier._sources = sources[1:]  # no owner installed: the pack is accepted by no one
    with pytest.warns(FlytuneWarning, match="not accepted"):
        assert tier.index("t.k", ("n",), h200).hit((8,)) is None


@pytest.mark.parametrize("value", ["/tmp/somewhere/_flytune", "../ownpkg/_flytune", "ownpkg/_flytune",
                                   "ownpkg._flytune:bundle"])
def test_an_entry_point_value_that_is_a_path_is_never_followed(tmp_path, site, value):
    abs_bundle = tmp_path / "somewhere"
    install(site, owner_project(tmp_path), "ownpkg", ep_value=value)
    (abs_bundle / "_flytune").mkdir(parents=True)
    for f in (site / PKG / "_flytune").iterdir():
        (abs_bundle / "_flytune" / f.name).write_bytes(f.read_bytes())
    with pytest.warns(FlytuneWarning, match="not a dotted module name"):
        assert served(100)[0] == "heuristic"


def test_a_bundle_under_a_package_its_distribution_does_not_install_owns_nothing(tmp_path, site):
    """A data-only distribution writing `ownpkg/_flytune/` (the package itself comes from elsewhere)."""
    install(site, owner_project(tmp_path), "intruder", package_files=False)
    (site / PKG / "__init__.py").write_text(KERNEL.replace("fixpkg.add", KERNEL_NAME))  # ownpkg, from no RECORD
    with pytest.warns(FlytuneWarning, match="the distribution does not own that package"):
        assert served(100)[0] == "heuristic"


def intruder(site: Path, bundle_dir: Path, dist: str, rel: str, manifest_package: str, files: dict[str, bytes],
             direct_url: str | None = None) -> None:
    """Install `dist`: the bundle in `bundle_dir`, re-labelled as `manifest_package`'s and placed at
    `rel` (a bundle directory), with `files` beside it, its RECORD listing them all."""
    src = {p.name: p.read_bytes() for p in bundle_dir.iterdir()}
    m = src[bundle.MANIFEST]
    src[bundle.MANIFEST] = m.replace(b'"package":"ownpkg"', f'"package":"{manifest_package}"'.encode())
    info = f"{dist}-1.0.dist-info"
    out = {**{f"{rel}/{n}": d for n, d in src.items()}, **files,
           f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n".encode(),
           f"{info}/entry_points.txt": f"[flytune.bundles]\n{dist} = {rel.replace('/', '.')}\n".encode()}
    if direct_url is not None:
        out[f"{info}/direct_url.json"] = direct_url.encode()
    for name, data in out.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
    lines = "".join(f"{n},sha256={encode(hashlib.sha256(d).digest())},{len(d)}\n" for n, d in out.items())
    (site / info / "RECORD").write_text(lines + f"{info}/RECORD,,\n")


def retuned_owner(tmp_path: Path) -> Path:
    """The owner's project with other configs: an intruder copying its bundle serves BLOCK 64, not 32."""
    return project(tmp_path / "other", "ownpkg", PKG, [artifact(100, 64, kernel=KERNEL_NAME),
                                                       artifact(200, 64, kernel=KERNEL_NAME)],
                   code=KERNEL.replace("fixpkg.add", KERNEL_NAME))


@pytest.mark.parametrize("rel,package,files", [
    ("ownpkg/add/_flytune", "ownpkg.add", {"ownpkg/add/__init__.py": b""}),   # a sub-package named like the kernel
    ("ownpkg/add/_flytune", "ownpkg.add", {"ownpkg/add/k.py": b""}),         # the same, with no __init__.py
])
def test_a_distribution_inside_another_distributions_package_owns_nothing_there(tmp_path, site, rel, package, files):
    """The longest package a kernel lies under is its owner only where that package is its
    distribution's own: here `ownpkg/__init__.py` is the owner's, so the intruder is a config pack."""
    other = tmp_path / "o"
    install(other, retuned_owner(tmp_path), "ownpkg")   # the intruder's bundle: other configs, same kernel
    install(site, owner_project(tmp_path), "ownpkg")
    intruder(site, other / PKG / "_flytune", "intruder", rel, package, files)
    with pytest.warns(FlytuneWarning, match="the distribution does not own that package"):
        assert served(100) == ("offline", 32, None)   # the owner's, not the intruder's 64
    assert served(200)[0] == "heuristic"                # the intruder's other key: an unaccepted pack


def test_a_package_is_owned_by_the_distribution_whose_init_it_is():
    """core.serving.owns over a RECORD and the files beside it."""
    on_disk = {"fla/__init__.py", "fla/ops/__init__.py", "google/cloud/x/__init__.py"}
    own = {"fla/__init__.py", "fla/ops/__init__.py", "fla/ops/k.py"}
    assert serving.owns(own, "fla.ops", on_disk.__contains__)
    assert not serving.owns({"fla/ops/mine.py"}, "fla.ops", on_disk.__contains__)          # fla's package
    assert not serving.owns({"fla/ops/new/__init__.py"}, "fla.ops.new", on_disk.__contains__)  # inside fla's
    assert serving.owns({"google/cloud/x/__init__.py"}, "google.cloud.x", on_disk.__contains__)  # namespace parents
    assert not serving.owns({"numpy_data.txt"}, "numpy", on_disk.__contains__)               # installs nothing


@pytest.mark.parametrize("tree", ["none", "foreign", "owner"])
def test_an_editable_bundle_owns_the_package_only_where_its_source_tree_holds_it(tmp_path, site, tree):
    """An editable wheel's bundle (`__flytune_editable__.<name>`) lies outside the package: it owns the
    package only where the install's source tree (direct_url.json) is where that package comes from."""
    import shutil

    other = tmp_path / "o"
    install(other, retuned_owner(tmp_path), "ownpkg")
    install(site, owner_project(tmp_path), "ownpkg")
    shutil.rmtree(site / PKG / "_flytune")               # the package, installed without a bundle of its own
    (tmp_path / "evil" / "evilpkg").mkdir(parents=True)  # another project's source tree
    where = {"foreign": tmp_path / "evil", "owner": site}.get(tree)
    direct = None if where is None else f'{{"url": "{where.as_uri()}", "dir_info": {{"editable": true}}}}'
    intruder(site, other / PKG / "_flytune", "editor", "__flytune_editable__/editor", PKG, {}, direct_url=direct)
    if tree == "owner":
        assert served(100) == ("offline", 64, None)       # the source tree holds ownpkg: its bundle serves
    else:
        with pytest.warns(FlytuneWarning, match="the distribution does not own that package"):
            assert served(100)[0] == "heuristic"


@pytest.mark.parametrize("extra,ok", [({}, False), ({"__editable__.ownpkg-1.0.pth": b"/src\n"}, True)])
def test_verify_refuses_an_editable_bundle_in_a_wheel_that_is_not_editable(tmp_path, extra, ok):
    from flytune_build.audit import source

    state = pipeline.run(owner_project(tmp_path), out=io.StringIO())
    files = {k.replace(f"{PKG}/_flytune/", "__flytune_editable__/ownpkg/"): v for k, v in state.files.items()}
    files.update(extra, **{"ownpkg-1.0.dist-info/entry_points.txt":
                           b"[flytune.bundles]\nownpkg = __flytune_editable__.ownpkg\n",
                           "ownpkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-any\n"})
    src = source.verify(str(wheel(tmp_path / "ownpkg-1.0-py3-none-any.whl", files)))
    assert src.ok is ok, render.render_verify(src)
    if not ok:
        assert any("an editable install whose source tree does not hold it" in str(e) for e in src.errors)


def test_the_build_refuses_a_package_the_project_does_not_hold(tmp_path):
    root = owner_project(tmp_path)
    text = (root / "pyproject.toml").read_text().replace(f'package = "{PKG}"', 'package = "numpy"')
    (root / "pyproject.toml").write_text(text)
    with pytest.raises(ProjectError) as e:
        pipeline.run(root, out=io.StringIO())
    assert e.value.field == "tool.flytune.package" and "'numpy', which this project does not hold" in e.value.rule
    (root / "numpy" / "_flytune").mkdir(parents=True)  # a bundle directory alone does not make it the project's
    with pytest.raises(ProjectError):
        pipeline.run(root, out=io.StringIO())


def test_the_build_finds_packages_where_the_backend_is_told_to(tmp_path):
    root = project(tmp_path / "p", "libpkg", "libpkg", [artifact(100, 32, kernel="libpkg.add")])
    (root / "lib").mkdir()
    (root / "libpkg").rename(root / "lib" / "libpkg")
    text = (root / "pyproject.toml").read_text()
    with pytest.raises(ProjectError):
        pipeline.run(root, out=io.StringIO())
    (root / "pyproject.toml").write_text(text + '\n[tool.setuptools.packages.find]\nwhere = ["lib"]\n')
    assert pipeline.run(root, out=io.StringIO()).entry_point[1] == "libpkg._flytune"


def test_accepted_packs_travel_in_the_manifest_and_are_absent_when_none(tmp_path):
    state = pipeline.run(owner_project(tmp_path, 'packs = ["Vendor_Configs", "b"]'), out=io.StringIO())
    data = state.files[serving.bundle_prefix(PKG) + bundle.MANIFEST]
    assert bundle.Manifest.from_bytes(data, file="m").packs == ("b", "vendor-configs")
    plain = pipeline.run(pack_project(tmp_path), out=io.StringIO())
    assert b'"packs"' not in plain.files[serving.bundle_prefix("vendor_configs") + bundle.MANIFEST]


def test_flytune_packs_must_name_distributions():
    assert settings.read({"FLYTUNE_PACKS": " A_b , c.d "}).packs == ("a-b", "c-d")
    with pytest.raises(SettingsError) as e:
        settings.read({"FLYTUNE_PACKS": "a b"})
    assert e.value.field == "FLYTUNE_PACKS"


def test_inspect_installed_says_which_bundle_serves_each_kernel(tmp_path, site):
    from flytune_build.audit import inspection

    install(site, owner_project(tmp_path), "ownpkg")
    install(site, pack_project(tmp_path), "Vendor_Configs")
    with pytest.warns(FlytuneWarning):
        info = inspection.installed()
    (k,) = [k for k in info["kernels"] if k["kernel"] == KERNEL_NAME]
    assert k["owner"] == PKG and k["keys"] == 1
    assert [(s["dist"], s["role"], s["keys_served"]) for s in k["sources"]] == [
        ("ownpkg", "owner", 1), ("Vendor_Configs", "pack, not accepted", 0)]
    text = render.render_installed(info)
    assert "pack, not accepted" in text and "\\n" not in text  # one table row per line, never an escaped newline
    assert any(line.lstrip().startswith(KERNEL_NAME) for line in text.splitlines())


def test_inspect_installed_leaves_the_process_offline_tier_as_it_is(tmp_path, site):
    """An API caller's index survives `inspect --installed`: the audit reads through a tier of its own."""
    from flytune_build.audit import inspection

    install(site, owner_project(tmp_path), "ownpkg")
    before = offline.TIER.sources()
    info = inspection.installed()
    assert offline.TIER.sources() is before
    assert [k["owner"] for k in info["kernels"] if k["kernel"] == KERNEL_NAME] == [PKG]


def test_verify_reports_a_pack_and_refuses_a_path_entry_point(tmp_path, site):
    from flytune_build.audit import source

    install(site, pack_project(tmp_path), "Vendor_Configs")
    src = source.verify("Vendor_Configs")
    assert src.ok, render.render_verify(src)
    assert any("a config pack" in w for w in src.warnings)


def test_config_time_reads_the_candidates_of_provenance():
    prov = {"candidates": [{"config": {"kwargs": {"B": 1}}, "time_ms": 2.5},
                           {"config": {"kwargs": {"B": 2}}, "time_ms": float("nan")}]}
    assert serving.config_time(prov, {"kwargs": {"B": 1}}) == 2.5
    assert serving.config_time(prov, {"kwargs": {"B": 2}}) is None and serving.config_time(None, {}) is None


def test_best_takes_the_best_rank_then_the_first_entry():
    got = serving.best([((1, 0), ["a", "b"], [1, 2]), ((0, 1), ["b"], [3]), ((1, 0), ["a"], [4]),
                        ((2, 0), ["c", "c"], [5, 6])])
    assert got == {"a": 1, "b": 3, "c": 5}


def wheel(path: Path, files: dict[str, bytes]) -> Path:
    import zipfile

    info = "ownpkg-1.0.dist-info"
    record = "".join(f"{n},sha256={encode(hashlib.sha256(d).digest())},{len(d)}\n" for n, d in files.items())
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in {**files, f"{info}/RECORD": (record + f"{info}/RECORD,,\n").encode()}.items():
            zf.writestr(name, data)
    return path


@pytest.mark.parametrize("value,rule", [
    ("/abs/ownpkg/_flytune", "not a dotted module name"),
    ("numpy._flytune", "places a bundle under package 'numpy', which this wheel does not otherwise contain"),
])
def test_verify_refuses_a_path_entry_point_and_a_bundle_in_a_package_the_wheel_lacks(tmp_path, value, rule):
    from flytune_build.audit import source

    state = pipeline.run(owner_project(tmp_path), out=io.StringIO())
    files = dict(state.files)
    if value.startswith("numpy"):  # the same bundle, moved into numpy/ and naming it
        files = {k.replace(f"{PKG}/", "numpy/", 1): v for k, v in files.items()}
        m = serving.bundle_prefix("numpy") + bundle.MANIFEST
        files[m] = files[m].replace(b'"package":"ownpkg"', b'"package":"numpy"')
    files[f"{PKG}/__init__.py"] = b""
    files["ownpkg-1.0.dist-info/entry_points.txt"] = f"[flytune.bundles]\nownpkg = {value}\n".encode()
    src = source.verify(str(wheel(tmp_path / "ownpkg-1.0-py3-none-any.whl", files)))
    assert not src.ok and any(rule in str(e) for e in src.errors), render.render_verify(src)


def test_a_refused_pack_hit_leaves_the_key_to_the_next_tier(tmp_path, site, monkeypatch):
    install(site, owner_project(tmp_path), "ownpkg")
    install(site, pack_project(tmp_path), "Vendor_Configs")
    monkeypatch.setenv("FLYTUNE_PACKS", "*")
    assert served(200) == ("offline", 64, "Vendor_Configs")
    from flytune_build.runtime.serving import registry

    idx = registry.kernel(KERNEL_NAME).offline_index()
    assert idx.refuse(("float32", 200)).pack == "Vendor_Configs"
    assert idx.hit(("float32", 200)) is None and idx.hit(("float32", 100)).pack is None


def test_a_pack_config_that_fails_to_launch_is_refused_once_and_the_next_tier_serves(tmp_path, site, monkeypatch):
    """The owner never accepted the pack's config: its launch failure is one warning, not an
    ArtifactExecutionError, and the heuristic serves the key from then on (an owner's failure stays loud)."""
    install(site, owner_project(tmp_path), "ownpkg")
    install(site, pack_project(tmp_path, blocks=((200, 48),)), "Vendor_Configs")  # 48: no power of 2, no launch
    monkeypatch.setenv("FLYTUNE_PACKS", "*")
    with pytest.warns(FlytuneWarning, match=r"config pack Vendor_Configs: .* failed to launch .*refused, the next "
                                            r"tier serves"):
        assert served(200) == ("heuristic", 16, None)
    assert served(200) == ("heuristic", 16, None)  # decided again after a reset: the pack is read afresh, refused again


ADOPTED_SOURCE = '''
import triton, triton.language as tl
from flytune_build.triton import adopt


@triton.autotune([triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


adopt(add_kernel, "ownpkg.add")


def add(x, y):
    out = x.new_empty(x.shape)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out
'''


def adopted_key(n: int) -> dict:
    return {"n": n, "x": "float32", "y": "float32", "out": "float32"}


@pytest.mark.parametrize("owner_block,loud", [(32, False), (48, True)])
def test_an_adopted_kernels_pack_config_that_fails_is_refused_and_the_owners_stays_loud(
        tmp_path, site, monkeypatch, owner_block, loud):
    """The same rule for an adopted `@triton.autotune` kernel: a pack's config (48 elements: no power
    of 2, no launch) is refused with one warning and the first config serves; the owner's failing
    config is an ArtifactExecutionError naming it."""
    from flytune_build.core.errors import ArtifactExecutionError
    from flytune_build.runtime.serving import registry

    install(site, project(tmp_path / "owner", "ownpkg", PKG,
                          [artifact(100, owner_block, kernel=KERNEL_NAME, key=adopted_key(100))], "", ADOPTED_SOURCE),
            "ownpkg")
    install(site, project(tmp_path / "pack", "Vendor_Configs", "vendor_configs",
                          [artifact(200, 48, kernel=KERNEL_NAME, key=adopted_key(200))]), "Vendor_Configs")
    monkeypatch.setenv("FLYTUNE_PACKS", "*")
    ft.reset_stats()
    mod = importlib.import_module(PKG)
    if loud:
        with pytest.raises(ArtifactExecutionError, match="failed to compile or launch with the accepted artifact"):
            mod.add(torch.randn(100), torch.randn(100))
        return
    x = torch.randn(100)
    assert torch.allclose(mod.add(x, x), 2 * x)
    x = torch.randn(200)
    with pytest.warns(FlytuneWarning, match=r"config pack Vendor_Configs: .* failed to launch .*refused"):
        assert torch.allclose(mod.add(x, x), 2 * x)
    assert torch.allclose(mod.add(x, x), 2 * x)   # decided: no second failure, no second warning
    calls = registry.kernel(KERNEL_NAME).stats()["calls"]
    assert calls.get("offline") == 1 and calls.get("heuristic") == 2, calls


def test_a_distribution_name_with_escape_sequences_reaches_no_warning_raw(tmp_path, site, monkeypatch):
    """A hostile distribution name quoted in a runtime warning is written as Python escapes."""
    install(site, owner_project(tmp_path), "ownpkg")
    install(site, pack_project(tmp_path), "Evil\x1b[31mRED\x1b[0m")
    with pytest.warns(FlytuneWarning) as got:
        served(100)
    text = " ".join(str(w.message) for w in got)
    assert "\x1b" not in text and "\\x1b[31mRED" in text


def test_a_copy_of_the_package_shadowed_on_sys_path_owns_nothing(tmp_path, site, monkeypatch):
    """Ownership follows the package the interpreter imports: a second distribution whose own `ownpkg/`
    (with a bundle) lies later on sys.path, never imported, serves nothing as owner, and
    `inspect --installed` names one owner, the imported one's."""
    from flytune_build.audit import inspection

    install(site, owner_project(tmp_path), "ownpkg")
    later = tmp_path / "later-site"
    later.mkdir()
    shadow = project(tmp_path / "shadow", "shadowdist", PKG, [artifact(100, 64, kernel=KERNEL_NAME)], "",
                     KERNEL.replace("fixpkg.add", KERNEL_NAME))
    install(later, shadow, "shadowdist")
    monkeypatch.setattr(sys, "path", [*sys.path, str(later)])  # after site: site's ownpkg is the one imported
    with pytest.warns(FlytuneWarning, match="shadowdist bundle.*does not own"):
        assert served(100) == ("offline", 32, None)
    info = inspection.installed()
    (k,) = [k for k in info["kernels"] if k["kernel"] == KERNEL_NAME]
    assert [(s["dist"], s["role"]) for s in k["sources"]] == [("ownpkg", "owner"),
                                                               ("shadowdist", "pack, not accepted")]


def test_ownership_is_decided_alike_before_and_after_the_package_is_imported(tmp_path, site):
    """What the import system would import decides, whether or not the package is imported yet: the
    owner found before the first kernel call is the owner found after it."""
    from flytune_build.core import installed as inst

    install(site, owner_project(tmp_path), "ownpkg")
    before = [(s.dist, s.package) for s in inst.bundles()]
    importlib.import_module(PKG)
    after = [(s.dist, s.package) for s in inst.bundles()]
    assert before == after == [("ownpkg", PKG)]
    assert inst.import_location(PKG) == [site / PKG]


def test_a_record_that_lists_the_owners_init_does_not_demote_the_owner(tmp_path, site):
    """A second distribution whose RECORD lists `ownpkg/__init__.py` (the very file, byte for byte) takes
    nothing from the owner: the owner's artifact still serves as the owner's, the other's stays an
    unaccepted pack, and `flytune verify` of the other is a violation naming the file."""
    from flytune_build.audit import source

    install(site, owner_project(tmp_path), "ownpkg")
    install(site, pack_project(tmp_path), "Vendor_Configs")
    info = site / "Vendor_Configs-1.0.dist-info"
    init = (site / PKG / "__init__.py").read_bytes()
    line = f"{PKG}/__init__.py,sha256={encode(hashlib.sha256(init).digest())},{len(init)}\n"
    record = (info / "RECORD").read_text()
    (info / "RECORD").write_text(line + record)
    with pytest.warns(FlytuneWarning, match="a config pack, not accepted"):
        assert served(100) == ("offline", 32, None)
    assert served(200) == ("heuristic", 16, None)
    src = source.verify("Vendor_Configs")
    assert not src.ok and any(f"{PKG}/__init__.py" in str(e) for e in src.errors), render.render_verify(src)


def test_an_imported_package_that_sets_its_own_path_is_found_where_it_imports_from(tmp_path, monkeypatch):
    from flytune_build.core import installed as inst

    (tmp_path / "a" / "pathpkg").mkdir(parents=True)
    (tmp_path / "b" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "pathpkg" / "sub").mkdir()
    (tmp_path / "b" / "sub" / "__init__.py").write_text("")
    (tmp_path / "a" / "pathpkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "a" / "pathpkg" / "__init__.py").write_text(f"__path__ = [{str(tmp_path / 'b')!r}]\n")
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.delitem(sys.modules, "pathpkg", raising=False)
    importlib.import_module("pathpkg")
    try:
        assert inst.import_location("pathpkg.sub") == [tmp_path / "b" / "sub"]
    finally:
        sys.modules.pop("pathpkg", None)


def test_a_hand_made_dist_info_naming_another_owners_bundle_owns_nothing(tmp_path, site):
    """No RECORD (laid out by hand) and an entry point naming `ownpkg._flytune`, which an installed
    distribution owns: the hand-made one is no owner, and `inspect --installed` names one owner."""
    from flytune_build.audit import inspection

    install(site, owner_project(tmp_path), "ownpkg")
    info = site / "evil-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[flytune.bundles]\nevil = {PKG}._flytune\n")
    assert served(100) == ("offline", 32, None)
    (k,) = [k for k in inspection.installed()["kernels"] if k["kernel"] == KERNEL_NAME]
    assert [s["role"] for s in k["sources"] if s["dist"] == "ownpkg"] == ["owner"]
    assert [s["role"] for s in k["sources"] if s["dist"] == "evil"] in ([], ["pack, not accepted"])


# -- a package imported from its own source tree (run from the project root) ---------------------------------
def source_tree(tmp_path: Path, files: dict[str, str], package_dir: str = PKG) -> Path:
    """A project root holding `ownpkg/` (the owner's code) and `files`, put first on sys.path as
    `python` run from there puts it; returns the root."""
    root = tmp_path / "checkout"
    (root / package_dir).mkdir(parents=True)
    (root / package_dir / "__init__.py").write_text(KERNEL.replace("fixpkg.add", KERNEL_NAME))
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def first_on_path(monkeypatch, where: Path) -> None:
    monkeypatch.syspath_prepend(str(where))
    sys.modules.pop(PKG, None)
    importlib.invalidate_caches()


EGG_INFO = {"ownpkg.egg-info/PKG-INFO": "Metadata-Version: 2.1\nName: ownpkg\nVersion: 1.0\n",
            "ownpkg.egg-info/top_level.txt": "ownpkg\n"}


@pytest.mark.parametrize("files,on_path", [
    (EGG_INFO, "."),                                                         # what a setuptools build leaves
    ({"pyproject.toml": '[project]\nname = "OwnPkg"\nversion = "1.0"\n'}, "."),  # hatchling: no egg-info
    ({"pyproject.toml": '[project]\nname = "ownpkg"\nversion = "1.0"\n'}, "src"),  # src layout
], ids=["egg-info", "pyproject", "src-layout"])
def test_the_installed_bundle_serves_the_distributions_own_source_tree_imported_first(
        tmp_path, site, monkeypatch, files, on_path):
    """Run from the project root, `import ownpkg` imports the checkout, not the installed copy: the
    installed bundle still serves it (the same distribution's source, the same kernels), with no warning,
    and `inspect --installed` and the warm-up's plan say so alike."""
    from flytune_build.audit import inspection
    from flytune_build.runtime.warming import warmup

    install(site, owner_project(tmp_path), "ownpkg")
    root = source_tree(tmp_path, files, package_dir=f"{on_path}/{PKG}" if on_path != "." else PKG)
    first_on_path(monkeypatch, root / on_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlytuneWarning)
        assert served(100) == ("offline", 32, None)
        assert importlib.import_module(PKG).__file__.startswith(str(root))
        (k,) = [k for k in inspection.installed()["kernels"] if k["kernel"] == KERNEL_NAME]
    assert [(s["dist"], s["role"], s["keys_served"]) for s in k["sources"]] == [("ownpkg", "owner", 1)]
    units, notes = warmup.plan(("ownpkg",))
    assert units and not any("does not own" in n for n in notes), notes


@pytest.mark.parametrize("files", [{}, {"pyproject.toml": '[project]\nname = "otherlib"\n'},
                                   {"ownpkg.egg-info/PKG-INFO": "Metadata-Version: 2.1\nName: otherlib\n"}],
                         ids=["bare", "other-project", "other-egg-info"])
def test_a_shadowing_tree_that_is_not_the_distributions_source_is_said_once_naming_both_paths(
        tmp_path, site, monkeypatch, files):
    from flytune_build.runtime.warming import warmup

    install(site, owner_project(tmp_path), "ownpkg")
    root = source_tree(tmp_path, files)
    first_on_path(monkeypatch, root)
    with pytest.warns(FlytuneWarning) as got:
        assert served(100)[0] == "heuristic"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlytuneWarning)  # no reset: nothing is said twice
        x = torch.randn(200)
        assert torch.allclose(importlib.import_module(PKG).add(x, x), 2 * x)
    assert len(got) == 1, [str(w.message) for w in got]
    said = [str(w.message) for w in got if "is imported from" in str(w.message)]
    assert str(root / PKG) in said[0] and str(site / PKG) in said[0] and "does not own" in said[0]
    assert any("does not own" in n for n in warmup.plan(("ownpkg",))[1])


def test_run_from_the_project_root_after_a_real_build_the_installed_wheel_serves(tmp_path):
    """The guide's user: a wheel built with pip (leaving `fixpkg.egg-info` in the project root) and
    installed; `python -c` run from the project root imports the source tree, and the installed bundle
    serves it, no warning (FLYTUNE_AUTOTUNE=bundle: nothing else may)."""
    import subprocess
    import zipfile

    from buildkit import make_project, pip_wheel
    from conftest import python_env

    proj = make_project(tmp_path / "project")
    r = pip_wheel(proj, tmp_path / "dist")
    assert r.returncode == 0, r.stderr
    assert (proj / "fixpkg.egg-info").is_dir()
    (whl,) = (tmp_path / "dist").glob("*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(site)
    code = ("import warnings, torch, flytune_build as ft\nwarnings.simplefilter('error', ft.FlytuneWarning)\n"
            "import fixpkg\nx = torch.randn(100)\nassert torch.equal(fixpkg.add(x, x), x + x)\n"
            "print(fixpkg.__file__, ft.stats()['fixpkg.add']['calls']['offline'])")
    r = subprocess.run([sys.executable, "-c", code], cwd=proj, capture_output=True, text=True, check=False,
                       env=python_env(PYTHONPATH=f"{site}{os.pathsep}{ROOT}", TRITON_INTERPRET=1,
                                      FLYTUNE_AUTOTUNE="bundle", FLYTUNE_CACHE_DIR=tmp_path / "cache"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [str(proj / "fixpkg" / "__init__.py"), "1"]


def test_an_adopted_kernel_imported_from_its_source_tree_is_seeded_from_the_installed_bundle(
        tmp_path, site, monkeypatch):
    from flytune_build.runtime.serving import registry

    install(site, project(tmp_path / "owner", "ownpkg", PKG, [artifact(100, 32, kernel=KERNEL_NAME,
                                                                       key=adopted_key(100))], "", ADOPTED_SOURCE),
            "ownpkg")
    root = source_tree(tmp_path, EGG_INFO)
    (root / PKG / "__init__.py").write_text(ADOPTED_SOURCE)
    first_on_path(monkeypatch, root)
    ft.reset_stats()
    mod = importlib.import_module(PKG)
    x = torch.randn(100)
    assert torch.allclose(mod.add(x, x), 2 * x)
    assert registry.kernel(KERNEL_NAME).stats()["calls"]["offline"] == 1 and mod.add_kernel.best_config.kwargs == {
        "BLOCK": 32}


# -- two distributions listing one __init__.py: ambiguity, never ownership -------------------------------------
def copied_init(site: Path) -> dict[str, bytes]:
    return {f"{PKG}/__init__.py": (site / PKG / "__init__.py").read_bytes()}


def test_a_pack_that_copies_the_owners_init_takes_no_kernel_of_it(tmp_path, site):
    """A pack wheel installing a byte-identical `ownpkg/__init__.py` (its RECORD lists the owner's file)
    and a bundle of `ownpkg.add`, the kernel's name: the owner, whose bundle is ownpkg's own, keeps its
    kernels; the pack's configs serve nothing, and the warning names the file and both distributions."""
    other = tmp_path / "o"
    install(other, retuned_owner(tmp_path), "ownpkg")
    install(site, owner_project(tmp_path), "ownpkg")
    intruder(site, other / PKG / "_flytune", "Vendor", f"{PKG}/add/_flytune", f"{PKG}.add",
             {f"{PKG}/add/__init__.py": b"", **copied_init(site)})
    with pytest.warns(FlytuneWarning) as got:
        assert served(100) == ("offline", 32, None)   # the owner's, not the pack's 64
    said = [str(w.message) for w in got if "is listed as its own file by Vendor and ownpkg" in str(w.message)]
    assert len(said) == 1 and "Vendor and ownpkg" in said[0], [str(w.message) for w in got]
    with pytest.warns(FlytuneWarning, match="the distribution does not own that package"):
        assert served(200)[0] == "heuristic"           # the pack's other key: no owner's, no accepted pack's


def test_two_distributions_shipping_the_same_packages_bundle_are_ambiguous_and_neither_serves(tmp_path, site):
    """The pack also writes `ownpkg/_flytune/` (its configs over the owner's) and names `ownpkg._flytune`:
    both list `ownpkg/__init__.py` and both ship ownpkg's bundle. Nobody owns ownpkg's kernels (the
    heuristic serves), and one warning names both distributions."""
    other = tmp_path / "o"
    install(other, retuned_owner(tmp_path), "ownpkg")
    install(site, owner_project(tmp_path), "ownpkg")
    intruder(site, other / PKG / "_flytune", "Vendor", f"{PKG}/_flytune", PKG, copied_init(site))
    with pytest.warns(FlytuneWarning) as got:
        assert served(100)[0] == "heuristic"
    said = [str(w.message) for w in got if "ambiguous" in str(w.message)]
    assert len(said) == 1 and "Vendor and ownpkg" in said[0] and "each ship a bundle" in said[0], \
        [str(w.message) for w in got]


def test_a_pack_copying_the_init_of_a_package_that_ships_no_bundle_owns_nothing(tmp_path, site):
    """The owner installs ownpkg with no bundle; a pack copying its `__init__.py` does not become ownpkg's
    owner by that claim: neither ships ownpkg's own bundle, so neither owns it, nor `ownpkg.add` in it."""
    import shutil

    other = tmp_path / "o"
    install(other, retuned_owner(tmp_path), "ownpkg")
    install(site, owner_project(tmp_path), "ownpkg")
    shutil.rmtree(site / PKG / "_flytune")
    intruder(site, other / PKG / "_flytune", "Vendor", f"{PKG}/add/_flytune", f"{PKG}.add",
             {f"{PKG}/add/__init__.py": b"", **copied_init(site)})
    with pytest.warns(FlytuneWarning, match=r"none ships package ownpkg's own bundle: which of them owns ownpkg is "
                                            r"ambiguous"):
        assert served(100)[0] == "heuristic"


def test_a_pack_shipping_a_bundle_into_a_package_another_installs_as_a_whole_owns_nothing(tmp_path, site):
    """The owner installs ownpkg (its `__init__.py` and `ops.py`) and no bundle; a pack copies the
    `__init__.py` and writes `ownpkg/_flytune/`: the package as a whole is the owner's, so the pack's
    bundle owns nothing there, and nothing serves ownpkg's kernels from it."""
    import shutil

    other = tmp_path / "o"
    install(other, retuned_owner(tmp_path), "ownpkg")
    install(site, owner_project(tmp_path), "ownpkg")
    shutil.rmtree(site / PKG / "_flytune")
    (site / "ownpkg-1.0.dist-info" / "entry_points.txt").unlink()  # ownpkg, installed with no bundle
    ops = b"X = 1\n"
    (site / PKG / "ops.py").write_bytes(ops)
    record = site / "ownpkg-1.0.dist-info" / "RECORD"
    record.write_text(f"{PKG}/ops.py,sha256={encode(hashlib.sha256(ops).digest())},{len(ops)}\n" + record.read_text())
    intruder(site, other / PKG / "_flytune", "Vendor", f"{PKG}/_flytune", PKG, copied_init(site))
    with pytest.warns(FlytuneWarning, match=r"Vendor ships package ownpkg's bundle but another installs more of it: "
                                            r"which of them owns ownpkg is ambiguous"):
        assert served(100)[0] == "heuristic"


def test_a_namespace_stub_every_portion_lists_keeps_each_portion_its_own(tmp_path, site):
    """pkgutil-style namespace packages: each portion's RECORD lists the parent's stub `__init__.py`; a
    portion with a bundle still owns its own package."""
    stub = b"__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n"
    root = project(tmp_path / "portion", "ns-portion", "nsroot", [artifact(100, 32, kernel="nsroot.portion.add")])
    text = (root / "pyproject.toml").read_text().replace('package = "nsroot"', 'package = "nsroot.portion"')
    (root / "pyproject.toml").write_text(text)
    (root / "nsroot" / "__init__.py").write_bytes(stub)
    (root / "nsroot" / "portion").mkdir()
    (root / "nsroot" / "portion" / "__init__.py").write_text(KERNEL.replace("fixpkg.add", "nsroot.portion.add"))
    install(site, root, "ns-portion")
    info = site / "ns_portion-1.0.dist-info"
    record = (info / "RECORD").read_text()
    line = f"nsroot/__init__.py,sha256={encode(hashlib.sha256(stub).digest())},{len(stub)}\n"
    for rel in ("nsroot/__init__.py", "nsroot/portion/__init__.py"):
        data = (root / rel).read_bytes()
        (site / rel).write_bytes(data)
        record = f"{rel},sha256={encode(hashlib.sha256(data).digest())},{len(data)}\n" + record
    (info / "RECORD").write_text(record)
    other = site / "ns_other-1.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: ns-other\nVersion: 1.0\n")
    (other / "RECORD").write_text(line + "ns_other-1.0.dist-info/RECORD,,\n")
    assert [(s.dist, s.package, s.refused) for s in installed.bundles()] == [("ns-portion", "nsroot.portion", "")]


def test_a_stale_second_dist_info_of_the_same_distribution_is_no_contest(tmp_path, site):
    install(site, owner_project(tmp_path), "ownpkg")
    old = site / "ownpkg-0.9.dist-info"
    old.mkdir()
    (old / "METADATA").write_text("Metadata-Version: 2.1\nName: ownpkg\nVersion: 0.9\n")
    for name in ("RECORD", "entry_points.txt"):
        (old / name).write_text((site / "ownpkg-1.0.dist-info" / name).read_text())
    assert served(100) == ("offline", 32, None)


def test_two_claims_of_one_init_are_ambiguity_unless_one_ships_the_packages_bundle():
    """core.serving.contest: (ships the package's bundle, other modules of it installed) per claimant."""
    assert serving.contest({"owner": (True, 3), "pack": (False, 0)}, False) == ("owner",)
    assert serving.contest({"owner": (True, 0), "pack": (False, 0)}, False) == ("owner",)
    assert serving.contest({"pack": (True, 0), "owner": (False, 3)}, False) == ()   # the package is the other's
    assert serving.contest({"a": (True, 1), "b": (True, 1)}, False) == ()
    assert serving.contest({"a": (False, 0), "b": (False, 2)}, False) == ()
    assert serving.contest({"a": (False, 0), "b": (False, 0)}, True) == ("a", "b")   # pkgutil namespace stub
    assert serving.modules(["p/__init__.py", "p/a.py", "p/_c.so", "p/sub/b.py", "p/_flytune/m.json"], "p") == 2
