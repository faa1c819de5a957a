"""The continuous-batching engine on a tiny converted decoder, against the single-sequence
reference loop `llama_check.greedy`."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnxruntime as ort
import pytest

from tiermesh.convert.llama_check import greedy
from tiermesh.generate.engine import Engine, Event
from tiermesh.generate.inputs import Sampling
from tiermesh.generate.scheduler import GenRequest, Limits, SeqState

PROMPTS = {
    "p3": (5, 17, 42),
    "p7": (250, 3, 3, 9, 120, 77, 1),
    "p12": tuple(range(100, 112)),
    "p19": tuple((i * 37) % 300 for i in range(19)),
}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def session(tiny_decoder: ort.InferenceSession) -> ort.InferenceSession:
    return tiny_decoder


def run_all(engine: Engine, max_steps: int = 500) -> tuple[dict[str, list[int]], list[Event]]:
    tokens: dict[str, list[int]] = {}
    events: list[Event] = []
    for _ in range(max_steps):
        if engine.idle():
            break
        for e in engine.step():
            events.append(e)
            if e.kind == "token":
                assert isinstance(e.value, int)
                tokens.setdefault(e.request_id, []).append(e.value)
    assert engine.idle()
    return tokens, events


def test_batched_tokens_equal_each_prompt_alone(session: ort.InferenceSession) -> None:
    # Small chunks and budget: p12 and p19 are still prefilling while p3 and p7 decode, and
    # caches of four different lengths share every run.
    limits = Limits(max_sequences=4, max_kv_tokens=1000, prefill_chunk=4, step_tokens=8)
    engine = Engine(session, stop_ids=(), limits=limits, clock_ns=FakeClock())
    new = 12
    for i, (rid, prompt) in enumerate(PROMPTS.items()):
        engine.submit(GenRequest(rid, prompt, new, arrived_ns=i))
    tokens, events = run_all(engine)
    for rid, prompt in PROMPTS.items():
        alone, _ = greedy(session, np.array([prompt], np.int64), new, stop=())
        assert tokens[rid] == alone, rid
    assert {e.request_id for e in events if e.kind == "done"} == set(PROMPTS)
    assert all(e.value == "length" for e in events if e.kind == "done")
    assert engine.reserved_tokens == 0 and engine.cached_tokens == 0


class NoRepeat:
    """A deterministic chooser that never repeats a token of the sequence (the tiny random
    model's greedy choice just repeats the last token), recording the logits it is given."""

    def __init__(self) -> None:
        self.logits: dict[str, list[np.ndarray]] = defaultdict(list)

    def __call__(self, logits: np.ndarray, seq: SeqState) -> int:
        self.logits[seq.request_id].append(logits.copy())
        masked = logits.copy()
        masked[list({*seq.request.prompt, *seq.generated})] = -np.inf
        return int(np.argmax(masked))


def full_logits(session: ort.InferenceSession, tokens: list[int]) -> np.ndarray:
    """Logits [len(tokens), vocab] of one run over all tokens, no cache."""
    past = {
        i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values.")
    }
    feeds = {
        "input_ids": np.array([tokens], np.int64),
        "attention_mask": np.ones((1, len(tokens)), np.int64),
        "position_ids": np.arange(len(tokens), dtype=np.int64)[None, :],
        **past,
    }
    logits: np.ndarray = session.run(["logits"], feeds)[0][0]
    return logits


def test_batched_logits_equal_one_uncached_run(session: ort.InferenceSession) -> None:
    """Every step's logits, with padded caches, chunks and decodes mixed, equal those of the
    whole text run at once without a cache; with varied tokens so the caches matter."""
    limits = Limits(max_sequences=4, max_kv_tokens=1000, prefill_chunk=5, step_tokens=9)
    chooser = NoRepeat()
    engine = Engine(session, stop_ids=(), limits=limits, clock_ns=FakeClock(), choose=chooser)
    for i, (rid, prompt) in enumerate(PROMPTS.items()):
        engine.submit(GenRequest(rid, prompt, 6 + 3 * i, arrived_ns=i))
    tokens, _ = run_all(engine)
    for rid, prompt in PROMPTS.items():
        assert len(set(tokens[rid])) == len(tokens[rid])
        expected = full_logits(session, [*prompt, *tokens[rid][:-1]])[len(prompt) - 1 :]
        np.testing.assert_allclose(np.stack(chooser.logits[rid]), expected, atol=1e-4)


@pytest.mark.parametrize("chunk", [2, 3, 4])
def test_sequences_leaving_and_joining_keep_every_cache_exact(
    session: ort.InferenceSession, chunk: int
) -> None:
    """Two slots, six requests of different lengths: sequences leave while others finish
    their prefill and join, so the decode batch changes members between runs (while it
    does not, its cache arrays are reused as they are); every step's logits still equal an
    uncached run of the whole text."""
    limits = Limits(max_sequences=2, max_kv_tokens=1000, prefill_chunk=chunk, step_tokens=2 + chunk)
    chooser = NoRepeat()
    engine = Engine(session, stop_ids=(), limits=limits, clock_ns=FakeClock(), choose=chooser)
    prompts = {f"{rid}.{k}": p for k in range(2) for rid, p in PROMPTS.items() if len(p) < 15}
    for i, (rid, prompt) in enumerate(prompts.items()):
        engine.submit(GenRequest(rid, prompt, 2 + (5 * i) % 7, arrived_ns=i))
    tokens, _ = run_all(engine)
    for rid, prompt in prompts.items():
        expected = full_logits(session, [*prompt, *tokens[rid][:-1]])[len(prompt) - 1 :]
        np.testing.assert_allclose(np.stack(chooser.logits[rid]), expected, atol=1e-4)


def test_stop_token_ends_a_sequence(session: ort.InferenceSession) -> None:
    alone, _ = greedy(session, np.array([PROMPTS["p7"]], np.int64), 10, stop=())
    stop = alone[3]
    expected, _ = greedy(session, np.array([PROMPTS["p7"]], np.int64), 10, stop={stop})
    engine = Engine(session, stop_ids={stop}, limits=Limits(), clock_ns=FakeClock())
    engine.submit(GenRequest("p7", PROMPTS["p7"], 10))
    engine.submit(GenRequest("p12", PROMPTS["p12"], 10))
    tokens, events = run_all(engine)
    assert tokens["p7"] == expected and tokens["p7"][-1] == stop
    assert Event("p7", "done", "stop") in events


def test_short_request_finishes_after_its_own_tokens(session: ort.InferenceSession) -> None:
    limits = Limits(max_sequences=4, max_kv_tokens=1000, prefill_chunk=32, step_tokens=64)
    engine = Engine(session, stop_ids=(), limits=limits, clock_ns=FakeClock())
    engine.submit(GenRequest("long1", PROMPTS["p19"], 40, arrived_ns=0))
    engine.submit(GenRequest("short", PROMPTS["p3"], 3, arrived_ns=1))
    engine.submit(GenRequest("long2", PROMPTS["p12"], 40, arrived_ns=2))
    done_at: dict[str, int] = {}
    step = 0
    while not engine.idle():
        step += 1
        for e in engine.step():
            if e.kind == "done":
                done_at[e.request_id] = step
    # step 1 prefills the whole prompt and yields token 1; steps 2 and 3 yield tokens 2 and 3
    assert done_at["short"] == 3
    assert done_at["long1"] == done_at["long2"] == 40


def test_a_short_request_starts_within_one_run_while_long_ones_decode(
    session: ort.InferenceSession,
) -> None:
    """Issue 23: four long answers decode; a short request arriving then gets its first
    token within two steps (one model run each: the run after the one in flight, or the
    one after that when a prefill was in flight), and while prompts are fed no long answer
    goes two steps in a row without a token."""
    limits = Limits(max_sequences=8, max_kv_tokens=1000, prefill_chunk=4, step_tokens=16)
    engine = Engine(session, stop_ids=(), limits=limits, clock_ns=FakeClock())
    longs = [f"long{i}" for i in range(4)]
    for i, rid in enumerate(longs):
        engine.submit(GenRequest(rid, PROMPTS["p7"], 60, arrived_ns=i))
    tokens_at: dict[str, list[int]] = defaultdict(list)
    step = 0
    for arrival, prompt in enumerate(("p3", "p19", "p12")):
        while not all(tokens_at[rid] for rid in longs):  # the long ones decode
            step += 1
            for e in engine.step():
                tokens_at[e.request_id].append(step)
        rid = f"short{arrival}"
        engine.submit(GenRequest(rid, PROMPTS[prompt], 3, arrived_ns=10 + arrival))
        submitted = step
        while not tokens_at[rid]:
            step += 1
            for e in engine.step():
                if e.kind == "token":
                    tokens_at[e.request_id].append(step)
        # p19's 19-token prompt needs 5 chunks of 4: 5 prefill runs, a decode run between two
        runs = 1 if len(PROMPTS[prompt]) <= limits.prefill_chunk else 9
        assert tokens_at[rid][0] - submitted <= runs + 1, (prompt, tokens_at[rid], submitted)
        for _ in range(3):  # and the first short one to its end
            step += 1
            for e in engine.step():
                if e.kind == "token":
                    tokens_at[e.request_id].append(step)
    for rid in longs:
        gaps = np.diff(tokens_at[rid])
        assert gaps.max() <= 2, (rid, tokens_at[rid])
    assert engine.running == longs


def test_cancel_frees_slot_and_cache(session: ort.InferenceSession) -> None:
    limits = Limits(max_sequences=1, max_kv_tokens=1000, prefill_chunk=8, step_tokens=8)
    engine = Engine(session, stop_ids=(), limits=limits, clock_ns=FakeClock())
    engine.submit(GenRequest("first", PROMPTS["p12"], 30))
    engine.submit(GenRequest("second", PROMPTS["p3"], 2))
    for _ in range(4):
        engine.step()
    assert engine.running == ["first"] and engine.waiting == ["second"]
    assert engine.reserved_tokens == 42 and engine.cached_tokens == 12 + 2
    assert engine.cancel("first")
    assert engine.reserved_tokens == 0 and engine.cached_tokens == 0
    assert engine.running == []
    events = engine.step()
    assert engine.running == ["second"]
    assert [e.kind for e in events] == ["token"]
    assert not engine.cancel("first")


def test_deadline_with_injected_clock(session: ort.InferenceSession) -> None:
    clock = FakeClock()
    limits = Limits(max_sequences=1, max_kv_tokens=1000, prefill_chunk=8, step_tokens=8)
    engine = Engine(session, stop_ids=(), limits=limits, clock_ns=clock)
    engine.submit(GenRequest("running", PROMPTS["p3"], 50, deadline_ns=1000))
    engine.submit(GenRequest("waiting", PROMPTS["p3"], 5, deadline_ns=500))
    engine.step()
    clock.now = 500
    assert Event("waiting", "rejected", "deadline") in engine.step()
    clock.now = 1000
    assert engine.step() == [Event("running", "done", "deadline")]
    assert engine.idle() and engine.cached_tokens == 0


def test_oversized_request_rejected(session: ort.InferenceSession) -> None:
    limits = Limits(max_sequences=2, max_kv_tokens=10, prefill_chunk=8, step_tokens=8)
    engine = Engine(session, stop_ids=(), limits=limits, clock_ns=FakeClock())
    engine.submit(GenRequest("big", PROMPTS["p7"], 4))
    assert engine.step() == [Event("big", "rejected", "too_large")]
    with pytest.raises(ValueError):
        engine.submit(GenRequest("dup", (1,), 1))
        engine.submit(GenRequest("dup", (1,), 1))


def test_a_seeded_sampled_request_gives_the_same_tokens_batched_or_alone(
    session: ort.InferenceSession,
) -> None:
    """Per-request sampling (generate/sampling.py): its own seeded stream, so batching it
    with other requests changes nothing; another seed gives other tokens."""
    # The tiny random model's logits are very peaked: a high temperature (beyond what
    # parse_inputs lets a client ask) flattens them so that the seed matters.
    warm = Sampling(temperature=100.0, top_p=0.95, seed=11)

    def sampled(seed: int, with_others: bool) -> list[int]:
        engine = Engine(session, stop_ids=(), limits=Limits(max_sequences=4, step_tokens=16))
        s = Sampling(warm.temperature, warm.top_p, seed)
        engine.submit(GenRequest("s", PROMPTS["p7"], max_new_tokens=20, sampling=s))
        if with_others:
            engine.submit(GenRequest("g", PROMPTS["p12"], max_new_tokens=20))
            engine.submit(GenRequest("o", PROMPTS["p3"], max_new_tokens=20, sampling=warm))
        tokens, _ = run_all(engine)
        return tokens["s"]

    alone = sampled(11, with_others=False)
    assert sampled(11, with_others=True) == alone
    assert sampled(12, with_others=False) != alone
    assert len(set(alone)) > 1  # sampled, not the tiny model's repeated argmax
