"""What a running Envoy's admin port says about a cluster's hosts."""

from __future__ import annotations

from tests.support.http import request


def host_health(admin_url: str, cluster: str) -> dict[str, str]:
    """``ip:port`` of each host Envoy holds in ``cluster`` -> its health flags
    (``healthy``, ``/failed_active_hc``, ``/failed_eds_health``, ...)."""
    _, _, text = request(f"{admin_url}/clusters")
    hosts = {}
    for line in text.decode().splitlines():
        parts = line.split("::")
        if parts[0] == cluster and len(parts) == 4 and parts[2] == "health_flags":
            hosts[parts[1]] = parts[3]
    return hosts
