"""Prompts of the generate scenario: a built-in set of varied chat prompts, or a file.

The built-in prompts differ in length (a few words to a paragraph of context) and in the
kind of answer they invite (a word, a list, code, a summary), so prompt processing and
answer lengths both vary; how long each answer may grow is set apart (`max_new_tokens`).
"""

from __future__ import annotations

import json
from pathlib import Path

BUILTIN = "built-in"

BUILTIN_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Say hello in three languages.",
    "How many legs does a spider have?",
    "Name a colour that rhymes with 'bed'.",
    "What is 17 multiplied by 23?",
    "Give me a synonym for 'happy'.",
    "Write a haiku about autumn leaves.",
    "Explain in one paragraph why the sky is blue.",
    "List five fruits that are rich in vitamin C.",
    "What is the difference between a list and a tuple in Python?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Suggest three names for a small bakery that sells sourdough bread.",
    "Translate 'Where is the train station?' into Spanish and German.",
    "Give me a short recipe for pancakes.",
    "What are the main causes of the seasons on Earth?",
    "Write a limerick about a cat who learns to code.",
    "Explain what a hash table is to a ten-year-old.",
    "Compare electric cars and petrol cars in a few bullet points.",
    "Write a polite email declining a meeting invitation for Thursday afternoon.",
    "What should I pack for a three-day hiking trip in the mountains?",
    "Describe the water cycle step by step.",
    "Write a SQL query that counts orders per customer in a table named orders.",
    "Give three tips for getting better sleep.",
    "Tell me a short story about a robot who finds a lost dog in the rain.",
    "Summarise the following text in two sentences: The city council met on Monday to "
    "discuss the new cycling lanes. Supporters said the lanes would make commuting safer "
    "and reduce traffic, while shop owners worried that removing parking spaces would "
    "drive customers away. After three hours of debate the council agreed to a six-month "
    "trial on the main street, with a review of accident figures and shop takings at the "
    "end of the trial.",
    "Read this note and list the tasks it mentions: Hi team, before Friday please update "
    "the release notes, run the load tests against the staging cluster, and send me the "
    "latency figures. Also, someone needs to book the meeting room for the retrospective "
    "and order lunch for twelve people. Thanks!",
    "You are a helpful travel guide. A visitor has one day in Rome, likes history and "
    "good food, and does not want to spend more than 50 euros. Plan their day from "
    "breakfast to dinner, with the places to visit in a sensible walking order.",
    "Here is a function: def area(r): return 3.14 * r * r. Explain what it does, point "
    "out any weaknesses, and rewrite it in a better way with a docstring.",
    "A train leaves at 9:40 and arrives at 13:15. How long is the journey? Show the steps.",
    "Write the opening paragraph of a mystery novel set in a lighthouse.",
    "What are the pros and cons of working from home? Answer in a short table.",
    "Explain the difference between weather and climate, with an example of each.",
)


def load_prompts(path: Path) -> tuple[str, ...]:
    """The prompts of a file: a `.jsonl` file holds one JSON string, or object with a
    `prompt` string, per line (for prompts with line breaks); any other file one prompt
    per non-empty line. ValueError when the file cannot be read or holds no prompt."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--prompts {path}: cannot read it ({exc})") from None
    out: list[str] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            out.append(line.strip())
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"--prompts {path}:{n}: not a JSON line") from None
        prompt = item.get("prompt") if isinstance(item, dict) else item
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(
                f"--prompts {path}:{n}: expected a non-empty string or an object with a "
                "'prompt' string"
            )
        out.append(prompt)
    if not out:
        raise ValueError(f"--prompts {path}: no prompts in it")
    return tuple(out)
