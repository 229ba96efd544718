"""`inv eval`: measure a draft on the server, the way it will be served.

- `sglang`: SGLang's launch flags and its native ``/generate``, with where SGLang documents them.
- `prompts`: the held-out prompts (train's held-out records, or a file).
- `report`: accept length and speed-up per setting, the fastest, the warnings.

The stage in `remote.stages.eval` puts them together.
"""
