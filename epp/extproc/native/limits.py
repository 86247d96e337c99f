"""What the native transport bounds on one connection, against the known HTTP/2
denial-of-service classes and a peer that stops answering. Each limit sits well above
what Envoy does as an ext_proc client (docs/operations.md, "Native transport limits");
past one, the connection gets GOAWAY ENHANCE_YOUR_CALM and closes, or the message or
stream is refused with a clear status."""

from __future__ import annotations

# Control frames (SETTINGS and PING acks, RST_STREAM, WINDOW_UPDATE) queued while the
# peer is not reading what the connection writes: the ping, settings and reset floods
# grow this queue when their answers cannot leave. Go's HTTP/2 server bounds it at the
# same 10,000; Envoy queues a handful.
MAX_CONTROL_BACKLOG = 10_000

# PING and SETTINGS frames that need an answer: a burst, then a steady rate (a token
# bucket). Envoy sends one SETTINGS per connection and a keepalive PING every few seconds
# at most; a peer asking for a thousand answers at once is flooding.
CONTROL_BURST = 1_000
CONTROL_RATE = 100.0  # per second, refilling the burst

# Frames in a row with an empty payload that end nothing (DATA without END_STREAM,
# HEADERS or CONTINUATION without END_HEADERS): each costs a frame's work and moves
# nothing. A gRPC message never fits in an empty DATA frame, so Envoy sends none.
MAX_EMPTY_FRAMES = 100

# CONTINUATION frames in one header block: a block is bounded in bytes (streams.py's
# MAX_HEADER_BLOCK), this bounds it in frames (tiny CONTINUATIONs cost a frame each).
# An ext_proc stream's header block is a few hundred bytes: one HEADERS frame.
MAX_CONTINUATIONS = 256

# Rapid reset (CVE-2023-44487): streams the peer resets before the server answered them
# with anything. Once there are this many on a connection and they are more than half of
# the streams it opened, the connection ends. Envoy resets an ext_proc stream unanswered
# only when its client leaves before the routing answer (or message_timeout passes).
RAPID_RESETS = 1_000

# Bytes credited to the peer before the application read them, summed over the
# connection's streams: a message larger than the stream window is credited as it
# arrives while its reader waits for it (else it could never complete), one message per
# stream. Past this sum a further such message is refused (RESOURCE_EXHAUSTED). Twice the
# largest message any transport accepts, so one message of any accepted size always fits.
MAX_CREDITED_AHEAD = 128 * 1024 * 1024

# Keepalive, as grpclib's and grpcio's servers do by default: while streams are open
# and nothing has arrived from the peer for KEEPALIVE_TIME seconds, PING it; no ack
# within KEEPALIVE_TIMEOUT seconds ends the connection (GOAWAY, then closed).
KEEPALIVE_TIME = 7200.0
KEEPALIVE_TIMEOUT = 20.0
