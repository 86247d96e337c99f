"""Where endpoint load comes from: Prometheus scrapes and ORCA reports."""
