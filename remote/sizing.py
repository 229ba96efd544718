"""`inv plan` on the host: how big the hidden states will be, and the route for extract and train that fits.

Offline EAGLE-3 states cost ``(len(layers) + 1) x hidden x dtype bytes`` per
token -- 57 KB for Kimi-K2.5 (3 aux layers + the final state, hidden 7168,
bfloat16), so 88,000 records of 2-4k tokens are 10-20 TB. The routes:

- ``offline``: every state on disk, then train (fits when the states fit the budget);
- ``chunked``: extract a chunk of records that fits, train on it, delete it, go on
  (`remote.orchestration.chunked`); fits while the largest record fits the budget;
- ``online``: SpecForge trains with the target running alongside; nothing on disk.

Per extract engine, `extract_engines` says what the target needs in memory there against this host's
GPUs (`remote.eagle3.target_memory`, from the checkpoint's headers), and `remote.vocabulary.plan_texts`
says when the configured engine cannot hold it (`inv run` refuses then).

Per route, `costs` says what it asks of the target -- its loads and the
tokens its forward passes read (tokens x passes) -- and the hours that takes
where a previous run on the host measured the throughput (`throughput`).

Tokens per dataset come from prep's manifest (tokenize's for a prompts
dataset) when prep has run, else from the workstation's estimate: `inv
validate`'s sample statistics scaled by the source's row count (``rows`` in
the inventory, else the lines of a source file on the host, else ``limit``).
The budget is ``stages.extract.disk_budget`` (bytes, or ``500G``/``2T``),
never more than the disk's free space. Standard library only.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from remote.vocabulary import layout
from remote.vocabulary.states import DRAFT
from remote.eagle3 import model_config, target_memory
from remote.eagle3.model_config import ConfigError
from remote.eagle3.target_memory import DTYPE_BYTES

UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
#: What a stored record costs beyond its states: int64 ids and mask per token, and the file's own framing.
ID_BYTES_PER_TOKEN = 16
RECORD_OVERHEAD = 8192


class PlanError(Exception):
    """A setting the plan cannot read; one line for the user."""


def parse_size(value: Any) -> int | None:
    """Bytes from an int or a string such as ``500G``, ``1.5T``, ``800GiB``; None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
    number, unit = (text[:-1], text[-1]) if text and text[-1] in UNITS else (text, "")
    try:
        size = float(number) * UNITS[unit]
    except ValueError:
        raise PlanError(f"stages.extract.disk_budget {value!r}: expected bytes or a size such as 500G or 2T") from None
    if size <= 0:
        raise PlanError(f"stages.extract.disk_budget {value!r}: must be more than 0")
    return int(size)


def record_bytes(tokens: int, bytes_per_token: int) -> int:
    """What one stored record of `tokens` tokens takes on disk, at most."""
    return tokens * (bytes_per_token + ID_BYTES_PER_TOKEN) + RECORD_OVERHEAD


def stored_bytes(tokens: int, records: int, bytes_per_token: int) -> int:
    """What every record's stored states take on disk -- the states, ids and masks, and each file's
    framing: the one sizing `inv plan`, `inv check` and the route's choice share."""
    return tokens * (bytes_per_token + ID_BYTES_PER_TOKEN) + records * RECORD_OVERHEAD


def bytes_per_token(layers: list[int], hidden: int, dtype: str) -> int:
    """What one token's hidden states take: the auxiliary layers' and the final one's, `hidden` values each."""
    return (len(layers) + 1) * int(hidden) * DTYPE_BYTES[dtype]


def hidden_size(model: str | None) -> int | None:
    """The target's hidden size from its config.json (a directory on the host); None while target.model is
    unset, `ConfigError` (one line) when its config cannot give it."""
    if not model:
        return None  # NOTE: not Path("") / "config.json", which is the working directory's
    return model_config.read(model, "target.model").hidden_size


def free_bytes(root: Path) -> int:
    """Free space where `root` is or will be: its nearest existing folder's (a fresh host has no root yet)."""
    where = root
    while not where.exists() and where != where.parent:
        where = where.parent
    return shutil.disk_usage(where).free


