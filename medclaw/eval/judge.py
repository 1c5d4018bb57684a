"""The 4-dimension judge: a local LLM (the `judge` role) scores an answer against the gold.

    judge = Judge(backend, JudgeConfig())
    score = await judge.score(record, answer, evidence_times)     # -> JudgeScore

Dimensions, each an integer 1–5: CI (correctness of information), DO (detail orientation), CU
(contextual understanding), TU (temporal understanding); `avg` is their mean. The prompt is a
versioned file (`prompts/<version>.md`, a `string.Template` with $question, $gold, $gold_window,
$answer, $evidence); its name and SHA-256 are recorded with every score, with the judge model's
name and revision and the rationale.

The output is schema-constrained (`judge_schema`): rationale first (a bounded string), then four
integers with minimum 1 and maximum 5, no other properties. With the engine's xgrammar backend and
`disable_any_whitespace`, even a random-weight model's reply parses: every field is bounded, and
`max_tokens` covers the longest string the schema allows (`TOKENS_PER_CHAR` tokens per character:
a JSON escape such as \\u00e9 is 6 characters, a byte-level BPE may spend one token on each).
Backends without schema enforcement get the same prompt and a tolerant parser; a reply that still
does not parse is recorded (`parsed=False`, the raw text kept) and scores 1 on every dimension.

An episode without an answer is not sent to the judge: it scores 1 everywhere (`judged=False`),
so failures pull the mean down instead of vanishing from it.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from string import Template

from medclaw.requests.output_format import first_json_object

DIMENSIONS = ("CI", "DO", "CU", "TU")
MIN_SCORE, MAX_SCORE = 1, 5
TOKENS_PER_CHAR = 6
PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
DEFAULT_PROMPT = "judge_v1"


@dataclass(slots=True)
class JudgeConfig:
    prompt_version: str = DEFAULT_PROMPT
    rationale_max_chars: int = 600
    temperature: float = 0.0

    def __post_init__(self) -> None:
        from medclaw.errors import ConfigError

        if not isinstance(self.rationale_max_chars, int) or not 8 <= self.rationale_max_chars <= 4000:
            raise ConfigError("judge config: rationale_max_chars must be an integer in [8, 4000]")
        if not (PROMPT_DIR / f"{self.prompt_version}.md").is_file():
            known = sorted(p.stem for p in PROMPT_DIR.glob("*.md"))
            raise ConfigError(f"judge config: no judge prompt {self.prompt_version!r}; known: {known}")

    @property
    def max_tokens(self) -> int:
        return TOKENS_PER_CHAR * self.rationale_max_chars + 64


# Judge settings a model profile needs (a table, like PROFILE_EPISODE_DEFAULTS): random tiny
# models fill every string to its maxLength, so a short rationale keeps each judge call short.
PROFILE_JUDGE_DEFAULTS: dict[str, dict] = {
    "tiny-cpu": dict(rationale_max_chars=24),
}


def judge_config_for(profile: str, section: dict | None = None) -> JudgeConfig:
    """Defaults ← the (resolved) profile's row ← a config file's `judge:` section."""
    from medclaw.errors import ConfigError

    if section is not None and not isinstance(section, dict):
        raise ConfigError("judge config: `judge:` must be a mapping")
    section = dict(section or {})
    known = {"prompt_version", "rationale_max_chars", "temperature"}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"judge config: unknown key(s) {unknown}; known: {sorted(known)}")
    return JudgeConfig(**{**PROFILE_JUDGE_DEFAULTS.get(profile, {}), **section})


def judge_schema(rationale_max_chars: int) -> dict:
    score = {"type": "integer", "minimum": MIN_SCORE, "maximum": MAX_SCORE}
    return {
        "type": "object",
        "properties": {"rationale": {"type": "string", "minLength": 1, "maxLength": rationale_max_chars},
                       **{d: dict(score) for d in DIMENSIONS}},
        "required": ["rationale", *DIMENSIONS],
        "additionalProperties": False,
    }


@dataclass(slots=True)
class JudgeScore:
    CI: int
    DO: int
    CU: int
    TU: int
    rationale: str = ""
    judged: bool = True          # False: no answer, scored 1 without asking the judge
    parsed: bool = True          # False: the judge's reply did not parse (raw kept)
    raw: str = ""
    model: str = ""
    revision: str = ""
    prompt_version: str = ""
    prompt_sha256: str = ""
    latency_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def avg(self) -> float:
        return round(sum(getattr(self, d) for d in DIMENSIONS) / len(DIMENSIONS), 4)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["avg"] = self.avg
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "JudgeScore":
        return cls(**{k: v for k, v in data.items() if k in cls.__slots__})


def load_prompt(version: str) -> tuple[str, str]:
    """(template text, sha256 of the file) of a judge prompt version."""
    data = (PROMPT_DIR / f"{version}.md").read_bytes()
    return data.decode("utf-8"), hashlib.sha256(data).hexdigest()


def parse_reply(text: str) -> dict | None:
    """The judge's JSON object with four in-range integer scores, or None."""
    data = first_json_object(text or "")
    if data is None:
        return None
    for dim in DIMENSIONS:
        value = data.get(dim)
        if isinstance(value, bool) or not isinstance(value, int) or not MIN_SCORE <= value <= MAX_SCORE:
            return None
    rationale = data.get("rationale", "")
    data["rationale"] = rationale if isinstance(rationale, str) else str(rationale)
    return data


def _window_text(window) -> str:
    return f"{window[0]:g}-{window[1]:g}" if window else "not given"


class Judge:
    """Scores answers with one judge backend (see module docstring)."""

    def __init__(self, backend, config: JudgeConfig | None = None):
        self.backend = backend
        self.config = config or JudgeConfig()
        text, self.prompt_sha256 = load_prompt(self.config.prompt_version)
        self.template = Template(text)
        self.schema = judge_schema(self.config.rationale_max_chars)

    def prompt(self, record, answer: str, evidence_times) -> str:
        evidence = ", ".join(f"{float(t):g}" for t in evidence_times) if evidence_times else "none"
        return self.template.safe_substitute(
            question=record.question, gold=record.gold, gold_window=_window_text(record.gold_window_s),
            answer=answer, evidence=evidence)

    def unjudged(self) -> JudgeScore:
        return JudgeScore(1, 1, 1, 1, rationale="no answer", judged=False,
                          prompt_version=self.config.prompt_version, prompt_sha256=self.prompt_sha256)

    async def score(self, record, answer: str | None, evidence_times=()) -> JudgeScore:
        from medclaw.types import GenRequest

        if not answer or not answer.strip():
            return self.unjudged()
        constrained = getattr(self.backend, "supports_json_schema", False)
        request = GenRequest(
            messages=[{"role": "user", "content": [
                {"type": "text", "text": self.prompt(record, answer.strip(), evidence_times)}]}],
            max_tokens=self.config.max_tokens, temperature=self.config.temperature,
            json_schema=self.schema if constrained else None, request_id=f"judge-{record.id}")
        result = await self.backend.generate_one(request)
        data = parse_reply(result.text)
        meta = dict(model=result.model_name, revision=result.model_revision,
                    prompt_version=self.config.prompt_version, prompt_sha256=self.prompt_sha256,
                    latency_s=round(result.latency_s, 4), raw=result.text)
        if data is None:
            return JudgeScore(1, 1, 1, 1, rationale="", parsed=False, **meta)
        return JudgeScore(*(data[d] for d in DIMENSIONS), rationale=data["rationale"], **meta)
