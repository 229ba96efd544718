"""Run the target over tokenised records and keep the hidden states EAGLE-3 trains on.

One forward pass per batch with hooks on exactly what is kept: the inputs of
the decoder layers SGLang captures for the configured ids (HF's
``hidden_states[j]`` for each captured layer ``j``; which ``j`` an id means
depends on the architecture, see `remote.eagle3.layer_ids`), concatenated in
layer order, and the final norm's output (what the lm_head reads and what SpecForge stores as
``hidden_state``). ``output_hidden_states`` would keep every layer's states for
the batch -- 62 tensors of ``B x T x 7168`` for Kimi-K2.5 when 4 are needed --
so it is never asked for; the other layers' outputs are freed as the forward
pass goes. The base model is called without its lm_head, so no ``T x vocab``
logits are ever built.

A multimodal target whose ``config.json`` keeps the language model in
``text_config`` (Kimi-K2.5: a DeepseekV3-style MoE with MLA, weights under
``language_model.*``) is loaded as that language model alone: the vision
tower is never built.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from remote.eagle3 import StageInputError, load_report
from remote.eagle3.prep_input import Record
from remote.eagle3.shards import ShardStore
from remote.eagle3.model_config import ModelConfig
from remote.eagle3.target import LANGUAGE_PREFIX, read_target
from remote.control_plane.progress import Progress

DTYPES = ("bfloat16", "float16", "float32")


def load_target(path: Any, dtype: str, trust_remote_code: bool, device: str, config: ModelConfig | None = None):
    """The target's language model in eval mode on `device` (spread over every GPU when there are several),
    refused unless every parameter came from the checkpoint and every tensor of it was used
    (`remote.eagle3.load_report`), its parameters in `dtype`. `config`: its config.json, when already read."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype), "trust_remote_code": trust_remote_code}
    if device == "cuda" and torch.cuda.device_count() > 1:
        kwargs["device_map"] = "auto"
    config = config or read_target(Path(path))
    load_report.check_checkpoint(Path(path), config.quantization)
    text = language_config(config)
    if text is not None:
        # NOTE: the wrapper's weights are `language_model.<causal LM name>`; the
        # mapping strips the prefix and the vision weights are left unread.
        kwargs.update(config=text, key_mapping={rf"^{re.escape(LANGUAGE_PREFIX)}": ""})
    # NOTE: a tensor of the wrong shape (a fused expert stack short of one) is reported, not raised: the
    # report names it with everything else that did not load, in one line.
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    load_report.check_complete(info, path, wrapper=text is not None)
    load_report.to_dtype(model, dtype)
    model = model.eval()
    if "device_map" not in kwargs:
        model = model.to(device)
    return model


def language_config(config: ModelConfig):
    """The `text_config` of a multimodal wrapper as a transformers config, or None for a plain causal LM.

    Kimi's text ``model_type`` (``kimi_k2``) is not one transformers knows; its
    shape is DeepseekV3's (MLA + MoE), so an unknown type with MLA's
    ``kv_lora_rank`` is read as ``deepseek_v3``. A ``quantization_config`` at the
    wrapper's top level applies to the language model too, as vLLM's
    ``KimiK25Config`` has it (the text config's own wins when both are given):
    transformers reads it only from the config it builds the model from.
    """
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not config.is_wrapper:
        return None
    text = config.text
    values = {k: v for k, v in text.items() if k != "model_type"}
    if config.quantization is not None:
        values["quantization_config"] = config.quantization
    model_type = text.get("model_type", "")
    if model_type not in CONFIG_MAPPING:
        if "kv_lora_rank" not in text:
            raise config.error(f"has text_config model_type {model_type!r}, which transformers does not know",
                               "give the language model's model_type, or an MLA text_config (kv_lora_rank) read as deepseek_v3")
        model_type = "deepseek_v3"
    return AutoConfig.for_model(model_type, **values)


def decoder_of(model):
    """The model without its lm_head; the hidden states are the same."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if get else None
    return decoder if decoder is not None else model


def decoder_layers(decoder) -> tuple[Any, Any]:
    """(the decoder layers, the final norm) of a base model: Llama, DeepseekV3 and their kin."""
    layers = getattr(decoder, "layers", None)
    norm = getattr(decoder, "norm", None)
    if layers is None or norm is None:
        raise StageInputError(f"{type(decoder).__name__} has no .layers and .norm: a decoder-only causal LM is needed")
    return layers, norm


@contextmanager
def hooks(decoder, inputs: list[int]) -> Iterator[dict[Any, Any]]:
    """Hooks that keep the inputs of the decoder layers `inputs` (by index) and the final norm's output
    (key "final")."""
    blocks, norm = decoder_layers(decoder)
    kept: dict[Any, Any] = {}

    def keep_input(key: int):
        def hook(module, args, kwargs) -> None:
            # NOTE: SGLang captures what enters the layer (hidden_states + residual): HF's hidden_states[key].
            kept[key] = args[0] if args else kwargs["hidden_states"]
        return hook

    def keep_output(module, args, output) -> None:
        kept["final"] = output[0] if isinstance(output, tuple) else output

    handles = [blocks[j].register_forward_pre_hook(keep_input(j), with_kwargs=True) for j in inputs]
    handles.append(norm.register_forward_hook(keep_output))
    try:
        yield kept
    finally:
        for handle in handles:
            handle.remove()


def capture(decoder, batch: Sequence[Sequence[int]], inputs: list[int], device: str) -> list[tuple[Any, Any]]:
    """(aux (T, len(inputs) * H), final (T, H)) per sequence, padding cut off, on the CPU.

    `inputs` are the decoder layers whose inputs are kept (`remote.eagle3.layer_ids.captured`).
    """
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
    with torch.inference_mode(), hooks(decoder, inputs) as kept:
        decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
    # NOTE: with device_map="auto" the layers sit on different GPUs: gather on the last one's.
    final = kept["final"]
    aux = torch.cat([kept[j].to(final.device) for j in inputs], dim=-1)
    # NOTE: copied, not viewed: on the CPU a slice shares the whole batch's storage, and
    # torch.save writes the storage -- every record's file would hold the batch's states.
    return [(aux[row, :n].to("cpu", copy=True), final[row, :n].to("cpu", copy=True)) for row, n in enumerate(lengths)]


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
    inputs: list[int],
    shard_size: int,
    batch_size: int,
    device: str,
    progress: Progress,
) -> dict[str, int]:
    """Fill every shard that is not complete yet with the inputs of the decoder layers `inputs`;
    counts of written, resumed and skipped records."""
    return fill(records, store, shard_size, batch_size, progress, lambda batch: capture(decoder, batch, inputs, device))


def fill(
    records: Iterable[Record],
    store: Any,
    shard_size: int,
    batch_size: int,
    progress: Any,
    capture_batch: Callable[[list[list[int]]], list[tuple[Any, Any]]],
) -> dict[str, int]:
    """Fill every shard of `store` that is not complete yet, `capture_batch` giving (aux, final) per
    sequence of a batch of token lists (each engine's own forward pass); counts of written, resumed
    and skipped records. `store` is a `ShardStore` or one with its `is_complete`, `meta` and `writer`."""
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
            for (i, record), (aux, final) in zip(batch, capture_batch([list(r.input_ids) for _, r in batch])):
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
