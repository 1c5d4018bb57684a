"""A scripted backend for agent-logic tests: it replays answers instead of running a model.

It never stands in for a real engine in engine tests; it lets episode logic, tool routing and
distillation gates be tested deterministically. A script is either a list of replies (served in
order, each reply a string or a callable taking the request) or a single callable.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from medclaw.engine.backends.base import Backend
from medclaw.types import GenRequest, GenResult

Reply = str | Callable[[GenRequest], str]


class ScriptedBackend(Backend):
    supports_json_schema = False
    supports_media = True

    def __init__(self, script: Sequence[Reply] | Callable[[GenRequest], str] = (),
                 model_name: str = "scripted", model_revision: str = "none"):
        self.script = script
        self.model_name = model_name
        self.model_revision = model_revision
        self.requests: list[GenRequest] = []     # every request seen, for assertions in tests
        self._next = 0
        self._lock = asyncio.Lock()

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        results = []
        async with self._lock:
            for request in requests:
                self.requests.append(request)
                text = self._reply_for(request)
                prompt_tokens = sum(len(str(m.get("content", ""))) for m in request.messages) // 4
                results.append(GenResult(
                    text=text, model_name=self.model_name, model_revision=self.model_revision,
                    num_prompt_tokens=prompt_tokens, num_completion_tokens=len(text) // 4,
                    finish_reason="stop"))
        return results

    def _reply_for(self, request: GenRequest) -> str:
        if callable(self.script):
            return self.script(request)
        if self._next >= len(self.script):
            raise RuntimeError(f"scripted backend {self.model_name!r} ran out of replies "
                               f"after {self._next} requests")
        reply = self.script[self._next]
        self._next += 1
        return reply(request) if callable(reply) else reply
