"""A draft to continue training from (``stages.train.init_draft``), held against the target first.

The directory is a draft in SGLang's EAGLE-3 format: ``config.json``
(``architectures: ["LlamaForCausalLMEagle3"]``) and ``*.safetensors``, in
either of the forms drafts come in:

- as SpecForge exports it (and as aerie's own `remote.eagle3.checkpoint` writes
  it): a reduced draft vocabulary, ``lm_head`` with ``draft_vocab_size`` rows
  and the ``d2t``/``t2d`` maps. Training goes on with that map, so
  ``stages.train.draft_vocab_size`` must be its size.
- as some published drafts ship it: the target's full vocabulary (``lm_head``
  with ``vocab_size`` rows) and no ``d2t``/``t2d``. Kept whole when
  ``stages.train.draft_vocab_size`` is at least the target's vocabulary; else
  cut to the data's most frequent tokens, keeping the draft's own ``lm_head``
  rows for them (a new draft would take the target's).

Weight names may carry a ``language_model.`` or ``model.`` prefix and name the
decoder layer ``layers.0`` (SGLang's own names) instead of ``midlayer``; the
draft's ``embed_tokens`` (the target's, frozen) is left out, as SGLang does.

Before a weight is read, `config_for` refuses in one line each: an MLA draft
or another architecture, more than one decoder layer, a ``hidden_size`` or
``target_hidden_size`` other than the target's hidden size, another
vocabulary, ``eagle_aux_hidden_state_layer_ids`` other than
``stages.extract.layers``, RoPE scaling (aerie's draft applies plain RoPE),
and a draft vocabulary other than the setting's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from remote.eagle3 import StageInputError
from remote.eagle3 import draft_config, model_config

#: Config keys only a multi-head latent attention (MLA) draft has (SGLang's kimi_k25_eagle3).
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim")
#: Prefixes a published draft's weight names may carry.
PREFIXES = ("language_model.", "model.")
MAPS = ("d2t", "t2d")
INIT_DRAFT = "stages.train.init_draft"


@dataclass(frozen=True)
class InitDraft:
    """What a draft directory holds, as `check` saw it: its config and its weights' names and shapes."""

    path: Path
    config: dict[str, Any]
    #: aerie's (SGLang's) name of each tensor -> (its name in the file, its shape).
    tensors: dict[str, tuple[str, tuple[int, ...]]]

    @property
    def has_map(self) -> bool:
        return "d2t" in self.tensors

    @property
    def head_rows(self) -> int:
        return self.tensors["lm_head.weight"][1][0]

    def where(self) -> str:
        return f"stages.train.init_draft {self.path}"


def directory(setting: str) -> Path:
    """The draft's directory (relative: from the release directory), refused unless it has a config.json."""
    return model_config.directory(setting, INIT_DRAFT)


def aerie_name(name: str) -> str:
    """A tensor's name as aerie's draft (and SGLang's legacy loader) names it."""
    stripped = True
    while stripped:
        stripped = False
        for prefix in PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix):], True
    return "midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name


def inspect(setting: str) -> InitDraft:
    """The draft's config and its tensors' names and shapes (the safetensors headers only: no weight is read)."""
    from safetensors import safe_open

    path = directory(setting)
    config = model_config.read(path, INIT_DRAFT).raw
    files = sorted(path.glob("*.safetensors"))
    if not isinstance(config, dict) or not files:
        raise StageInputError(f"stages.train.init_draft {path}: expected SGLang's draft layout, a config.json object "
                              "and *.safetensors weights")
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                for name in weights.keys():
                    tensors[aerie_name(name)] = (name, tuple(weights.get_slice(name).get_shape()))
        except Exception as exc:  # safetensors raises its own error types for a torn or foreign file
            raise StageInputError(f"stages.train.init_draft {file}: not a readable safetensors file ({exc})") from None
    if "lm_head.weight" not in tensors:
        raise StageInputError(f"stages.train.init_draft {path}: no lm_head.weight among its weights")
    return InitDraft(path, config, tensors)


def check(init: InitDraft, hidden_size: int, vocab_size: int, layers: list[int], draft_vocab: int) -> int:
    """Refuse, in one line, a draft that cannot go on training against this target and these settings;
    the draft vocabulary it trains with on success."""
    config, where = init.config, init.where()
    architectures = list(config.get("architectures") or [])
    mla = [key for key in MLA_KEYS if config.get(key)]
    if mla or any("Deepseek" in a or "MLA" in a for a in architectures):
        raise StageInputError(f"{where}: an MLA draft ({', '.join(architectures) or 'no architectures'}; {', '.join(mla)}): "
                              f"aerie trains {draft_config.ARCHITECTURE} drafts (Llama attention) only")
    if architectures != [draft_config.ARCHITECTURE] or "hidden_size" not in config:
        raise StageInputError(f"{where}: architectures {architectures}, not [{draft_config.ARCHITECTURE!r}]: "
                              "not an EAGLE-3 draft aerie can train")
    if int(config.get("num_hidden_layers") or 1) != 1:
        raise StageInputError(f"{where}: {config['num_hidden_layers']} decoder layers; aerie trains one-layer drafts")
    for key in ("hidden_size", "target_hidden_size"):
        value = int(config.get(key) or config["hidden_size"])
        if value != hidden_size:
            raise StageInputError(f"{where}: {key} {value} but the target's hidden size is {hidden_size}: "
                                  "a draft of another target (or width) cannot go on training here")
    if int(config.get("vocab_size") or 0) != vocab_size:
        raise StageInputError(f"{where}: vocab_size {config.get('vocab_size')} but the target's vocabulary is {vocab_size}")
    ids = draft_config.aux_layer_ids(config)
    if ids is not None and list(ids) != list(layers):
        raise StageInputError(f"{where}: serves aux layers {list(ids)} but stages.extract.layers is {layers}; "
                              "extract the layers the draft was trained on")
    scaling = config.get("rope_scaling") or {}
    if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
        raise StageInputError(f"{where}: rope_scaling {scaling.get('rope_type') or scaling.get('type')}: aerie's draft "
                              "applies plain RoPE; remove rope_scaling from a copy of the draft, or use engine: specforge")
    return _draft_vocab(init, vocab_size, draft_vocab)


