"""bench workload: share parsing, exact seeded mixes, inputs per model; arrival schedules."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing

from tiermesh.bench import arrivals
from tiermesh.bench.workload import (
    DEFAULT_LENGTHS,
    NUMERIC,
    WORDS,
    InputSpec,
    Workload,
    block_counts,
    counting_tokenizer,
    mixed_texts,
    parse_lengths,
    parse_mix,
    parse_priorities,
    parse_shares,
    text_with_tokens,
)

TEXT = [InputSpec("text", "BYTES", (-1, 1))]
NUMBERS = [InputSpec("INPUT0", "FP32", (-1, 4))]


def take(work: Workload, n: int) -> list:  # type: ignore[type-arg]
    return list(itertools.islice(work, n))


def test_parse_shares_normalises() -> None:
    assert parse_shares("a=7, b=3") == (("a", 0.7), ("b", 0.3))
    assert parse_priorities("1=0.2,2=0.8") == ((1, 0.2), (2, 0.8))
    assert parse_mix("short=1") == (("short", 1.0),)


@pytest.mark.parametrize("text", ["a", "a=x", "=1", "a=-1", "a=0", "a=1,a=2", "a=nan", "a=inf"])
def test_parse_shares_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_shares(text)


def test_parse_mix_and_priorities_reject_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown length class"):
        parse_mix("tiny=1")
    with pytest.raises(ValueError):
        parse_priorities("high=1")
    with pytest.raises(ValueError):
        parse_priorities("-1=1")


def test_parse_lengths() -> None:
    out = parse_lengths("short=3-5")
    assert out["short"] == (3, 5) and out["long"] == DEFAULT_LENGTHS["long"]
    for bad in ("short=5-3", "short=0-3", "tiny=1-2", "short=4"):
        with pytest.raises(ValueError):
            parse_lengths(bad)


def test_block_counts_are_exact_and_sum_to_the_block() -> None:
    assert block_counts([0.7, 0.25, 0.05]) == [70, 25, 5]
    assert block_counts([1 / 3, 1 / 3, 1 / 3]) == [34, 33, 33]
    assert sum(block_counts([0.123, 0.456, 0.421])) == 100


def test_text_mix_is_exact_per_hundred_and_shuffled() -> None:
    work = Workload(TEXT, seed=7, priorities=((1, 0.2), (2, 0.8)))
    reqs = take(work, 1000)
    assert Counter(r.length for r in reqs) == {"short": 700, "medium": 250, "long": 50}
    assert Counter(r.priority for r in reqs) == {1: 200, 2: 800}
    for block in range(10):
        chunk = reqs[block * 100 : (block + 1) * 100]
        assert Counter(r.length for r in chunk)["long"] == 5
    assert [r.length for r in reqs[:100]] != sorted(r.length for r in reqs[:100])
    assert [r.index for r in reqs] == list(range(1000))


def test_text_lengths_follow_their_class() -> None:
    for req in take(Workload(TEXT, seed=1), 300):
        (tensor,) = req.inputs
        assert tensor.array.shape == (1, 1) and tensor.datatype == "BYTES"
        words = len(tensor.array[0, 0].decode().split())
        lo, hi = DEFAULT_LENGTHS[req.length]
        assert lo <= words <= hi


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    a = take(Workload(TEXT, seed=3), 50)
    b = take(Workload(TEXT, seed=3), 50)
    c = take(Workload(TEXT, seed=4), 50)
    texts = [r.inputs[0].array[0, 0] for r in a]
    assert texts == [r.inputs[0].array[0, 0] for r in b]
    assert texts != [r.inputs[0].array[0, 0] for r in c]
    assert len(set(texts)) == 50  # distinct, so no response cache answers for the mesh


def test_priority_shares_do_not_change_the_texts() -> None:
    a = take(Workload(TEXT, seed=3, priorities=((1, 1.0),)), 30)
    b = take(Workload(TEXT, seed=3, priorities=((1, 0.5), (2, 0.5))), 30)
    assert [r.inputs[0].array[0, 0] for r in a] == [r.inputs[0].array[0, 0] for r in b]


def test_numeric_models_get_random_values_and_no_length_mix() -> None:
    specs = [*NUMBERS, InputSpec("mask", "INT64", (-1, -1)), InputSpec("fixed", "FP16", (2, 3))]
    reqs = take(Workload(specs, seed=0), 20)
    assert {r.length for r in reqs} == {NUMERIC}
    x, mask, fixed = reqs[0].inputs
    assert x.array.shape == (1, 4) and x.array.dtype == np.float32
    assert mask.array.shape == (1, 1) and mask.array.dtype == np.int64
    assert set(np.unique(np.concatenate([r.inputs[1].array.ravel() for r in reqs]))) <= {0, 1}
    assert fixed.array.shape == (2, 3) and fixed.array.dtype == np.float16
    assert not np.array_equal(reqs[0].inputs[0].array, reqs[1].inputs[0].array)


def test_unusable_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        Workload([], seed=0)
    with pytest.raises(ValueError):
        Workload([InputSpec("x", "COMPLEX", (1,))], seed=0)


def test_poisson_arrivals_at_a_steady_rate() -> None:
    plan = arrivals.BurstPlan(rate_rps=200.0)
    times = list(arrivals.arrival_times(plan, 50.0, 10**9, np.random.default_rng(0)))
    assert len(times) == pytest.approx(10_000, rel=0.05)
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 50.0


def test_spikes_raise_the_rate_in_their_windows() -> None:
    plan = arrivals.BurstPlan(100.0, 1000.0, spike_every_s=10.0, spike_len_s=2.0)
    times = np.array(list(arrivals.arrival_times(plan, 40.0, 10**9, np.random.default_rng(1))))
    in_spike = np.array([arrivals.in_spike(plan, t) for t in times])
    assert in_spike.sum() / (3 * 2.0) == pytest.approx(1000.0, rel=0.1)  # 3 spikes of 2 s
    assert (~in_spike).sum() / (40.0 - 6.0) == pytest.approx(100.0, rel=0.1)
    assert not arrivals.in_spike(plan, 1.0)  # the run starts at the base rate
    assert arrivals.expected_count(plan, 40.0) == pytest.approx(34 * 100 + 6 * 1000)


def test_uniform_arrivals_limit_and_seed() -> None:
    plan = arrivals.BurstPlan(rate_rps=10.0, poisson=False)
    times = list(arrivals.arrival_times(plan, 100.0, 5, np.random.default_rng(0)))
    assert times == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    poisson = arrivals.BurstPlan(rate_rps=10.0)
    a = list(arrivals.arrival_times(poisson, 5.0, 100, np.random.default_rng(9)))
    b = list(arrivals.arrival_times(poisson, 5.0, 100, np.random.default_rng(9)))
    assert a == b


def test_spikes_only() -> None:
    plan = arrivals.BurstPlan(0.0, 100.0, spike_every_s=5.0, spike_len_s=1.0, poisson=False)
    times = list(arrivals.arrival_times(plan, 11.0, 10**6, np.random.default_rng(0)))
    assert all(arrivals.in_spike(plan, t) for t in times)
    assert len(times) == pytest.approx(200, abs=2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate_rps": -1.0},
        {"rate_rps": 0.0},
        {"rate_rps": 1.0, "spike_rate_rps": 5.0, "spike_every_s": 2.0, "spike_len_s": 2.0},
    ],
)
def test_burst_plan_rejects(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        arrivals.BurstPlan(**kwargs)  # type: ignore[arg-type]


def _tokenizer() -> Tokenizer:
    """Every workload word one token, plus [CLS] and [SEP] around each text."""
    vocab = {w: i for i, w in enumerate(("[UNK]", "[CLS]", "[SEP]", *WORDS))}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    return tok


@pytest.mark.parametrize("target", [3, 16, 64, 256])
def test_text_with_tokens_hits_the_target_count(target: int) -> None:
    tok = _tokenizer()
    text, count = text_with_tokens(tok, np.random.default_rng(target), target)
    assert count == target == len(tok.encode(text).ids)


def test_mixed_texts_hold_the_exact_mix_at_the_right_lengths() -> None:
    classes = [("short", 0.7, (8, 14)), ("medium", 0.25, (40, 60)), ("long", 0.05, (110, 125))]
    texts = mixed_texts(_tokenizer(), np.random.default_rng(3), 40, classes)
    assert Counter(t.kind for t in texts) == {"short": 28, "medium": 10, "long": 2}
    spans = {k: span for k, _, span in classes}
    assert all(spans[t.kind][0] <= t.tokens <= spans[t.kind][1] for t in texts)


def _text_model(root: Path, stable: str) -> Path:
    """A text model folder with versions 1 and 2, each with its own tokenizer (version 2's
    knows no word: every one is [UNK]); the shipped kind pads to 8 and truncates at 4."""
    folder = root / "texty"
    config = {
        "name": "texty",
        "max_batch_size": 8,
        "inputs": [{"name": "text", "datatype": "BYTES", "dims": [1]}],
        "outputs": [{"name": "out", "datatype": "FP32", "dims": [2]}],
        "compute": {
            "inputs": [{"name": "input_ids", "datatype": "INT64", "dims": [-1]}],
            "outputs": [{"name": "out", "datatype": "FP32", "dims": [2]}],
        },
        "tokenize": {"tokenizer": "tok.json", "max_length": 16},
        "versions": {"1": {"model.onnx": "0" * 64}, "2": {"model.onnx": "0" * 64}},
        "stable_version": stable,
    }
    for version, words in (("1", WORDS), ("2", ())):
        (folder / version).mkdir(parents=True)
        vocab = {w: i for i, w in enumerate(("[UNK]", "[CLS]", "[SEP]", "[PAD]", *words))}
        tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = Whitespace()
        tok.enable_padding(pad_id=3, pad_token="[PAD]", length=8)
        tok.enable_truncation(max_length=4)
        tok.save(str(folder / version / "tok.json"))
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def test_the_counting_tokenizer_is_the_stable_versions_and_counts_every_token(
    tmp_path: Path,
) -> None:
    text = " ".join(WORDS[:6])
    stable_one = counting_tokenizer(_text_model(tmp_path / "a", stable="1"))
    ids = stable_one.encode(text).ids
    assert len(ids) == 6  # neither padded to 8 nor cut at 4
    assert 0 not in ids  # version 1's vocabulary
    stable_two = counting_tokenizer(_text_model(tmp_path / "b", stable="2"))
    assert stable_two.encode(text).ids == [0] * 6


def test_a_model_without_text_has_no_counting_tokenizer(tmp_path: Path) -> None:
    folder = _text_model(tmp_path, stable="1")
    raw = yaml.safe_load((folder / "config.yaml").read_text())
    del raw["tokenize"], raw["compute"]
    (folder / "config.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="no tokenize section"):
        counting_tokenizer(folder)
