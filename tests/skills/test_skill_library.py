"""The skill library: shipped SKILL.md parses, bad frontmatter is rejected, index is stable."""
import pytest

from medclaw.errors import MedClawError
from medclaw.skills.library import (REQUIRED_FIELDS, Skill, SkillError, SkillFormatError,
                                    SkillLibrary, SkillNotFoundError, parse_skill,
                                    shipped_library_dir)

TOOL_NAMES = ("view_full_video", "crop_video", "select_video_frame", "crop_video_frame",
              "search_surgical_kb", "load_skill", "final_answer")

GOOD = """---
name: {name}
description: A test skill.
trigger: {trigger}
version: {version}
created_by: test
tags: [a, b]
---
# Steps

1. Call view_full_video.
"""


def write_skill(root, name, trigger="When testing.", version=1, text=None):
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(text if text is not None
                                     else GOOD.format(name=name, trigger=trigger, version=version))
    return folder / "SKILL.md"


def test_shipped_directed_relook_parses():
    library = SkillLibrary()
    assert "directed-relook" in library.names()
    skill = library.get("directed-relook")
    assert isinstance(skill, Skill) and skill.version >= 1 and skill.created_by
    assert skill.path == str(shipped_library_dir() / "directed-relook" / "SKILL.md")
    assert "before" in skill.trigger.lower() and "after" in skill.trigger.lower()
    for tool in TOOL_NAMES:                          # the body is steps over the real tool names
        assert tool in skill.body, tool
    assert not skill.body.startswith("---")


def test_user_dir_adds_and_overrides(tmp_path):
    write_skill(tmp_path, "zoom-on-clips", trigger="Question about clips.")
    write_skill(tmp_path, "directed-relook", trigger="Overridden trigger.", version=7)
    library = SkillLibrary([tmp_path])
    assert library.names() == ["directed-relook", "zoom-on-clips"]
    assert library.get("directed-relook").version == 7        # later dirs win
    assert len(SkillLibrary([tmp_path], include_shipped=False)) == 2


def test_index_text_sorted_and_stable(tmp_path):
    for name in ("zeta-skill", "alpha-skill", "mid-skill"):
        write_skill(tmp_path, name, trigger=f"When {name}\n  is needed.")
    library = SkillLibrary([tmp_path], include_shipped=False)
    lines = library.index_text().splitlines()
    assert [line.split()[1] for line in lines] == ["alpha-skill", "mid-skill", "zeta-skill"]
    assert lines[0] == "- alpha-skill (v1): When alpha-skill is needed."
    assert SkillLibrary([tmp_path], include_shipped=False).index_text() == library.index_text()
    assert SkillLibrary([], include_shipped=False).index_text() == "(no skills)"


def test_unknown_skill_lists_available():
    with pytest.raises(SkillNotFoundError) as err:
        SkillLibrary().get("no-such-skill")
    assert "no-such-skill" in str(err.value) and "directed-relook" in str(err.value)
    assert isinstance(err.value, LookupError) and isinstance(err.value, MedClawError)


@pytest.mark.parametrize("missing", REQUIRED_FIELDS)
def test_missing_field_names_file_and_field(tmp_path, missing):
    text = "\n".join(line for line in GOOD.format(name="bad-skill", trigger="t", version=1)
                     .splitlines() if not line.startswith(f"{missing}:")) + "\n"
    path = write_skill(tmp_path, "bad-skill", text=text)
    with pytest.raises(SkillFormatError) as err:
        SkillLibrary([tmp_path])
    message = str(err.value)
    assert str(path) in message and missing in message and "\n" not in message


@pytest.mark.parametrize("text, needle", [
    ("# no frontmatter\n", "no YAML frontmatter"),
    ("---\nname: [unclosed\n---\nbody\n", "invalid YAML"),
    ("---\n- a list\n---\nbody\n", "mapping"),
    (GOOD.format(name="bad-skill", trigger="t", version="two"), "version"),
    (GOOD.format(name="bad-skill", trigger="t", version=0), "version"),
    (GOOD.format(name="Other_Name", trigger="t", version=1), "name"),
    (GOOD.format(name="other-name", trigger="t", version=1), "folder name"),
    (GOOD.format(name="bad-skill", trigger="t", version=1).replace("tags: [a, b]", "tags: a"), "tags"),
    (GOOD.format(name="bad-skill", trigger="t", version=1).replace("tags:", "colour: red\ntags:"),
     "unknown frontmatter"),
    (GOOD.format(name="bad-skill", trigger="t", version=1).split("# Steps")[0], "empty body"),
])
def test_bad_frontmatter_rejected(tmp_path, text, needle):
    path = write_skill(tmp_path, "bad-skill", text=text)
    with pytest.raises(SkillFormatError) as err:
        parse_skill(path)
    assert needle in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_dir_is_an_error(tmp_path):
    with pytest.raises(SkillError):
        SkillLibrary([tmp_path / "absent"])


def test_add_round_trips_and_versions_only_go_up(tmp_path):
    library = SkillLibrary()
    skill = Skill(name="zoom-on-clips", description="Zoom to count clips.",
                  trigger="The question asks how many clips were placed.", version=1,
                  created_by="distillation:run-1", tags=["clips", "count"],
                  body="# Steps\n\n1. Call crop_video_frame on the duct.\n")
    path = library.add(skill, tmp_path)
    assert path == tmp_path / "zoom-on-clips" / "SKILL.md"
    loaded = parse_skill(path)
    for key in ("name", "description", "trigger", "version", "created_by", "tags"):
        assert getattr(loaded, key) == getattr(skill, key)
    assert loaded.body == skill.body.strip()
    assert library.get("zoom-on-clips").path == str(path)
    assert "zoom-on-clips" in SkillLibrary([tmp_path]).names()

    with pytest.raises(SkillError) as err:
        library.add(skill, tmp_path)                               # same version again
    assert "version" in str(err.value)
    skill.version = 2
    library.add(skill, tmp_path)
    assert parse_skill(path).version == 2 and library.get("zoom-on-clips").version == 2


def test_invalid_skill_object_rejected():
    with pytest.raises(SkillFormatError):
        Skill(name="x", description="d", trigger="two\nlines", version=1, created_by="me")
