"""`skill_manage`: the tool through which the orchestrator writes lessons as skills (distillation).

    candidates = CandidateSet(library, max_candidates=5, created_by="distillation:<run>")
    tool = SkillManageTool(candidates)
    tool.source = "<mining episode id>"                   # whose lesson the next write records
    obs = await tool.run(None, {"action": "create", "name": ..., ...})

Actions: `list` (every skill of the library and every candidate so far: name, version, trigger,
description), `view` (one skill's body), `create`, `update`. Nothing is written to disk here:
candidates live in memory until the distillation gate keeps or drops them.

The tool reads the library before it writes. A `create` whose name is taken, or whose trigger and
description are a near-duplicate of an existing skill or candidate (shared content words / the
smaller word set >= `NEAR_DUPLICATE`), becomes an `update` of that skill — a repeated lesson refines one skill instead
of adding a second copy. An update of a library skill proposes its next version; an update of a
candidate refines that candidate in place (it stays one candidate). At most `max_candidates`
distinct candidates; past that, `create` is refused (the model is told to update one instead).
Every candidate remembers the sources (mining episode ids) of the lessons merged into it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from medclaw.skills.library import Skill, SkillError, SkillLibrary
from medclaw.tools.base import Tool, ToolContext, ToolError
from medclaw.types import Observation

NEAR_DUPLICATE = 0.7
MAX_BODY_CHARS = 4000
_STOP = frozenset("a an the of to in on at for and or is are was were be it its this that with "
                  "what which when how question questions asks by not use".split())


def slug(name: str) -> str:
    return "-".join(re.findall(r"[a-z0-9]+", str(name).lower()))[:64]


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def similarity(a: Skill, description: str, trigger: str) -> float:
    """Overlap of content words (trigger + description): shared / the smaller set's size, so a
    short paraphrase of a longer skill counts as a duplicate of it."""
    left, right = _words(f"{a.trigger} {a.description}"), _words(f"{trigger} {description}")
    smaller = min(len(left), len(right))
    return len(left & right) / smaller if smaller else 0.0


@dataclass(slots=True)
class Candidate:
    skill: Skill
    base_version: int | None            # the library version it updates; None: a new skill
    sources: list[str] = field(default_factory=list)
    lessons: int = 1


class CandidateSet:
    """Candidate skills proposed in one distillation run, over a fixed library."""

    def __init__(self, library: SkillLibrary, max_candidates: int, created_by: str):
        self.library = library
        self.max_candidates = max_candidates
        self.created_by = created_by
        self.candidates: dict[str, Candidate] = {}

    def _current(self, name: str) -> Skill | None:
        if name in self.candidates:
            return self.candidates[name].skill
        return self.library.get(name) if name in self.library else None

    def _all(self) -> list[Skill]:
        merged = {s.name: s for s in self.library.list_skills()}
        merged.update({n: c.skill for n, c in self.candidates.items()})
        return [merged[n] for n in sorted(merged)]

    def listing(self) -> str:
        lines = []
        for skill in self._all():
            state = "candidate" if skill.name in self.candidates else "library"
            lines.append(f"- {skill.name} (v{skill.version}, {state}): trigger: "
                         f"{' '.join(skill.trigger.split())} | {' '.join(skill.description.split())}")
        return "\n".join(lines) or "(the library is empty)"

    def near_duplicate(self, description: str, trigger: str) -> tuple[str, float] | None:
        best = max(((s.name, similarity(s, description, trigger)) for s in self._all()),
                    key=lambda pair: pair[1], default=None)
        return best if best is not None and best[1] >= NEAR_DUPLICATE else None

    def write(self, action: str, fields: dict, source: str) -> tuple[Candidate, str]:
        """Apply a create / update; returns the candidate and a note for the model."""
        name = slug(fields.get("name", ""))
        note = ""
        if action == "create":
            if not name:
                raise ToolError("create needs a name (lower-case words joined by '-')")
            duplicate = None
            if self._current(name) is not None:
                duplicate = (name, 1.0)
            elif fields.get("description") and fields.get("trigger"):
                duplicate = self.near_duplicate(fields["description"], fields["trigger"])
            if duplicate is not None:
                note = (f"{duplicate[0]!r} already covers this (similarity {duplicate[1]:.2f}); "
                        f"updated it instead of adding a near-duplicate. ")
                name, action = duplicate[0], "update"
        if action == "update":
            current = self._current(name)
            if current is None:
                raise ToolError(f"no skill named {name!r} to update; skills: "
                                f"{', '.join(s.name for s in self._all()) or 'none'}")
            return self._update(current, fields, source), note + f"updated {name!r}"
        missing = [k for k in ("description", "trigger", "body") if not str(fields.get(k, "")).strip()]
        if missing:
            raise ToolError(f"create needs {', '.join(missing)}")
        if len(self.candidates) >= self.max_candidates:
            raise ToolError(f"the limit of {self.max_candidates} candidate skills is reached; "
                            f"update one of: {', '.join(sorted(self.candidates))}")
        skill = self._skill(name, fields, version=1, base=None)
        candidate = self.candidates[name] = Candidate(skill, None, [source])
        return candidate, note + f"created candidate {name!r}"

    def _update(self, current: Skill, fields: dict, source: str) -> Candidate:
        existing = self.candidates.get(current.name)
        if existing is None and len(self.candidates) >= self.max_candidates:
            raise ToolError(f"the limit of {self.max_candidates} candidate skills is reached; "
                            f"update one of: {', '.join(sorted(self.candidates))}")
        merged = {"description": current.description, "trigger": current.trigger,
                  "tags": list(current.tags), "body": current.body}
        merged.update({k: v for k, v in fields.items() if k in merged and v})
        if existing is not None:                       # refine the candidate in place
            existing.skill = self._skill(current.name, merged, current.version, existing.base_version)
            existing.sources.append(source)
            existing.lessons += 1
            return existing
        skill = self._skill(current.name, merged, current.version + 1, current.version)
        candidate = self.candidates[current.name] = Candidate(skill, current.version, [source])
        return candidate

    def _skill(self, name: str, fields: dict, version: int, base: int | None) -> Skill:
        tags = [t for t in (fields.get("tags") or []) if isinstance(t, str) and t.strip()]
        try:
            return Skill(name=name, description=" ".join(str(fields["description"]).split()),
                         trigger=" ".join(str(fields["trigger"]).split()), version=version,
                         created_by=self.created_by, tags=tags or ["distilled"],
                         body=str(fields["body"]).strip()[:MAX_BODY_CHARS])
        except SkillError as err:
            raise ToolError(str(err)) from None


_NAME = {"type": "string", "minLength": 1, "maxLength": 64,
         "description": "skill name: lower-case words joined by '-'"}
_DESCRIPTION = {"type": "string", "minLength": 1, "maxLength": 200,
                "description": "one line: what the skill does"}
_TRIGGER = {"type": "string", "minLength": 1, "maxLength": 200, "description": "one line: when to use it"}
_TAGS = {"type": "array", "maxItems": 5, "items": {"type": "string", "minLength": 1, "maxLength": 32}}
_BODY = {"type": "string", "minLength": 1, "maxLength": MAX_BODY_CHARS,
         "description": "markdown: concrete steps that name the tools to call"}


def _action(name: str, fields: dict, required: list[str] | None = None) -> dict:
    properties = {"action": {"type": "string", "enum": [name]}, **fields}
    return {"type": "object", "properties": properties,
            "required": ["action", *(list(fields) if required is None else required)],
            "additionalProperties": False}


class SkillManageTool(Tool):
    name = "skill_manage"
    description = ("Read and write the skill library: list the skills, view one, create a new skill "
                   "or update an existing one. A create that repeats an existing skill updates it.")
    # One branch per action, each with the fields that action needs: constrained decoding can
    # then only produce a complete create (a weak model cannot stop after `"action": "create"`).
    parameters = {"anyOf": [
        _action("list", {}),
        _action("view", {"name": _NAME}),
        _action("create", {"name": _NAME, "description": _DESCRIPTION, "trigger": _TRIGGER,
                           "tags": _TAGS, "body": _BODY},
                required=["name", "description", "trigger", "body"]),
        _action("update", {"name": _NAME, "description": _DESCRIPTION, "trigger": _TRIGGER,
                           "tags": _TAGS, "body": _BODY}, required=["name"]),
    ]}

    def __init__(self, candidates: CandidateSet):
        self.candidates = candidates
        self.source = ""

    async def run(self, ctx: ToolContext, args: dict) -> Observation:
        action = args["action"]
        if action == "list":
            return Observation(text="Skills:\n" + self.candidates.listing())
        if action == "view":
            skill = self.candidates._current(slug(args.get("name", "")))
            if skill is None:
                raise ToolError(f"no skill named {args.get('name')!r}")
            return Observation(text=f"{skill.name} v{skill.version}:\n{skill.body}")
        candidate, note = self.candidates.write(action, args, source=self.source)
        return Observation(text=f"{note} (v{candidate.skill.version}).",
                           data={"written": True, "skill": candidate.skill.name,
                                 "version": candidate.skill.version})
