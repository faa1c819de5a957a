"""The worker's Redis side: consumer groups, reads, acknowledgements, heartbeats.

`WorkStreams` is what the batched loop (worker/loop.py and its parts) asks of them;
`StreamClient` does it over Redis, one round trip per call (a call covers a whole batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ResponseError

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.redis_cluster import execute_replicated, get_many, is_cluster
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.wire import decode_job

log = structlog.get_logger("tiermesh.worker")

# A held entry is touched for at most this many times the reclaim's idle time from its
# read: a batch may take that long without being taken over, and an entry whose work was
# given up without an acknowledgement (a hand-off that failed, an ack that did not reach
# Redis: "entries stay pending") is free for a reclaim at most this much later.
HOLD_LIMIT = 3

# What a stream call raises when Redis is away; the loop logs it and goes on.
STREAM_ERRORS: tuple[type[Exception], ...] = (aioredis.RedisError, OSError)

# The dead-letter stream of a compute unit and tier keeps this many entries (exact MAXLEN:
# dead letters are rare, and the bound is then what it says), each with the request's job
# when that is at most DEAD_LETTER_MAX_PAYLOAD_BYTES: at most ~16 MiB a stream.
DEAD_LETTER_MAX_LEN = 1000
DEAD_LETTER_MAX_PAYLOAD_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class StreamRead:
    """Streams read together, up to `count` new entries each."""

    streams: Sequence[StreamKey]
    count: int


@dataclass(frozen=True, slots=True)
class Entry:
    stream: StreamKey
    entry_id: str
    fields: dict[bytes, bytes]


class WorkStreams(Protocol):
    """The stream calls of the batched loop, each about many entries at once (see
    StreamClient for what each guarantees). Failures raise one of STREAM_ERRORS. A reclaim
    takes over other consumers' entries, never one this consumer read and is still working
    on (buffered, computing, being handed off)."""

    @property
    def consumer(self) -> str:
        """This worker's consumer name in every group (and in the worker sets)."""
        ...

    async def ensure_groups(self, streams: Iterable[StreamKey]) -> None: ...

    async def read(
        self, streams: Sequence[StreamKey], count: int, block_ms: int | None, pending: bool = False
    ) -> list[Entry]: ...

    async def read_checking(
        self,
        reads: Sequence[StreamRead],
        block_ms: int | None,
        check: Sequence[str],
    ) -> tuple[list[Entry], set[str]]: ...

    async def done(
        self, stream: StreamKey, entry_ids: Sequence[str], drain_rate: float | None = None
    ) -> None: ...

    async def reclaim(self, stream: StreamKey, min_idle_ms: int, count: int) -> list[Entry]: ...

    async def reclaim_many(
        self, rooms: Mapping[StreamKey, int], min_idle_ms: int
    ) -> dict[StreamKey, list[Entry]]: ...

    async def deliveries(self, stream: StreamKey, entry_ids: Sequence[str]) -> dict[str, int]: ...

    async def dead_letter(self, entry: Entry, reason: str) -> None: ...

    async def requeue(
        self, stream: StreamKey, job: bytes, trace_context: dict[str, str]
    ) -> bool: ...

    async def cancelled(self, request_ids: Sequence[str]) -> set[str]: ...

    async def heartbeat(
        self,
        units: Iterable[ComputeUnit],
        tier: str,
        ttl_ms: int,
        providers: Mapping[ComputeUnit, str] | None = None,
    ) -> None: ...

    async def leave(self, units: Iterable[ComputeUnit], tier: str) -> None: ...


