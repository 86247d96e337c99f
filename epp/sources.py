"""Where plugin packages import the discovery source API from (docs/extending.md); it
lives in :mod:`epp.serving.sources`."""

from epp.serving.sources import DiscoveryContext, DiscoveryKind, DiscoverySource

__all__ = ["DiscoveryContext", "DiscoveryKind", "DiscoverySource"]
