"""`load_skill(name)`: the body of one skill (SKILL.md) from the skill library.

The orchestrator's system prompt carries the library's index (names + one-line descriptions);
this tool fetches a full skill on demand. With `names` given the schema's `name` is an enum of the
library's skills. Unknown name or no library → error observation listing what exists.
"""
from __future__ import annotations

from collections.abc import Sequence

from medclaw.tools.base import Tool, ToolContext, ToolError
from medclaw.types import Observation


class LoadSkillTool(Tool):
    name = "load_skill"
    description = ("Load a skill (a procedure for a kind of question, e.g. directed-relook for "
                   "before/after questions) by name from the skill index, and follow it.")

    def __init__(self, names: Sequence[str] | None = None):
        name_field = ({"type": "string", "enum": sorted(names)} if names
                      else {"type": "string", "minLength": 1, "maxLength": 80})
        name_field["description"] = "skill name, as listed in the skill index"
        self.parameters = {"type": "object", "properties": {"name": name_field},
                           "required": ["name"], "additionalProperties": False}

    async def run(self, ctx: ToolContext, args: dict) -> Observation:
        library = ctx.skills
        if library is None:
            raise ToolError("no skill library is configured for this session")
        name = args["name"].strip()
        try:
            skill = library.get(name)
        except LookupError:
            skill = None
        if skill is None:
            raise ToolError(f"unknown skill {name!r}; available skills: "
                            f"{', '.join(_names(library)) or 'none'}")
        return Observation(text=f"Skill {skill.name}:\n{skill.body.strip()}",
                           data={"skill": skill.name, "version": getattr(skill, "version", None)})


def _names(library) -> list[str]:
    names = getattr(library, "names", None)
    if callable(names):
        return sorted(names())
    skills = getattr(library, "skills", None)
    if isinstance(skills, dict):
        return sorted(skills)
    if skills is not None:
        return sorted(s.name for s in skills)
    return []
