"""A batch job's durable state in Redis: the record, its inputs, its results.

Everything a job is lives under its own keys (core/keys.py): the record hash, the list of
inputs by index, and the results hash by index; its id is also in its tenant's set of open
jobs and, from its seal to its end, in the set of active jobs. Writes that must hold
together run as one script: creating (the open-jobs cap + the record), appending and
sealing (only while the job is loading), advancing the feed cursor (only while it is where
the feeder read it) and recording results (HSETNX per index + the counts + the end of the
job), so a redelivered input computed twice is written once. A feed queues its entries
first and advances the cursor after (the streams live in their models' slots of a Redis
Cluster, the bookkeeping in its own): a Redis restarted from its AOF, or a primary failed
over, never sees a cursor ahead of what it queued; a feeder that dies between the two
queues those inputs again, which costs compute, never a result.

Every key has a TTL from its first write: a loading job's record and inputs expire
`loading_ttl_ms` after its creation (a Submit that never ends, or whose gateway died,
leaves nothing unbounded); sealing, each feed and the end of the job set them (and the
results) to `retention_s` from then on. The open and active sets hold only ids, at most
the tenants' open-jobs caps of them; ids of ended or expired jobs are pruned.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

import redis.asyncio as aioredis

from tiermesh.batch.plan import CANCELLED, FINISHED, LOADING, RUNNING, JobRecord
from tiermesh.core import keys
from tiermesh.core.keys import StreamKey
from tiermesh.core.redis_cluster import execute_replicated, run_script

# How long a finished job's record and results are kept (a week).
DEFAULT_RETENTION_S = 7 * 24 * 3600
# How long a job may stay loading (its Submit still sending) before its keys expire.
DEFAULT_LOADING_TTL_MS = 3600 * 1000
# Stream entry field naming the batch job an entry belongs to (cancel finds them by it).
BATCH_FIELD = "batch"

# KEYS: record, tenant's open set. ARGV: job id, open-jobs cap (0: none), record TTL (ms),
# open set TTL (ms), then the record's field/value pairs. 0: the tenant is at its cap.
_CREATE = """
local cap = tonumber(ARGV[2])
if cap > 0 and redis.call('SCARD', KEYS[2]) >= cap then return 0 end
redis.call('SADD', KEYS[2], ARGV[1])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: record, inputs. ARGV: payloads. The inputs expire with the record; -1: the job is
# no longer loading (expired, cancelled), nothing appended.
_APPEND = """
if redis.call('HGET', KEYS[1], 'status') ~= 'loading' then return -1 end
local n = 0
for i = 1, #ARGV, 1000 do  -- unpack's stack holds ~8000 values
  n = redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return n
"""

# KEYS: record, inputs, active set, tenant's open set. ARGV: job id, now_ms, retention_ms.
# The job's total (-1: no longer loading, nothing changed).
_SEAL = """
if redis.call('HGET', KEYS[1], 'status') ~= 'loading' then return -1 end
local total = redis.call('LLEN', KEYS[2])
if total > 0 then
  redis.call('HSET', KEYS[1], 'total', total, 'status', 'queued')
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
else
  redis.call('HSET', KEYS[1], 'total', 0, 'status', 'done', 'finished_ms', ARGV[2])
  redis.call('SREM', KEYS[4], ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return total
"""

# KEYS: record, results, active set, inputs. ARGV: now_ms, job_id, retention_ms, then
# (index, payload, ok) triples. The results hash expires from its first write.
_RECORD = """
local st = redis.call('HGET', KEYS[1], 'status')
if (not st) or st == 'cancelled' then return -1 end
local ok, err = 0, 0
for i = 4, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) == 1 then
    if ARGV[i + 2] == '1' then ok = ok + 1 else err = err + 1 end
  end
end
if redis.call('PTTL', KEYS[2]) == -1 then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
local done = redis.call('HINCRBY', KEYS[1], 'done', ok)
local errors = redis.call('HINCRBY', KEYS[1], 'errors', err)
local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
if st ~= 'loading' and st ~= 'done' and done + errors >= total then
  redis.call('HSET', KEYS[1], 'status', 'done', 'finished_ms', ARGV[1])
  redis.call('SREM', KEYS[3], ARGV[2])
  redis.call('DEL', KEYS[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return ok + err
"""

# KEYS: record, inputs, results. ARGV: expected cursor, entries queued, retention_ms. A job
# being fed lives `retention_ms` past its latest feed.
_ADVANCE = """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' and st ~= 'running' then return -1 end
if tonumber(redis.call('HGET', KEYS[1], 'fed')) ~= tonumber(ARGV[1]) then return -1 end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[3]) end
if st == 'queued' then redis.call('HSET', KEYS[1], 'status', 'running') end
return redis.call('HINCRBY', KEYS[1], 'fed', ARGV[2])
"""

