"""Prep: any chat or agent dataset, normalised to one record shape and tokenised.

The pieces, in the order a row meets them:

- `load`: rows from a hub id (via `datasets`) or a local JSONL / JSON / Parquet;
- `normalise`: a row of any known family to a `Record`, or a `Skip` with a reason
  (`content`: a turn's parts, and the images that keep a row out; `tools`: tool schemas
  and calls to the shape a client sends; `roles`: every spelling of a role);
- `template`: the target's chat template rendered, with the character spans of
  the assistant turns found from the template itself;
- `tokenise`: token ids and a loss mask over those spans, in batches;
- `pipeline`: the above over a whole dataset, counting every row;
- `write`: the outputs, through temporary names and a final rename.

`remote.stages.prep` runs it as a stage; `remote.prep.validate` runs it in
memory over a local sample for `inv validate`.
"""
