"""The CRD is generated from the models, structural, explainable, and committed copies don't drift."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml
from llmtrain.api.crd import CRD_FILENAME, _Converter, crd, crd_yaml
from llmtrain.api.validation import InvalidJob, parse_job
from llmtrain.constants import GROUP_VERSION, KIND
from llmtrain.generate import generated_files
from llmtrain.generate import main as generate_main

from tests.support.jobs import REPO_ROOT, minimal_job


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{key}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}[*]")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")


def _version() -> dict[str, Any]:
    version: dict[str, Any] = crd()["spec"]["versions"][0]
    return version


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = _version()["schema"]["openAPIV3Schema"]
    return schema


def test_committed_generated_files_match_make_generate() -> None:
    stale = [
        str(p) for p, text in generated_files(REPO_ROOT).items() if not p.exists() or p.read_text() != text
    ]
    assert not stale, f"run `make generate`: stale {stale}"
    assert generate_main(["--root", str(REPO_ROOT), "--check"]) == 0


def test_chart_and_manifests_hold_the_same_crd() -> None:
    a = (REPO_ROOT / "manifests" / "crds" / CRD_FILENAME).read_text()
    b = (REPO_ROOT / "charts" / "llmtrain" / "crds" / CRD_FILENAME).read_text()
    assert a == b == crd_yaml()


def test_structural_every_node_typed_no_refs() -> None:
    text = crd_yaml()
    assert "$ref" not in text and "anyOf" not in text and "allOf" not in text
    for path, node in _nodes(_schema()):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        assert not isinstance(node.get("exclusiveMinimum"), int | float) or isinstance(
            node.get("exclusiveMinimum"), bool
        ), path


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    undocumented = [
        path
        for path, node in _nodes(_schema())
        if path.startswith((".spec", ".status"))
        and not path.endswith(("[]", "[*]"))
        and not node.get("description")
    ]
    assert not undocumented


def test_names_categories_subresource_and_columns() -> None:
    spec = crd()["spec"]
    assert spec["group"] == "llmtrain.dev"
    assert spec["names"]["shortNames"] == ["llmtj"]
    assert set(spec["names"]["categories"]) == {"llmtrain", "ml"}
    version = _version()
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    for name in ("Phase", "Strategy", "Workers", "GPUs", "Progress", "Loss", "Age"):
        assert name in columns and columns[name].get("priority", 0) == 0
    assert all(
        c.get("priority") == 1
        for n, c in columns.items()
        if n not in {"Phase", "Strategy", "Workers", "GPUs", "Progress", "Loss", "Age"}
    )
    assert columns["Progress"]["jsonPath"] == ".status.progress.summary"


def test_defaults_enums_and_bounds_come_from_the_models() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["strategy"]["properties"]["type"]["enum"] == ["fsdp", "deepspeed", "ddp"]
    assert spec["strategy"]["properties"]["type"]["default"] == "fsdp"
    assert spec["strategy"]["properties"]["deepspeed"]["properties"]["zeroStage"]["enum"] == [1, 2, 3]
    assert spec["resources"]["properties"]["workers"]["minimum"] == 1
    assert spec["resources"]["properties"]["gpuResourceName"]["default"] == "nvidia.com/gpu"
    lr = spec["training"]["properties"]["learningRate"]
    assert lr["minimum"] == 0 and lr["exclusiveMinimum"] is True
    assert spec["storage"]["properties"]["create"]["properties"]["accessModes"]["default"] == [
        "ReadWriteMany"
    ]
    assert spec["resources"]["default"] == {}


def test_status_keeps_kopf_bookkeeping_and_progress() -> None:
    status = _schema()["properties"]["status"]["properties"]
    assert status["kopf"]["x-kubernetes-preserve-unknown-fields"] is True
    assert set(status["progress"]["properties"]) >= {
        "step",
        "totalSteps",
        "epoch",
        "loss",
        "learningRate",
        "tokensPerSecond",
        "mfu",
        "etaSeconds",
        "lastCheckpoint",
        "updatedAt",
    }
    assert set(status["progress"]["properties"]["lastCheckpoint"]["properties"]) == {
        "path",
        "step",
        "seconds",
    }
    assert status["conditions"]["items"]["required"] == ["type", "status", "lastTransitionTime", "reason"]


def test_crd_object_validates_as_apiextensions_v1() -> None:
    kubernetes_validate.validate(yaml.safe_load(crd_yaml()), "1.33", strict=True)


def test_the_model_pins_apiversion_and_kind_to_the_constants() -> None:
    """job.py builds its Literal types from llmtrain.constants (mypy sees str there): pydantic, and so
    `llmtrain validate`, must still accept exactly this apiVersion and kind."""
    job = parse_job(minimal_job())
    assert (job.api_version, job.kind) == (GROUP_VERSION, KIND)
    for key, right, wrong in (
        ("apiVersion", GROUP_VERSION, "llmtrain.dev/v1"),
        ("kind", KIND, "LLMTrainingJobs"),
    ):
        with pytest.raises(InvalidJob, match=rf"^\.{key}: must be one of '{right}'$"):
            parse_job({**minimal_job(), key: wrong})


def test_the_converter_on_the_smallest_schemas() -> None:
    """What the models do not produce today but a new field could: each conversion rule on a
    schema of its own, so a rule gone wrong shows before it reaches the API server."""
    node = _Converter({}).node
    # A one-value Literal (JSON Schema's const) is a one-value enum, typed by its value.
    assert node({"const": 3}) == {"type": "integer", "enum": [3]}
    assert node({"const": "x", "enum": ["x", "y"]}) == {"type": "string", "enum": ["x", "y"]}
    # A field that can only be null, and a node without a type, have no structural form.
    with pytest.raises(ValueError, match="a field that can only be null cannot be expressed"):
        node({"type": "null"})
    with pytest.raises(ValueError, match="untyped schema node"):
        node({"description": "anything"})
    assert node({"x-kubernetes-preserve-unknown-fields": True}) == {
        "x-kubernetes-preserve-unknown-fields": True
    }
    # An object without fields is free-form (kept whole); one with fields drops additionalProperties.
    assert node({"type": "object"}) == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    fields = {"type": "object", "properties": {"a": {"type": "integer", "default": 1}}}
    assert node(fields) == fields
    # An object's default is {}: the API server fills in the nested defaults itself.
    assert node({**fields, "default": {"a": 2}}) == {**fields, "default": {}}
    assert node({"type": "object", "default": {"a": 2}}) == {
        "type": "object",
        "default": {"a": 2},
        "x-kubernetes-preserve-unknown-fields": True,
    }


def test_the_converter_resolves_references_and_optionals() -> None:
    inner = {
        "type": "object",
        "description": "The inner model.",
        "properties": {"a": {"type": "integer"}},
        "x-kubernetes-validations": [{"rule": "r1", "message": "m1"}],
    }
    node = _Converter({"Inner": inner}).node
    field_rule = {"rule": "r2", "message": "m2"}
    # A described reference (allOf of one $ref): the field's description wins, the model's rules stay.
    assert node({"allOf": [{"$ref": "#/$defs/Inner"}], "description": "The  field."}) == {
        **inner,
        "description": "The field.",
    }
    # Optional[Inner] = None: the null option and the null default go, the model's description
    # stands in for the field's, and the field's rules follow the model's.
    optional = {"anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}], "default": None}
    assert node({**optional, "x-kubernetes-validations": [field_rule]}) == {
        **inner,
        "x-kubernetes-validations": [*inner["x-kubernetes-validations"], field_rule],
    }
    assert node({"anyOf": [{"type": "string"}, {"type": "null"}]}) == {"type": "string"}
    assert node({"anyOf": [{"type": "string"}, {"type": "null"}], "default": "x"}) == {
        "type": "string",
        "default": "x",
    }
    with pytest.raises(ValueError, match="unions other than Optional"):
        node({"anyOf": [{"type": "string"}, {"type": "integer"}]})


def test_the_converter_types_enums_and_objects_it_is_given_untyped() -> None:
    node = _Converter({}).node
    assert node({"enum": [True, False]}) == {"type": "boolean", "enum": [True, False]}
    assert node({"enum": [0.5, 1.5]}) == {"type": "number", "enum": [0.5, 1.5]}
    assert node({"enum": ["a"]}) == {"type": "string", "enum": ["a"]}
    # A stated type stands: 1 and 2 are numbers here, not integers.
    assert node({"enum": [1, 2], "type": "number"}) == {"type": "number", "enum": [1, 2]}
    # Named fields make an object, with or without "type".
    assert node({"properties": {"a": {"type": "string"}}}) == {
        "type": "object",
        "properties": {"a": {"type": "string"}},
    }
