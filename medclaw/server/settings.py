"""Service settings: one slots dataclass, from the `server:` section of the config file + flags.

```yaml
# medclaw.yaml (the same file `medclaw ask --config` reads: profile:, models:, episode:)
server:
  allowed_roots: [/data/videos]   # video paths a job may name (their real paths must lie inside)
  max_upload_mb: 2048             # larger uploads are refused with 413
  concurrency: 2                  # episodes in flight at once, sharing the engines
  profiles: [tiny-cpu]            # engines started with the server (default: the config's profile)
  data_dir: ~/.cache/medclaw/server   # jobs.sqlite, the bearer token, uploads, traces
  cors_origins: []                # no CORS headers unless origins are listed here
```

Lowest priority first: dataclass defaults, the file's `server:` section, then CLI flags.
Unknown keys and bad values raise `ConfigError` (one line), before anything starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from medclaw.errors import ConfigError


@dataclass(slots=True)
class ServerSettings:
    host: str = "127.0.0.1"            # loopback: nothing outside this machine can reach the service
    port: int = 8080
    allowed_roots: list[str] = field(default_factory=list)
    max_upload_mb: float = 2048.0
    concurrency: int = 2
    profiles: list[str] = field(default_factory=list)     # empty: the config's profile (or default)
    data_dir: str = ""                 # empty: $MEDCLAW_HOME/server
    cors_origins: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(isinstance(self.host, str) and self.host != "", "host must be a non-empty string")
        _check(_is_int(self.port) and 0 <= self.port <= 65535, "port must be an integer in 0-65535")
        _check(_is_str_list(self.allowed_roots), "allowed_roots must be a list of folders")
        _check(_is_number(self.max_upload_mb) and self.max_upload_mb > 0, "max_upload_mb must be > 0")
        _check(_is_int(self.concurrency) and self.concurrency >= 1, "concurrency must be an integer >= 1")
        _check(_is_str_list(self.profiles), "profiles must be a list of profile names")
        _check(isinstance(self.data_dir, str), "data_dir must be a path")
        _check(_is_str_list(self.cors_origins), "cors_origins must be a list of origins")
        for root in self.allowed_roots:
            if not Path(root).expanduser().is_dir():
                raise ConfigError(f"server: allowed root {root!r} is not a folder")

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 2 ** 20)

    def resolved_data_dir(self) -> Path:
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        from medclaw.home import medclaw_home

        return medclaw_home() / "server"

    @classmethod
    def from_dict(cls, data: dict | None) -> "ServerSettings":
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"server config: unknown key(s) {unknown}; known: {sorted(known)}")
        if _is_int(data.get("max_upload_mb")):
            data["max_upload_mb"] = float(data["max_upload_mb"])
        return cls(**data)


def load_server_settings(config: dict | None = None, *, add_roots: list[str] | None = None,
                         **overrides) -> ServerSettings:
    """Defaults ← `config["server"]` (the parsed config file) ← non-None `overrides` (flags);
    `add_roots` (repeated `--allow-root`) extend the file's allowed_roots."""
    section = (config or {}).get("server") or {}
    if not isinstance(section, dict):
        raise ConfigError("config file: `server:` must be a mapping")
    merged = {**section, **{k: v for k, v in overrides.items() if v is not None}}
    if add_roots:
        roots = merged.get("allowed_roots", [])
        merged["allowed_roots"] = [*roots, *add_roots] if isinstance(roots, list) else roots
    return ServerSettings.from_dict(merged)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(f"server config: {message}")
