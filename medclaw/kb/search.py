"""Search a knowledge-base index folder (written by `medclaw.kb.build`).

    kb = KnowledgeBase.load(index_dir)             # checks the files; the encoder loads lazily
    hits = kb.search("what does a clip applier do", k=5, type="instrument")   # -> list[Hit]

Contract
- `load` raises `IndexNotFoundError` for a missing folder/file and `IndexCorruptError` when the
  files are unreadable or disagree (row counts, dimension); each message is one line.
- The encoder is the one named in the manifest (its path; if that folder is gone and the manifest
  names the default model, the installed default), unless `encoder=` overrides it. It is loaded on
  the first search and shared process-wide (`kb.encoder.get_encoder`).
- `search` returns at most `k` hits, best first, scores are cosine similarities. `type` keeps only
  passages of that type (case-insensitive); a type the index does not hold raises
  `UnknownPassageTypeError` listing the known ones. An empty query raises `KnowledgeBaseError`.
- With a CUDA FAISS build and a visible GPU (`faiss.get_num_gpus() > 0`) the index is searched on
  the GPU; otherwise on CPU. Results are the same (exact flat index).
- Safe to share between concurrent episodes and threads (callers run `search` in worker
  threads): index lookups are serialised by a lock (they take milliseconds; the encoder is the
  slow part and is itself locked), and the encoder is loaded once even when the first searches
  arrive together.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medclaw.jsonl import iter_objects
from medclaw.kb.build import INDEX_FILE, MANIFEST_FILE, PASSAGES_FILE
from medclaw.kb.passages import Passage
from medclaw.kb.errors import (EncoderNotFoundError, IndexCorruptError, IndexNotFoundError,
                               KnowledgeBaseError, UnknownPassageTypeError)

MAX_K = 100


@dataclass(slots=True)
class Hit(Passage):
    """A passage returned by `KnowledgeBase.search`, with its score."""

    score: float = 0.0         # cosine similarity in [-1, 1]


class KnowledgeBase:
    """A loaded index: FAISS index + passages + manifest. Build with `load`."""

    __slots__ = ("index_dir", "manifest", "passages", "_index", "_encoder_ref", "_encoder",
                 "_type_rows", "_lock", "_encoder_lock")

    def __init__(self, index_dir: Path, manifest: dict, passages: list[dict], index: Any,
                 encoder_ref: str | os.PathLike | None) -> None:
        self.index_dir = index_dir
        self.manifest = manifest
        self.passages = passages
        self._index = index
        self._encoder_ref = encoder_ref
        self._encoder = None
        self._type_rows: dict[str, int] = {}
        for row in passages:
            self._type_rows[row["type"]] = self._type_rows.get(row["type"], 0) + 1
        self._lock = threading.Lock()
        self._encoder_lock = threading.Lock()

    # ---- loading -------------------------------------------------------------------------------

    @classmethod
    def load(cls, index_dir: str | os.PathLike, encoder: str | os.PathLike | None = None,
             use_gpu: bool | None = None) -> "KnowledgeBase":
        import faiss

        folder = Path(index_dir).expanduser()
        if not folder.is_dir():
            raise IndexNotFoundError(f"knowledge-base index not found: {folder}")
        for name in (MANIFEST_FILE, INDEX_FILE, PASSAGES_FILE):
            if not (folder / name).is_file():
                raise IndexNotFoundError(
                    f"not a complete knowledge-base index (no {name}) in {folder}; "
                    f"build one with: medclaw kb build DIR --out {folder}")
        try:
            manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
            count, dim = int(manifest["count"]), int(manifest["encoder"]["dim"])
        except (ValueError, KeyError, TypeError) as err:
            raise IndexCorruptError(f"corrupt manifest in {folder}: {type(err).__name__}") from err
        passages = _read_passages(folder / PASSAGES_FILE)
        try:
            index = faiss.read_index(str(folder / INDEX_FILE))
        except RuntimeError as err:
            raise IndexCorruptError(f"corrupt FAISS index file {folder / INDEX_FILE}") from err
        if not (index.ntotal == len(passages) == count) or index.d != dim:
            raise IndexCorruptError(
                f"index files disagree in {folder}: faiss rows {index.ntotal}, passages "
                f"{len(passages)}, manifest count {count}; faiss dim {index.d}, manifest dim {dim}")
        if encoder is not None:
            _check_same_encoder(encoder, manifest, folder)
        if use_gpu is None:
            use_gpu = getattr(faiss, "get_num_gpus", lambda: 0)() > 0
        if use_gpu:
            index = faiss.index_cpu_to_all_gpus(index)
        return cls(folder, manifest, passages, index, encoder)

    @property
    def types(self) -> list[str]:
        """Passage types this index holds, sorted."""
        return sorted(self._type_rows)

    def __len__(self) -> int:
        return len(self.passages)

    def encoder(self):
        """The sentence encoder for queries (loaded on first use, shared process-wide)."""
        with self._encoder_lock:
            if self._encoder is None:
                self._encoder = self._load_encoder()
        return self._encoder

    def _load_encoder(self):
        from medclaw.kb.encoder import DEFAULT_ENCODER_NAME, get_encoder

        info = self.manifest.get("encoder", {})
        ref = self._encoder_ref
        if ref is None:
            ref = info.get("path")
            if info.get("name") == DEFAULT_ENCODER_NAME and not Path(str(ref)).is_dir():
                ref = None          # index moved to another machine: use the installed default
        enc = get_encoder(ref)
        if enc.dim != int(info.get("dim", enc.dim)):
            raise EncoderNotFoundError(
                f"encoder {enc.path} makes {enc.dim}-d vectors but the index {self.index_dir} "
                f"was built with {info.get('dim')}-d ({info.get('name')})")
        return enc

    def warm(self) -> None:
        """Load the encoder and run it once, e.g. at engine start, so the first episode's
        `search_surgical_kb` call does not pay the encoder's load time."""
        self.encoder().encode(["warm-up"], progress=False)

    # ---- search --------------------------------------------------------------------------------

    def search(self, query: str, k: int = 5, type: str | None = None) -> list[Hit]:
        """The `k` passages closest to `query`, best first; only passages of `type` if given."""
        if not isinstance(query, str) or not query.strip():
            raise KnowledgeBaseError("empty knowledge-base query")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise KnowledgeBaseError(f"k must be an integer in [1, {MAX_K}], got {k!r}")
        wanted = None
        if type is not None and str(type).strip():
            wanted = str(type).strip().lower()
            if wanted not in self._type_rows:
                raise UnknownPassageTypeError(
                    f"unknown passage type {type!r}; known types: {', '.join(self.types)}")
        vector = self.encoder().encode([query.strip()], progress=False)       # (1, D)
        available = self._type_rows[wanted] if wanted else len(self.passages)
        want = min(k, available)
        # A type filter over a flat index: ask for more rows until `want` of them match. Exact,
        # and works the same on CPU and GPU FAISS (GPU indexes take no ID selectors).
        fetch = want if wanted is None else min(len(self.passages), max(4 * want, 32))
        while True:
            with self._lock:
                scores, rows = self._index.search(vector, fetch)               # (1, fetch) each
            hits = [self._hit(float(s), int(r)) for s, r in zip(scores[0], rows[0]) if r >= 0]
            if wanted is not None:
                hits = [h for h in hits if h.type == wanted]
            if len(hits) >= want or fetch >= len(self.passages):
                return hits[:want]
            fetch = min(len(self.passages), fetch * 4)

    def _hit(self, score: float, row: int) -> Hit:
        p = self.passages[row]
        return Hit(text=p["text"], title=p["title"], type=p["type"], source=p["source"],
                   chunk_id=p["chunk_id"], score=score)


def _read_passages(path: Path) -> list[dict]:
    keys = ("text", "title", "type", "source", "chunk_id")
    rows: list[dict] = []
    for line_no, row in iter_objects(path, IndexCorruptError,
                                     hint="rebuild with `medclaw kb build`"):
        if any(not isinstance(row.get(k), str) for k in keys):
            raise IndexCorruptError(f"corrupt passage at {path}:{line_no}")
        rows.append(row)
    return rows


def _check_same_encoder(encoder: str | os.PathLike, manifest: dict, folder: Path) -> None:
    """Refuse a query encoder other than the one the index was built with: its vectors live in
    another space, so every search would return confident nonsense. Compared by name (the
    default model's name, else the folder name, as the manifest records it); nothing is loaded."""
    from medclaw.kb.encoder import encoder_name, resolve_encoder_path

    wanted = encoder_name(resolve_encoder_path(encoder).resolve())
    built_with = str(manifest.get("encoder", {}).get("name"))
    if wanted != built_with:
        raise EncoderNotFoundError(
            f"the configured encoder {wanted!r} is not the one the index {folder} was built with "
            f"({built_with!r}); rebuild it with: medclaw kb build DIR --out {folder} --encoder PATH")
