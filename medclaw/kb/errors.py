"""Knowledge-base errors: bad input (missing folder, empty corpus, broken index, missing encoder).

All are `MedClawError`s, so the CLI prints them as one line with exit status 2, and the
`search_surgical_kb` tool can turn them into an observation for the orchestrator to read.
"""
from __future__ import annotations

from medclaw.errors import MedClawError


class KnowledgeBaseError(MedClawError):
    """Base class of every knowledge-base error. str(err) is one line."""


class CorpusNotFoundError(KnowledgeBaseError):
    """The corpus folder (or file) given to `kb build` does not exist."""


class EmptyCorpusError(KnowledgeBaseError):
    """The corpus holds no .txt/.md/.jsonl passage with any text."""


class CorpusFormatError(KnowledgeBaseError):
    """A corpus file cannot be read (e.g. a .jsonl line that is not a JSON object with "text")."""


class IndexNotFoundError(KnowledgeBaseError):
    """The index folder, or one of its files, does not exist."""


class IndexCorruptError(KnowledgeBaseError):
    """The index folder exists but its files are unreadable or disagree with each other."""


class EncoderNotFoundError(KnowledgeBaseError):
    """The sentence-encoder folder does not exist or is not a sentence-transformers model."""


class UnknownPassageTypeError(KnowledgeBaseError):
    """A search asked for a passage type the index does not hold."""
