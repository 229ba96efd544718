"""What an auxiliary layer id means.

aerie counts layers the way SGLang's EAGLE-3 draft config does
(``eagle_config.eagle_aux_hidden_state_layer_ids``) and SpecForge's capture
does: id ``i`` is the **output of decoder layer i** (0-based), i.e. the
residual stream after layer ``i`` and before layer ``i + 1``.

- Hugging Face ``output_hidden_states``: ``hidden_states[0]`` is the embedding
  output and ``hidden_states[j]`` the output of layer ``j - 1`` for
  ``1 <= j < N``; the last entry, ``hidden_states[N]``, already has the final
  norm applied. So id ``i`` is ``hidden_states[i + 1]``.
- SGLang (``set_eagle3_layers_to_capture``) adds 1 to every id and captures
  ``hidden_states + residual`` *entering* that layer, which is the same
  tensor. It never captures past the last layer, so valid ids are
  ``0 .. N - 2``: id ``N - 1`` would name the last layer's output, which SGLang
  never hands to the draft.
- SpecForge's HF backend hooks the output of ``layers[i]`` (same meaning); its
  default ids are ``[1, N // 2 - 1, N - 4]`` -- SGLang's id-less default,
  ``layers_to_capture = [2, N // 2, N - 3]``, written in this convention.
- vLLM does *not* add 1: there id ``j`` is the output of layer ``j - 1``.

For Kimi-K2.5 (N = 61) the ids ``[2, 30, 58]`` mean the outputs of layers 2,
30 and 58, i.e. ``hidden_states[3]``, ``[31]`` and ``[59]``. For the tiny
4-layer model the valid ids are 0, 1 and 2.
"""

from __future__ import annotations

from remote.eagle3 import StageInputError

#: EAGLE-3 fuses exactly three auxiliary states: SGLang's ``fc`` is ``3 * H -> H``.
EAGLE3_AUX_LAYERS = 3


def validate_layers(layers: list[int], num_layers: int) -> None:
    """Refuse ids SGLang cannot capture for a target with `num_layers` decoder layers."""
    if not layers:
        raise StageInputError("stages.extract.layers is empty: give three decoder-layer ids, e.g. [2, 30, 58]")
    if len(set(layers)) != len(layers):
        raise StageInputError(f"stages.extract.layers {layers} repeats an id: give distinct ids")
    bad = [i for i in layers if not 0 <= i <= num_layers - 2]
    if bad:
        raise StageInputError(
            f"stages.extract.layers {layers}: {bad} out of range for a {num_layers}-layer target; "
            f"ids name a layer's output (SGLang's convention) and must lie in 0..{num_layers - 2}"
        )


def feature_width(layers: list[int], hidden_size: int) -> int:
    """The width of the concatenated auxiliary states written per token."""
    return len(layers) * hidden_size
