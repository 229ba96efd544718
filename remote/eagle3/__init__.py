"""EAGLE-3 on the host: hidden-state extraction and draft training.

- `layers`: what an auxiliary layer id means and which ids are valid.
- `target`: the target model's shape and the few weights the draft needs.
- `draft_config`: the draft's config.json and the feature-width check.
- `prep_input`: the prep stage's tokenised records, checked before use.
- `shards`: the sharded hidden-state store (SpecForge's per-sample ``.ckpt``).
- `model`, `vocab`, `trainer`, `checkpoint`: the draft model, its reduced
  vocabulary, training-time-test training, SGLang-loadable checkpoints.
- `specforge`: the command that runs SpecForge's trainer instead.

The stages in `remote.stages.extract` and `remote.stages.train` put them together.
"""


class StageInputError(Exception):
    """A mistake the user can fix (a setting, an upstream job); shown as one line, no traceback."""
