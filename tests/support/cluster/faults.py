"""Fault rules for the fault proxy: make the next N matching requests fail or slow down before they
reach the API server, or fail the way a network or a proxy in front of it does (a reset connection,
an HTML error page).

Rules are matched by Kubernetes verb (`get list watch create update patch delete`, `*` for any) and
resource as RBAC spells it (`rayjobs`, `rayjobs/status`, `rayjobs.ray.io`, `*`). Tests set rules from
their own thread while the proxy consumes them from its thread, hence the lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

# The reason a Kubernetes `Status` carries for each code the rules answer with.
REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, reason: str, message: str, details: Any = None) -> dict[str, Any]:
    """A failure as the API server answers it: a v1 `Status` object."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "*"})


@dataclass
class Fault:
    verb: str
    resource: str
    status: int | None = None  # None: only the delay
    times: int | None = 1  # None: every matching request until cleared
    retry_after: float | None = None
    delay: float = 0.0
    message: str | None = None
    hits: int = 0  # how many requests this rule has answered so far
    # How a failure is answered: "status" (the API server's JSON Status), "html" (a load balancer's
    # HTML page with `status`), "reset" (the connection dropped with a TCP RST, no answer at all).
    answer: str = "status"
    namespace: str | None = None  # None: requests in any namespace (or none)

    def matches(
        self, verb: str, group: str, plural: str, subresource: str | None, namespace: str | None = None
    ) -> bool:
        names = {plural, f"{plural}.{group}"} if group else {plural}
        if subresource:
            names = {f"{name}/{subresource}" for name in names}
        return (
            self.verb in ("*", verb)
            and (self.resource == "*" or self.resource in names)
            and self.namespace in (None, namespace)
        )

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times


class Faults:
    """The fault rules of one server; the first rule that matches a request answers it."""

    def __init__(self) -> None:
        self._rules: list[Fault] = []
        self._lock = threading.Lock()

    def fail(
        self,
        verb: str,
        resource: str,
        status: int = 500,
        *,
        times: int | None = 1,
        retry_after: float | None = None,
        message: str | None = None,
        delay: float = 0.0,
        html: bool = False,
    ) -> Fault:
        """Answer the next `times` matching requests with `status` (e.g. 500, 429 with `retry_after`, 409);
        `html`: with an HTML page, as a proxy or load balancer in front of the API server does."""
        answer = "html" if html else "status"
        return self._add(Fault(verb, resource, status, times, retry_after, delay, message, answer=answer))

    def reset(self, verb: str, resource: str, *, times: int | None = 1) -> Fault:
        """Drop the connection of the next `times` matching requests (TCP RST) without answering."""
        return self._add(Fault(verb, resource, 0, times, answer="reset"))

    def delay(
        self,
        verb: str,
        resource: str,
        seconds: float,
        *,
        times: int | None = None,
        namespace: str | None = None,
    ) -> Fault:
        """Serve the matching requests (in `namespace` only, if given) normally, but only after
        `seconds`."""
        return self._add(Fault(verb, resource, None, times, None, seconds, namespace=namespace))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def take(
        self, verb: str, group: str, plural: str, subresource: str | None, namespace: str | None = None
    ) -> Fault | None:
        """Consume one use of the first live rule that matches this request, if any."""
        with self._lock:
            for rule in self._rules:
                if not rule.exhausted and rule.matches(verb, group, plural, subresource, namespace):
                    rule.hits += 1
                    return rule
        return None

    def _add(self, rule: Fault) -> Fault:
        if rule.verb not in VERBS:
            raise ValueError(f"unknown verb {rule.verb!r}; use one of {sorted(VERBS)}")
        with self._lock:
            self._rules.append(rule)
        return rule