def _draft_vocab(init: InitDraft, vocab_size: int, draft_vocab: int) -> int:
    """The draft vocabulary training keeps: the draft's own map's, or a full one kept or cut to the setting's."""
    where, rows = init.where(), init.head_rows
    if "t2d" in init.tensors and not init.has_map:
        raise StageInputError(f"{where}: has t2d but no d2t; SGLang maps draft ids to the target's with d2t")
    if not init.has_map:
        if rows != vocab_size:
            raise StageInputError(f"{where}: lm_head has {rows} rows but no d2t/t2d; a draft without a vocabulary map "
                                  f"needs the target's full vocabulary ({vocab_size})")
        return min(draft_vocab, vocab_size)
    if init.tensors["d2t"][1] != (rows,):
        raise StageInputError(f"{where}: d2t has shape {list(init.tensors['d2t'][1])} but lm_head has {rows} rows")
    if rows != draft_vocab:
        raise StageInputError(f"{where}: its draft vocabulary is {rows} (d2t/t2d) but stages.train.draft_vocab_size is "
                              f"{draft_vocab}; set stages.train.draft_vocab_size: {rows} to go on with its vocabulary map")
    return rows


def config_for(setting: str, hidden_size: int, vocab_size: int, layers: list[int], draft_vocab: int) -> dict[str, Any]:
    """The config of the draft that goes on training from `setting`: its own, checked (`check`), with the
    fields SGLang's loader needs and the vocabulary training keeps."""
    init = inspect(setting)
    kept = check(init, hidden_size, vocab_size, layers, draft_vocab)
    return draft_config.finalize(init.config, layers, vocab_size, kept)


def start(setting: str, config: dict[str, Any], embed: Any, mapping: Callable[[], tuple[Any, Any]]):
    """The draft of `config` (`config_for`'s) with `setting`'s weights and vocabulary map, the target's
    embeddings; `mapping` (d2t, t2d of the data's tokens) is called only to cut a full vocabulary."""
    import torch
    from safetensors import safe_open

    from remote.eagle3.model import Eagle3Draft

    init = inspect(setting)
    state: dict[str, torch.Tensor] = {}
    for file in sorted(init.path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():
                state[aerie_name(name)] = weights.get_tensor(name)
    state.pop("embed_tokens.weight", None)  # the target's, frozen: SGLang hands the draft the target's own
    vocab, kept = int(config["vocab_size"]), int(config["draft_vocab_size"])
    if "d2t" in state:
        state["d2t"] = state["d2t"].long()
        state["t2d"] = _t2d_of(init, state["d2t"], state.get("t2d"), vocab)
    elif kept == vocab:  # the full vocabulary, kept whole: every draft id is its target id
        state["d2t"], state["t2d"] = torch.zeros(vocab, dtype=torch.long), torch.ones(vocab, dtype=torch.bool)
    else:
        d2t, t2d = mapping()
        state["lm_head.weight"] = state["lm_head.weight"][t2d]
        state["d2t"], state["t2d"] = d2t, t2d
    state["embed_tokens.weight"] = embed
    draft = Eagle3Draft(config)
    _require_fit(init, draft, state)
    draft.load_state_dict(state, strict=True)
    return draft


def _t2d_of(init: InitDraft, d2t: Any, t2d: Any, vocab: int) -> Any:
    """The target-vocabulary mask of `d2t`'s tokens, refused when `d2t` names ids outside the target's
    vocabulary (twice, or out of range) or when the draft's own `t2d` says otherwise."""
    import torch

    hot = d2t + torch.arange(d2t.numel())
    if int(hot.min()) < 0 or int(hot.max()) >= vocab or hot.unique().numel() != hot.numel():
        raise StageInputError(f"{init.where()}: d2t maps draft ids to target ids outside 0..{vocab - 1} or to one id twice")
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[hot] = True
    if t2d is not None and not torch.equal(t2d.bool().flatten(), mask):
        raise StageInputError(f"{init.where()}: its t2d and d2t name different tokens")
    return mask


def _require_fit(init: InitDraft, draft: Any, state: dict[str, Any]) -> None:
    """One line naming the weights the draft's config.json does not account for, or of the wrong shape."""
    wanted = {name: tuple(t.shape) for name, t in draft.state_dict().items()}
    missing = sorted(set(wanted) - set(state))
    unexpected = sorted(init.tensors[n][0] if n in init.tensors else n for n in set(state) - set(wanted))
    shapes = sorted(f"{n} {list(state[n].shape)} (config.json: {list(wanted[n])})"
                    for n in set(wanted) & set(state) if tuple(state[n].shape) != wanted[n])
    problems = [f"{label} {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                for label, names in (("lacks", missing), ("has weights aerie's draft has not:", unexpected),
                                     ("has shapes", shapes)) if names]
    if problems:
        raise StageInputError(f"{init.where()}: " + "; ".join(problems))
