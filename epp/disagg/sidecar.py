"""``epp sidecar``: a reverse proxy beside a decode server that carries out llm-d's
P/D protocol.

The EPP (coordinator ``sidecar``) routes a disaggregated request to this proxy with
``x-prefiller-host-port: ip:port``, and its next choices, in order, in
``x-prefiller-fallbacks: ip:port,ip:port``. The proxy runs vLLM's NIXL flow: a one-token
prefill leg on that server, then the client's request, plus the returned
``kv_transfer_params``, to its decode server, streamed back. A prefill answer of 400-451
goes back to the client; a prefill server that cannot be reached, times out or answers
5xx passes the leg to the next one named; when none is left, or one answers 2xx
without ``kv_transfer_params``, the decode server computes the prefill itself. Requests
without the header, and every other path (/metrics, /health, /v1/models), pass straight
through. A decode server that cannot be reached ends an inference request's connection
unanswered, as the server would itself, so the gateway retries it on another endpoint;
other paths get a 502 naming it.

It calls only prefill servers it can vouch for, since anyone who reaches it can set the
header: with ``--epp-url``, the prefill members the EPP lists in its ``/status`` (read
again when a request names one it does not know, at most once a second); and those in
the ``--allow-prefiller`` networks, which default to loopback when no EPP is given.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from epp.common import argtypes
from epp.common.readyfile import write_ready
from epp.disagg import bodies
from epp.disagg.coordinators import PREFILLER_FALLBACKS_HEADER, PREFILLER_HEADER
from epp.disagg.legs import AiohttpLegTransport, LegClient, LegFailed
from epp.observability.logsetup import add_log_level
from epp.types import Endpoint, parse_host_port

log = logging.getLogger("epp.sidecar")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK: tuple[Network, ...] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)
# a request naming an unknown prefiller re-reads the EPP's /status at most this often
EPP_REFRESH_S = 1.0

# RFC 9110 §7.6.1 connection-specific fields, plus what aiohttp sets itself
_HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
        "proxy-authorization", "proxy-authenticate", "proxy-connection",
        "content-length", "host",
    }
)  # fmt: skip
_P_D_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


class Sidecar:
    def __init__(
        self,
        decode: Endpoint,
        legs: LegClient,
        allowed: Sequence[Network] = LOOPBACK,
        epp_url: str | None = None,
    ) -> None:
        self.decode = decode
        self.legs = legs
        # networks whose prefill servers this sidecar may call
        self.allowed = tuple(allowed)
        # the EPP whose /status lists the prefill servers it may call, and that list
        self.epp_url = epp_url.rstrip("/") if epp_url else None
        self._epp_prefill: frozenset[str] = frozenset()
        self._epp_read_at = float("-inf")
        self.session: aiohttp.ClientSession | None = None
        self.stats = {
            "proxied": 0, "prefill_legs": 0, "fallbacks": 0, "rejected": 0, "refused": 0,
            "failovers": 0,
        }  # fmt: skip
        # prefill_legs: answered 2xx with kv_transfer_params; fallbacks: decoded alone
        # (every prefill unreachable or failed, or one answered without params);
        # rejected: 400-451; refused: a named prefill server is neither an EPP member
        # nor allowed; failovers: a failed prefill leg passed on to the next one named

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.legs.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        prefiller = request.headers.get(PREFILLER_HEADER)
        if prefiller and request.method == "POST" and request.path in _P_D_PATHS:
            more = request.headers.get(PREFILLER_FALLBACKS_HEADER, "")
            names = [prefiller, *(n.strip() for n in more.split(",") if n.strip())]
            rewritten = await self._prefill(request, body, names)
            if isinstance(rewritten, web.Response):
                return rewritten
            body = rewritten
        self.stats["proxied"] += 1
        return await self._to_decode(request, body)

    async def _prefill(
        self, request: web.Request, body: bytes, prefillers: Sequence[str]
    ) -> bytes | web.Response:
        """The decode body after the prefill leg (unchanged on fallback), or the
        prefill's own client-error answer. ``prefillers``: tried in order."""
        rid = request.headers.get("x-request-id", "-")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            log.warning("request %s: not running a prefill leg: %s", rid, exc)
            return body
        if not isinstance(doc, dict):
            return body
        headers = {k.lower(): v for k, v in request.headers.items()}
        for index, prefiller in enumerate(prefillers):
            if index:
                self.stats["failovers"] += 1
            endpoint = await self._endpoint(rid, prefiller)
            if endpoint is None:
                continue
            try:
                result = await self.legs.post(
                    endpoint, request.path_qs, bodies.nixl_prefill(doc), headers
                )
            except LegFailed as exc:
                log.warning("request %s: prefill leg failed (%s)", rid, exc)
                continue
            if 400 <= result.status <= 451:
                self.stats["rejected"] += 1
                return web.Response(
                    status=result.status, body=result.body, content_type="application/json"
                )
            if result.status >= 300:
                log.warning("request %s: prefill on %s answered %d", rid, prefiller, result.status)
                continue
            params = bodies.returned_kv_params(result.json())
            if params is None:
                log.warning(
                    "request %s: prefill on %s answered without kv_transfer_params; "
                    "decoding alone", rid, prefiller,
                )  # fmt: skip
                break
            self.stats["prefill_legs"] += 1
            return orjson.dumps(bodies.nixl_decode(doc, params))
        self.stats["fallbacks"] += 1
        log.warning("request %s: no prefill leg succeeded; decoding alone", rid)
        return body

    async def _endpoint(self, rid: str, prefiller: str) -> Endpoint | None:
        """The prefill server ``prefiller`` names, if it parses and may be called."""
        try:
            host, port = parse_host_port(prefiller)
        except ValueError as exc:
            log.warning("request %s: not a prefill server: %s", rid, exc)
            return None
        if not await self._vouched_for(host, port):
            self.stats["refused"] += 1
            log.warning(
                "request %s: prefiller %s is not %s",
                rid,
                prefiller,
                "a prefill member of the EPP nor allowed" if self.epp_url else "allowed",
            )
            return None
        return Endpoint(host, port)

    async def _vouched_for(self, host: str, port: int) -> bool:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:  # a name, not an address: never on an allow list
            return False
        if any(ip in net for net in self.allowed):
            return True
        if self.epp_url is None:
            return False
        address = f"[{ip.compressed}]:{port}" if ip.version == 6 else f"{ip}:{port}"
        if address not in self._epp_prefill and time.monotonic() - self._epp_read_at >= (
            EPP_REFRESH_S
        ):
            await self._read_epp()
        return address in self._epp_prefill

    async def _read_epp(self) -> None:
        """Re-read the EPP's prefill members; on failure keep the last list."""
        assert self.session is not None
        self._epp_read_at = time.monotonic()
        url = f"{self.epp_url}/status"
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                doc = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("cannot read the EPP's prefill members from %s: %s", url, exc)
            return
        nodes = doc.get("prefill_nodes") if isinstance(doc, dict) else None
        if not isinstance(nodes, list):
            log.warning("%s did not answer an EPP /status document; keeping the last", url)
            return
        self._epp_prefill = frozenset(n for n in nodes if isinstance(n, str))

    async def _to_decode(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert self.session is not None
        drop = (
            _HOP_BY_HOP
            | {PREFILLER_HEADER, PREFILLER_FALLBACKS_HEADER}
            | _connection_tokens(request.headers)
        )
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in drop)
        url = f"http://{self.decode.address}{request.path_qs}"
        try:
            upstream = await self.session.request(
                request.method, url, data=body or None, headers=headers
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            message = f"decode server {self.decode.address} unreachable: {exc}"
            if request.path in _P_D_PATHS and request.transport is not None:
                # nothing reached the decode server: end the connection unanswered, as
                # the server itself would be met, so the gateway tries the next endpoint
                # (Envoy retries a reset before the response starts, not a 502)
                log.warning("%s: closing the connection unanswered", message)
                request.transport.close()
                raise web.HTTPServiceUnavailable() from exc  # written nowhere: it is closed
            return _error(502, message)
        async with upstream:
            response = web.StreamResponse(status=upstream.status)
            drop = _HOP_BY_HOP | _connection_tokens(upstream.headers)
            for k, v in upstream.headers.items():
                if k.lower() not in drop:
                    response.headers.add(k, v)
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:  # before aiohttp's ClientError: it is one too
                # the client closed while we were relaying (a scraper's timeout, a
                # client that gave up): expected, nobody left to answer
                log.info("client closed %s %s before its answer was relayed", request.method,
                         request.path)  # fmt: skip
            except (aiohttp.ClientError, TimeoutError) as exc:
                # headers are out: all we can do is cut the stream short, visibly
                log.warning("decode server %s failed mid-response: %s", self.decode.address, exc)
                if request.transport is not None:
                    request.transport.close()
            return response


def _connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    """Header names a ``Connection`` field lists: hop-by-hop for this message."""
    return {
        token.strip().lower()
        for value in headers.getall("connection", [])
        for token in value.split(",")
        if token.strip()
    }


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "bad_gateway", "code": status}}, status=status
    )


