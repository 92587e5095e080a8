"""docs/reliability.md#r44-sample-configs: every key of the config schema is documented in the
configuration reference of the user guide, docs/configuration.md."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pydantic

from zrepl_py.config import schema

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "configuration.md"


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


def _undocumented(reference: str) -> list[str]:
    """The schema's keys that no ``code span`` of ``reference`` (Markdown) names as a word."""
    spans = re.findall(r"`([^`\n]+)`", reference)
    return sorted(key for key in _keys(schema.Config, set())
                  if not any(re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", span)
                             for span in spans))


def test_every_key_of_the_config_schema_is_in_the_configuration_reference():
    """docs/reliability.md#r44-sample-configs: each key a config may hold appears in the
    configuration reference as a word inside a code span (``[jobs.NAME.archive] keep_chains``),
    so no setting is hidden."""
    assert _undocumented(REFERENCE.read_text()) == []


def test_a_key_missing_from_the_reference_is_named():
    """The check above can fail: the reference with ``keep_within`` misspelt everywhere names it,
    and a key only inside another word (``keep_within_days``) does not count."""
    text = REFERENCE.read_text()
    assert _undocumented(text.replace("keep_within", "keep_withn")) == ["keep_within"]
    assert _undocumented(text.replace("keep_within", "keep_within_days")) == ["keep_within"]
