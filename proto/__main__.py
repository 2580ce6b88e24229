"""Generate the gRPC stubs: ``python -m proto`` (importing the package does it when needed)."""

from proto import generate

generate()
