"""What the gateway decides about a request to a generative model, with no gRPC and no Redis.

`generation_of` checks the prompt and the generation parameters (tiermesh.generate.inputs'
rules) and raises INVALID_ARGUMENT naming the field; the prompt's token count against the
context is the router's check, once the chat template is applied. `TextCursor` turns the
pieces of an answer, which may come twice (a redelivered request is generated again), into
what a streaming caller has not been sent yet.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tiermesh.core.errors import invalid
from tiermesh.core.jobs import GenerationRequest
from tiermesh.core.model_config import GenerationSpec
from tiermesh.core.tensors import TensorData
from tiermesh.generate.inputs import GenerationInputError, parse_inputs
from tiermesh.generate.tensors import prompt_of

# The request parameters a generation request may carry (KServe v2 InferParameter values).
PARAMETERS = ("max_new_tokens", "temperature", "top_p", "seed", "stop")
SEED_LIMIT = 2**63 - 1


def generation_of(
    spec: GenerationSpec,
    inputs: tuple[TensorData, ...],
    parameters: dict[str, object],
    request_id: str,
    stream: bool,
    messages: tuple[tuple[str, str], ...] = (),
    raw_prompt: bool = False,
) -> GenerationRequest:
    """The checked generation request; INVALID_ARGUMENT for a bad prompt or parameter.
    Without a `seed`, one is drawn from the request id: the answer is random per request
    but the same if the request is computed again after a worker's crash."""
    prompt = prompt_of(inputs)
    size = len(prompt.encode("utf-8"))
    if size > spec.max_prompt_bytes:
        raise invalid(f"prompt: {size} bytes, over the limit of {spec.max_prompt_bytes}")
    try:
        parsed = parse_inputs(prompt, parameters, spec.max_new_tokens)
    except GenerationInputError as exc:
        raise invalid(str(exc)) from None
    seed = parsed.sampling.seed if "seed" in parameters else derived_seed(request_id)
    return GenerationRequest(
        max_new_tokens=parsed.max_new_tokens,
        temperature=parsed.sampling.temperature,
        top_p=parsed.sampling.top_p,
        seed=seed,
        stop=parsed.stop,
        stream=stream,
        messages=messages,
        raw_prompt=raw_prompt,
    )


def derived_seed(request_id: str) -> int:
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & SEED_LIMIT


@dataclass
class TextCursor:
    """How much of one answer a streaming caller has been sent (characters)."""

    sent: int = 0

    def piece(self, offset: int, text: str) -> str:
        """What of a piece starting at `offset` is new: "" for one sent before (a repeat
        after redelivery) and for one past a gap (a lost piece; the final answer fills it)."""
        end = offset + len(text)
        if end <= self.sent or offset > self.sent:
            return ""
        new = text[self.sent - offset :]
        self.sent = end
        return new

    def rest(self, answer: str) -> str:
        """The end of the whole answer that was not sent as pieces."""
        new = answer[self.sent :]
        self.sent = max(self.sent, len(answer))
        return new
