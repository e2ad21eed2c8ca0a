"""A Kubernetes-like API server for the operator's integration tests, built on kmock's emulator.

See tests/README.md ("Test API server") for usage and for what still differs from a real server.
"""

from tests.support.apiserver.faults import Fault, Faults
from tests.support.apiserver.server import ApiError, ApiServer, Response

__all__ = ["ApiError", "ApiServer", "Fault", "Faults", "Response"]
