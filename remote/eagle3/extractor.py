"""Run the target over tokenised records and keep the hidden states EAGLE-3 trains on.

One forward pass per batch with ``output_hidden_states``; per record it keeps
the concatenated outputs of the configured layers (``hidden_states[id + 1]``,
see `remote.eagle3.layers`) and the final hidden state (``hidden_states[-1]``,
after the final norm -- what the lm_head reads and what SpecForge stores as
``hidden_state``). The base model is called without its lm_head, so no
``T x vocab`` logits are ever built.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

from remote.eagle3.layers import hf_index
from remote.eagle3.prep_input import Record
from remote.eagle3.shards import ShardStore
from remote.progress import Progress

DTYPES = ("bfloat16", "float16", "float32")


def load_target(path: Any, dtype: str, trust_remote_code: bool, device: str):
    """The target in eval mode on `device` (spread over every GPU when there are several)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype), "trust_remote_code": trust_remote_code}
    if device == "cuda" and torch.cuda.device_count() > 1:
        kwargs["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    if "device_map" not in kwargs:
        model = model.to(device)
    return model


def decoder_of(model):
    """The model without its lm_head; the hidden states are the same."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if get else None
    return decoder if decoder is not None else model


def capture(decoder, batch: Sequence[Sequence[int]], layers: list[int], device: str) -> list[tuple[Any, Any]]:
    """(aux (T, len(layers) * H), final (T, H)) per sequence, padding cut off, on the CPU."""
    import torch

    lengths = [len(ids) for ids in batch]
    width = max(lengths)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, seq in enumerate(batch):
        # NOTE: right padding: a causal model's states at real positions do not
        # depend on the pad tokens after them.
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    with torch.inference_mode():
        out = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True, use_cache=False)
    states = out.hidden_states
    aux = torch.cat([states[hf_index(i)] for i in layers], dim=-1)
    final = states[-1]
    return [(aux[row, :n].cpu(), final[row, :n].cpu()) for row, n in enumerate(lengths)]


def sample(record: Record, aux, final) -> dict[str, Any]:
    """One record in SpecForge's offline layout."""
    import torch

    return {
        "id": record.id,
        "input_ids": torch.tensor(record.input_ids, dtype=torch.long),
        "loss_mask": torch.tensor(record.loss_mask, dtype=torch.long),
        "aux_hidden_state": aux.unsqueeze(0).contiguous(),
        "hidden_state": final.unsqueeze(0).contiguous(),
    }


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def extract(
    decoder,
    records: Iterable[Record],
    store: ShardStore,
    layers: list[int],
    shard_size: int,
    batch_size: int,
    device: str,
    progress: Progress,
) -> dict[str, int]:
    """Fill every shard that is not complete yet; counts of written, resumed and skipped records."""
    counts = {"written": 0, "resumed": 0, "skipped": 0, "shards": 0}
    for index, shard in enumerate(chunks(enumerate(records), shard_size)):
        counts["shards"] += 1
        if store.is_complete(index):
            done = len(store.meta(index)["files"])
            counts["resumed"] += done
            progress.written(done)
            progress.resumed()  # an earlier run's work: not part of this run's rate
            continue
        writer = store.writer(index)
        kept = [(i, r) for i, r in shard if _trainable(r, progress, counts)]
        for batch in chunks(kept, batch_size):
            for (i, record), (aux, final) in zip(batch, capture(decoder, [r.input_ids for _, r in batch], layers, device)):
                writer.add(i, sample(record, aux, final))
                counts["written"] += 1
                progress.written()
        writer.commit()
    return counts


def _trainable(record: Record, progress: Progress, counts: dict[str, int]) -> bool:
    """A record with no trained token, or too short to predict anything, teaches the draft nothing."""
    if len(record.input_ids) != len(record.loss_mask):
        reason = "input_ids and loss_mask differ in length"
    elif len(record.input_ids) < 3:
        reason = "fewer than 3 tokens"
    elif not any(record.loss_mask):
        reason = "no loss tokens"
    else:
        return True
    progress.skipped(reason)
    counts["skipped"] += 1
    return False
