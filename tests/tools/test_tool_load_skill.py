"""load_skill over a REAL SkillLibrary (SKILL.md files on disk)."""
import pytest

from medclaw.tools.registry import default_registry

SKILL = """---
name: directed-relook
description: look again next to an event for before/after questions
trigger: the question asks what happened before or after an event
version: 2
created_by: human
tags: [temporal]
---
# Directed re-look
1. Localise the event with view_full_video.
2. crop_video the window just before (or after) it.
"""


@pytest.fixture
def library(tmp_path):
    from medclaw.skills.library import SkillLibrary

    folder = tmp_path / "skills" / "directed-relook"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(SKILL)
    return SkillLibrary([tmp_path / "skills"], include_shipped=False)


async def test_load_skill_returns_the_body(library, make_bare_ctx):
    ctx = make_bare_ctx(skills=library)
    obs = await default_registry(skill_names=library.names()).run(ctx, "load_skill",
                                                                  {"name": "directed-relook"})
    assert obs.error is None
    assert obs.text.startswith("Skill directed-relook:\n# Directed re-look")
    assert "crop_video the window just before" in obs.text
    assert obs.data == {"skill": "directed-relook", "version": 2}


async def test_unknown_skill_lists_names(library, make_bare_ctx):
    ctx = make_bare_ctx(skills=library)
    obs = await default_registry().run(ctx, "load_skill", {"name": "time-travel"})
    assert obs.error is not None
    assert "unknown skill 'time-travel'" in obs.error and "directed-relook" in obs.error


async def test_skill_enum_rejects_unknown_names_before_running(library, make_bare_ctx):
    ctx = make_bare_ctx(skills=library)
    obs = await default_registry(skill_names=library.names()).run(ctx, "load_skill",
                                                                  {"name": "time-travel"})
    assert obs.error is not None and "is not one of ['directed-relook']" in obs.error


async def test_no_library(bare_ctx):
    obs = await default_registry().run(bare_ctx, "load_skill", {"name": "directed-relook"})
    assert obs.error is not None and "no skill library" in obs.error
