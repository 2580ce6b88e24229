"""The client's tests run against a server: the server tests' running-server fixture."""

from tests.server.conftest import running  # noqa: F401  (a fixture, used by name)
