"""The precise prefix index: which endpoint holds which blocks of KV, as the endpoints
themselves reported it (pure: the subscriber feeds it events, the scorer looks up).

vLLM's own block hashes cannot be recomputed here (a per-process seed for most hash
functions, and the published value is a truncated digest), so blocks are keyed by
their content instead: a block's key is xxhash64 of its token ids, seeded with its
parent's key, the first block's seed naming the LoRA adapter. A request's tokens cut
at the endpoint's block size give the same keys, so a lookup walks the request's
chain and stops where an endpoint's blocks end. The engine's hashes are kept per
endpoint only to resolve ``parent_block_hash`` and ``BlockRemoved``.

Like the approximate index (epp.scheduling.prefixindex), each endpoint is a bit and a
key maps to the bitmask of endpoints holding it, one table for GPU blocks and one for
blocks on another medium (offloaded to CPU memory or disk): the longest prefix held on
the GPU and the longest held anywhere are both found in one walk.

Memory is bounded per endpoint (``max_blocks_per_endpoint``); past it the oldest
entries are dropped and counted. Trust is per endpoint: an endpoint whose events were
lost (a sequence gap without replay, a reconnect, a restart seen too late) is not
trusted until its state is rebuilt (``rebuild_s`` of events after the reset, or an
``AllBlocksCleared``); the scorer falls back to the approximate index meanwhile.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import xxhash

from epp.kvevents.wire import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent

GPU = "GPU"
_h64 = xxhash.xxh64_intdigest
_TOKEN_BYTES = 8  # token ids are packed as int64 (array "q") on both sides


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids packed the way both events and requests are hashed."""
    return array("q", token_ids).tobytes()


def chain_root(lora: str) -> int:
    """The seed of a chain's first block: the base model ("") or a LoRA adapter's name."""
    return _h64(b"epp-kv-chain/" + lora.encode())


