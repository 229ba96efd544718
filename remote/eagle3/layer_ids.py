"""What an auxiliary layer id means: what SGLang serves the draft, per target architecture.

An id list is the draft's ``eagle_config.eagle_aux_hidden_state_layer_ids``
(aerie's ``stages.extract.layers``). The server hands it to the target model's
``set_eagle3_layers_to_capture``, which turns it into ``layers_to_capture``:
decoder layers whose **input** (``hidden_states + residual`` entering the
layer) is captured, concatenated in layer order. The input of layer ``j`` is
Hugging Face's ``hidden_states[j]`` (``hidden_states[0]`` is the embedding
output), so extract stores ``hidden_states[j]`` for each captured ``j``.

How ids become captured layers differs by architecture (SGLang 0.5.23, the
same code in 0.5.14; ``sglang/srt/models/*.py``):

- ``plus-one`` -- Llama, Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE:
  ``[id + 1 for id in ids]``. Id ``i`` is the output of layer ``i``,
  ``hidden_states[i + 1]``; valid ids ``0 .. N - 2``.
- ``deepseek`` -- DeepSeek-V2/V3 and Kimi-K2.5 (whose ``KimiK25ForConditionalGeneration``
  hands the call to its DeepseekV3 language model): ``list(ids)``, *unless the
  first id is 1*, then ``[id + 1 for id in ids]``. Id ``i`` is the input of
  layer ``i``, ``hidden_states[i]`` (id 0: the embedding output); valid ids
  ``0 .. N - 1``, or ``1 .. N - 2`` when the first id is 1.

SGLang captures only inputs of layers it runs, so a captured layer past the
last (``N``) is never captured: the server would fail or feed the draft fewer
states. For Kimi-K2.5 (N = 61) ``[2, 30, 58]`` are ``hidden_states[2]``,
``[30]`` and ``[58]``; for the 4-layer tiny Llama ``[0, 1, 2]`` are
``hidden_states[1]``, ``[2]``, ``[3]``.

Standard library only: ``inv check``'s host side reads it too.
"""

from __future__ import annotations

from pathlib import Path

from remote.eagle3 import StageInputError, model_config

#: EAGLE-3 fuses exactly three auxiliary states: SGLang's ``fc`` is ``3 * H -> H``.
EAGLE3_AUX_LAYERS = 3
#: The SGLang release whose model code the rules below were read from (and the tests hold them against).
SGLANG_CHECKED = "0.5.23"

PLUS_ONE = "plus-one"
DEEPSEEK = "deepseek"

#: The target's ``architectures[0]`` -> how its SGLang model class maps ids to captured layers.
RULES = {
    "LlamaForCausalLM": PLUS_ONE,
    "MistralForCausalLM": PLUS_ONE,  # SGLang's subclasses LlamaForCausalLM
    "Qwen2ForCausalLM": PLUS_ONE,
    "Qwen3ForCausalLM": PLUS_ONE,
    "Qwen2MoeForCausalLM": PLUS_ONE,
    "Qwen3MoeForCausalLM": PLUS_ONE,
    "DeepseekV2ForCausalLM": DEEPSEEK,
    "DeepseekV3ForCausalLM": DEEPSEEK,
    "KimiK25ForConditionalGeneration": DEEPSEEK,
}

CONVENTIONS = {
    PLUS_ONE: "id i = output of decoder layer i = HF hidden_states[i + 1]",
    DEEPSEEK: "id i = input of decoder layer i = HF hidden_states[i]; "
              "when the first id is 1, every id + 1 (HF hidden_states[i + 1])",
}


def target_architecture(model: Path) -> str:
    """The architecture of the target model directory `model` (its config.json, no weights read)."""
    return model_config.read(model, "target.model").architecture


def rule(arch: str) -> str:
    """How `arch`'s SGLang model maps ids to captured layers; refused for an architecture not checked."""
    try:
        return RULES[arch]
    except KeyError:
        raise StageInputError(
            f"target architecture {arch} is not one whose layer ids aerie has checked against SGLang {SGLANG_CHECKED} "
            f"({', '.join(sorted(RULES))}): what an id captures differs by model; see docs/hidden-states.md"
        ) from None


def captured(layers: list[int], arch: str) -> list[int]:
    """The decoder layers whose input SGLang captures for `layers`: HF ``hidden_states`` indices."""
    if rule(arch) == DEEPSEEK and not (layers and layers[0] == 1):
        return list(layers)
    return [i + 1 for i in layers]


def convention(arch: str) -> str:
    """One line on what an id means for `arch` (the extract manifest's ``layer_convention``)."""
    return f"{arch} in SGLang {SGLANG_CHECKED}: {CONVENTIONS[rule(arch)]}"


def server_default(arch: str, num_layers: int) -> list[int]:
    """What SGLang captures for a draft without ids: ``[2, N // 2, N - 3]`` as captured layers, every architecture."""
    rule(arch)
    return [2, num_layers // 2, num_layers - 3]


def valid_ids(layers: list[int], num_layers: int, arch: str) -> tuple[int, int]:
    """The (lowest, highest) id valid beside `layers` for an `num_layers`-layer target of `arch`."""
    if captured(layers, arch) == list(layers):
        return 0, num_layers - 1
    return 0, num_layers - 2


def validate_layers(layers: list[int], num_layers: int, arch: str) -> None:
    """Refuse ids SGLang cannot capture, or captures in another order than extract's, before any work."""
    if not layers:
        raise StageInputError("stages.extract.layers is empty: give three decoder-layer ids, e.g. [2, 30, 58]")
    if len(set(layers)) != len(layers):
        raise StageInputError(f"stages.extract.layers {layers} repeats an id: give distinct ids")
    if sorted(layers) != list(layers):
        # NOTE: SGLang concatenates the captured states in layer order, whatever the ids' order.
        raise StageInputError(f"stages.extract.layers {layers}: give the ids in increasing order ({sorted(layers)}); "
                              "SGLang concatenates the captured states in layer order")
    low, high = valid_ids(layers, num_layers, arch)
    bad = [i for i in layers if not low <= i <= high]
    if bad:
        raise StageInputError(
            f"stages.extract.layers {layers}: {bad} out of range for a {num_layers}-layer {arch} target; "
            f"there {CONVENTIONS[rule(arch)]} (SGLang {SGLANG_CHECKED}), so the ids must lie in {low}..{high}"
        )


def feature_width(layers: list[int], hidden_size: int) -> int:
    """The width of the concatenated auxiliary states written per token."""
    return len(layers) * hidden_size
