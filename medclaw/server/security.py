"""The service's two gates: who may call it (a bearer token) and which files a job may read.

- `load_or_create_token(path)`: the token is generated (`secrets.token_urlsafe(32)`) on first
  start and written with mode 0600, created exclusively; later starts read it back. A token file
  that others can read or write is refused (like ssh refuses a loose key), not silently fixed.
- `token_matches(header, token)`: `Authorization: Bearer <token>`, compared in constant time.
- `resolve_video_path(raw, roots)`: the real path (symlinks and `..` resolved) of an existing
  regular file inside one of the allowed roots, else `PathRejectedError` (the API answers 400).
"""
from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from medclaw.errors import ConfigError, MedClawError

TOKEN_BYTES = 32                       # 256 bits, ~43 url-safe characters


class PathRejectedError(MedClawError):
    """A job named a video outside the allowed roots (or not a regular file)."""


def load_or_create_token(path: Path) -> str:
    """The service's bearer token, created on first call (see module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_token(path)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    with os.fdopen(fd, "w") as file:
        file.write(token + "\n")
    os.chmod(path, 0o600)              # O_CREAT's mode is filtered by the umask; be explicit
    return token


def _read_token(path: Path) -> str:
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise ConfigError(f"token file {path} is not a regular file")
    if mode & 0o077:
        raise ConfigError(f"token file {path} is accessible by other users "
                          f"(mode {stat.S_IMODE(mode):04o}); run: chmod 600 {path}")
    token = path.read_text().strip()
    if len(token) < 32:
        raise ConfigError(f"token file {path} holds no usable token; delete it to make a new one")
    return token


def token_matches(authorization: str | None, token: str) -> bool:
    if not authorization:
        return False
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value:
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())


def resolve_video_path(raw: str, roots: list[str | Path]) -> Path:
    """The real path of `raw` if it is a regular file inside one of `roots`."""
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
        raise PathRejectedError("the video path is empty or malformed")
    if not roots:
        raise PathRejectedError("this server accepts uploads only: no allowed_roots are configured "
                                "for video paths")
    candidate = Path(raw).expanduser()
    if not candidate.is_absolute():
        raise PathRejectedError(f"the video path must be absolute: {raw}")
    real = Path(os.path.realpath(candidate))
    for root in roots:
        real_root = Path(os.path.realpath(Path(root).expanduser()))
        if real == real_root or real_root in real.parents:
            break
    else:
        # The message repeats the path given; it never tells what the real path resolved to.
        raise PathRejectedError(f"the video path is outside the allowed roots: {raw}")
    if not real.is_file():
        raise PathRejectedError(f"no such video file: {raw}")
    return real