def chain_keys(tokens: bytes, block_size: int, max_blocks: int, root: int) -> list[int]:
    """The keys of the full ``block_size`` blocks of packed ``tokens`` (at most
    ``max_blocks``), each seeded with the one before."""
    step = block_size * _TOKEN_BYTES
    n = min(len(tokens) // step, max_blocks)
    keys: list[int] = []
    prev = root
    for start in range(0, n * step, step):
        prev = _h64(tokens[start : start + step], prev)
        keys.append(prev)
    return keys


# How many leading blocks of a request an endpoint holds: (on the GPU, on the GPU or
# another medium); the second is never smaller. Plain tuples: a lookup may return one
# per endpoint of a large pool.
Held = tuple[int, int]


@dataclass(slots=True)
class _Endpoint:
    bit: int
    block_size: int = 0  # from its BlockStored events; 0 = none seen
    gpu: dict[BlockHash, int] = field(default_factory=dict)  # engine hash -> our key
    other: dict[BlockHash, int] = field(default_factory=dict)  # on CPU, disk, ...
    trusted_from: float = math.inf  # inf: not trusted (no stream, or lost events)
    suspended_from: float | None = None  # trusted_from before a disconnect


@dataclass(slots=True)
class IndexStats:
    """Counters since start (reported on /metrics)."""

    stored: int = 0  # blocks announced and indexed
    removed: int = 0  # blocks removed that were indexed
    removed_unknown: int = 0  # removals of blocks we never saw stored
    orphans: int = 0  # stored blocks whose parent we do not hold (events were missed)
    dropped: int = 0  # blocks forgotten at the per-endpoint cap
    other_groups: int = 0  # blocks of KV-cache groups other than the first (ignored)
    cleared: int = 0  # AllBlocksCleared events


class PreciseIndex:
    def __init__(self, max_blocks_per_endpoint: int = 100_000, rebuild_s: float = 60.0) -> None:
        self.max_blocks_per_endpoint = max(max_blocks_per_endpoint, 1)
        self.rebuild_s = rebuild_s
        self.stats = IndexStats()
        self._gpu: dict[int, int] = {}  # key -> bitmask of endpoints holding it on GPU
        self._other: dict[int, int] = {}  # key -> bitmask holding it on another medium
        self._endpoints: dict[str, _Endpoint] = {}
        self._names: list[str | None] = []  # bit number -> address (None: free)
        self._free: list[int] = []  # bit numbers of forgotten endpoints
        self._sizes: dict[int, int] = {}  # block size -> endpoints using it
        self.lora_names: set[str] = set()  # adapters seen in events (requests by name)
        self._roots: dict[str, int] = {"": chain_root("")}
        # trusted addresses, valid until _trust_until or the next change
        self._trusted: frozenset[str] = frozenset()
        self._trust_until = -math.inf

    # -- what the subscriber reports -----------------------------------------------
    def apply(self, address: str, events: Iterable[KvEvent], now: float) -> None:
        """Apply one batch of ``address``'s events, in order."""
        ep = self._endpoint(address)
        for event in events:
            kind = type(event)
            if kind is BlockStored:
                self._store(ep, event)  # type: ignore[arg-type]
            elif kind is BlockRemoved:
                self._remove(ep, event)  # type: ignore[arg-type]
            elif kind is AllBlocksCleared:
                self._clear(ep)
                self.stats.cleared += 1
                if ep.suspended_from is None and ep.trusted_from > now:
                    self._set_trust(ep, now)  # empty is known state: rebuilt at once

    def reset(self, address: str, now: float, *, complete: bool) -> None:
        """Forget what ``address`` holds. ``complete``: the events that follow are its
        whole history (a new publisher, or a replay from its first message), so it is
        trusted at once; else only after ``rebuild_s`` of events."""
        ep = self._endpoint(address)
        self._clear(ep)
        ep.suspended_from = None
        self._set_trust(ep, now if complete else now + self.rebuild_s)

    def suspend(self, address: str) -> None:
        """The stream broke (disconnect): distrust ``address`` but keep its blocks; the
        next message either proves nothing was lost (:meth:`resume`) or resets it."""
        ep = self._endpoints.get(address)
        if ep is not None and ep.suspended_from is None:
            ep.suspended_from = ep.trusted_from
            self._set_trust(ep, math.inf)

    def resume(self, address: str) -> None:
        ep = self._endpoints.get(address)
        if ep is not None and ep.suspended_from is not None:
            trusted_from, ep.suspended_from = ep.suspended_from, None
            self._set_trust(ep, trusted_from)

    def forget(self, address: str) -> None:
        """Drop ``address`` entirely (it left the pool, or its stream stopped)."""
        ep = self._endpoints.pop(address, None)
        if ep is None:
            return
        self._clear(ep)
        self._set_block_size(ep, 0)
        number = ep.bit.bit_length() - 1
        self._names[number] = None
        self._free.append(number)
        self._trust_until = -math.inf

    # -- what the scorer asks ----------------------------------------------------------
    def trusted(self, now: float) -> frozenset[str]:
        """Addresses whose view is trusted at ``now`` (cached until it can change)."""
        if now >= self._trust_until:
            trusted, until = [], math.inf
            for address, ep in self._endpoints.items():
                if ep.trusted_from <= now:
                    trusted.append(address)
                elif ep.trusted_from < until:
                    until = ep.trusted_from
            self._trusted, self._trust_until = frozenset(trusted), until
        return self._trusted

    def block_sizes(self) -> list[int]:
        """The block sizes endpoints announce blocks in (usually one)."""
        return list(self._sizes)

    def root(self, lora: str) -> int:
        root = self._roots.get(lora)
        if root is None:
            root = self._roots[lora] = chain_root(lora)
        return root

    def match(self, keys: Sequence[int]) -> dict[str, Held]:
        """address -> (GPU, any medium) leading blocks of ``keys`` it holds, for the
        endpoints holding at least the first; O(blocks + endpoints matched)."""
        if not keys:
            return {}
        gpu_of, other_of = self._gpu, self._other
        if not other_of:  # nothing offloaded anywhere: one walk counts both
            return self._match_gpu(keys)
        on_gpu = gpu_of.get(keys[0], 0)
        anywhere = on_gpu | other_of.get(keys[0], 0)
        if not anywhere:
            return {}
        names = self._names
        gpu_len: dict[int, int] = {}  # bit number -> blocks, for those that stopped early
        found: dict[str, Held] = {}
        for i in range(1, len(keys)):
            key = keys[i]
            g = gpu_of.get(key, 0)
            if on_gpu and on_gpu & g != on_gpu:
                for number in _numbers(on_gpu & ~g):
                    gpu_len[number] = i
                on_gpu &= g
            held = g | other_of.get(key, 0)
            if anywhere & held != anywhere:
                for number in _numbers(anywhere & ~held):
                    found[names[number]] = (gpu_len.get(number, 0), i)  # type: ignore[index]
                anywhere &= held
                if not anywhere:
                    return found
        n = len(keys)
        for number in _numbers(anywhere):
            gpu = n if on_gpu >> number & 1 else gpu_len.get(number, 0)
            found[names[number]] = (gpu, n)  # type: ignore[index]
        return found

    def _match_gpu(self, keys: Sequence[int]) -> dict[str, Held]:
        """:meth:`match` when every block is on the GPU."""
        holders_of, names = self._gpu, self._names
        alive = holders_of.get(keys[0], 0)
        found: dict[str, Held] = {}
        if not alive:
            return found
        for i in range(1, len(keys)):
            holders = holders_of.get(keys[i], 0)
            if alive & holders != alive:
                for number in _numbers(alive & ~holders):
                    found[names[number]] = (i, i)  # type: ignore[index]
                alive &= holders
                if not alive:
                    return found
        n = len(keys)
        for number in _numbers(alive):
            found[names[number]] = (n, n)  # type: ignore[index]
        return found

    def blocks(self, address: str) -> tuple[int, int]:
        """(GPU blocks, blocks on other media) ``address`` is known to hold."""
        ep = self._endpoints.get(address)
        return (len(ep.gpu), len(ep.other)) if ep is not None else (0, 0)

    def addresses(self) -> list[str]:
        return list(self._endpoints)

    def size(self) -> int:
        """Blocks indexed over all endpoints (memory is proportional to this)."""
        return sum(len(ep.gpu) + len(ep.other) for ep in self._endpoints.values())

    # -- internals ---------------------------------------------------------------------
    def _endpoint(self, address: str) -> _Endpoint:
        ep = self._endpoints.get(address)
        if ep is None:
            if self._free:
                number = self._free.pop()
                self._names[number] = address
            else:
                number = len(self._names)
                self._names.append(address)
            ep = self._endpoints[address] = _Endpoint(1 << number)
        return ep

    def _set_trust(self, ep: _Endpoint, trusted_from: float) -> None:
        ep.trusted_from = trusted_from
        self._trust_until = -math.inf  # recompute on the next read

    def _set_block_size(self, ep: _Endpoint, size: int) -> None:
        if ep.block_size == size:
            return
        if ep.block_size:
            left = self._sizes[ep.block_size] - 1
            if left:
                self._sizes[ep.block_size] = left
            else:
                del self._sizes[ep.block_size]
        if size:
            self._sizes[size] = self._sizes.get(size, 0) + 1
        ep.block_size = size

    def _store(self, ep: _Endpoint, ev: BlockStored) -> None:
        stats = self.stats
        if ev.group_idx:  # hybrid models: the first (full-attention) group decides
            stats.other_groups += len(ev.block_hashes)
            return
        parent = ev.parent_block_hash
        if parent is None:
            lora = ev.lora_name or ("" if ev.lora_id is None else f"#{ev.lora_id}")
            if ev.lora_name:
                self.lora_names.add(ev.lora_name)
            prev = self.root(lora)
        else:
            seed = ep.gpu.get(parent)
            if seed is None:
                seed = ep.other.get(parent)
            if seed is None:
                stats.orphans += len(ev.block_hashes)
                return
            prev = seed
        on_gpu = ev.medium is None or ev.medium == GPU
        table, holders = (ep.gpu, self._gpu) if on_gpu else (ep.other, self._other)
        self._set_block_size(ep, ev.block_size)
        data = ev.token_ids.tobytes()
        step = ev.block_size * _TOKEN_BYTES
        extra_keys = ev.extra_keys
        bit = ep.bit
        added = 0
        for i, engine_hash in enumerate(ev.block_hashes):
            key = _h64(data[i * step : (i + 1) * step], prev)
            if extra_keys is not None and extra_keys[i]:
                # a cache salt or image hashes: a text request never matches this block
                # nor, through the chain, its children (the LoRA name is in the root)
                extra = [k for k in extra_keys[i] or () if k != ev.lora_name]
                if extra:
                    key = _h64(repr(extra).encode(), key)
            prev = key
            if engine_hash in table:
                continue
            table[engine_hash] = key
            holders[key] = holders.get(key, 0) | bit
            added += 1
        stats.stored += added
        if len(ep.gpu) + len(ep.other) > self.max_blocks_per_endpoint:
            self._shed(ep)

    def _remove(self, ep: _Endpoint, ev: BlockRemoved) -> None:
        on_gpu = ev.medium is None or ev.medium == GPU
        table, holders = (ep.gpu, self._gpu) if on_gpu else (ep.other, self._other)
        if ev.group_idx:
            return
        for engine_hash in ev.block_hashes:
            key = table.pop(engine_hash, None)
            if key is None:
                self.stats.removed_unknown += 1
                continue
            self.stats.removed += 1
            _unset(holders, key, ep.bit)

    def _clear(self, ep: _Endpoint) -> None:
        for table, holders in ((ep.gpu, self._gpu), (ep.other, self._other)):
            for key in table.values():
                _unset(holders, key, ep.bit)
            table.clear()

    def _shed(self, ep: _Endpoint) -> None:
        """Over the cap: forget the oldest entries (other media first), a sixteenth of
        the cap at once so the cost per stored block stays constant."""
        excess = len(ep.gpu) + len(ep.other) - self.max_blocks_per_endpoint
        excess += self.max_blocks_per_endpoint // 16
        for table, holders in ((ep.other, self._other), (ep.gpu, self._gpu)):
            if excess <= 0:
                break
            victims: list[BlockHash] = []
            for engine_hash in table:
                if len(victims) >= excess:
                    break
                victims.append(engine_hash)
            for engine_hash in victims:
                _unset(holders, table.pop(engine_hash), ep.bit)
            self.stats.dropped += len(victims)
            excess -= len(victims)


def _unset(holders: dict[int, int], key: int, bit: int) -> None:
    # Two engine hashes of one endpoint naming the same content (never seen with a
    # single KV group) would clear the bit early: a missed hit, never a false one.
    mask = holders.get(key, 0) & ~bit
    if mask:
        holders[key] = mask
    else:
        holders.pop(key, None)


def _numbers(mask: int) -> list[int]:
    """The numbers of the bits set in ``mask``, lowest first: a few bits by integer
    arithmetic, many by searching its binary digits (a pool of hundreds of endpoints
    makes masks of hundreds of bits, where each integer operation costs more)."""
    found = []
    if mask.bit_count() <= 8:
        while mask:
            low = mask & -mask
            found.append(low.bit_length() - 1)
            mask ^= low
        return found
    digits = bin(mask)[:1:-1]  # least significant first, without "0b"
    at = digits.find("1")
    while at >= 0:
        found.append(at)
        at = digits.find("1", at + 1)
    return found
