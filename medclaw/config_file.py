"""The one reader of MedClaw's YAML config file (`--config F`) and the one default profile.

A config file is a mapping with optional sections: `profile:` (a name from `medclaw models list`),
`models:` (read by `medclaw.models.registry`), `episode:` (read by `medclaw.engine.config`).
Each reader takes its own section from `read_config_file`; none parses YAML itself, so a broken file
gets the same one-line error (with the line number) whichever command reads it first.
"""
from __future__ import annotations

import os
from pathlib import Path

from medclaw.errors import ConfigError

DEFAULT_PROFILE = "tiny-cpu"       # runs anywhere: tiny random-weight checkpoints built locally


def read_yaml_mapping(path: Path) -> dict:
    """A YAML file whose top level is a mapping (empty file → {}); ConfigError otherwise."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"config {path} is not valid YAML{at}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a YAML mapping at the top level")
    return data


def read_config_file(config_path: str | os.PathLike | None) -> dict:
    """The user's config file as a mapping ({} when no file is given)."""
    if config_path is None:
        return {}
    path = Path(config_path).expanduser()
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    data = read_yaml_mapping(path)
    if "profile" in data and not isinstance(data["profile"], str):
        raise ConfigError(f"{path}: `profile` must be a profile name")
    return data


def profile_name(profile: str | None, config: dict) -> str:
    """Which profile applies: the flag, else the config's `profile:`, else DEFAULT_PROFILE."""
    return profile or config.get("profile") or DEFAULT_PROFILE
