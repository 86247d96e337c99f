"""HTTP admin surface: the EPP's own /metrics (and, later, the admin API)."""
