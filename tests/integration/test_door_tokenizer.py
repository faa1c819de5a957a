"""The Go front door's tokenizer (frontdoor/go/wordpiece.go) against the router's
(core/text.py, the `tokenizers` library) on the real MiniLM tokenizers: the same ids and
the same `truncated` for every ASCII text, including what a BertNormalizer drops or splits
(control characters, tabs and line ends, punctuation, special tokens written in the text,
words longer than WordPiece takes, texts past max_length); any other text is left to the
router. The plan it runs on is the one the gateway hands the door (core/direct_plan.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import MODELS
from tests.go_toolchain import needs_go
from tests.integration.conftest import door_answers
from tiermesh.core.direct_plan import text_plan
from tiermesh.core.repository import ModelRepository
from tiermesh.core.text import TextEncoder
from tiermesh.gateway.door_plans import DoorPlans

pytestmark = [
    pytest.mark.slow,
    needs_go,
]

WORDS = (
    "the quick brown fox jumps over lazy dogs tokenization unbelievably antidisestablishment "
    "serving mesh gRPC ONNX runtime KServe v2 x86_64 e-mail don't U.S.A. 3.14159 #hashtag "
    "@mention [CLS] [SEP] [MASK] [PAD] [UNK] [cls] [CLS [SEP]] ##ing ## a"
).split()


def corpus(rng: np.random.Generator) -> list[str]:
    texts = ["", " ", "\t\n\r", "[CLS]", "[CLS][SEP]", "a[MASK]b", "x" * 101, "y" * 100]
    texts += ["Hello, World!", "It's 5 o'clock; isn't it?", "A\x00B\x07C\x7fD\x0bE\x0cF"]
    printable = [chr(c) for c in range(32, 127)]
    every = [chr(c) for c in range(0, 128)]
    for _ in range(400):
        texts.append(" ".join(rng.choice(WORDS, int(rng.integers(1, 40)))))
    for _ in range(400):
        texts.append("".join(rng.choice(printable, int(rng.integers(1, 200)))))
    for _ in range(200):
        texts.append("".join(rng.choice(every, int(rng.integers(1, 80)))))
    # past max_length (128 with [CLS] and [SEP]): truncated
    texts += [" ".join(rng.choice(WORDS, n)) for n in (126, 127, 200, 400)]
    return texts


NOT_ASCII = ["café", "naïve résumé", "日本語", "emoji 🙂", "Ünïcödé", "\u00a0nbsp"]


@pytest.mark.parametrize("model", ["minilm-l3", "minilm-l6"])
def test_the_door_tokenizes_ascii_texts_as_the_router_does(
    model: str, fetched_models: tuple[str, ...], tmp_path: Path, door_binary: Path
) -> None:
    repo = ModelRepository(MODELS)
    cfg = repo.load()[model]
    assert cfg.tokenize is not None
    path = MODELS / model / cfg.stable.version / cfg.tokenize.tokenizer_file
    data = path.read_bytes()
    plan = text_plan(cfg, json.loads(data), str(path), hashlib.sha256(data).hexdigest())
    assert plan is not None  # the MiniLM tokenizers have the shape the door knows
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    texts = corpus(np.random.default_rng(7)) + NOT_ASCII
    answers = door_answers(door_binary, ["tokenize", str(plan_file)], texts)
    router = TextEncoder(path, cfg.tokenize.max_length)
    truncated = 0
    for text, answer in zip(texts, answers, strict=True):
        if not text.isascii():
            assert answer is None, text  # the router's to tokenize
            continue
        encoded = router.encode([text])
        assert answer == {
            "ids": encoded.input_ids[0].tolist(),
            "truncated": encoded.truncated,
        }, text
        truncated += encoded.truncated
    assert truncated >= 4  # the corpus did reach past max_length


def test_a_tokenizer_of_another_shape_gets_no_plan(fetched_models: tuple[str, ...]) -> None:
    cfg = ModelRepository(MODELS).load()["minilm-l3"]
    assert cfg.tokenize is not None
    path = MODELS / "minilm-l3" / cfg.stable.version / cfg.tokenize.tokenizer_file
    tokenizer = json.loads(path.read_text())
    assert text_plan(cfg, tokenizer, str(path), "0") is not None
    for change in (
        {"normalizer": {"type": "NFKC"}},
        {"pre_tokenizer": {"type": "Whitespace"}},
        {"model": {**tokenizer["model"], "type": "BPE"}},
        {"post_processor": {"type": "RobertaProcessing"}},
        {"added_tokens": [{**tokenizer["added_tokens"][0], "normalized": True}]},
    ):
        assert text_plan(cfg, {**tokenizer, **change}, str(path), "0") is None, change


def test_the_gateway_hands_the_door_a_checked_tokenizer(
    fetched_models: tuple[str, ...], tmp_path: Path
) -> None:
    """gateway/door_plans.py: the plan names the version's tokenizer.json and its digest;
    a tokenizer that no longer matches its sha256 gives no plan (the router tokenizes)."""
    folder = tmp_path / "minilm-l3"
    (folder / "1").mkdir(parents=True)
    shutil.copy(MODELS / "minilm-l3" / "config.yaml", folder / "config.yaml")
    tokenizer = folder / "1" / "tokenizer.json"
    shutil.copy(MODELS / "minilm-l3" / "1" / "tokenizer.json", tokenizer)
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg.pop("tiers")
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    repo = ModelRepository(tmp_path)
    model = repo.load()["minilm-l3"]
    plan = json.loads(DoorPlans(repo, explicit_control=False).parameter(model))
    assert plan["text"]["file"] == str(tokenizer)
    assert plan["text"]["sha256"] == hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    with tokenizer.open("ab") as f:
        f.write(b" ")
    assert DoorPlans(repo, explicit_control=False).parameter(model) == ""
