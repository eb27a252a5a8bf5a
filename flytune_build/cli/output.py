"""What every `flytune` command shares on the way out: the one exit-code table and the --json document."""
from __future__ import annotations

import json

EXIT_OK, EXIT_VIOLATIONS, EXIT_USAGE, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED = 0, 1, 2, 120, 130
EXIT_FAILED = EXIT_VIOLATIONS  # a run that failed reads as violations do: 1
JSON_FORMAT = 1  # "format" of every --json document; bumped on incompatible change
EXIT_CODES = """exit codes:
  0    success: everything checked is clean
  1    violations found, or the command failed (one line `flytune: error: ...` on stderr)
  2    usage error: bad arguments, no pyproject.toml or no [tool.flytune] table, `tune` refused where CI is set
  120  stdout was closed before the output was written (`flytune ... | head`, or `>&-`); nothing more is printed,
       as pip does (the work itself, a merge or a write, is done); with `>&-`, a run that found violations
       still exits 1
  130  interrupted"""


def dump(doc: dict) -> str:
    """A --json document: the report with its format version at the top level."""
    return json.dumps({"format": JSON_FORMAT, **doc}, indent=2, sort_keys=True)
