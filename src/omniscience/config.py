"""A probe set's YAML file, validated: unique names, a known activation, an existing `.safetensors` file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Activation = Literal["linear", "sigmoid", "tanh"]


class ProbeError(ValueError):
    """A probe set that cannot be loaded; the message names the file, entry or tensor at fault."""


class ProbeConfig(BaseModel):
    """One entry of the YAML file: a probe (or a bank of probes) reading `blocks.{layer}.resid_post`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    layer: int = Field(ge=0)
    weight_path: Path  # relative paths are resolved against the YAML file's folder
    activation: Activation = "linear"

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if name != name.strip() or any(c in name for c in ",\n"):
            raise ValueError(f"probe name {name!r} must not contain commas, newlines or surrounding spaces")
        return name


class ProbeSetConfig(BaseModel):
    """The whole file: `probes: [...]`."""

    model_config = ConfigDict(extra="forbid")

    probes: list[ProbeConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> "ProbeSetConfig":
        names = [p.name for p in self.probes]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"probe names must be unique; repeated: {', '.join(repeated)}")
        return self


def read_config(path: str | Path) -> ProbeSetConfig:
    """Parse and validate a probe-set YAML file; weight paths come back absolute and checked to exist."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ProbeError(f"probe set file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ProbeError(f"{path}: not valid YAML: {exc}") from exc
    try:
        config = ProbeSetConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())
        raise ProbeError(f"{path}: {problems}") from exc
    for i, probe in enumerate(config.probes):
        weights = probe.weight_path.expanduser()
        weights = weights if weights.is_absolute() else path.parent / weights
        if weights.suffix != ".safetensors":
            raise ProbeError(f"{path}: probes.{i}.weight_path: {weights} must be a .safetensors file")
        if not weights.is_file():
            raise ProbeError(f"{path}: probes.{i}.weight_path: file not found: {weights}")
        probe.weight_path = weights.resolve()
    return config
