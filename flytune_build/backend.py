"""PEP 517 / PEP 660 build backend: setuptools' `build_meta`, plus the tuned-config bundle.

`build-backend = "flytune_build.backend"`. Without `[tool.flytune]` every hook is setuptools' own.
With it, the wheel hooks collect -> verify -> assemble the bundle beside setuptools' build, add it
and its entry point, and make the wheel reproducible (`flytune_build.pipeline.hooks`).
"""
from setuptools import build_meta as _setuptools

# flytune's own modules load inside the hooks that need them: a frontend runs each hook in a fresh
# process, and the get_requires hooks need none of them
get_requires_for_build_wheel = _setuptools.get_requires_for_build_wheel
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    from .pipeline import hooks
    return hooks.build_wheel(_setuptools.build_wheel, wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    from .pipeline import hooks
    return hooks.build_wheel(_setuptools.build_editable, wheel_directory, config_settings, metadata_directory,
                             editable=True)


def build_sdist(sdist_directory, config_settings=None):
    from .pipeline import hooks
    return hooks.build_sdist(_setuptools.build_sdist, sdist_directory, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    from .pipeline import hooks
    return hooks.prepare_metadata(_setuptools.prepare_metadata_for_build_wheel, metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    from .pipeline import hooks
    return hooks.prepare_metadata(_setuptools.prepare_metadata_for_build_editable, metadata_directory,
                                  config_settings, editable=True)
