"""What one request left behind: the reply's own account of its time, and the client's."""

from __future__ import annotations

from dataclasses import dataclass, field

# Server-side stages in path order, as the response parameters name them (`<stage>_ms`).
STAGES = ("queue", "preprocess", "batch_wait", "compute", "postprocess", "delivery")
OK = "OK"
# Never sent: an open loop's arrival found the client's in-flight cap reached.
NOT_SENT = "NOT_SENT"
# The client failed before any status came back (bad input on our side, closed channel).
CLIENT_ERROR = "CLIENT_ERROR"
# A generation stream carried an error message in place of a response (ModelStreamInfer's
# in-band errors have no status code).
STREAM_ERROR = "STREAM_ERROR"
# A generation stream ended before the request's final response.
INCOMPLETE = "INCOMPLETE"


@dataclass(frozen=True, slots=True)
class Reply:
    """The timing and placement parameters a response carried; absent ones stay empty."""

    stages_ms: dict[str, float] = field(default_factory=dict)
    total_ms: float | None = None
    batch_size: int | None = None
    bucket: int | None = None
    tokens: int | None = None
    padded_tokens: int | None = None
    tier: str = ""
    variant: str = ""
    worker: str = ""


@dataclass(frozen=True, slots=True)
class GenerationRecord:
    """What one generation request showed: the client's own timings of its pieces and what
    the final response said. Client times are None where they cannot be known (no piece
    with text; TPOT with fewer than two tokens or no stream)."""

    max_new_tokens: int
    ttft_ms: float | None = None  # send -> first piece with text
    tpot_ms: float | None = None  # (last text piece - first) / (generated_tokens - 1)
    pieces: int = 0  # responses received, the final one included
    text_chars: int = 0
    generated_tokens: int | None = None
    prompt_tokens: int | None = None
    server_ttft_ms: float | None = None
    server_tpot_ms: float | None = None
    finish_reason: str = ""
    error: str = ""  # the message of a failed request


@dataclass(frozen=True, slots=True)
class Outcome:
    """One call as the client saw it: status code name, latency and, when OK, the reply;
    `generation` for requests of the generate scenario (failed ones too)."""

    code: str
    latency_ms: float
    reply: Reply | None = None
    retry_after_ms: float | None = None
    generation: GenerationRecord | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """One request of a run. `start_s` counts from the start of the measured run;
    `concurrency` is the closed loop's number of callers (0 in an open loop); `lag_ms` is
    how late an open loop sent it against its schedule."""

    start_s: float
    length: str
    priority: int
    step: int
    concurrency: int
    outcome: Outcome
    lag_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome.code == OK

    @property
    def sent(self) -> bool:
        return self.outcome.code != NOT_SENT

    @property
    def end_s(self) -> float:
        return self.start_s + self.outcome.latency_ms / 1000.0
