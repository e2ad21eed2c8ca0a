"""The generated docs equal their sources: the API reference (docs/api.md, the README's summary)
the models, and the chart's values.yaml, values.schema.json and README table the one description of
the values (llmtrain/chart_values.py). Editing a description without `make generate` fails here."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmtrain import chart_values
from llmtrain.api.crd import openapi_schema
from llmtrain.api.reference import API_DOC, api_reference, readme_summary, with_summary
from llmtrain.chart_values import VALUES, Group, SchemaOnly, Value

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CHART_README = ROOT / chart_values.README_FILE


def _committed(relative: str) -> str:
    return (ROOT / relative).read_text()


# ------------------------------------------------------------------------------ API reference


def test_api_reference_equals_the_models() -> None:
    assert _committed(API_DOC) == api_reference(), "docs/api.md is stale: run `make generate`"
    assert README.read_text() == with_summary(README.read_text()), "README's API summary is stale"


def _field_paths(node: dict[str, Any], path: str) -> list[tuple[str, str]]:
    """(section, field) for every named field under node, with lists' items as `name[]` sections."""
    out = []
    for name, sub in node.get("properties", {}).items():
        out.append((path, name))
        element = sub["items"] if sub.get("type") == "array" else sub
        child = f"{path}.{name}" + ("[]" if element is not sub else "")
        out += _field_paths(element, child)
    return out


def _documented_fields(doc: str) -> set[tuple[str, str]]:
    fields = set()
    for section in re.split(r"^#{2,4} ", doc, flags=re.MULTILINE)[1:]:
        heading = section.split("\n", 1)[0].strip()
        fields |= {(heading, name) for name in re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE)}
    return fields


def test_api_reference_has_every_field_of_spec_and_status_in_its_section() -> None:
    schema = openapi_schema()
    expected = set(_field_paths(schema["properties"]["spec"], "spec"))
    expected |= set(_field_paths(schema["properties"]["status"], "status"))
    expected = {(s, f) for s, f in expected if not s.startswith("status.kopf")}
    assert len(expected) > 150
    assert expected <= _documented_fields(_committed(API_DOC))


def test_api_reference_shows_defaults_bounds_and_rules() -> None:
    doc = _committed(API_DOC)
    assert "| `maxSeqLength` | integer (8 ≤ value ≤ 1048576) | `2048` |" in doc
    assert "| `model` | [object](#specmodel) | required | *Immutable.*" in doc
    assert "| `suspend` | boolean | `false` |" in doc  # mutable: no immutability note
    # A CEL rule of an object, with the message the API server returns.
    assert "- method.lora is only valid with method.type: lora; remove it or set type: lora." in doc


def test_a_description_edited_in_the_models_reaches_the_docs() -> None:
    """Seeded drift: a changed description changes docs/api.md and the README summary, so the
    committed copies no longer match and the test above fails until `make generate`."""
    schema = copy.deepcopy(openapi_schema())
    schema["properties"]["spec"]["properties"]["dataset"]["description"] = "Edited dataset text."
    schema["properties"]["spec"]["properties"]["training"]["properties"]["seed"]["description"] = (
        "Edited seed."
    )
    assert "Edited seed." in api_reference(schema)
    assert api_reference(schema) != _committed(API_DOC)
    assert "Edited dataset text." in readme_summary(schema)
    assert with_summary(README.read_text(), schema) != README.read_text()


def test_readme_summary_links_resolve_to_sections_of_the_reference() -> None:
    headings = {
        re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#{2,4} (.+)$", _committed(API_DOC), flags=re.MULTILINE)
    }
    links = re.findall(rf"\]\({re.escape(API_DOC)}#([^)]+)\)", README.read_text())
    assert len(links) >= 10
    assert set(links) <= headings


# ------------------------------------------------------------------------------ chart values


def test_chart_values_files_equal_their_one_source() -> None:
    assert _committed(chart_values.VALUES_FILE) == chart_values.values_yaml(), "values.yaml is stale"
    assert _committed(chart_values.SCHEMA_FILE) == chart_values.values_schema_json(), "schema is stale"
    readme = CHART_README.read_text()
    assert readme == chart_values.with_values_table(readme), "the chart README's Values table is stale"


def test_one_description_per_value_in_all_three_files() -> None:
    """The same text is the values.yaml comment, the schema description and the README row."""
    text = _committed(chart_values.VALUES_FILE)
    comments = " ".join(
        line.strip().removeprefix("#").removeprefix(" --").strip()
        for line in text.splitlines()
        if "#" in line
    )
    schema = json.loads(_committed(chart_values.SCHEMA_FILE))
    readme = CHART_README.read_text()
    for entry in VALUES:
        node = schema
        for key in entry.path.split("."):
            node = node["properties"][key]
        assert node["description"] == entry.doc, entry.path
        if not isinstance(entry, SchemaOnly):
            assert entry.doc in comments, entry.path
        if isinstance(entry, Value):
            assert f"| `{entry.path}` |" in readme and entry.doc.replace("|", "\\|") in readme, entry.path


def test_defaults_in_values_yaml_are_the_sources() -> None:
    values = yaml.safe_load(_committed(chart_values.VALUES_FILE))
    for entry in VALUES:
        if isinstance(entry, Value):
            node = values
            for key in entry.path.split("."):
                node = node[key]
            assert node == entry.default, entry.path


def _edited(path: str, doc: str) -> tuple[chart_values.Entry, ...]:
    return tuple(replace(e, doc=doc) if e.path == path else e for e in VALUES)


@pytest.mark.parametrize("path", ["logLevel", "metrics.serviceMonitor.interval", "rbac.userRoles", "global"])
def test_a_description_edited_in_the_source_changes_every_file_that_shows_it(path: str) -> None:
    """Seeded drift: one edit in chart_values.py reaches each generated file that carries the text."""
    entries = _edited(path, "An edited description.")
    (entry,) = [e for e in entries if e.path == path]
    assert "An edited description." in chart_values.values_schema_json(entries)
    assert chart_values.values_schema_json(entries) != _committed(chart_values.SCHEMA_FILE)
    if not isinstance(entry, SchemaOnly):
        assert chart_values.values_yaml(entries) != _committed(chart_values.VALUES_FILE)
    readme = CHART_README.read_text()
    if isinstance(entry, Value):
        assert chart_values.with_values_table(readme, entries) != readme
    if isinstance(entry, Group):
        assert chart_values.with_values_table(readme, entries) == readme  # groups have no row


def test_every_entry_sits_under_a_group_declared_before_it() -> None:
    seen = {""}
    for entry in VALUES:
        parent = entry.path.rpartition(".")[0]
        assert parent in seen and (parent == "" or isinstance(_by_path(parent), Group)), entry.path
        seen.add(entry.path)


def _by_path(path: str) -> chart_values.Entry:
    (entry,) = [e for e in VALUES if e.path == path]
    return entry
