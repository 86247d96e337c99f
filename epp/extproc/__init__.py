"""The Envoy adapter: ext_proc gRPC servicer, per-stream state machine, proto builders."""
