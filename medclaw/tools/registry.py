"""The tool table: name → Tool instance, with schema checks on the way in and the way out.

Contract
- `register(tool)` checks the tool's `parameters` with JSON Schema Draft 2020-12 `check_schema`,
  and checks that the schema is *bounded* (an object with `additionalProperties: false`; every
  number has minimum and maximum, every string a maxLength or enum, every array maxItems), because
  xgrammar-constrained decoding of a weak model only stays parseable on bounded fields. A bad
  schema is our bug: it raises `ValueError` at registration, never at run time.
- `specs()` lists the tools in registration order; `default_registry()` registers them in a fixed
  order, so the orchestrator's system prompt is byte-identical across episodes (prefix cache).
- `await run(ctx, name, args)` turns whatever the *model's* choice can cause into
  `Observation(error=...)` for the orchestrator to read: an unknown tool, arguments that fail the
  schema, and any exception the tool raises that `medclaw.errors.ERROR_KINDS` calls MODEL — a
  `ToolError`, a region too thin to resize, a corrupt stretch of video, a decode timeout, a
  rejected sub-agent request, any ValueError or OSError. Programming errors (TypeError,
  AttributeError, …), lost engines / servers / memory, and cancellation propagate.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from medclaw.errors import MODEL, describe, error_kind
from medclaw.tools.base import Tool, ToolContext, error_observation
from medclaw.tools.schema import argument_problem
from medclaw.types import Observation


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()):
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    # --- table --------------------------------------------------------------------------------
    def register(self, tool: Tool) -> Tool:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        if not tool.name or not tool.name.isidentifier():
            raise ValueError(f"tool name must be an identifier, got {tool.name!r}")
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        if not tool.description:
            raise ValueError(f"tool {tool.name!r} needs a description")
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as err:
            raise ValueError(f"tool {tool.name!r}: invalid JSON schema: {err.message}") from None
        check_bounded(tool.parameters, where=tool.name)
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool:
        return self._tools[name]

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> list[dict]:
        """`{"name", "description", "parameters"}` per tool, in registration order."""
        return [tool.spec() for tool in self._tools.values()]

    # --- execution ----------------------------------------------------------------------------
    def validate(self, name: str, args: object) -> str | None:
        """One line describing why `args` do not fit tool `name`'s schema, or None when they do."""
        return argument_problem(name, self._tools[name].parameters, args)

    async def run(self, ctx: ToolContext, name: str, args: object) -> Observation:
        if name not in self._tools:
            return error_observation(
                "", f"unknown tool {name!r}; available tools: {', '.join(self._tools)}")
        problem = self.validate(name, args)
        if problem is not None:
            return error_observation("", problem)
        try:
            return await self._tools[name].run(ctx, args)
        except Exception as err:
            if error_kind(err) != MODEL:
                raise
            return error_observation(name, describe(err))


def check_bounded(schema: dict, *, where: str = "schema") -> None:
    """Raise ValueError unless every leaf of `schema` is bounded (see module docstring)."""
    kind = schema.get("type")
    if "enum" in schema or "const" in schema:
        return
    if kind == "object":
        if schema.get("additionalProperties", True) is not False:
            raise ValueError(f"{where}: objects must set additionalProperties: false")
        for key, sub in schema.get("properties", {}).items():
            check_bounded(sub, where=f"{where}.{key}")
    elif kind in ("number", "integer"):
        if "minimum" not in schema or "maximum" not in schema:
            raise ValueError(f"{where}: numbers need minimum and maximum")
    elif kind == "string":
        if "maxLength" not in schema:
            raise ValueError(f"{where}: strings need maxLength (or an enum)")
    elif kind == "array":
        if "maxItems" not in schema or "items" not in schema:
            raise ValueError(f"{where}: arrays need items and maxItems")
        check_bounded(schema["items"], where=f"{where}[]")
    elif kind == "boolean":
        return
    else:
        raise ValueError(f"{where}: unsupported or missing type {kind!r}")


def default_registry(*, kb_types: Sequence[str] | None = None,
                     skill_names: Sequence[str] | None = None) -> ToolRegistry:
    """The paper's seven tools, coarse to fine, then knowledge, skills and the answer.

    `kb_types` (the knowledge base's passage types) and `skill_names` become enums in the schemas
    when given, which keeps constrained decoding on names that exist.
    """
    from medclaw.tools.crop_video import CropVideoTool
    from medclaw.tools.crop_video_frame import CropVideoFrameTool
    from medclaw.tools.final_answer import FinalAnswerTool
    from medclaw.tools.search_kb import SearchKBTool
    from medclaw.tools.select_video_frame import SelectVideoFrameTool
    from medclaw.tools.skills import LoadSkillTool
    from medclaw.tools.view_full_video import ViewFullVideoTool

    return ToolRegistry([
        ViewFullVideoTool(),
        CropVideoTool(),
        SelectVideoFrameTool(),
        CropVideoFrameTool(),
        SearchKBTool(types=kb_types),
        LoadSkillTool(names=skill_names),
        FinalAnswerTool(),
    ])
