"""Build a knowledge-base index folder from a corpus.

    build_index(corpus_dir=None, out_dir, encoder=None) -> BuildResult

`corpus_dir=None` means the general surgical-background corpus shipped with the package
(`medclaw/kb/corpus/`). The index folder holds three files:

- `index.faiss`     FAISS `IndexFlatIP` over L2-normalised embeddings (inner product = cosine);
                    row i is passage i.
- `passages.jsonl`  one passage per line: text, title, type, source, chunk_id.
- `manifest.json`   format version, encoder (name, path, dim), count, types, corpus (path, sha256,
                    files), chunking, faiss version, created time (UTC), build timing.

The manifest is written last: an index folder with a manifest is complete. Existing index files in
`out_dir` are replaced; nothing else there is touched.

    current_index(corpus_dir, out_dir, encoder=None) -> dict | None

The manifest of the index already in `out_dir` when it is complete, readable and was built from
the same corpus bytes, chunking and encoder (what `build_index` would write again); else None.
Cheap (hashes the corpus, reads the index; loads no encoder): `medclaw demo` builds only then.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from medclaw.kb.errors import KnowledgeBaseError
from medclaw.kb.passages import ChunkConfig, corpus_sha256, read_corpus

FORMAT_VERSION = 1
INDEX_FILE = "index.faiss"
PASSAGES_FILE = "passages.jsonl"
MANIFEST_FILE = "manifest.json"


def shipped_corpus_dir() -> Path:
    """The general surgical-background corpus that ships inside the package."""
    return Path(__file__).resolve().parent / "corpus"


@dataclass(slots=True)
class BuildResult:
    index_dir: str
    count: int                 # passages (chunks) indexed
    num_files: int
    dim: int
    seconds: float             # whole build: read + chunk + encoder load + embed + write
    embed_seconds: float       # embedding only (encoder already loaded)
    manifest: dict = field(default_factory=dict)

    @property
    def passages_per_s(self) -> float:
        return self.count / self.embed_seconds if self.embed_seconds > 0 else float("inf")

    def to_dict(self) -> dict:
        return {"index_dir": self.index_dir, "count": self.count, "num_files": self.num_files,
                "dim": self.dim, "seconds": round(self.seconds, 3),
                "embed_seconds": round(self.embed_seconds, 3),
                "passages_per_s": round(self.passages_per_s, 1), "manifest": self.manifest}


def build_index(corpus_dir: str | os.PathLike | None, out_dir: str | os.PathLike,
                encoder: str | os.PathLike | None = None,
                chunking: ChunkConfig | None = None, progress: bool | None = None) -> BuildResult:
    """Read, chunk, embed and write the corpus at `corpus_dir` into the index folder `out_dir`."""
    import faiss

    from medclaw.kb.encoder import get_encoder

    started = time.perf_counter()
    root = Path(corpus_dir).expanduser() if corpus_dir is not None else shipped_corpus_dir()
    chunking = chunking or ChunkConfig()
    passages, files = read_corpus(root, chunking)        # errors on a missing/empty corpus first
    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # before the slow part; e.g. --out names an existing file, or no permission
        raise KnowledgeBaseError(f"cannot create index folder {out}: {err.strerror}") from None
    enc = get_encoder(encoder)

    embed_started = time.perf_counter()
    vectors = enc.encode([p.embedding_text() for p in passages], progress=progress)   # (N, D)
    embed_seconds = time.perf_counter() - embed_started

    # Exact search: a surgical background corpus is thousands of passages, not millions, and an
    # exact flat index has no training step and no recall loss.
    index = faiss.IndexFlatIP(enc.dim)
    index.add(vectors)

    (out / MANIFEST_FILE).unlink(missing_ok=True)         # incomplete until the manifest is back
    faiss.write_index(index, str(out / INDEX_FILE))
    with open(out / PASSAGES_FILE, "w", encoding="utf-8") as fh:
        for passage in passages:
            fh.write(json.dumps(passage.to_dict(), ensure_ascii=False) + "\n")

    seconds = time.perf_counter() - started
    manifest = {
        "format_version": FORMAT_VERSION,
        "encoder": {"name": enc.name, "path": str(enc.path), "dim": enc.dim},
        "count": len(passages),
        "types": sorted({p.type for p in passages}),
        "corpus": {"path": str(root.resolve()), "sha256": corpus_sha256(root, files),
                   "files": len(files)},
        "chunking": {"max_words": chunking.max_words, "overlap_words": chunking.overlap_words},
        "metric": "inner_product",
        "faiss_version": getattr(faiss, "__version__", "unknown"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "build": {"seconds": round(seconds, 3), "embed_seconds": round(embed_seconds, 3),
                  "device": enc.device},
    }
    tmp = out / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out / MANIFEST_FILE)
    return BuildResult(str(out), len(passages), len(files), enc.dim, seconds, embed_seconds, manifest)


def current_index(corpus_dir: str | os.PathLike | None, out_dir: str | os.PathLike,
                  encoder: str | os.PathLike | None = None,
                  chunking: ChunkConfig | None = None) -> dict | None:
    """The manifest of `out_dir`'s index if `build_index` with these arguments would build the
    same one (format, corpus hash, chunking, encoder folder) and its files load; else None."""
    from medclaw.kb.encoder import resolve_encoder_path
    from medclaw.kb.passages import corpus_files
    from medclaw.kb.search import KnowledgeBase

    root = Path(corpus_dir).expanduser() if corpus_dir is not None else shipped_corpus_dir()
    chunking = chunking or ChunkConfig()
    try:
        manifest = KnowledgeBase.load(out_dir, use_gpu=False).manifest   # complete and consistent
        wanted = {
            "format_version": FORMAT_VERSION,
            "encoder_path": str(resolve_encoder_path(encoder)),
            "corpus_sha256": corpus_sha256(root, corpus_files(root)),
            "chunking": {"max_words": chunking.max_words, "overlap_words": chunking.overlap_words},
        }
    except KnowledgeBaseError:
        return None          # no index there, a broken one, or a corpus/encoder build would refuse
    found = {
        "format_version": manifest.get("format_version"),
        "encoder_path": manifest.get("encoder", {}).get("path"),
        "corpus_sha256": manifest.get("corpus", {}).get("sha256"),
        "chunking": manifest.get("chunking"),
    }
    return manifest if found == wanted else None
