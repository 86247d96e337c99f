"""The discovery source API under its older import path, kept for plugin packages that
import it from here; new code imports it from :mod:`epp.plugin` (docs/extending.md). It
lives in :mod:`epp.serving.sources`."""

from epp.serving.sources import DiscoveryContext, DiscoveryKind, DiscoverySource

__all__ = ["DiscoveryContext", "DiscoveryKind", "DiscoverySource"]