_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""


def _text(raw: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in raw.items()
    }


class BatchStore:
    """A job's inputs are deleted once it has ended (done or cancelled: nothing reads them
    again); its record and results expire `retention_s` after."""

    def __init__(self, redis: aioredis.Redis, retention_s: int = DEFAULT_RETENTION_S) -> None:
        self._redis = redis
        self._retention_ms = retention_s * 1000
        self._create = redis.register_script(_CREATE)
        self._append = redis.register_script(_APPEND)
        self._seal = redis.register_script(_SEAL)
        self._record = redis.register_script(_RECORD)
        self._advance = redis.register_script(_ADVANCE)
        self._lock = redis.register_script(_LOCK)

    async def create(
        self,
        tenant: str,
        model: str,
        variant: str,
        tier: str = "",
        *,
        max_open: int = 0,
        loading_ttl_ms: int = DEFAULT_LOADING_TTL_MS,
    ) -> JobRecord | None:
        """A new job in status loading (inputs still arriving; nothing fed yet), counted
        among its tenant's open jobs; None when the tenant has `max_open` unfinished jobs
        already (0: no cap). Its record expires `loading_ttl_ms` from now unless sealed."""
        job = JobRecord(
            job_id=uuid.uuid4().hex[:16],
            tenant=tenant,
            model=model,
            variant=variant,
            status=LOADING,
            total=0,
            fed=0,
            done=0,
            errors=0,
            created_ms=int(time.time() * 1000),
            tier=tier,
        )
        script_keys = [keys.batch_job_key(job.job_id), keys.batch_open_key(tenant)]
        args: list[str | int] = [
            job.job_id,
            max_open,
            loading_ttl_ms,
            loading_ttl_ms + self._retention_ms,
            *(x for kv in job.fields().items() for x in kv),
        ]
        if await self._create(keys=script_keys, args=args):
            return job
        # At the cap: ids of jobs that ended (or expired) since are pruned, then once more.
        if not await self._prune_open(tenant):
            return None
        return job if await self._create(keys=script_keys, args=args) else None

    async def _prune_open(self, tenant: str) -> int:
        """Drop from the tenant's open set the jobs that have ended or expired; how many."""
        key = keys.batch_open_key(tenant)
        members = sorted(m.decode() for m in cast(set[bytes], await self._redis.smembers(key)))
        statuses = await self.statuses(members)
        ended = [m for m in members if statuses.get(m, CANCELLED) in FINISHED]
        if ended:
            await self._redis.srem(key, *ended)
        return len(ended)

    async def append(self, job_id: str, inputs: Sequence[bytes]) -> int:
        """Add `inputs` to a loading job; how many it holds now, -1 when it is no longer
        loading (expired or cancelled meanwhile: nothing added)."""
        if not inputs:
            return 0
        script_keys = [keys.batch_job_key(job_id), keys.batch_inputs_key(job_id)]
        return int(await self._append(keys=script_keys, args=list(inputs)))

    async def seal(self, job_id: str, tenant: str) -> JobRecord | None:
        """Every input is in: the job's total is fixed and the feeder takes it up (a job of
        no inputs is done at once). None when the job is no longer loading."""
        total = await self._seal(
            keys=[
                keys.batch_job_key(job_id),
                keys.batch_inputs_key(job_id),
                keys.BATCH_ACTIVE,
                keys.batch_open_key(tenant),
            ],
            args=[job_id, int(time.time() * 1000), self._retention_ms],
        )
        return None if int(total) < 0 else await self.get(job_id)

    async def discard(self, job_id: str, tenant: str) -> None:
        """Delete everything of a job whose Submit did not end well (refused, cancelled,
        timed out): its caller never learnt its id, so nothing could ever read it."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(
                keys.batch_job_key(job_id),
                keys.batch_inputs_key(job_id),
                keys.batch_results_key(job_id),
            )
            pipe.srem(keys.batch_open_key(tenant), job_id)
            pipe.srem(keys.BATCH_ACTIVE, job_id)
            await pipe.execute()

    async def deactivate(self, job_id: str) -> None:
        """Forget an active job whose record is gone (expired): nothing is left to feed."""
        await self._redis.srem(keys.BATCH_ACTIVE, job_id)

    async def get(self, job_id: str) -> JobRecord | None:
        raw = await self._redis.hgetall(keys.batch_job_key(job_id))
        return JobRecord.from_fields(_text(raw)) if raw else None

    async def active(self) -> list[str]:
        members = cast(set[bytes], await self._redis.smembers(keys.BATCH_ACTIVE))
        return sorted(m.decode() for m in members)

    async def inputs(self, job_id: str, start: int, count: int) -> list[bytes]:
        key = keys.batch_inputs_key(job_id)
        return cast(list[bytes], await self._redis.lrange(key, start, start + count - 1))

    async def feed(
        self, job_id: str, cursor: int, entries: Sequence[tuple[StreamKey, bytes]]
    ) -> int:
        """Queue `entries` (the job's inputs from `cursor` on), then advance the cursor past
        them: the new cursor, or -1 when it moved meanwhile or the job stopped (what was
        queued then is skipped by the workers or written once)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream, payload in entries:
                pipe.xadd(stream.name, {keys.JOB_FIELD: payload, BATCH_FIELD: job_id})
            await execute_replicated(self._redis, pipe, {s.name for s, _ in entries})
        return int(
            await self._advance(
                keys=[
                    keys.batch_job_key(job_id),
                    keys.batch_inputs_key(job_id),
                    keys.batch_results_key(job_id),
                ],
                args=[cursor, len(entries), self._retention_ms],
            )
        )

    async def record(self, job_id: str, results: Sequence[tuple[int, bytes, bool]]) -> int:
        """Write each (index, result, ok) unless that index has a result already; returns
        how many were new (-1: the job is cancelled or gone, nothing written). Finishes the
        job when every input has its result."""
        args: list[Any] = [int(time.time() * 1000), job_id, self._retention_ms]
        for index, payload, ok in results:
            args += [index, payload, "1" if ok else "0"]
        script_keys = [
            keys.batch_job_key(job_id),
            keys.batch_results_key(job_id),
            keys.BATCH_ACTIVE,
            keys.batch_inputs_key(job_id),
        ]
        # Written on a cluster's replica too before the worker acknowledges the entries.
        return int(await run_script(self._redis, self._record, script_keys, args))

    async def results(self, job_id: str, start: int, count: int) -> list[tuple[int, bytes]]:
        """The finished results among indices [start, start + count), in index order."""
        indices = list(range(start, start + count))
        if not indices:
            return []
        values = cast(
            list[bytes | None], await self._redis.hmget(keys.batch_results_key(job_id), indices)
        )
        return [(i, v) for i, v in zip(indices, values, strict=True) if v is not None]

    async def result_count(self, job_id: str) -> int:
        return int(await self._redis.hlen(keys.batch_results_key(job_id)))

    async def statuses(self, job_ids: Sequence[str]) -> dict[str, str]:
        """Status of each job (missing jobs left out), one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(keys.batch_job_key(job_id), "status")
            values = await pipe.execute()
        return {j: v.decode() for j, v in zip(job_ids, values, strict=True) if v is not None}

    async def cancel(self, job_id: str, streams: Sequence[StreamKey]) -> JobRecord | None:
        """Stop the job: no more feeding, no more results written, and its entries deleted
        from `streams` (the background streams it was fed to). Entries a worker has read
        already are skipped by it (the status says cancelled)."""
        job = await self.get(job_id)
        if job is None:
            return None
        if job.status not in FINISHED:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(
                    keys.batch_job_key(job_id),
                    mapping={"status": CANCELLED, "finished_ms": int(time.time() * 1000)},
                )
                pipe.srem(keys.BATCH_ACTIVE, job_id)
                pipe.srem(keys.batch_open_key(job.tenant), job_id)
                pipe.delete(keys.batch_inputs_key(job_id))
                pipe.pexpire(keys.batch_job_key(job_id), self._retention_ms)
                pipe.pexpire(keys.batch_results_key(job_id), self._retention_ms)
                await pipe.execute()
        await self.purge(job_id, streams)
        return await self.get(job_id)

    async def purge(self, job_id: str, streams: Sequence[StreamKey]) -> int:
        """Delete (and acknowledge) the job's entries still on `streams`; how many."""
        removed = 0
        marker = job_id.encode()
        for stream in streams:
            entries = cast(
                list[tuple[bytes, dict[bytes, bytes]]],
                await self._redis.xrange(stream.name, "-", "+"),
            )
            ids = [eid for eid, f in entries if f and f.get(BATCH_FIELD.encode()) == marker]
            if ids:
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.xack(stream.name, keys.GROUP, *ids)
                    pipe.xdel(stream.name, *ids)
                    await pipe.execute()
                removed += len(ids)
        return removed

    async def hold_lock(self, owner: str, ttl_ms: int) -> bool:
        """Take the feeder lock, or keep it when `owner` holds it already."""
        return bool(await self._lock(keys=[keys.BATCH_FEED_LOCK], args=[owner, ttl_ms]))


__all__ = ["BATCH_FIELD", "RUNNING", "BatchStore"]
