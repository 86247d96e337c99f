"""The ``native`` gRPC transport: HTTP/2 and gRPC framing written for the one kind of
peer the EPP serves (docs/architecture.md, "Transports")."""
