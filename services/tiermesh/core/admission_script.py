"""The admission script: bounded, idempotent enqueue onto work streams, decided in Redis in
one round trip for a batch of jobs (router/admission.py calls it for the router; the Go
front door calls the same script for the jobs it places itself, core/direct_plan.py).

KEYS: every key the batch touches, each once (streams, workers zsets, rate hashes, the
      requests' enqueued keys, guard keys).
ARGV: 1 number of items, 2-4 the entry's three field names (job, traceparent, tracestate),
      then per item ITEM_ARGS values: the KEYS index of its stream, workers zset, rate hash
      and enqueued key; stream bound; model bound (0 = none); rate field; ms left (-1 = no
      deadline); how long to remember the enqueue (ms); the job; traceparent; tracestate;
      the KEYS index of its guard key (0 = none); the number of its model's streams (for
      the model bound), then their KEYS indexes.
Returns outcome, detail for each item, in order. Items are decided one after another, as
separate calls would be: an item sees the entries the items before it added. An item whose
guard key exists is not queued (`reroute`): the door's placement no longer holds for it (a
rollout of its model began), and the router places it instead.
"""

from __future__ import annotations

ADMISSION_SCRIPT = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local job_f, tp_f, ts_f = ARGV[2], ARGV[3], ARGV[4]
local out = {}
local a = 5
local function decide(stream, workers, rate, enqueued, bound, model_bound, field, left_ms,
                      remember_ms, job, tp, ts, guard, first, count)
  if guard > 0 and redis.call('EXISTS', KEYS[guard]) == 1 then
    return 'reroute', '0'
  end
  local seen = redis.call('GET', enqueued)
  if seen then
    return 'dup', seen
  end
  if redis.call('ZCOUNT', workers, now_ms, '+inf') == 0 then
    return 'noworker', '0'
  end
  local backlog = redis.call('XLEN', stream)
  if backlog >= bound then
    return 'full', tostring(backlog)
  end
  if model_bound > 0 then
    local total = 0
    for i = first, first + count - 1 do
      total = total + redis.call('XLEN', KEYS[tonumber(ARGV[i])])
    end
    if total >= model_bound then
      return 'modelfull', tostring(total)
    end
  end
  if left_ms >= 0 and backlog > 0 then
    local r = tonumber(redis.call('HGET', rate, field) or '0')
    if r and r > 0 then
      local drain_ms = math.floor(backlog / r * 1000)
      if drain_ms > left_ms then
        return 'late', tostring(drain_ms)
      end
    end
  end
  local id = redis.call('XADD', stream, '*', job_f, job, tp_f, tp, ts_f, ts)
  redis.call('SET', enqueued, id, 'PX', remember_ms)
  return 'ok', id
end
for _ = 1, tonumber(ARGV[1]) do
  local count = tonumber(ARGV[a + 13])
  local outcome, detail = decide(
    KEYS[tonumber(ARGV[a])], KEYS[tonumber(ARGV[a + 1])], KEYS[tonumber(ARGV[a + 2])],
    KEYS[tonumber(ARGV[a + 3])], tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), ARGV[a + 6],
    tonumber(ARGV[a + 7]), ARGV[a + 8], ARGV[a + 9], ARGV[a + 10], ARGV[a + 11],
    tonumber(ARGV[a + 12]), a + 14, count)
  out[#out + 1] = outcome
  out[#out + 1] = detail
  a = a + 14 + count
end
return out
"""
# How long an enqueue is remembered past the request's deadline (or at all, without one).
REMEMBER_MARGIN_MS = 5_000
REMEMBER_NO_DEADLINE_MS = 600_000
