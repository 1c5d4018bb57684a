"""The backend contract every generation engine implements.

A backend serves one model. `generate` takes a batch of requests and returns one result per request
in the same order; it is async so that many episodes can await the same engine concurrently and the
engine (vLLM) batches them. Results always carry token accounting, including cached prompt tokens.
"""
from __future__ import annotations

import abc

from medclaw.types import GenRequest, GenResult


class Backend(abc.ABC):
    """An async text (or vision-language) generation engine for one model."""

    #: True when `GenRequest.json_schema` is enforced by the engine (constrained decoding).
    #: Callers still validate the output; without enforcement they use a tolerant parser.
    supports_json_schema: bool = False
    #: True when the backend accepts video / image media parts.
    supports_media: bool = False

    @abc.abstractmethod
    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Run every request; results come back in request order."""

    async def generate_one(self, request: GenRequest) -> GenResult:
        return (await self.generate([request]))[0]

    async def close(self) -> None:
        """Release engine resources. Safe to call twice."""
