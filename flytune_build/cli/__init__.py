"""The `flytune` command (`flytune_build.cli:main`)."""
from .main import main

__all__ = ["main"]
