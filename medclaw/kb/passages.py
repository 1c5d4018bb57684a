"""Read a corpus (a folder or one file of .md / .txt / .jsonl) into chunked `Passage`s.

Contract
- Files are read in sorted relative-path order, so the same corpus always yields the same passages
  in the same order (and the same `corpus_sha256`).
- `.md`: optional YAML frontmatter (`title`, `type`, `source`); the first `# ` heading is the title
  when the frontmatter has none; every heading starts a new section, and the section's heading
  path ("Title › Section") is the passage title. Chunks never cross a heading.
- `.txt`: title is the file stem; type "general".
- `.jsonl`: one passage per line, `{"text": ..., "title"?, "type"?, "source"?}`; blank lines skipped;
  a line that is not a JSON object with a non-empty string "text" is a `CorpusFormatError` naming
  file and line.
- Chunking packs whole paragraphs up to `max_words` words; a paragraph longer than that is cut into
  word windows. Each new chunk of a section starts with the last `overlap_words` words of the
  previous one, so a sentence cut at a boundary is still findable.
- Types are lower-case; `chunk_id` is unique within a corpus ("rel/path.md#3", "f.jsonl:12#0").
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from medclaw.errors import ConfigError, first_line
from medclaw.jsonl import iter_objects
from medclaw.kb.errors import CorpusFormatError, CorpusNotFoundError, EmptyCorpusError

SUFFIXES = (".md", ".txt", ".jsonl")
DEFAULT_TYPE = "general"
DEFAULT_MAX_WORDS = 120      # ~160 word pieces: inside MiniLM's 256-token window with room to spare
DEFAULT_OVERLAP_WORDS = 20

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FRONTMATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)", re.DOTALL)


@dataclass(slots=True)
class Passage:
    text: str
    title: str
    type: str
    source: str
    chunk_id: str

    def to_dict(self) -> dict:
        return asdict(self)

    def embedding_text(self) -> str:
        # The title carries the topic ("Critical view of safety › Criteria"); a chunk's own text
        # often does not repeat it, so it is embedded with the chunk.
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(slots=True)
class ChunkConfig:
    max_words: int = DEFAULT_MAX_WORDS
    overlap_words: int = DEFAULT_OVERLAP_WORDS

    def __post_init__(self) -> None:
        if self.max_words < 16:
            raise ConfigError(f"max_words must be >= 16, got {self.max_words}")
        if not 0 <= self.overlap_words <= self.max_words // 2:
            raise ConfigError(f"overlap_words must be in [0, max_words/2], got {self.overlap_words}")


def corpus_files(root: Path) -> list[Path]:
    """The corpus files under `root` (or `root` itself), sorted. Hidden files are skipped."""
    if not root.exists():
        raise CorpusNotFoundError(f"corpus not found: {root}")
    if root.is_file():
        if root.suffix.lower() not in SUFFIXES:
            raise CorpusFormatError(f"unsupported corpus file {root} (expected {', '.join(SUFFIXES)})")
        return [root]
    files = [p for p in root.rglob("*")
             if p.is_file() and p.suffix.lower() in SUFFIXES
             and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def corpus_sha256(root: Path, files: list[Path]) -> str:
    """Hash of every file's relative path and bytes: changes when any passage could change."""
    digest = hashlib.sha256()
    base = root if root.is_dir() else root.parent
    for path in files:
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def read_corpus(root: str | Path, config: ChunkConfig | None = None) -> tuple[list[Passage], list[Path]]:
    """All passages of the corpus at `root`, and the files they came from."""
    root = Path(root).expanduser()
    config = config or ChunkConfig()
    files = corpus_files(root)
    base = root if root.is_dir() else root.parent
    passages: list[Passage] = []
    for path in files:
        rel = path.relative_to(base).as_posix()
        reader = _READERS[path.suffix.lower()]
        passages.extend(reader(path, rel, config))
    if not passages:
        raise EmptyCorpusError(f"no passages in {root} (looked for non-empty {', '.join(SUFFIXES)} files)")
    return passages, files


# ---- readers -----------------------------------------------------------------------------------

