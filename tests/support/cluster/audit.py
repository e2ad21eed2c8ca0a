"""The API server's own record of what the operator asked (its audit log, see `AUDIT_POLICY`).

Recorded by the server, not by the client: a request the operator makes through any library, and
one refused by RBAC or admission, is there with the verb and resource RBAC judged it by.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class Call:
    user: str
    verb: str
    api_group: str
    resource: str  # as RBAC spells it: "rayjobs", "llmtrainingjobs/status"
    namespace: str
    name: str
    code: int
    authorized: bool  # RBAC's decision; a 403 with this True came from admission (e.g. a quota)
    # Which token made it (its JTI): two processes of one ServiceAccount, each with its own token.
    credential: str = ""
    at: datetime | None = None  # when the API server received it
    uri: str = ""  # the request's path and query as sent, e.g. a list's labelSelector and limit

    @property
    def permission(self) -> tuple[str, str, str]:
        return (self.api_group, self.resource, self.verb)


def size(log: Path) -> int:
    """A mark to read from later (`calls(log, since=...)`)."""
    return log.stat().st_size if log.exists() else 0


def calls(log: Path, user: str, since: int = 0) -> list[Call]:
    """Every resource request `user` made (after byte offset `since`), once answered."""
    out = []
    with log.open("rb") as f:
        f.seek(since)
        for line in f:
            if not line.endswith(b"\n"):
                break  # being written
            event = json.loads(line)
            ref = event.get("objectRef")
            if event["user"]["username"] != user or not ref or event["stage"] != "ResponseComplete":
                continue
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            out.append(
                Call(
                    user=user,
                    verb=event["verb"],
                    api_group=ref.get("apiGroup", ""),
                    resource=resource,
                    namespace=ref.get("namespace", ""),
                    name=ref.get("name", ""),
                    code=int((event.get("responseStatus") or {}).get("code", 0)),
                    authorized=(event.get("annotations") or {}).get("authorization.k8s.io/decision")
                    == "allow",
                    credential=",".join(
                        event["user"].get("extra", {}).get("authentication.kubernetes.io/credential-id", [])
                    ),
                    at=datetime.fromisoformat(event["requestReceivedTimestamp"]),
                    uri=event.get("requestURI", ""),
                )
            )
    return out
