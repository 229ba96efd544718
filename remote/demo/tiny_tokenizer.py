"""A small Kimi-style tokenizer, built offline, for tests and `inv demo`.

Kimi-K2's own tokenizer needs the hub (and `trust_remote_code`), so the tests
and the demo use this stand-in: a byte-level BPE trained with `tokenizers` on a
little built-in text, saved as a `transformers` tokenizer directory with a chat
template that behaves like Kimi-K2.5's (``<|im_user|>user<|im_middle|>...<|im_end|>``,
a ``tool_declare`` turn, tool calls by id, a ``tool`` role, reasoning as
``<think>...</think>`` kept only after the last plain assistant turn) and, like
Kimi's, no ``{% generation %}`` markers.

Usage: ``python -m remote.demo.tiny_tokenizer OUTDIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: Vocabulary of the trained BPE (bytes + merges); special tokens come on top.
BPE_VOCAB_SIZE = 1000

SPECIAL_TOKENS = [
    "[BOS]",
    "[PAD]",
    "[UNK]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
]

# NOTE: shaped like Kimi-K2.5's own template in what prep depends on: reasoning
# is rendered only for the assistant turns after the last assistant turn without
# tool calls (every turn with `preserve_thinking`), earlier ones get an empty
# `<think></think>`; a tool call renders its id (Kimi's `functions.NAME:IDX`),
# not the function's name; tools are declared in a `tool_declare` turn; the
# generation prompt opens `<think>` (`<think></think>` with `thinking=False`).
# Tools are declared as JSON: this tokenizer has no Python override to write
# Kimi's TypeScript-style declaration.
CHAT_TEMPLATE = """\
{%- set preserve_thinking = preserve_thinking | default(false) -%}
{%- set ns = namespace(last_plain=-1) -%}
{%- if not preserve_thinking -%}
{%- for m in messages -%}{%- if m.role == 'assistant' and not m.tool_calls -%}{%- set ns.last_plain = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- if tools -%}
<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}
<|im_user|>user<|im_middle|>
{%- elif message.role == 'assistant' -%}
<|im_assistant|>assistant<|im_middle|>
{%- elif message.role in ('system', 'tool') -%}
<|im_system|>{{ message.role }}<|im_middle|>
{%- else -%}
{{ raise_exception('unknown role ' ~ message.role) }}
{%- endif -%}
{%- if message.role == 'assistant' -%}
{%- if loop.index0 > ns.last_plain and not (thinking is defined and thinking is false and not preserve_thinking) -%}
<think>{{ message.reasoning_content or '' }}</think>
{%- else -%}
<think></think>
{%- endif -%}
{{ message.content or '' }}
{%- if message.tool_calls -%}
<|tool_calls_section_begin|>
{%- for call in message.tool_calls -%}
<|tool_call_begin|>{{ call.id }}<|tool_call_argument_begin|>
{%- if call.function.arguments is string -%}{{ call.function.arguments }}{%- else -%}{{ call.function.arguments | tojson }}{%- endif -%}
<|tool_call_end|>
{%- endfor -%}
<|tool_calls_section_end|>
{%- endif -%}
{%- elif message.role == 'tool' -%}
## Return of {{ message.tool_call_id }}
{{ message.content }}
{%- else -%}
{{ message.content }}
{%- endif -%}
<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_assistant|>assistant<|im_middle|>
{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}
{%- endif -%}
"""

# Enough English, code and JSON for BPE to learn useful merges; the content is
# not important, only that it is fixed so the vocabulary is deterministic.
TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A user asks a question and the
assistant answers it. You are a helpful assistant. Please explain the answer
step by step, then give the final result. What is the capital of France? The
capital of France is Paris. How many days are there in a week? There are seven.
Let me think about this problem carefully. First, we read the file. Then we run
the tests and look at the output. The test failed because the function returned
None instead of a list. I will fix the bug in the parser and run the tests again.
All tests passed. Here is the patch. Thank you for your help!
def add(a, b):
    return a + b

class Parser:
    def __init__(self, text: str) -> None:
        self.text = text

    def parse(self) -> list[str]:
        return [line.strip() for line in self.text.splitlines() if line]

import os
import sys
for i in range(10):
    print(i, file=sys.stderr)
if __name__ == "__main__":
    main()
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"type": "function", "function": {"name": "search", "parameters": {"query": "string"}}}
<function=bash><parameter=command>ls -la /testbed</parameter></function>
<function=str_replace_editor><parameter=path>/testbed/src/main.py</parameter></function>
OBSERVATION: total 12 drwxr-xr-x 2 root root 4096 README.md setup.py tests
The weather in Paris is sunny, 21 degrees. Tomorrow it will rain.
Solve for x: 2x + 3 = 11. Subtract 3 from both sides: 2x = 8, so x = 4.
The sum of the first n integers is n(n+1)/2. For n = 100 that is 5050.
Write a short poem about the sea. The sea is wide, the sea is deep, it sings
the sailors all to sleep. Summarize the following article in one sentence.
"""


def build_tokenizer(path: Path) -> Path:
    """Train the tiny tokenizer and save it as a `transformers` directory at `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the text changes no merge order; it only gives pairs counts above 1.
    tokenizer.train_from_iterator([TRAINING_TEXT] * 4, trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="[BOS]",
        eos_token="<|im_end|>",
        pad_token="[PAD]",
        unk_token="[UNK]",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("[BOS]", "[PAD]", "[UNK]", "<|im_end|>")],
    )
    fast.chat_template = CHAT_TEMPLATE
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m remote.demo.tiny_tokenizer OUTDIR", file=sys.stderr)
        return 2
    out = build_tokenizer(Path(argv[0]))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
