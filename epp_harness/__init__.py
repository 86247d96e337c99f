"""epp_harness: the dev harness around the EPP, apart from the product.

``sim`` (a vLLM-compatible model-server simulator, ``epp sim``), ``stack`` (Envoy + EPP +
simulators on loopback, ``epp stack`` / ``make run``), ``envoyconfig`` (the Envoy
bootstrap configs, also written to ``envoy/``), ``envoyproc`` (running and validating
Envoy) and ``procs`` (child processes with ready files). The tests and benchmarks use
them too.

The harness may import ``epp``; ``epp`` never imports the harness (its CLI looks the
``sim`` and ``stack`` subcommands up by module name, and
tests/unit/test_product_apart.py checks that the server pulls in none of this package).
"""
