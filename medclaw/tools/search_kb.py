"""`search_surgical_kb(query, type, k)`: top-k passages from the local knowledge base.

k is bounded 1..10 by the schema. With `types` given (the KB's passage types) the `type` field is an
enum of "any" + those types; otherwise it is a short free string. No configured KB → error
observation (the orchestrator should stop asking). The search (one sentence-encoder pass + a
FAISS lookup, and on first use the encoder's load) runs in a worker thread, never on the event
loop: other episodes keep going meanwhile. The knowledge base serialises its own encoder and index.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from medclaw.tools.base import Tool, ToolContext, ToolError
from medclaw.tools.schema import object_schema, text_field
from medclaw.types import Observation

MAX_K = 10
ANY_TYPE = "any"
_PASSAGE_CHARS = 1200          # per hit in the observation text; the full hit is in data


class SearchKBTool(Tool):
    name = "search_surgical_kb"
    description = ("Search the local surgical knowledge base (guidelines, anatomy, instruments, "
                   "procedure steps). Returns the k most relevant passages.")

    def __init__(self, types: Sequence[str] | None = None):
        if types:
            type_field = {"type": "string", "enum": [ANY_TYPE, *sorted(set(types) - {ANY_TYPE})],
                          "description": "restrict to one passage type, or any"}
        else:
            type_field = {"type": "string", "maxLength": 40,
                          "description": "restrict to one passage type, or 'any'"}
        self.parameters = object_schema({
            "query": text_field("what to look up"),
            "type": type_field,
            "k": {"type": "integer", "minimum": 1, "maximum": MAX_K,
                  "description": "number of passages"},
        }, required=["query", "type", "k"])

    async def run(self, ctx: ToolContext, args: dict) -> Observation:
        kb = ctx.knowledge_base
        if kb is None:
            raise ToolError("no knowledge base is configured for this session; answer from the "
                            "video and the skills instead")
        query = args["query"].strip()
        if not query:   # the schema allows " "; the encoder needs words
            raise ToolError("the query is empty; say what to look up")
        kind = args["type"].strip().lower()
        from medclaw.kb.errors import UnknownPassageTypeError

        try:
            hits = await asyncio.to_thread(kb.search, query, k=int(args["k"]),
                                           type=None if kind in ("", ANY_TYPE) else kind)
        except UnknownPassageTypeError as err:
            raise ToolError(str(err)) from None
        if not hits:
            return Observation(text=f"No passages found for {query!r} (type {kind or ANY_TYPE}).",
                               data={"hits": []})
        blocks = []
        for rank, hit in enumerate(hits, 1):
            text = hit.text if len(hit.text) <= _PASSAGE_CHARS else hit.text[:_PASSAGE_CHARS] + "…"
            blocks.append(f"[{rank}] {hit.title} ({hit.type}; {hit.source}; score {hit.score:.3f})\n"
                          f"{text}")
        return Observation(text="\n\n".join(blocks), data={"hits": [h.to_dict() for h in hits]})
