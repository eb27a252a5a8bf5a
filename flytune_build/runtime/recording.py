"""`flytune_build.runtime.recording`, the import path of earlier releases: runtime.inductor.recording."""
from __future__ import annotations

from .inductor.recording import Record, Recording, artifacts, recording

__all__ = ["Record", "Recording", "artifacts", "recording"]