class StreamClient:
    """WorkStreams over Redis Streams and consumer groups (and `touch`, for the generative
    loop's long-running entries).

    It keeps the entries it read and has not acknowledged yet ("held": buffered, computing,
    being handed off), with when it read and last touched each. A held entry must not idle
    into a reclaim: neither another worker's, nor this worker's own (which would compute it
    twice and count a delivery each time, until a batch that is merely slow is
    dead-lettered as poison). So every `reclaim_many` first touches, in the same round
    trip, the held entries last touched a quarter of the reclaim's idle time ago; with a
    reclaim at least every half of it (WorkerSettings checks it) none idles that long. An
    entry held HOLD_LIMIT times the idle time is let go instead: its work was given up.

    On a Redis Cluster one XREADGROUP reads only streams of one slot (one model's), so a
    read of several models' streams is one XREADGROUP per model; a blocking one blocks on
    each at once and returns as soon as any has entries, leaving the others blocked (owned
    here, collected by the next read, awaited by `aclose`)."""

    @classmethod
    def from_settings(cls, redis: aioredis.Redis, settings: WorkerSettings) -> StreamClient:
        """The worker's client, its consumer named by TIERMESH_WORKER_ID, else by host, tier
        and process."""
        host, tier = socket.gethostname(), settings.worker_tier
        return cls(
            redis,
            settings.worker_id or f"{host}-{tier}-{os.getpid()}",
            dead_letter_max_len=settings.dead_letter_max_len,
            dead_letter_max_payload_bytes=settings.dead_letter_max_payload_bytes,
        )

    def __init__(
        self,
        redis: aioredis.Redis,
        consumer: str,
        clock_ms: Callable[[], float] = lambda: time.monotonic() * 1000,
        dead_letter_max_len: int = DEAD_LETTER_MAX_LEN,
        dead_letter_max_payload_bytes: int = DEAD_LETTER_MAX_PAYLOAD_BYTES,
    ) -> None:
        self._redis = redis
        self.consumer = consumer
        self._clock_ms = clock_ms
        self._dead_max_len = dead_letter_max_len
        self._dead_max_payload = dead_letter_max_payload_bytes
        # stream -> entry id -> (read, last touched), on clock_ms
        self._held: dict[StreamKey, dict[str, tuple[float, float]]] = defaultdict(dict)
        self._cluster = is_cluster(redis)
        # A cluster's blocking reads still waiting, by the streams each reads.
        self._blocked: dict[tuple[StreamKey, ...], asyncio.Task[object]] = {}

    async def aclose(self) -> None:
        """Wait for the blocking reads still out (a cluster's), at most their block time
        (`poll_block_ms`): what they got stays pending for this consumer, read again at its
        next start or reclaimed by another worker."""
        blocked, self._blocked = list(self._blocked.values()), {}
        for task in blocked:
            with contextlib.suppress(*STREAM_ERRORS):
                await task

    def held(self, stream: StreamKey) -> set[str]:
        """Entries of `stream` read here and not acknowledged yet."""
        return set(self._held.get(stream, ()))

    def _hold(self, entries: Iterable[Entry]) -> None:
        now = self._clock_ms()
        for e in entries:
            self._held[e.stream][e.entry_id] = (now, now)

    def _release(self, stream: StreamKey, entry_ids: Iterable[str]) -> None:
        held = self._held.get(stream)
        if held is not None:
            for entry_id in entry_ids:
                held.pop(entry_id, None)
            if not held:
                del self._held[stream]

    async def ensure_groups(self, streams: Iterable[StreamKey]) -> None:
        """Create the consumer group of every stream (and the stream) if absent."""
        for key in streams:
            try:
                await self._redis.xgroup_create(key.name, keys.GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def read(
        self, streams: Sequence[StreamKey], count: int, block_ms: int | None, pending: bool = False
    ) -> list[Entry]:
        """XREADGROUP up to `count` entries per stream. `pending` re-reads this consumer's
        own unacknowledged entries (after a restart) instead of new ones."""
        if not streams:
            return []
        ident = "0" if pending else ">"
        if self._cluster:
            groups = _by_slot(streams)
            if len(groups) > 1:
                return await self._read_slots(groups, ident, count, block_ms)
        try:
            reply = await self._xreadgroup(streams, ident, count, block_ms)
        except ResponseError as exc:
            # A Redis that came back without its data (no AOF, or flushed) lost the groups:
            # create them again and go on rather than failing every read from now on.
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_groups(streams)
            reply = await self._xreadgroup(streams, ident, count, block_ms)
        return self._entries(streams, reply)

    async def read_checking(
        self,
        reads: Sequence[StreamRead],
        block_ms: int | None,
        check: Sequence[str],
    ) -> tuple[list[Entry], set[str]]:
        """`read` of new entries, one XREADGROUP per `StreamRead` (its streams, its count per
        stream), and, in the same round trip (the flags first, so a read that blocks does
        not hold them back), the cancel flags of the request ids in `check`: (entries, the
        ids among `check` whose callers have given up). Reads that may block are merged
        into one (Redis blocks on each XREADGROUP in turn), with the largest count."""
        reads = [r for r in reads if r.streams]
        if block_ms is not None and len(reads) > 1:
            reads = [StreamRead([k for r in reads for k in r.streams], max(r.count for r in reads))]
        if self._cluster:  # the flags, then the reads (each by slot)
            try:
                flagged = await self.cancelled(check)
            except STREAM_ERRORS:  # a node away: the reads of the others go on
                flagged = set()
            return [
                e for r in reads for e in await self.read(r.streams, r.count, block_ms)
            ], flagged
        if not check and len(reads) == 1:
            return await self.read(reads[0].streams, reads[0].count, block_ms), set()
        if not reads:
            return [], await self.cancelled(check)
        async with self._redis.pipeline(transaction=False) as pipe:
            if check:
                pipe.mget(_cancel_keys(check))
            for r in reads:
                pipe.xreadgroup(
                    keys.GROUP,
                    self.consumer,
                    {k.name: ">" for k in r.streams},
                    count=r.count,
                    block=block_ms,
                )
            replies = await pipe.execute(raise_on_error=False)
        gone: set[str] = set()
        if check:
            flags, *replies = replies
            if isinstance(flags, Exception):
                raise flags
            gone = _flagged(check, flags)
        entries: list[Entry] = []
        for r, reply in zip(reads, replies, strict=True):
            if isinstance(reply, ResponseError) and "NOGROUP" in str(reply):
                entries += await self.read(r.streams, r.count, block_ms)  # as `read` recovers
            elif isinstance(reply, Exception):
                raise reply
            else:
                entries += self._entries(r.streams, reply)
        return entries, gone

    async def _read_slots(
        self,
        groups: list[tuple[StreamKey, ...]],
        ident: str,
        count: int,
        block_ms: int | None,
    ) -> list[Entry]:
        """`read` of streams in several slots of a cluster: one XREADGROUP per slot, all
        at once."""
        if block_ms is None or ident != ">":  # none blocks
            answers = await asyncio.gather(
                *(self._xreadgroup(g, ident, count, None) for g in groups), return_exceptions=True
            )
            return await self._collect(list(zip(groups, answers, strict=True)))
        for group in groups:
            if group not in self._blocked:
                self._blocked[group] = asyncio.ensure_future(
                    self._xreadgroup(group, ident, count, block_ms)
                )
        # Until a read comes back: one that failed (its node away) does not end the wait
        # while the others may still bring entries.
        end = time.monotonic() + block_ms / 1000 + 1
        waiting = {self._blocked[g] for g in groups}
        while waiting:
            came, waiting = await asyncio.wait(
                waiting,
                timeout=max(0.0, end - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not came or any(t.cancelled() or t.exception() is None for t in came):
                break
        done = [(g, t) for g, t in self._blocked.items() if t.done()]
        for group, _ in done:
            del self._blocked[group]
        came_back: list[tuple[Sequence[StreamKey], object]] = [
            (g, t.exception() or t.result()) for g, t in done
        ]
        reading = bool(self._blocked.keys() & set(groups))
        return await self._collect(came_back, still_reading=reading)

    async def _collect(
        self, replies: list[tuple[Sequence[StreamKey], object]], still_reading: bool = False
    ) -> list[Entry]:
        """The entries of each slot's reply. A slot whose read failed (its node away, as
        while a primary fails over) does not hold back the others: it raises only when
        every slot's read failed (none answered, none `still_reading`)."""
        entries: list[Entry] = []
        failed: list[BaseException] = []
        for group, reply in replies:
            try:
                entries += await self._got(group, reply)
            except STREAM_ERRORS as exc:
                failed.append(exc)
        if failed and len(failed) == len(replies) and not still_reading:
            raise failed[0]
        if failed:
            log.warning("some models' streams unreadable; read the others", error=str(failed[0]))
        return entries

    async def _got(self, group: Sequence[StreamKey], reply: object) -> list[Entry]:
        """The entries of one slot's XREADGROUP reply; a group lost (NOGROUP) is created
        again (read next time), any other failure raised."""
        if isinstance(reply, ResponseError) and "NOGROUP" in str(reply):
            await self.ensure_groups(group)
            return []
        if isinstance(reply, BaseException):
            raise reply
        return self._entries(group, reply)

    def _entries(self, streams: Sequence[StreamKey], reply: object) -> list[Entry]:
        """The entries of an XREADGROUP reply, held from now on."""
        by_name = {k.name: k for k in streams}
        out = []
        # RESP2 reply: [[stream, [[id, {field: value}], ...]], ...]
        rows = cast(list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes] | None]]]], reply or [])
        for name, items in rows:
            stream = by_name[name.decode()]
            for entry_id, fields in items:
                if fields:  # a pending entry deleted meanwhile comes back empty
                    out.append(Entry(stream, entry_id.decode(), fields))
        self._hold(out)
        return out

    async def _xreadgroup(
        self, streams: Sequence[StreamKey], ident: str, count: int, block_ms: int | None
    ) -> object:
        if self._cluster:
            # Sent to the slot's node named here: redis-py would otherwise ask one node
            # of the cluster (COMMAND GETKEYS) where XREADGROUP's keys are, and while that
            # one is away every read would fail, whatever its slot.
            cluster = cast(aioredis.RedisCluster, self._redis)
            node = cluster.get_node_from_key(streams[0].name)
            return await cluster.execute_command(
                "XREADGROUP",
                "GROUP",
                keys.GROUP,
                self.consumer,
                "COUNT",
                count,
                *(("BLOCK", block_ms) if block_ms is not None else ()),
                "STREAMS",
                *(k.name for k in streams),
                *(ident for _ in streams),
                target_nodes=node,
            )
        return await self._redis.xreadgroup(
            keys.GROUP,
            self.consumer,
            {k.name: ident for k in streams},
            count=count,
            block=block_ms,
        )

    async def done(
        self, stream: StreamKey, entry_ids: Sequence[str], drain_rate: float | None = None
    ) -> None:
        """Acknowledge and delete handed-off entries, atomically: the stream's length stays
        the backlog that admission bounds. `drain_rate` (entries per second) is published
        for admission in the same round trip."""
        if not entry_ids:
            return
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.xack(stream.name, keys.GROUP, *entry_ids)
                pipe.xdel(stream.name, *entry_ids)
                if drain_rate is not None:
                    pipe.hset(
                        keys.rate_key(stream.unit, stream.tier),
                        keys.rate_field(stream.bucket),
                        f"{drain_rate:.3f}",
                    )
                await pipe.execute()
        finally:  # acknowledged, or left to be delivered again: no longer worked on here
            self._release(stream, entry_ids)

    async def reclaim(self, stream: StreamKey, min_idle_ms: int, count: int) -> list[Entry]:
        """Take over entries other consumers read but left unacknowledged for `min_idle_ms`
        (their worker died): XAUTOCLAIM, which also counts the delivery."""
        return (await self.reclaim_many({stream: count}, min_idle_ms)).get(stream, [])

    async def reclaim_many(
        self, rooms: Mapping[StreamKey, int], min_idle_ms: int
    ) -> dict[StreamKey, list[Entry]]:
        """`reclaim` over several streams (up to `rooms[stream]` entries each) in one round
        trip, after touching the held entries older than `min_idle_ms / 4` (those no longer
        pending are let go): the streams where something was taken over. A stream whose
        XAUTOCLAIM failed (its group gone) is logged and left out; a lost connection
        raises."""
        now = self._clock_ms()
        stale = self._due_a_touch(now, min_idle_ms)
        if not rooms and not stale:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for stream, ids in stale.items():
            pipe.xclaim(stream.name, keys.GROUP, self.consumer, 0, list(ids), justid=True)
        for stream, count in rooms.items():
            pipe.xautoclaim(
                stream.name, keys.GROUP, self.consumer, min_idle_ms, start_id="0-0", count=count
            )
        replies = await pipe.execute(raise_on_error=False)
        for (stream, ids), reply in zip(stale.items(), replies, strict=False):
            if not isinstance(reply, Exception):  # else touched again next round
                self._touched(stream, ids, reply, now)
        taken: dict[StreamKey, list[Entry]] = {}
        for stream, reply in zip(rooms, replies[len(stale) :], strict=True):
            if isinstance(reply, Exception):
                log.warning("reclaim failed", stream=stream.name, error=str(reply))
                continue
            held = self._held.get(stream, {})
            # Never one of this consumer's own: it is computing or handing it off.
            entries = [e for e in _claimed(stream, reply) if e.entry_id not in held]
            if entries:
                self._hold(entries)
                taken[stream] = entries
        return taken

    def _due_a_touch(self, now: float, min_idle_ms: int) -> dict[StreamKey, list[str]]:
        """The held entries to touch now (last touched a quarter of the idle time ago),
        after letting go of those held HOLD_LIMIT times the idle time."""
        for stream, held in list(self._held.items()):
            limit = HOLD_LIMIT * min_idle_ms
            self._release(stream, [i for i, (read, _) in held.items() if now - read >= limit])
        return {
            stream: ids
            for stream, held in self._held.items()
            if (ids := [i for i, (_, at) in held.items() if now - at >= min_idle_ms / 4])
        }

    def _touched(self, stream: StreamKey, ids: list[str], reply: Any, now: float) -> None:
        """After an XCLAIM JUSTID of `ids`: those it returned are touched now, the rest are
        no longer pending (acknowledged or dead-lettered meanwhile) and let go."""
        touched = {i.decode() if isinstance(i, bytes) else str(i) for i in reply}
        self._release(stream, [i for i in ids if i not in touched])
        held = self._held.get(stream, {})
        for i in touched & held.keys():  # not acknowledged meanwhile
            held[i] = (held[i][0], now)

    async def touch(self, stream: StreamKey, entry_ids: Sequence[str]) -> None:
        """Reset the idle time of entries this consumer is still working on (a long
        generation), so no other worker's reclaim takes them over. JUSTID: not counted as
        a delivery."""
        if entry_ids:
            reply = await self._redis.xclaim(
                stream.name, keys.GROUP, self.consumer, 0, list(entry_ids), justid=True
            )
            self._touched(stream, list(entry_ids), reply, self._clock_ms())

    async def deliveries(self, stream: StreamKey, entry_ids: Sequence[str]) -> dict[str, int]:
        """How many times each pending entry has been delivered."""
        if not entry_ids:
            return {}
        lo, hi = min(entry_ids, key=_id_key), max(entry_ids, key=_id_key)
        rows = await self._redis.xpending_range(
            stream.name, keys.GROUP, lo, hi, 10 * len(entry_ids)
        )
        wanted = set(entry_ids)
        out = {}
        for row in rows:
            eid = row["message_id"]
            eid = eid.decode() if isinstance(eid, bytes) else str(eid)
            if eid in wanted:
                out[eid] = int(row["times_delivered"])
        return out

    async def dead_letter(self, entry: Entry, reason: str) -> None:
        """Move an entry to its dead-letter stream, atomically with its acknowledgement. The
        stream keeps its newest `dead_letter_max_len` entries; each holds the reason, the
        stream, the entry id and the request id, and of the entry's own fields those of at
        most `dead_letter_max_payload_bytes` (a bigger job is noted by its size only)."""
        fields = self._dead_fields(entry, reason)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.xadd(
                    keys.dead_letter_key(entry.stream.unit, entry.stream.tier),
                    fields,
                    maxlen=self._dead_max_len,
                    approximate=False,
                )
                pipe.xack(entry.stream.name, keys.GROUP, entry.entry_id)
                pipe.xdel(entry.stream.name, entry.entry_id)
                await pipe.execute()
        finally:
            self._release(entry.stream, [entry.entry_id])

    def _dead_fields(self, entry: Entry, reason: str) -> dict[Any, Any]:
        """A dead letter's fields: what says which request it was and why, and the entry's
        fields that are within the payload bound."""
        job = entry.fields.get(keys.JOB_FIELD.encode(), b"")
        try:  # a rare path: decoding a big job once is no cost to speak of
            request_id = decode_job(job).request_id
        except Exception:
            request_id = ""
        fields: dict[Any, Any] = {
            name: value
            for name, value in entry.fields.items()
            if len(value) <= self._dead_max_payload
        }
        dropped = {name: len(value) for name, value in entry.fields.items() if name not in fields}
        for name, size in dropped.items():
            fields[b"dropped:" + name] = str(size)  # its size in bytes
        fields.update(
            {
                "reason": reason[: self._dead_max_payload],
                "stream": entry.stream.name,
                "entry_id": entry.entry_id,
                "request_id": request_id[: self._dead_max_payload],
            }
        )
        return fields

    async def requeue(self, stream: StreamKey, job: bytes, trace_context: dict[str, str]) -> bool:
        """XADD a job to another tier's stream (a cascade); False when no worker lives there
        (the caller then keeps its own answer)."""
        now_ms = int(time.time() * 1000)
        if not await self._redis.zcount(keys.workers_key(stream.unit, stream.tier), now_ms, "+inf"):
            return False
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xadd(
                stream.name,
                {
                    keys.JOB_FIELD: job,
                    keys.TRACEPARENT_FIELD: trace_context.get("traceparent", ""),
                    keys.TRACESTATE_FIELD: trace_context.get("tracestate", ""),
                },
            )
            # On a cluster, on a replica too before the entry it replaces is acknowledged.
            await execute_replicated(self._redis, pipe, [stream.name])
        return True

    async def cancelled(self, request_ids: Sequence[str]) -> set[str]:
        """The ids among `request_ids` whose callers have given up."""
        if not request_ids:
            return set()
        return _flagged(request_ids, await get_many(self._redis, _cancel_keys(request_ids)))

    async def heartbeat(
        self,
        units: Iterable[ComputeUnit],
        tier: str,
        ttl_ms: int,
        providers: Mapping[ComputeUnit, str] | None = None,
    ) -> None:
        """Register this consumer in the worker set of each unit on `tier` for `ttl_ms`
        (routers admit work while one is live), dropping members whose time is up; and, in
        the same round trip, the execution provider its session of each unit got
        (`providers`: unit -> provider; a unit without one is left out), in a key of its
        own that expires with the membership (ModelConfig reads it)."""
        now_ms = int(time.time() * 1000)
        providers = providers or {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for unit in units:
                key = keys.workers_key(unit, tier)
                pipe.zadd(key, {self.consumer: now_ms + ttl_ms})
                pipe.zremrangebyscore(key, "-inf", now_ms)
                if provider := providers.get(unit):
                    pipe.set(keys.provider_key(unit, tier, self.consumer), provider, px=ttl_ms)
            await pipe.execute()

    async def leave(self, units: Iterable[ComputeUnit], tier: str) -> None:
        """Deregister this consumer from the worker set of each unit on `tier`, and drop
        its execution provider there."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for unit in units:
                pipe.zrem(keys.workers_key(unit, tier), self.consumer)
                pipe.delete(keys.provider_key(unit, tier, self.consumer))
            await pipe.execute()


def _by_slot(streams: Sequence[StreamKey]) -> list[tuple[StreamKey, ...]]:
    """`streams` grouped by their hash tag (their model's slot), in order."""
    groups: dict[str, list[StreamKey]] = defaultdict(list)
    for stream in streams:
        groups[keys.model_tag(stream.unit.model)].append(stream)
    return [tuple(g) for g in groups.values()]


def _claimed(stream: StreamKey, reply: Any) -> list[Entry]:
    """The entries of an XAUTOCLAIM reply (those deleted meanwhile come without fields)."""
    claimed = cast(list[tuple[bytes, dict[bytes, bytes] | None]], reply[1] if reply else [])
    return [Entry(stream, eid.decode(), fields) for eid, fields in claimed if fields]


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _cancel_keys(request_ids: Sequence[str]) -> list[str]:
    return [keys.cancel_key(r) for r in request_ids]


def _flagged(request_ids: Sequence[str], flags: Sequence[object]) -> set[str]:
    """The ids whose cancel flag (MGET's reply, in the same order) is set."""
    return {r for r, flag in zip(request_ids, flags, strict=True) if flag is not None}
