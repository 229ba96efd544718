"""A model's ``config.json`` -- the target's or a draft's -- read in one place, with one error policy.

Every reader of a model directory's config goes through `read`: a missing directory or file, a file
that is not a JSON object, or a field a caller needs that is missing or of the wrong type is a
`ConfigError`, one line that names the setting that points at the directory, the file, and what to
fix. The result is a `ModelConfig`, which callers pass down instead of reading the file again.

A multimodal wrapper (Kimi-K2.5's ``KimiK25ForConditionalGeneration``) keeps its language model's
shape, and its ``quantization_config``, in ``text_config``; ``architectures`` stays at the top level,
where SGLang picks the model class from it. `ModelConfig.text` is the language model's part either way.

Standard library only: ``inv plan`` and ``inv check`` read it on the host, where nothing else may be installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError

FILE = "config.json"
#: The whole-number fields of the language model's config a caller may ask for, and what each is.
COUNTS = {"hidden_size": "the model's width", "num_hidden_layers": "its decoder layers",
          "vocab_size": "its vocabulary"}
#: Where each setting's directory comes from, and the fix when its config is not one a model has.
FIXES = {
    "target.model": "point it at the target model's directory on the host (its config.json and safetensors weights)",
    "stages.train.init_draft": "point it at a draft directory on the host (SGLang's --speculative-draft-model-path)",
}
DEFAULT_FIX = "point it at a model directory whose config.json is the model's own"
JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "true/false", type(None): "null"}


class ConfigError(StageInputError):
    """A model directory whose ``config.json`` cannot be used: one line naming the setting, the file and the fix.

    `problem` says what is wrong in words that name no path, for a caller that names the directory itself
    (the eval stage lists every draft in one line)."""

    def __init__(self, setting: str, directory: str, what: str, problem: str, fix: str | None = None) -> None:
        self.setting, self.directory, self.what, self.problem = setting, directory, what, problem
        self.fix = fix or FIXES.get(setting, DEFAULT_FIX)
        super().__init__(f"{setting} {directory!r}: {what}; {self.fix}")

    def with_fix(self, fix: str) -> "ConfigError":
        """The same error with another fix (one the caller knows better, e.g. a copy in the hub's cache)."""
        return ConfigError(self.setting, self.directory, self.what, self.problem, fix)


@dataclass(frozen=True)
class ModelConfig:
    """A model directory's ``config.json``, as `read` found it; each typed field is checked when asked for."""

    #: The model's directory.
    directory: Path
    #: The setting that names the directory (``target.model``, ``stages.train.init_draft``, ...), for errors.
    setting: str
    #: The file as written.
    raw: dict[str, Any]

    @property
    def file(self) -> Path:
        return self.directory / FILE

    @property
    def is_wrapper(self) -> bool:
        """A multimodal wrapper whose language model's config is ``text_config`` (Kimi-K2.5)."""
        return isinstance(self.raw.get("text_config"), dict)

    @property
    def text(self) -> dict[str, Any]:
        """The language model's config: a wrapper's ``text_config``, else the whole file."""
        return self.raw["text_config"] if self.is_wrapper else self.raw

    @property
    def architecture(self) -> str:
        """``architectures[0]``, from which SGLang picks the model class (and what a layer id means)."""
        names = self.raw.get("architectures")
        if not isinstance(names, list) or not names or not isinstance(names[0], str):
            raise self.error("has no architectures list", "add e.g. \"architectures\": [\"LlamaForCausalLM\"]: SGLang "
                             "picks the model code (and what a layer id means) from it")
        return names[0]

    @property
    def hidden_size(self) -> int:
        return self.count("hidden_size")

    @property
    def num_layers(self) -> int:
        return self.count("num_hidden_layers")

    @property
    def vocab_size(self) -> int:
        return self.count("vocab_size")

    @property
    def tie_word_embeddings(self) -> bool:
        """Whether the lm_head is the embedding: the wrapper's flag, else the language model's (default no)."""
        return bool(self.raw.get("tie_word_embeddings", self.text.get("tie_word_embeddings", False)))

    @property
    def quantization(self) -> dict[str, Any] | None:
        """The checkpoint's quantization config: the text config's, else the wrapper's top-level one -- both
        placements mean the language model's weights (vLLM's ``KimiK25Config`` propagates the one inside
        ``text_config`` up; transformers reads only the config it builds the model from)."""
        found = self.text.get("quantization_config") or self.raw.get("quantization_config")
        return found if isinstance(found, dict) else None

    def count(self, key: str) -> int:
        """A whole-number field of the language model's config."""
        self.require(key)
        return self.text[key]

    def require(self, *keys: str) -> "ModelConfig":
        """Itself, or one line naming every key of `keys` the language model's config lacks or has as no whole number."""
        bad = [k for k in keys if not isinstance(self.text.get(k), int) or isinstance(self.text.get(k), bool)]
        if bad:
            what = ", ".join(f"{k} ({COUNTS.get(k, 'a whole number')})" for k in bad)
            inside = " in its text_config" if self.is_wrapper else ""
            raise self.error(f"has no whole-number {what}{inside}", "is it a causal LM's? give the model's own config.json")
        return self

    def error(self, problem: str, fix: str) -> ConfigError:
        return ConfigError(self.setting, str(self.directory), f"{self.file} {problem}", f"its config.json {problem}", fix)


def directory(model: str | Path, setting: str, base: Path | None = None) -> Path:
    """The directory `model` names (relative: from `base`, else the working directory, a job's release),
    refused unless it holds a config.json. Errors name it resolved: where it was looked for."""
    path = Path(model).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    if not path.is_dir():
        raise ConfigError(setting, str(path), f"no config.json in {path}: no such directory", "no such directory")
    if not (path / FILE).is_file():
        raise ConfigError(setting, str(path), f"no config.json in {path}", "no config.json")
    return path


def read(model: str | Path, setting: str, base: Path | None = None) -> ModelConfig:
    """The config.json of the model directory `model` (as `setting` names it), or `ConfigError`."""
    path = directory(model, setting, base)
    try:
        raw = json.loads((path / FILE).read_text())
        why = "" if isinstance(raw, dict) else f"a JSON {JSON_KINDS.get(type(raw), 'value')}"
    except (OSError, UnicodeDecodeError) as exc:
        raw, why = None, f"unreadable: {exc.strerror or exc}" if isinstance(exc, OSError) else "not UTF-8 text"
    except json.JSONDecodeError as exc:
        raw, why = None, f"{exc.msg} at line {exc.lineno}"
    if why:
        raise ConfigError(setting, str(path), f"{path / FILE} is not a JSON object ({why})",
                          "its config.json is not a JSON object")
    text = raw.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError(setting, str(path), f"{path / FILE} has a text_config that is not an object",
                          "its config.json has a text_config that is not an object")
    return ModelConfig(path, setting, raw)


def of(raw: dict[str, Any], directory: Path = Path("."), setting: str = "target.model") -> ModelConfig:
    """A `ModelConfig` of a config already in hand (a server's, a test's); its fields are checked as a read one's."""
    return ModelConfig(directory, setting, raw)
