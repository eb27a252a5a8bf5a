import json

from . import tool_schema

print(json.dumps(tool_schema(), indent=2))