def make_app(sidecar: Sidecar) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def stats(_request: web.Request) -> web.Response:
        return web.json_response(sidecar.stats)

    app.router.add_get("/sidecar/stats", stats)
    app.router.add_route("*", "/{tail:.*}", sidecar.handle)
    return app


def _network(text: str) -> Network:
    return ipaddress.ip_network(text, strict=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=argtypes.port, default=8001, help="port (0 = any free)")
    parser.add_argument(
        "--decode",
        type=argtypes.endpoint(),
        required=True,
        metavar="HOST:PORT",
        help="the decode server this sidecar fronts",
    )
    parser.add_argument(
        "--prefill-timeout-seconds",
        type=argtypes.non_negative_float,
        default=60.0,
        help="longest one prefill leg may take before the next prefill server named "
        "(x-prefiller-fallbacks) gets it, or the request decodes alone",
    )
    parser.add_argument(
        "--connect-timeout-seconds",
        type=argtypes.non_negative_float,
        default=1.0,
        help="longest to wait to reach a prefill server before trying the next one named, "
        "or decoding alone",
    )
    parser.add_argument(
        "--epp-url",
        type=argtypes.http_url,
        metavar="URL",
        help="the EPP's HTTP port (e.g. http://epp:9090): call the prefill servers its "
        "/status lists",
    )
    parser.add_argument(
        "--allow-prefiller",
        action="append",
        type=argtypes.checked(_network),
        default=[],
        metavar="CIDR",
        help="also call prefill servers in this network (repeatable; default: loopback "
        "only, and none when --epp-url is given)",
    )
    parser.add_argument("--ready-file", help="write {host, port} as JSON here once listening")
    add_log_level(parser)


async def _serve(args: argparse.Namespace) -> int:
    allowed = args.allow_prefiller or (() if args.epp_url else LOOPBACK)
    sidecar = Sidecar(
        args.decode,
        LegClient(AiohttpLegTransport(args.connect_timeout_seconds, args.prefill_timeout_seconds)),
        allowed,
        args.epp_url,
    )
    await sidecar.start()
    # a client that goes away cancels its handler: no decode leg for nobody
    runner = web.AppRunner(make_app(sidecar), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", args.host, args.port, exc.strerror)
        await runner.cleanup()
        await sidecar.close()
        return 1
    port: Any = runner.addresses[0][1]
    write_ready(args.ready_file, {"host": args.host, "port": port})
    log.info("sidecar on %s:%d fronting decode server %s", args.host, port, args.decode.address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await sidecar.close()
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_serve(args))
