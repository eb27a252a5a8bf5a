"""PEP 517 / PEP 660 build backend: setuptools' `build_meta`, plus the tuned-config bundle.

`build-backend = "flytune_build.backend"`. Without `[tool.flytune]` every hook is setuptools' own, unless
a table is `[tool.flytune]` misnamed (`[tool.flytun]`): that is refused, naming it (`pipeline.load`).
With it, the wheel hooks collect -> verify -> assemble the bundle beside setuptools' build, add it
and its entry point, and make the wheel reproducible (`flytune_build.pipeline.pep517`).
"""
import sys

try:
    from setuptools import build_meta as _setuptools
except ImportError:  # `requires = ["flytune-build"]` alone: get_requires_* asks the frontend for it
    _setuptools = None

SETUPTOOLS = "setuptools>=70"

# flytune's own modules load inside the hooks that need them: a frontend runs each hook in a fresh
# process, and the get_requires hooks need none of them. Without setuptools they name it: a frontend
# installs what they return before it calls a build hook (PEP 517), so isolated builds just work.


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) if _setuptools else [SETUPTOOLS]


def get_requires_for_build_sdist(config_settings=None):
    return _setuptools.get_requires_for_build_sdist(config_settings) if _setuptools else [SETUPTOOLS]


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) if _setuptools else [SETUPTOOLS]


def _backend():
    if _setuptools is None:  # a build without isolation in an environment that lacks it
        print(f"flytune: error: flytune_build.backend builds with setuptools, which is not installed here: "
              f"install it, or add \"{SETUPTOOLS}\" to [build-system] requires (an isolated build gets it "
              f"by itself)", file=sys.stderr, flush=True)
        raise SystemExit(1)
    return _setuptools


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    from .pipeline import pep517
    return pep517.build_wheel(_backend().build_wheel, wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    from .pipeline import pep517
    return pep517.build_wheel(_backend().build_editable, wheel_directory, config_settings, metadata_directory,
                             editable=True)


def build_sdist(sdist_directory, config_settings=None):
    from .pipeline import pep517
    return pep517.build_sdist(_backend().build_sdist, sdist_directory, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    from .pipeline import pep517
    return pep517.prepare_metadata(_backend().prepare_metadata_for_build_wheel, metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    from .pipeline import pep517
    return pep517.prepare_metadata(_backend().prepare_metadata_for_build_editable, metadata_directory,
                                  config_settings, editable=True)
