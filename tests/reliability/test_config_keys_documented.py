"""docs/reliability.md#r44-sample-configs: every key of the config schema is documented in README.md
or an example config."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pydantic

from zrepl_py.config import schema

REPO = Path(__file__).resolve().parents[2]


def _keys(model: type[pydantic.BaseModel], seen: set[type]) -> set[str]:
    """Every field name of ``model`` and of the models its fields hold, recursively."""
    if model in seen:
        return set()
    seen.add(model)
    found: set[str] = set()
    for name, field in model.model_fields.items():
        found.add(field.alias or name)
        stack = [field.annotation]
        while stack:
            annotation = stack.pop()
            if inspect.isclass(annotation) and issubclass(annotation, pydantic.BaseModel):
                found |= _keys(annotation, seen)
            stack.extend(typing.get_args(annotation))
    return found


def test_every_key_of_the_config_schema_is_documented_in_the_readme_or_an_example():
    """docs/reliability.md#r44-sample-configs: each key a config may hold appears in README.md (as
    ``key``) or in an examples/*.toml file (as ``key =``, possibly commented out), so no setting is
    hidden."""
    readme = (REPO / "README.md").read_text()
    examples = "\n".join(p.read_text() for p in sorted((REPO / "examples").glob("*.toml")))
    undocumented = sorted(
        key for key in _keys(schema.Config, set())
        if not re.search(rf"`[^`\n]*\b{key}\b[^`\n]*`", readme)
        and not re.search(rf"\b{key} =", examples)
    )
    assert undocumented == []
