"""values.schema.json: well-formed, accepts every value set, rejects bad values naming the key."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml

from tests.chart.helm import BAD_VALUES_DIR, CHART, VALUE_SETS, chart, load_values, render

SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
BAD_FILES = sorted(BAD_VALUES_DIR.glob("*.yaml"))


def expected_error(path: Path) -> str:
    """The `# error: ...` header line: a fragment Helm's message must contain."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# error: "), f"{path.name} must start with '# error: <expected message>'"
    return first.removeprefix("# error: ")


def test_schema_is_a_valid_draft_07_schema() -> None:
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert SCHEMA["additionalProperties"] is False


def test_helm_loads_the_schema() -> None:
    assert chart().schema == SCHEMA


@pytest.mark.parametrize("value_set", ["default", *VALUE_SETS])
def test_value_sets_satisfy_the_schema(value_set: str) -> None:
    values = {} if value_set == "default" else load_values(value_set)
    chart().validate_schema(values)  # Helm's own validator
    # And an independent implementation, on the values Helm would use (defaults merged in).
    jsonschema.Draft7Validator(SCHEMA).validate(chart().merge_values(values))


def test_enough_bad_values_files() -> None:
    assert len(BAD_FILES) >= 10


@pytest.mark.parametrize("path", BAD_FILES, ids=lambda p: p.stem)
def test_bad_values_are_rejected_naming_the_key(path: Path) -> None:
    values = yaml.safe_load(path.read_text())
    expected = expected_error(path)
    with pytest.raises(helm_python.HelmValuesError) as schema_error:
        chart().validate_schema(values)
    assert expected in str(schema_error.value)
    # `helm install/template` runs the same check before rendering anything.
    with pytest.raises(helm_python.HelmValuesError) as render_error:
        render(values)
    assert expected in str(render_error.value)
    # `helm lint` reports it as an error.
    report = helm_python.lint(CHART, values)
    assert any(expected in e for e in report["errors"]), report["errors"]


@pytest.mark.parametrize("path", BAD_FILES, ids=lambda p: p.stem)
def test_bad_values_fail_an_independent_validator_too(path: Path) -> None:
    """Editors and CI linters use other JSON-schema implementations; they must agree with Helm."""
    values = yaml.safe_load(path.read_text())
    merged = chart().merge_values(values)
    assert list(jsonschema.Draft7Validator(SCHEMA).iter_errors(merged)), path.name


def test_bad_values_only_break_the_named_key() -> None:
    """Each bad file must fail for its stated reason alone, not because of an unrelated typo."""
    for path in BAD_FILES:
        values = yaml.safe_load(path.read_text())
        with pytest.raises(helm_python.HelmValuesError) as error:
            chart().validate_schema(values)
        locations = {
            line.split("'")[1] for line in str(error.value).splitlines() if line.lstrip().startswith("- at '")
        }
        expected_location = expected_error(path).split("'")[1] if "at '" in expected_error(path) else ""
        assert expected_location in locations, (path.name, locations)
        # Wrappers (allOf, $ref) also report the enclosing objects; nothing outside the key may fail.
        assert all(expected_location.startswith(loc) for loc in locations), (path.name, locations)


# ------------------------------------------------------------------------------ null parent keys


def _definition(node: dict[str, Any]) -> dict[str, Any]:
    """A property's schema with `allOf: [{$ref}]` wrappers resolved."""
    for sub in node.get("allOf", []):
        if "$ref" in sub:
            return {**SCHEMA["definitions"][sub["$ref"].rsplit("/", 1)[1]], **node}
    return node


def null_refused_paths() -> list[tuple[str, ...]]:
    """Keys that null must not delete: every top-level key of values.yaml, and every key holding an
    object or a list inside the chart's fixed-key objects (not inside free-form maps such as
    podAnnotations, whose entries are the user's to delete)."""
    defaults = chart().merge_values({})
    paths: list[tuple[str, ...]] = [(key,) for key in yaml.safe_load((CHART / "values.yaml").read_text())]

    def walk(node: dict[str, Any], values: dict[str, Any], prefix: tuple[str, ...]) -> None:
        node = _definition(node)
        if node.get("additionalProperties") is not False:
            return  # a free-form map
        for key, value in values.items():
            path = (*prefix, key)
            if isinstance(value, dict | list) and len(path) > 1:
                paths.append(path)
            if isinstance(value, dict):
                walk(node["properties"][key], value, path)

    walk(SCHEMA, defaults, ())
    return paths


def _nulled(path: tuple[str, ...]) -> dict[str, Any]:
    values: dict[str, Any] = {path[-1]: None}
    for key in reversed(path[:-1]):
        values = {key: values}
    return values


def test_null_refused_paths_cover_the_enforced_settings() -> None:
    paths = set(null_refused_paths())
    for path in [
        ("podSecurityContext",),
        ("securityContext",),
        ("resources",),
        ("image",),
        ("metrics",),
        ("securityContext", "capabilities"),
        ("securityContext", "capabilities", "drop"),
        ("podSecurityContext", "seccompProfile"),
        ("resources", "limits"),
        ("networkPolicy", "apiServer"),
        ("metrics", "serviceMonitor"),
        ("rbac", "userRoles"),
    ]:
        assert path in paths, path
    assert ("grafanaDashboard", "labels", "grafana_dashboard") not in paths  # the user's map


@pytest.mark.parametrize("path", null_refused_paths(), ids=".".join)
def test_a_null_key_is_refused_naming_it(path: tuple[str, ...]) -> None:
    """Helm deletes a key set to null (`--set key=null`, `key: null` in a values file) before it
    validates. Without `required`, a null parent took its whole subtree, with every rule in it
    (runAsNonRoot, the memory limit...), past the schema; it must fail like any bad value."""
    expected = f"at '{'/' + '/'.join(path[:-1]) if len(path) > 1 else ''}': missing property '{path[-1]}'"
    with pytest.raises(helm_python.HelmValuesError) as error:
        chart().validate_schema(_nulled(path))
    assert expected in str(error.value)
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(expected)):
        render(_nulled(path))


def test_an_emptied_free_form_map_entry_is_still_allowed() -> None:
    """null still deletes entries of the user's own maps, e.g. the default Grafana sidecar label."""
    values = {
        "grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": None, "dashboards": "ml"}}
    }
    chart().validate_schema(values)
    (dashboard,) = [o for o in render(values) if o["kind"] == "ConfigMap"]
    assert "grafana_dashboard" not in dashboard["metadata"]["labels"]
    assert dashboard["metadata"]["labels"]["dashboards"] == "ml"
