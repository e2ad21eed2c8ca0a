"""Small parts of the API: the variables the spec's object storage and tracking sections give the
Ray containers (plain settings as values, credentials only as Secret references), and the quantity
check of api/base.py."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from llmtrain.api.base import ApiModel, KubeQuantity, SecretKeyRef, quantity_message
from llmtrain.api.object_storage import ObjectStorageSpec
from llmtrain.api.tracking import TrackingSpec
from pydantic import ValidationError


def _ref(name: str) -> dict[str, str]:
    return {"name": name, "key": "k"}


def _storage(**wire: Any) -> ObjectStorageSpec:
    return ObjectStorageSpec.model_validate(wire)


def test_s3_on_aws_gets_its_region_and_keys_without_an_endpoint() -> None:
    s3 = _storage(accessKeySecretRef=_ref("s3-keys"), secretKeySecretRef=_ref("s3-secret"))
    assert s3.plain_env() == {"AWS_REGION": "us-east-1"}
    assert s3.secret_env() == {
        "AWS_ACCESS_KEY_ID": SecretKeyRef(name="s3-keys", key="k"),
        "AWS_SECRET_ACCESS_KEY": SecretKeyRef(name="s3-secret", key="k"),
    }


def test_an_endpoint_alone_gets_the_region_and_the_endpoint() -> None:
    store = _storage(endpoint="http://minio:9000", region="eu-1")
    assert store.plain_env() == {"AWS_REGION": "eu-1", "AWS_ENDPOINT_URL": "http://minio:9000"}
    assert store.secret_env() == {}


def test_gcs_and_azure_settings_and_keys() -> None:
    store = _storage(
        gcs={"credentialsSecretRef": _ref("gcs"), "endpoint": "http://gcs:4443"},
        azure={"accountName": "acct", "accountKeySecretRef": _ref("az"), "endpoint": "http://az:10000"},
    )
    assert store.plain_env() == {
        "LLMTRAIN_GCS_ENDPOINT": "http://gcs:4443",
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
        "LLMTRAIN_AZURE_ENDPOINT": "http://az:10000",
    }
    assert store.secret_env() == {
        "LLMTRAIN_GCS_CREDENTIALS": SecretKeyRef(name="gcs", key="k"),
        "AZURE_STORAGE_ACCOUNT_KEY": SecretKeyRef(name="az", key="k"),
    }
    bare = _storage(
        gcs={"credentialsSecretRef": _ref("gcs")},
        azure={"accountName": "acct", "accountKeySecretRef": _ref("az")},
    )
    assert bare.plain_env() == {"AZURE_STORAGE_ACCOUNT_NAME": "acct"}


def test_tracking_credentials_come_only_from_the_secrets_named() -> None:
    mlflow_only = TrackingSpec.model_validate(
        {"mlflow": {"trackingUri": "http://mlflow:5000", "tokenSecretRef": _ref("ml")}}
    )
    assert mlflow_only.secret_env() == {"MLFLOW_TRACKING_TOKEN": SecretKeyRef(name="ml", key="k")}
    wandb_offline = TrackingSpec.model_validate({"wandb": {"project": "p", "mode": "offline"}})
    assert wandb_offline.secret_env() == {}
    both = TrackingSpec.model_validate(
        {
            "mlflow": {"trackingUri": "http://mlflow:5000"},
            "wandb": {"project": "p", "apiKeySecretRef": _ref("wb")},
        }
    )
    assert both.secret_env() == {"WANDB_API_KEY": SecretKeyRef(name="wb", key="k")}


def test_a_quantity_field_refuses_a_malformed_value_with_its_own_example() -> None:
    # The model is built here, not at import, so the annotation's schema hook runs in the test.
    class Sized(ApiModel):
        size: Annotated[str, KubeQuantity("storage.size", "100Gi")]

    assert Sized.model_validate({"size": "1.5Ti"}).size == "1.5Ti"
    with pytest.raises(ValidationError) as refused:
        Sized.model_validate({"size": "100GB"})
    [error] = refused.value.errors()
    assert (error["type"], error["loc"], error["msg"]) == (
        "quantity",
        ("size",),
        quantity_message("storage.size", "100Gi"),
    )
    assert error["msg"].startswith("storage.size must be a Kubernetes quantity: use e.g. 100Gi (")
    with pytest.raises(ValidationError, match="valid string"):
        Sized.model_validate({"size": 100})  # the string schema stays under the check