def _read_markdown(path: Path, rel: str, config: ChunkConfig) -> list[Passage]:
    text = _read_text(path)
    meta: dict = {}
    match = _FRONTMATTER.match(text)
    if match:
        import yaml

        try:
            meta = yaml.safe_load(match.group(1)) or {}
        except yaml.YAMLError as err:
            raise CorpusFormatError(f"{path}: bad YAML frontmatter ({first_line(err)})") from err
        if not isinstance(meta, dict):
            raise CorpusFormatError(f"{path}: frontmatter must be a mapping")
        text = text[match.end():]
    sections = _split_sections(text)
    doc_title = str(meta.get("title") or "")
    if not doc_title:
        # The first top-level heading names the document; its own section keeps an empty path.
        for heading_path, _ in sections:
            if heading_path:
                doc_title = heading_path[0]
                break
    doc_title = doc_title or path.stem
    kind = _norm_type(meta.get("type"))
    source = str(meta.get("source") or rel)
    out: list[Passage] = []
    for heading_path, body in sections:
        # Drop the document title from the section path: it is already the prefix.
        parts = [h for h in heading_path if h != doc_title]
        title = " › ".join([doc_title, *parts])
        for chunk in chunk_text(body, config):
            out.append(Passage(chunk, title, kind, source, f"{rel}#{len(out)}"))
    return out


def _read_txt(path: Path, rel: str, config: ChunkConfig) -> list[Passage]:
    return [Passage(chunk, path.stem, DEFAULT_TYPE, rel, f"{rel}#{i}")
            for i, chunk in enumerate(chunk_text(_read_text(path), config))]


def _read_jsonl(path: Path, rel: str, config: ChunkConfig) -> list[Passage]:
    out: list[Passage] = []
    for line_no, record in iter_objects(path, CorpusFormatError):
        if not isinstance(record.get("text"), str) or not record["text"].strip():
            raise CorpusFormatError(f"{path}:{line_no}: expected a JSON object with a non-empty \"text\"")
        title = str(record.get("title") or "")
        kind = _norm_type(record.get("type"))
        source = str(record.get("source") or f"{rel}:{line_no}")
        for i, chunk in enumerate(chunk_text(record["text"], config)):
            out.append(Passage(chunk, title, kind, source, f"{rel}:{line_no}#{i}"))
    return out


_READERS = {".md": _read_markdown, ".txt": _read_txt, ".jsonl": _read_jsonl}


# ---- chunking ----------------------------------------------------------------------------------

def chunk_text(text: str, config: ChunkConfig) -> list[str]:
    """Pack paragraphs into chunks of <= max_words words, with overlap between chunks.

    Words keep the whitespace that follows them (a space, or a newline inside a list), so a
    chunk reads like its source.
    """
    step = config.max_words - config.overlap_words     # a unit must fit next to an overlap tail
    units: list[list[str]] = []                          # paragraph pieces, as word tokens
    for para in re.split(r"\n\s*\n", text):
        tokens = [m.group(1) + ("\n" if "\n" in m.group(2) else " ")
                  for m in re.finditer(r"(\S+)(\s*)", para.strip())]
        units.extend(tokens[i:i + step] for i in range(0, len(tokens), step))
    chunks: list[list[list[str]]] = []
    current: list[list[str]] = []
    for unit in units:
        if current and sum(map(len, current)) + len(unit) > config.max_words:
            chunks.append(current)
            tail = [t for u in current for t in u][-config.overlap_words:] if config.overlap_words else []
            current = [tail] if tail else []
        current.append(unit)
    if current:
        chunks.append(current)
    return ["\n\n".join("".join(unit).strip() for unit in chunk) for chunk in chunks]


def _split_sections(text: str) -> list[tuple[list[str], str]]:
    """[(heading path, body)], a new section at every heading; code fences are not headings."""
    sections: list[tuple[list[str], str]] = []
    path: list[tuple[int, str]] = []
    body: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line)
        if match:
            sections.append(([h for _, h in path], "\n".join(body)))
            level = len(match.group(1))
            path = [(lv, h) for lv, h in path if lv < level] + [(level, match.group(2))]
            body = []
        else:
            body.append(line)
    sections.append(([h for _, h in path], "\n".join(body)))
    return [(p, b) for p, b in sections if b.strip()]


def _norm_type(value) -> str:
    text = str(value).strip().lower() if value is not None else ""
    return text or DEFAULT_TYPE


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CorpusFormatError(f"{path}: not UTF-8 text") from err
