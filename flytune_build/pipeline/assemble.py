"""Assemble the bundle: `<package>/_flytune/manifest.json` plus one shard per kernel."""
from __future__ import annotations

import hashlib
from collections import defaultdict

from ..core import bundle, serving
from ..core.artifact import TOOLS
from .state import BuildState


def entry_point_name(dist_name: str | None, package: str) -> str:
    return serving.normalize(dist_name or package).replace("-", "_")


def assemble(state: BuildState) -> BuildState:
    proj = state.project
    prefix = serving.bundle_prefix(proj.package)
    by_kernel = defaultdict(list)
    for a in state.artifacts:
        by_kernel[a.kernel].append(a)
    kernels = {}
    for kernel, arts in sorted(by_kernel.items()):
        data = bundle.shard_bytes(kernel, arts)
        prov = bundle.provenance_bytes(kernel, arts)
        name, prov_name = bundle.shard_name(kernel), bundle.provenance_name(kernel)
        state.files[prefix + name] = data
        state.files[prefix + prov_name] = prov
        kernels[kernel] = bundle.ShardInfo(kernel, name, hashlib.sha256(data).hexdigest(), len(arts),
                                           arts[0].key_axes(), prov_name, hashlib.sha256(prov).hexdigest())
    tuned = defaultdict(set)
    for a in state.artifacts:
        for tool in TOOLS:
            v = (a.provenance or {}).get(tool)
            if v:
                tuned[tool].add(v)
    manifest = bundle.Manifest(proj.package, proj.targets, proj.triton,
                               {k: sorted(v) for k, v in sorted(tuned.items())}, kernels, proj.coverage,
                               proj.packs)
    state.files[prefix + bundle.MANIFEST] = manifest.to_bytes()
    state.entry_point = (entry_point_name(proj.name, proj.package), serving.bundle_value(proj.package))
    return state


EDITABLE_ROOT = serving.EDITABLE_ROOT


def relocate_for_editable(state: BuildState) -> BuildState:
    """An editable install imports the package from the source tree; a `<package>/` directory in
    site-packages would shadow it as a namespace package. Its bundle goes to
    `__flytune_editable__/<entry point name>/` instead, and the entry point names that."""
    name, _ = state.entry_point
    old = serving.bundle_prefix(state.project.package)
    new = f"{EDITABLE_ROOT}/{name}/"
    state.files = {new + k[len(old):]: v for k, v in state.files.items()}
    state.entry_point = (name, serving.editable_value(name))
    return state
