"""The process: ``epp serve`` (flags, wiring, start and stop), ``epp config``, discovery
sources and their registry, the two ports, config reloads and leader election."""
