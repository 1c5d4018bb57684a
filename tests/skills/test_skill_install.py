"""Installing, archiving, staging and swapping skill libraries (what distillation relies on)."""
from __future__ import annotations

from pathlib import Path

import pytest

from medclaw.skills.library import (ARCHIVE_DIR, Skill, SkillError, SkillLibrary, parse_skill,
                                    staged_library, use_library)


def _skill(name="count-events", version=1, body="# Count\n\n1. Call crop_video on each phase.", **kw):
    return Skill(name=name, description="Count repeated events phase by phase.",
                 trigger="The question asks how many times something happened.", version=version,
                 created_by=kw.pop("created_by", "distillation:test"), tags=["count"], body=body, **kw)


def test_provenance_round_trips(tmp_path):
    library = SkillLibrary([tmp_path])
    provenance = {"run_id": "r1", "source_traces": ["m-1", "m-2"], "R_0": 3.0, "R_s": 3.25,
                  "delta": 0.05, "date": "2026-12-01", "previous_version": None}
    path = library.add(_skill(provenance=provenance), tmp_path)
    assert parse_skill(path).provenance == provenance
    assert SkillLibrary([tmp_path]).get("count-events").provenance["R_s"] == 3.25


def test_install_archives_the_previous_version(tmp_path):
    library = SkillLibrary([tmp_path])
    library.install(_skill(body="# v1\n\n1. old steps"), tmp_path)
    library.install(_skill(version=2, body="# v2\n\n1. new steps"), tmp_path)
    archived = tmp_path / ARCHIVE_DIR / "v1" / "count-events" / "SKILL.md"
    assert parse_skill(archived).body.startswith("# v1")          # kept, not deleted
    reloaded = SkillLibrary([tmp_path])                             # the archive is not loaded
    assert reloaded.get("count-events").version == 2 and "count-events" in reloaded.names()
    with pytest.raises(SkillError, match="must be > 2"):
        library.install(_skill(version=2), tmp_path)


def test_staged_library_leaves_no_file_and_swaps_without_new_engines(tmp_path):
    from medclaw.engine.runtime import Runtime

    sentinel = object()
    runtime = Runtime({}, skills=SkillLibrary(), backends={"orchestrator": sentinel})

    def skill_enum():
        spec = next(s for s in runtime.registry.specs() if s["name"] == "load_skill")
        return spec["parameters"]["properties"]["name"]["enum"]

    assert skill_enum() == ["directed-relook"]
    with staged_library([tmp_path], [_skill()]) as staged:
        stage = Path(staged.dirs[-1])
        use_library(runtime, staged)
        assert skill_enum() == ["count-events", "directed-relook"]
        assert runtime.skills.get("count-events").version == 1
    assert not stage.exists() and list(tmp_path.iterdir()) == []
    use_library(runtime, SkillLibrary())
    assert skill_enum() == ["directed-relook"]
    assert runtime.live_backends()["orchestrator"] is sentinel     # the same engine throughout
