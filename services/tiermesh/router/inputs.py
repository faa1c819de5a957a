"""Input processing of a batch of jobs: texts to token ids, prompts through their template."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tiermesh.core.errors import MeshError, invalid, unavailable
from tiermesh.core.jobs import Job
from tiermesh.core.model_config import TEXT_TOKENS, TOO_LONG, TRUNCATED
from tiermesh.core.tensors import TensorData, to_numpy
from tiermesh.core.text import TextEncoder
from tiermesh.generate.inputs import GenerationInputError
from tiermesh.generate.tensors import prompt_of
from tiermesh.router.prompt import PromptEncoder

# From this many texts in a batch the tokenizer runs on a thread, the event loop meanwhile
# serving other streams; below it the hop to the thread costs more than it frees.
TOKENIZE_IN_THREAD = 8


async def tokenized(encoder: TextEncoder, jobs: Sequence[Job]) -> list[Job | MeshError]:
    """Each job's text as token ids and attention mask, `truncated` told to the caller: one
    encode_batch call for all of them (it runs without the GIL). A job whose caller asked
    for its whole text (`Controls.whole_text`) and whose text was cut is refused
    INVALID_ARGUMENT."""
    tensors = [job.inputs[0] for job in jobs]
    if len(tensors) >= TOKENIZE_IN_THREAD:
        encoded = await asyncio.to_thread(encoder.encode_many, tensors)
    else:
        encoded = encoder.encode_many(tensors)
    out: list[Job | MeshError] = []
    for job, e in zip(jobs, encoded, strict=True):
        if not job.controls.whole_text:
            out.append(with_tokens(job, e))
        elif e[1]:
            out.append(invalid(f"{TOO_LONG} {encoder.max_length} tokens"))
        else:
            done = with_tokens(job, e)
            tokens = str(int(to_numpy(e[0][1]).sum()))
            out.append(done.with_(annotations={**done.annotations, TEXT_TOKENS: tokens}))
    return out


def with_tokens(job: Job, encoded: tuple[tuple[TensorData, TensorData], bool]) -> Job:
    """The job with its text replaced by (input_ids, attention_mask), `truncated` told to
    the caller (the online path and the batch feeder alike)."""
    (ids, mask), truncated = encoded
    annotations = {**job.annotations, TRUNCATED: "true" if truncated else "false"}
    return job.with_(inputs=(ids, mask), annotations=annotations)


def prompted(encoder: PromptEncoder | None, model: str, job: Job) -> Job | MeshError:
    """A generative request's prompt, templated and tokenized; INVALID_ARGUMENT when it does
    not fit the context."""
    if encoder is None or job.generation is None:
        return unavailable(f"model '{model}': its tokenizer is not loaded on this router")
    try:
        ids = encoder.encode(prompt_of(job.inputs), job.generation)
    except GenerationInputError as exc:
        return invalid(str(exc))
    annotations = {**job.annotations, "prompt_tokens": str(ids.shape[1])}
    return job.with_(inputs=(ids,), annotations=annotations)
