"""JSON Schema of `[tool.flytune]`, for validate-pyproject's `validate_pyproject.tool_schema` entry point."""
import json
from pathlib import Path


def tool_schema(tool_name: str = "flytune") -> dict:
    """flytune-build's `[tool.${tool}]` table"""
    return json.loads((Path(__file__).with_name("tool_flytune.schema.json")).read_text("utf-8"))
