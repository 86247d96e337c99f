"""Scheduling: pure functions of (request, snapshot, clock, rng) -> SchedulingResult.

``base`` holds the contracts, ``profile`` runs filters -> scorers -> picker,
``scheduler`` adds the subset hint and admission, ``plugins`` holds the built-ins and
``registry`` maps their type names (docs/plugins.md lists every plugin).
"""
