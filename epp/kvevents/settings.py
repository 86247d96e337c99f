"""Where each endpoint publishes its KV events (pure).

The model server binds its PUB socket (vLLM: ``"endpoint": "tcp://*:5557"`` in
``--kv-events-config``), so any number of EPP replicas can connect to it. By default
the EPP connects to ``port`` on the endpoint's host; an endpoint label overrides that
(how each discovery source sets labels: docs/kv-events.md):

* ``epp.dev/kv-events``: ``5557`` (a port on the endpoint's host), ``host:port``,
  ``tcp://host:port``, or ``none`` (this endpoint publishes nothing: approximate only);
* ``epp.dev/kv-events-replay``: the same forms, for vLLM's replay socket
  (``replay_endpoint``), which re-sends missed batches after a sequence gap.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.common.addresses import parse_address
from epp.types import Endpoint

EVENTS_LABEL = "epp.dev/kv-events"
REPLAY_LABEL = "epp.dev/kv-events-replay"
DEFAULT_PORT = 5557  # vLLM's default publisher port
_OFF = ("none", "off", "")


@dataclass(frozen=True, slots=True)
class KvEventsSettings:
    """The ``kvEvents`` parameters of a precise-prefix-cache-scorer."""

    port: int | None = DEFAULT_PORT  # None: only endpoints with the label publish
    topic: str = ""  # subscription prefix ("" = every topic)
    replay_port: int | None = None  # None: no replay unless the label names one

    def addresses(self, endpoint: Endpoint) -> tuple[str | None, str | None]:
        """(PUB address, replay address) for ``endpoint`` as ZMQ URLs; None = none.
        Raises ValueError naming the label when a label value is malformed."""
        labels = endpoint.labels
        events = _resolve(endpoint.host, labels.get(EVENTS_LABEL), self.port, EVENTS_LABEL)
        if events is None:
            return None, None
        replay = _resolve(endpoint.host, labels.get(REPLAY_LABEL), self.replay_port, REPLAY_LABEL)
        return events, replay


def _resolve(host: str, label: str | None, port: int | None, name: str) -> str | None:
    if label is None:
        return None if port is None else _tcp(host, port)
    text = label.strip()
    if text.lower() in _OFF:
        return None
    if text.startswith(("tcp://", "ipc://")):
        return text
    if text.isdigit():
        number = int(text)
        if not 0 < number < 65536:
            raise ValueError(f"label {name}={label!r}: port must be 1-65535")
        return _tcp(host, number)
    try:
        other_host, other_port = parse_address(text)
    except ValueError as exc:
        raise ValueError(f"label {name}={label!r}: {exc}") from None
    return _tcp(other_host, other_port)


def _tcp(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