def prep_manifest(data: Path) -> dict[str, Any] | None:
    """The manifest of the prep output extract reads: tokenize's for a prompts dataset, else prep's."""
    for stage in ("tokenize", "prep"):
        try:
            manifest = json.loads((data / stage / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(manifest.get("tokens"), dict) and manifest["tokens"].get("total") is not None:
            return manifest
    return None


def source_rows(root: Path, dataset: dict[str, Any]) -> int | None:
    """The source's row count: the inventory's `rows`, else a source file's lines, else `limit`."""
    if dataset.get("rows"):
        return int(dataset["rows"])
    source = Path(dataset.get("source") or "")
    path = source if source.is_absolute() else root / "current" / source
    if dataset.get("source") and path.is_file() and path.suffix == ".jsonl":
        with path.open("rb") as handle:
            rows = sum(1 for line in handle if line.strip())
        return min(rows, int(dataset["limit"])) if dataset.get("limit") else rows
    return int(dataset["limit"]) if dataset.get("limit") else None


def dataset_tokens(root: Path, dataset: dict[str, Any]) -> dict[str, Any]:
    """{dataset, records, tokens, max_tokens, basis} from prep's manifest, else scaled from the sample."""
    name = dataset["dataset"]
    manifest = prep_manifest(layout.data_dir(root, name))
    if manifest is not None:
        tokens = manifest["tokens"]
        return {"dataset": name, "records": int(manifest.get("kept", 0)), "tokens": int(tokens["total"]),
                "max_tokens": int(tokens.get("max") or 0), "basis": "prep"}
    sample = dataset.get("estimate") or {}
    rows = source_rows(root, dataset)
    if rows is None or not sample.get("rows") or not sample.get("mean_tokens"):
        return {"dataset": name, "records": None, "tokens": None, "max_tokens": None, "basis": "unknown"}
    records = round(rows * sample["kept"] / sample["rows"])
    mean = float(sample["mean_tokens"]) + float(dataset.get("answer_tokens") or 0)
    return {"dataset": name, "records": records, "tokens": round(records * mean),
            "max_tokens": int(dataset.get("max_length") or 0), "basis": "estimate"}


def choose(offline_bytes: int, largest_record: int, budget: int, engine: str) -> tuple[str, int]:
    """(the route that fits, how many chunks): offline first, then chunked, else online."""
    if offline_bytes <= budget:
        return "offline", 1
    if largest_record <= budget:
        return "chunked", math.ceil(offline_bytes / budget)
    return "online", 0


def plan(args: dict[str, Any]) -> dict[str, Any]:
    """The figures `inv plan` shows, from the request the workstation sends (see `local.tasks.planning`)."""
    root = Path(args["root"])
    layers, dtype = list(args["layers"]), args["dtype"]
    try:
        hidden, why = hidden_size(args.get("model")), "target.model is not set"
    except ConfigError as exc:
        hidden, why = None, str(exc)
    datasets = [dataset_tokens(root, d) for d in args["datasets"]]
    known = [d for d in datasets if d["tokens"] is not None]
    tokens = sum(d["tokens"] for d in known)
    free = free_bytes(root)
    budget = parse_size(args.get("disk_budget"))
    usable = min(budget, free) if budget else free
    result: dict[str, Any] = {
        "datasets": [{k: d[k] for k in ("dataset", "records", "tokens", "basis")} for d in datasets],
        "tokens": tokens, "hidden_size": hidden, "layers": layers, "dtype": dtype,
        "bytes_per_token": None, "offline_bytes": None, "free_bytes": free, "disk_budget": budget,
        "route": None, "chunks": None, "configured_route": args["route"], "engine": args["engine"],
        "train_nproc": args.get("train_nproc"), "resident_train": args.get("resident_train", True),
        "unknown": [d["dataset"] for d in datasets if d["tokens"] is None],
    }
    if hidden is None:
        result["reason"] = why  # the reader's own line, as every other reader of the config gives it
        return result
    per_token = bytes_per_token(layers, hidden, dtype)
    records = sum(d["records"] or 0 for d in known)
    offline = tokens * per_token
    stored = stored_bytes(tokens, records, per_token)
    largest = record_bytes(max([d["max_tokens"] or 0 for d in known] or [0]) or int(args.get("max_length") or 0), per_token)
    route, chunks = choose(stored, largest, usable, result["engine"])
    result.update(bytes_per_token=per_token, offline_bytes=offline, stored_bytes=stored, usable_bytes=usable,
                  largest_record_bytes=largest, route=route, chunks=chunks)
    result["throughput"] = throughput(root)
    result["train_gpus"] = train_gpus(args)
    result["costs"] = costs(result, args)
    result["extract_engines"] = extract_engines(root, args, tokens)
    if result["unknown"]:
        result["reason"] = f"tokens unknown for {', '.join(result['unknown'])}: run prep, or give a sample and `rows`"
    return result


def extract_engines(root: Path, args: dict[str, Any], tokens: int) -> dict[str, Any]:
    """Per extract engine, what the target needs and what this host's GPUs hold (`remote.eagle3.target_memory`),
    with the hours at the rate the last extract measured (its manifest names the engine; older ones ran hf)."""
    rate = throughput(root).get("extract_tokens_per_s")
    manifests = sorted(layout.data_root(root).glob("*/extract/manifest.json"), key=lambda p: p.stat().st_mtime)
    engine = (read_manifest(manifests[-1]).get("engine") or "hf") if manifests else None
    # NOTE: no extract_engine in the request (an older workstation): sized, and nothing refused on it
    return target_memory.per_engine(args.get("model"), args["dtype"], args.get("extract_engine"), tokens,
                                    {"engine": engine, "tokens_per_s": rate}, root)


def costs(result: dict[str, Any], args: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per route: how often the target is loaded, the tokens its forward passes read (tokens x passes),
    the tokens trained on, and the hours those take at the throughput a previous run measured (else None)."""
    tokens, epochs, passes = result["tokens"], int(args.get("epochs") or 1), int(args.get("passes") or args.get("epochs") or 1)
    chunks = max(int(result.get("chunks") or 0), math.ceil(result["stored_bytes"] / max(result["usable_bytes"], 1)))
    routes = {
        # the built-in extract stage of every dataset shares one load (the runner's extract session)
        "offline": {"target_loads": 1 if args.get("resident", True) else len(result["datasets"]), "passes": 1},
        # a configured extract command is a process per chunk and pass; the built-in stage stays loaded
        "chunked": {"target_loads": 1 if args.get("resident", True) else chunks * passes, "passes": passes},
        "online": {"target_loads": 1, "passes": epochs},  # SGLang serves the target; every epoch reads it again
    }
    rates, gpus = result["throughput"], int(result.get("train_gpus") or 1)
    for name, route in routes.items():
        route.update(forward_tokens=tokens * route["passes"], trained_tokens=tokens * epochs)
        known = rates.get("extract_tokens_per_s") and rates.get("train_tokens_per_s")
        # NOTE: both routes' trainers run on every GPU they are given (the chunked route's as a resident group of ranks);
        # the online route's is SpecForge's.
        trained_per_s = rates["train_tokens_per_s"] * (gpus if name != "online" else 1) if known else None
        route["hours"] = round((route["forward_tokens"] / rates["extract_tokens_per_s"]
                                + route["trained_tokens"] / trained_per_s) / 3600, 2) if known else None
    return routes


def train_gpus(args: dict[str, Any]) -> int:
    """The processes aerie's engine trains with: ``stages.train.nproc``, else every GPU here (1 without)."""
    from remote.eagle3.distributed import resolve_nproc

    return resolve_nproc(args.get("train_nproc"))


def throughput(root: Path) -> dict[str, Any]:
    """Tokens per second of the target's forward passes (extract) and of training, as the last runs on this
    host measured them: the chunked route's manifest, else the offline extracts' and train's; None where none ran."""
    chunked = read_manifest(layout.output_dir(root, DRAFT, "chunked") / "manifest.json")
    if chunked.get("extract_seconds") and chunked.get("train_seconds"):
        return {"extract_tokens_per_s": chunked["extracted_tokens"] / chunked["extract_seconds"],
                "train_tokens_per_s": chunked["trained_tokens"] / chunked["train_seconds"], "from": layout.job_key(DRAFT, "chunked")}
    extracted, seconds = 0, 0.0
    for manifest_path in sorted(layout.data_root(root).glob("*/extract/manifest.json")):
        manifest, prep = read_manifest(manifest_path), prep_manifest(manifest_path.parent.parent)
        if manifest.get("seconds") and prep:
            extracted, seconds = extracted + int(prep["tokens"]["total"]), seconds + float(manifest["seconds"])
    train = read_manifest(layout.output_dir(root, DRAFT, "train") / "manifest.json")
    rate = {"extract_tokens_per_s": extracted / seconds if seconds else None, "train_tokens_per_s": None,
            "from": "offline extract and train" if seconds else None}
    if train.get("seconds") and train.get("engine") == "aerie" and train.get("route") != "chunked" and extracted:
        share = train["records"] / max(train["records"] + int(train.get("eval_records") or 0), 1)
        # per GPU: the run measured may have trained on several (its manifest's nproc)
        rate["train_tokens_per_s"] = extracted * share * int(train["epochs"]) / float(train["seconds"]) / int(train.get("nproc") or 1)
    return rate


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}
