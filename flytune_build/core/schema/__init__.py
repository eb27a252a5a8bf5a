"""JSON Schema of `[tool.flytune]`, for validate-pyproject's `validate_pyproject.tool_schema` entry point.

Generated from the rules the parser checks (`flytune_build.core.project.TOOL_FLYTUNE`), so the two
cannot drift; `python -m flytune_build.core.schema` prints it.
"""
from __future__ import annotations

ID = "https://flytune-build.invalid/schema/tool_flytune.schema.json"


def tool_schema(tool_name: str = "flytune") -> dict:
    """flytune-build's `[tool.${tool}]` table"""
    from ..project import TOOL_FLYTUNE

    return {"$schema": "http://json-schema.org/draft-07/schema#", "$id": ID, "title": f"[tool.{tool_name}]",
            **TOOL_FLYTUNE.documented()}
