"""The demo's tiny target, built offline on the host by `inv demo`: a Kimi-style tokenizer and a Llama wired to recite."""
