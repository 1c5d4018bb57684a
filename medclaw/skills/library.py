"""The skill library: SKILL.md files the orchestrator can list and load.

A skill is a folder `<name>/SKILL.md`: YAML frontmatter between `---` lines, then a markdown body of
concrete steps that reference tool names.

    ---
    name: directed-relook            # lower-case words joined by '-', equal to the folder name
    description: one line, what the skill does
    trigger: one line, when to use it (shown in the orchestrator's system prompt)
    version: 1                       # integer >= 1; a distilled rewrite bumps it
    created_by: human                # "human", or e.g. "distillation:<run id>"
    tags: [temporal, before-after]
    provenance: {...}                # optional: where a distilled skill came from (see below)
    ---
    # body …

`provenance` (distilled skills): run_id, source_traces (the mining episodes whose failures taught
the lesson), R_0 and R_s (mean validation reward without / with the skill), reward (what R
was: `skills.distill.REWARDS`), delta, date, previous_version.

Contract
- `SkillLibrary(dirs)` loads the shipped library (`medclaw/skills/library/`) and then each dir in
  `dirs`; a skill in a later dir replaces one of the same name from an earlier dir (that is how a
  distilled or user-edited version overrides the shipped one).
- A malformed SKILL.md raises `SkillFormatError` naming the file and the problem (one line).
- `index_text()` lists names + triggers sorted by name: identical libraries give identical text, so
  the orchestrator's system-prompt prefix stays cache-stable (docs/architecture.md, KV-cache rule 1).
- `get(name)` returns the `Skill`; an unknown name raises `SkillNotFoundError` listing the names.
- `add(skill, dir)` writes `dir/<name>/SKILL.md` and registers it; it refuses to overwrite a file
  whose version is >= the new one (versions only go up). `install(skill, dir)` does the same but
  first moves an existing `dir/<name>/SKILL.md` to `dir/.archive/v<version>/<name>/SKILL.md`:
  nothing is ever deleted silently.
- `staged_library(dirs, skills)`: a library of `dirs` plus `skills` written into a temporary
  folder that is removed on exit (distillation tries candidates without leaving files behind).
- `use_library(runtime, library)`: swap the skill library of a running `Runtime` between episodes;
  the engines keep running.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from medclaw.errors import MedClawError, first_line

SKILL_FILE = "SKILL.md"
REQUIRED_FIELDS = ("name", "description", "trigger", "version", "created_by", "tags")
OPTIONAL_FIELDS = ("provenance",)
ARCHIVE_DIR = ".archive"
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_FRONTMATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)


class SkillError(MedClawError):
    """Base class of skill-library errors. str(err) is one line."""


class SkillFormatError(SkillError):
    """A SKILL.md file is missing, unreadable, or has invalid frontmatter."""


class SkillNotFoundError(SkillError, LookupError):
    """No skill of that name in the library. Also a LookupError, which `load_skill` catches."""


def shipped_library_dir() -> Path:
    return Path(__file__).resolve().parent / "library"


@dataclass(slots=True)
class Skill:
    name: str
    description: str
    trigger: str
    version: int
    created_by: str
    tags: list[str] = field(default_factory=list)
    body: str = ""
    path: str = ""             # where it was loaded from / written to ("" for a new skill)
    provenance: dict | None = None

    def __post_init__(self) -> None:
        where = self.path or f"skill {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SkillFormatError(f"{where}: name must be lower-case words joined by '-', got {self.name!r}")
        for key in ("description", "trigger", "created_by"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value.strip() or "\n" in value.strip():
                raise SkillFormatError(f"{where}: {key} must be a non-empty one-line string")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise SkillFormatError(f"{where}: version must be an integer >= 1, got {self.version!r}")
        if not isinstance(self.tags, list) or not all(isinstance(t, str) and t for t in self.tags):
            raise SkillFormatError(f"{where}: tags must be a list of strings")
        if self.provenance is not None and not isinstance(self.provenance, dict):
            raise SkillFormatError(f"{where}: provenance must be a mapping")

    def to_markdown(self) -> str:
        import yaml

        meta = {"name": self.name, "description": self.description.strip(),
                "trigger": self.trigger.strip(), "version": self.version,
                "created_by": self.created_by.strip(), "tags": list(self.tags)}
        if self.provenance:
            meta["provenance"] = dict(self.provenance)
        front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=10 ** 6)
        return f"---\n{front}---\n\n{self.body.strip()}\n"


def parse_skill(path: str | os.PathLike) -> Skill:
    """Read and validate one SKILL.md."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SkillFormatError(f"{path}: cannot read ({type(err).__name__})") from err
    match = _FRONTMATTER.match(text)
    if not match:
        raise SkillFormatError(f"{path}: no YAML frontmatter (the file must start with a '---' block)")
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as err:
        raise SkillFormatError(f"{path}: invalid YAML frontmatter "
                               f"({first_line(err, 'invalid YAML')})") from err
    if not isinstance(meta, dict):
        raise SkillFormatError(f"{path}: frontmatter must be a YAML mapping")
    missing = [key for key in REQUIRED_FIELDS if key not in meta or meta[key] in (None, "")]
    if missing:
        raise SkillFormatError(f"{path}: frontmatter is missing {', '.join(missing)}")
    unknown = sorted(set(meta) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        raise SkillFormatError(f"{path}: unknown frontmatter field(s) {', '.join(map(str, unknown))}")
    skill = Skill(name=meta["name"], description=meta["description"], trigger=meta["trigger"],
                  version=meta["version"], created_by=meta["created_by"], tags=meta["tags"],
                  body=text[match.end():].strip(), path=str(path),
                  provenance=meta.get("provenance"))
    if path.parent.name != skill.name:
        raise SkillFormatError(f"{path}: name {skill.name!r} must equal its folder name {path.parent.name!r}")
    if not skill.body:
        raise SkillFormatError(f"{path}: empty body (write the steps below the frontmatter)")
    return skill


class SkillLibrary:
    """Skills by name, from the shipped library plus optional user dirs (later dirs win)."""

    __slots__ = ("dirs", "_skills")

    def __init__(self, dirs: list[str | os.PathLike] | None = None, include_shipped: bool = True) -> None:
        self.dirs: list[Path] = ([shipped_library_dir()] if include_shipped else []) + \
            [Path(d).expanduser() for d in (dirs or [])]
        self._skills: dict[str, Skill] = {}
        for folder in self.dirs:
            if not folder.is_dir():
                raise SkillError(f"skill directory not found: {folder}")
            for skill_file in sorted(folder.glob(f"*/{SKILL_FILE}")):
                skill = parse_skill(skill_file)
                self._skills[skill.name] = skill

    def names(self) -> list[str]:
        """Skill names, sorted."""
        return sorted(self._skills)

    def __len__(self) -> int:
        return len(self._skills)

    def __contains__(self, name: object) -> bool:
        return name in self._skills

    def get(self, name: str) -> Skill:
        skill = self._skills.get(str(name).strip())
        if skill is None:
            raise SkillNotFoundError(
                f"unknown skill {name!r}; available: {', '.join(self.names()) or '(none)'}")
        return skill

    def index_text(self) -> str:
        """One line per skill, sorted by name: `- name (vN): trigger`. Stable for prompt caching."""
        if not self._skills:
            return "(no skills)"
        return "\n".join(f"- {s.name} (v{s.version}): {' '.join(s.trigger.split())}"
                         for s in (self._skills[n] for n in self.names()))

    def add(self, skill: Skill, dir: str | os.PathLike) -> Path:
        """Write `skill` to `dir/<name>/SKILL.md`, register it, and return the file's path."""
        target = Path(dir).expanduser() / skill.name / SKILL_FILE
        if target.exists():
            existing = parse_skill(target)
            if existing.version >= skill.version:
                raise SkillError(
                    f"{target} already holds version {existing.version} of {skill.name!r}; "
                    f"a new version must be > {existing.version}, got {skill.version}")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".md.tmp")
        tmp.write_text(skill.to_markdown(), encoding="utf-8")
        tmp.replace(target)
        written = parse_skill(target)          # round-trip check: what we wrote must load
        self._skills[written.name] = written
        return target

    def install(self, skill: Skill, dir: str | os.PathLike) -> Path:
        """`add`, after archiving what `dir/<name>/SKILL.md` held (never deleted)."""
        target = Path(dir).expanduser() / skill.name / SKILL_FILE
        if target.exists():
            existing = parse_skill(target)
            if existing.version >= skill.version:
                raise SkillError(f"{target} already holds version {existing.version} of "
                                 f"{skill.name!r}; a new version must be > {existing.version}")
            archived = Path(dir).expanduser() / ARCHIVE_DIR / f"v{existing.version}" / skill.name / SKILL_FILE
            archived.parent.mkdir(parents=True, exist_ok=True)
            os.replace(target, archived)
        return self.add(skill, dir)

    def list_skills(self) -> list[Skill]:
        return [self._skills[n] for n in self.names()]


@contextmanager
def staged_library(dirs: list[str | os.PathLike], skills: list[Skill]):
    """A SkillLibrary of `dirs` plus `skills` (written to a temporary folder removed on exit)."""
    import shutil
    import tempfile

    stage = Path(tempfile.mkdtemp(prefix="medclaw-skill-stage-"))
    try:
        for skill in skills:
            folder = stage / skill.name
            folder.mkdir()
            (folder / SKILL_FILE).write_text(skill.to_markdown(), encoding="utf-8")
        yield SkillLibrary([*dirs, stage])
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def use_library(runtime, library: SkillLibrary) -> None:
    """Swap `runtime`'s skill library between episodes (engines keep running): the next episode's
    system prompt lists the new skills, and load_skill's name enum follows them."""
    runtime.use_skills(library)
