"""hatchling build hook: the tuned-config bundle in wheels that hatchling builds.

Enabled in a project by `[tool.hatch.build.hooks.flytune]` (flytune-build in `build-system.requires`),
configured by the same `[tool.flytune]` table as `flytune_build.backend`, and verified by the same
pipeline. hatchling finds the hook through the `hatch` entry point group (pluggy), which loads this
module in every hatchling build of an environment where flytune-build is installed: it imports only
hatchling here, flytune's pipeline when a build runs it.

- wheel: the bundle files (byte for byte those the setuptools backend writes) reach the wheel through
  `build_data["force_include"]`; the `flytune.bundles` entry point through the project's entry points,
  from which hatchling writes entry_points.txt (build data has no entry point field). Editable wheels
  carry the bundle under `__flytune_editable__/<name>/`, as with setuptools.
- sdist: verified as well, and it carries the artifact sources and tuning plan (force-included, so a
  VCS ignore file cannot drop them): sdist -> wheel gives the same bundle.

A failed verification is one line per problem and exit status 1, never a traceback; no wheel is written.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zipfile

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.plugin import hookimpl


class FlytuneBuildHook(BuildHookInterface):
    PLUGIN_NAME = "flytune"
    staging: str | None = None                        # the bundle files, until the wheel holds them
    entry_point: tuple[str, str, str] | None = None   # (group, name, value) the wheel must declare

    def initialize(self, version: str, build_data: dict) -> None:
        from . import pipeline
        from .core import bundle
        from .pipeline import assemble, load, pep517, run

        pep517.or_exit(self.refuse_options)
        proj = pep517.or_exit(load, self.root)
        if proj is None:
            self.app.display_warning(f"flytune: [tool.hatch.build.hooks.flytune] is enabled but "
                                     f"{pipeline.missing(self.root)}; nothing is bundled")
            return
        state = pep517.or_exit(lambda: run(proj.root, project=proj))
        if self.target_name == "sdist":
            for rel, path in pep517.or_exit(pep517.sdist_sources, proj).items():
                build_data["force_include"][str(path)] = rel
            return
        if self.target_name != "wheel":
            return
        if version == "editable":  # the package is imported from the source tree: keep out of its way
            assemble.relocate_for_editable(state)
        self.staging = tempfile.mkdtemp(prefix="flytune-bundle-")
        for name, data in sorted(state.files.items()):
            path = os.path.join(self.staging, *name.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            build_data["force_include"][path] = name
        self.entry_point = (bundle.ENTRY_POINT_GROUP, *state.entry_point)
        group, name, value = self.entry_point
        self.metadata.core.entry_points.setdefault(group, {})[name] = value

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        if self.entry_point is None:
            return
        group, name, value = self.entry_point
        with zipfile.ZipFile(artifact_path) as zf:
            eps = next((zf.read(n).decode("utf-8") for n in zf.namelist()
                        if n.endswith(".dist-info/entry_points.txt") and n.count("/") == 1), "")
        if f"[{group}]" not in eps or f"{name} = {value}" not in eps:  # a hatchling that stopped honouring it
            os.remove(artifact_path)
            from .pipeline import pep517

            pep517.or_exit(self.missing_entry_point, group, name, value)

    # hatchling's own options of every build hook: the rest of the hook's table would be ignored
    HATCHLING_OPTIONS = ("dependencies", "enable-by-default", "require-runtime-dependencies",
                         "require-runtime-features")

    def refuse_options(self) -> None:
        """A ProjectError where the hook's table holds options: the hook has none, [tool.flytune] has them."""
        from .core.errors import ProjectError

        ours = [k for k in self.config if k not in self.HATCHLING_OPTIONS]
        if ours:
            raise ProjectError(f"takes no options: move {', '.join(ours)} to [tool.flytune] (the hook's table "
                               f"only enables it; hatchling's own {', '.join(self.HATCHLING_OPTIONS)} aside)",
                               file=os.path.join(self.root, "pyproject.toml"), field="tool.hatch.build.hooks.flytune")

    @staticmethod
    def missing_entry_point(group: str, name: str, value: str) -> None:
        from .core.errors import BundleError

        raise BundleError(f"this hatchling did not write the entry point [{group}] {name} = {value}; the runtime "
                          f"would not find the bundle (no wheel was written)", field="entry_points.txt")


@hookimpl
def hatch_register_build_hook():
    return FlytuneBuildHook
