"""skill_manage: reads the library, turns a near-duplicate create into an update, caps candidates."""
from __future__ import annotations

import json

import pytest

from medclaw.engine.toolcall import ActionError, parse_action
from medclaw.skills.library import SkillLibrary
from medclaw.skills.manage import CandidateSet, SkillManageTool
from medclaw.tools.base import ToolError

LESSON = {"action": "create", "name": "adjacent-window", "body": "1. Call crop_video before the event.",
          "description": "Look just before or after the event.",
          "trigger": "The question asks what happened BEFORE or AFTER an event."}


@pytest.fixture
def tool():
    tool = SkillManageTool(CandidateSet(SkillLibrary(), max_candidates=2, created_by="distillation:t"))
    tool.source = "mine-1"
    return tool


async def test_list_shows_the_library_and_the_candidates(tool):
    listing = (await tool.run(None, {"action": "list"})).text
    assert "directed-relook (v1, library)" in listing
    await tool.run(None, {**LESSON, "name": "count-events", "trigger": "How many clips were placed.",
                          "description": "Count events."})
    assert "count-events (v1, candidate)" in (await tool.run(None, {"action": "list"})).text


async def test_near_duplicate_of_a_library_skill_becomes_its_next_version(tool):
    obs = await tool.run(None, LESSON)            # close to the shipped directed-relook trigger
    assert "'directed-relook' already covers this" in obs.text
    assert obs.data == {"written": True, "skill": "directed-relook", "version": 2}
    [candidate] = tool.candidates.candidates.values()
    assert candidate.base_version == 1 and candidate.skill.body.startswith("1. Call crop_video")
    tool.source = "mine-2"
    again = await tool.run(None, {**LESSON, "name": "before-after-relook"})
    assert again.data["version"] == 2 and len(tool.candidates.candidates) == 1   # refined in place
    assert candidate.sources == ["mine-1", "mine-2"] and candidate.lessons == 2


async def test_candidate_limit_and_unknown_update(tool):
    for name in ("count-clips", "find-bleeding"):
        await tool.run(None, {**LESSON, "name": name, "trigger": f"Questions about {name}.",
                              "description": f"Handle {name}."})
    with pytest.raises(ToolError, match="limit of 2 candidate skills"):
        await tool.run(None, {**LESSON, "name": "third", "trigger": "Something else entirely.",
                              "description": "Unrelated."})
    with pytest.raises(ToolError, match="no skill named 'nope'"):
        await tool.run(None, {"action": "update", "name": "nope"})


def test_schema_only_admits_complete_creates(tool):
    specs = [tool.spec()]
    partial = json.dumps({"thought": "", "tool": "skill_manage", "args": {"action": "create", "name": "x"}})
    assert isinstance(parse_action(partial, specs), ActionError)
    full = json.dumps({"thought": "", "tool": "skill_manage", "args": LESSON})
    assert parse_action(full, specs).args == LESSON
