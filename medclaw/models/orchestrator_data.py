"""Expert episodes for the trained miniature's orchestrator (`models.train_orchestrator`).

    videos = render_videos(root, seeds, minutes)          # [(SynthVideo, VideoInfo)]
    cases = question_cases(videos)                         # a Case per zoom question
    episodes = await play_all(cases, root)                 # [Episode(case, requests, replies, ...)]

A `Case` is one zoom question (`synth.zoom`: `small_object`, `look_alike`) put to the REAL
episode loop (`engine.episode.run_episode`, real tool registry and skill index, real frame
source decoding the synthetic video, real `crop_video_frame`), in which only the two models are
scripted:

- the orchestrator is the scripted expert (`expert_reply`): it crops the kind's fixed box at the
  asked time with the kind's query; when the observation names an object it answers that name
  (the name it READ, not the question's); when the observation is an error or "nothing of note",
  it crops once more with the box widened by `WIDEN` on each side, then answers what that shows
  (or `NOT_SEEN`);
- the frame verifier replies as the case says (`Case.replies`, one per crop): `IDEAL` is
  `train_data.region_target` of the decoded frame and the region asked (what a perfect verifier
  says), a name is said whatever the pixels hold (so a student must trust what it reads, not
  the question or the time), `NOTHING` and `EMPTY` (an empty reply, which the tool turns into
  an error observation) make the expert widen the box.

The orchestrator's requests are recorded, so the training text is, by construction, what an
episode sends (`train_orchestrator.encode_episode` renders each with the engine's own chat
rendering and checks that every earlier prompt + reply is a prefix of the next prompt).
"""
from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from medclaw.models.train_data import FIELD, NOTHING, QUERY, region_target
from medclaw.synth.truth import spoken
from medclaw.synth.zoom import LOOK_ALIKES, SMALL_OBJECTS

NAMES = {"small_object": [spoken(n) for n in SMALL_OBJECTS],
         "look_alike": [spoken(n) for n in LOOK_ALIKES]}
THOUGHT = {"small_object": "Zoom on the small object spot at that time.",
           "look_alike": "Zoom on the left instrument at that time.",
           "widen": "Nothing clear there: zoom again on a wider region.",
           "answer": "Answer with the name the region shows."}
# With QUOTE_IN_THOUGHTS (off in the recipe) the expert's thoughts quote what its action then
# copies: the asked time as the question writes it ("At 7.7 s, zoom on the left instrument.")
# and the line the observation read ("The region reads left instrument: dissector."), in the
# words of the source ("at 12.6 s" and "At 7.7 s," as synth.zoom's questions put them), so each
# copied token follows the same tokens as in its source: a copy an induction head makes.
# Trained alone, seeds 0-3 named no look-alike wrongly (the recipe's seed 1: half of them);
# not yet retrained into the committed miniature (train_orchestrator's Status).
QUOTE_IN_THOUGHTS = False
QUOTED = {"small_object": "Zoom on the small object spot at {asked}.",
          "look_alike": "At {asked}, zoom on the left instrument.",
          "answer": "The region reads {field}: {name}."}
WIDEN = 0.05
NOT_SEEN = "not seen"
IDEAL, EMPTY = "<ideal>", ""                    # verifier behaviours besides NOTHING and a name
_OBSERVED_RE = re.compile(r"(small object|left instrument): ([a-z][a-z ]*)")
ASKED_TIME_RE = re.compile(r"\d+(?:\.\d+)? s\b")        # "7.7 s", "17 s" in a question
_REGION_RE = re.compile(r"x (\d+\.\d+)-(\d+\.\d+), y (\d+\.\d+)-(\d+\.\d+) of the frame")


@dataclass(slots=True)
class Case:
    """One episode to play: a zoom question about one video and what the verifier will say."""

    video: str                      # path of the synthetic video
    info: object                    # its VideoInfo (probed once per video)
    gt: object                      # its GroundTruth
    kind: str                       # "small_object" | "look_alike"
    question: str
    time_s: float                   # the time the question asks about (0.1 s steps)
    box: tuple                      # the kind's box, rounded to 2 decimals
    replies: list = field(default_factory=lambda: [IDEAL])   # the verifier's, per crop


@dataclass(slots=True)
class Episode:
    case: Case
    requests: list                  # the orchestrator's GenRequests, in order
    replies: list                   # the orchestrator's reply text to each
    expected: list                  # the expert's reply to each same request
    status: str
    answer: str | None
    trace: str | None = None        # the episode's trace file (the real loop writes one)


def number(value: float):
    """A time or box edge as the expert writes it: an int when whole (as `{t:g}` prints it)."""
    value = round(float(value), 2)
    return int(value) if value == int(value) else value


def action(thought: str, tool: str, args: dict) -> str:
    """One action as compact JSON in the schema's key order (what constrained decoding emits)."""
    return json.dumps({"thought": thought, "tool": tool, "args": args}, separators=(",", ":"))


def widen(box) -> tuple:
    x1, y1, x2, y2 = box
    return (round(max(0.0, x1 - WIDEN), 2), round(max(0.0, y1 - WIDEN), 2),
            round(min(1.0, x2 + WIDEN), 2), round(min(1.0, y2 + WIDEN), 2))


def crop_args(case: Case, box) -> dict:
    x1, y1, x2, y2 = box
    return {"time_s": number(case.time_s), "x1": number(x1), "y1": number(y1), "x2": number(x2),
            "y2": number(y2), "query": QUERY[case.kind]}


def observed_name(text: str, kind: str) -> str | None:
    """The name an observation reports for the kind's field, or None (nothing, or an error)."""
    if text.startswith("Error at step"):
        return None
    for key, name in _OBSERVED_RE.findall(text):
        if key == FIELD[kind]:
            return name.strip()
    return None


def expert_reply(case: Case, request) -> str:
    """The expert's next action on the conversation of `request` (see the module docstring)."""
    from medclaw.requests.conversation import message_text

    messages = request.messages
    done = sum(1 for m in messages if m["role"] == "assistant")
    if done == 0:
        return action(thought(case, case.kind), "crop_video_frame", crop_args(case, case.box))
    name = observed_name(message_text(messages[-1]), case.kind)
    if name is None and done == 1:
        return action(THOUGHT["widen"], "crop_video_frame", crop_args(case, widen(case.box)))
    return action(thought(case, "answer", name), "final_answer",
                  {"text": name or NOT_SEEN, "evidence_times": [number(case.time_s)]})


def thought(case: Case, step: str, name: str | None = None) -> str:
    """The expert's thought before its first crop (`step` the case's kind) or its answer
    ("answer", `name` the name read or None): THOUGHT's, or QUOTED's with QUOTE_IN_THOUGHTS."""
    if not QUOTE_IN_THOUGHTS or (step == "answer" and name is None):
        return THOUGHT[step]
    return QUOTED[step].format(asked=ASKED_TIME_RE.search(case.question).group(),
                               field=FIELD[case.kind], name=name)


def verifier_reply(case: Case, request, calls: list) -> str:
    """What the scripted frame verifier says to its `len(calls)`-th request of the episode."""
    from medclaw.requests.conversation import message_text

    behaviour = case.replies[min(len(calls), len(case.replies) - 1)]
    calls.append(request)
    if behaviour != IDEAL:
        return behaviour if behaviour in (EMPTY, NOTHING) else f"{FIELD[case.kind]}: {behaviour}"
    found = _REGION_RE.search(message_text(request.messages[-1]))
    if found is None:                  # a whole frame: not what this expert asks for
        return NOTHING
    box = tuple(float(v) for v in found.groups())     # x1, x2, y1, y2 as the prompt writes them
    frame = request.media[-1].frame_indices[0]
    return region_target(case.gt, frame, (box[0], box[2], box[1], box[3]))


class Recorder:
    """A backend wrapper that keeps every request and reply (the orchestrator's side of an
    episode) and, when given an `expert`, the expert's reply to each same request."""

    def __init__(self, inner, expert=None):
        self.inner, self.expert = inner, expert
        self.supports_json_schema = inner.supports_json_schema
        self.supports_media = inner.supports_media
        self.model_name = getattr(inner, "model_name", "recorded")
        self.requests: list = []
        self.replies: list = []
        self.expected: list = []

    async def generate(self, requests):
        results = await self.inner.generate(requests)
        for request, result in zip(requests, results):
            self.requests.append(request)
            self.replies.append(result.text)
            if self.expert is not None:
                self.expected.append(self.expert(request))
        return results

    async def generate_one(self, request):
        return (await self.generate([request]))[0]

    async def close(self) -> None:
        """The inner backend belongs to the caller."""


def make_runtime(specs: dict, orchestrator, verifier, frames=None, kb_types=None):
    """A Runtime on the given role specs whose models are the given backends; the real tool
    registry (with `kb_types` as the search tool's enum, like a loaded knowledge base's) and the
    shipped skill library."""
    from medclaw.engine.runtime import Runtime, load_skill_library
    from medclaw.tools.registry import default_registry

    skills = load_skill_library()
    registry = default_registry(kb_types=kb_types, skill_names=sorted(skills.names()) or None)
    return Runtime(specs, skills=skills, registry=registry, frames=frames,
                   backends={"orchestrator": orchestrator, "video_expert": verifier,
                             "frame_verifier": verifier})


async def play(case: Case, specs: dict, trace_dir: str, student=None, frames=None,
               kb_types=None, max_steps: int = 4) -> Episode:
    """Run `case` through the real episode loop with the scripted verifier. The orchestrator is
    the scripted expert, or `student` (any backend), whose every request the expert also
    answers (`Episode.expected`) so the two can be compared step by step."""
    from medclaw.engine.backends.fake import ScriptedBackend
    from medclaw.engine.config import EpisodeConfig
    from medclaw.engine.episode import run_episode

    calls: list = []
    verifier = ScriptedBackend(lambda request: verifier_reply(case, request, calls),
                               model_name="scripted-verifier")
    expert = lambda request: expert_reply(case, request)            # noqa: E731
    inner = student or ScriptedBackend(expert, model_name="expert")
    recorder = Recorder(inner, expert)
    runtime = make_runtime(specs, recorder, verifier, frames, kb_types)
    config = EpisodeConfig(max_steps=max_steps, trace_dir=trace_dir)
    result = await run_episode(case.question, case.video, runtime, config, video_info=case.info)
    # not runtime.close(): the frame source and the student belong to the caller, and the
    # scripted backends hold nothing
    return Episode(case=case, requests=recorder.requests, replies=recorder.replies,
                   expected=recorder.expected, status=result.status, answer=result.answer,
                   trace=result.trace_path)


# ----------------------------------------------------- videos, cases, playing them all

def role_specs(root: Path) -> dict:
    """Role specs for playing episodes: scripted models, the tiny-trained verifier's budgets."""
    from medclaw.models.spec import ModelSpec
    from medclaw.models.train_tiny import MAX_PIXELS, MIN_PIXELS

    vlm = dict(backend="fake", min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    return {"orchestrator": ModelSpec(name="expert", path=str(root / "expert"), backend="fake"),
            "video_expert": ModelSpec(name="verifier", path=str(root / "verifier"), **vlm),
            "frame_verifier": ModelSpec(name="verifier", path=str(root / "verifier"), **vlm)}


def render_videos(root: Path, seeds, minutes) -> list:
    """[(SynthVideo, VideoInfo)] for `seeds` (minutes: one length, or lengths cycled)."""
    from medclaw.kernels.probe import probe_video
    from medclaw.models.train_data import FPS, HEIGHT, WIDTH
    from medclaw.synth.video import synthesize
    from medclaw.synth.zoom import ZoomOptions

    lengths = minutes if isinstance(minutes, (tuple, list)) else (minutes,)
    videos = []
    for k, seed in enumerate(seeds):
        video = synthesize(root / f"orch-{seed}.mp4", minutes=lengths[k % len(lengths)], seed=seed,
                           width=WIDTH, height=HEIGHT, fps=FPS, zoom=ZoomOptions.all(), progress=False)
        videos.append((video, probe_video(str(video.path))))
    return videos


def question_cases(videos) -> list:
    """A Case per small-object / look-alike question of `videos`, with an ideal verifier."""
    cases = []
    for video, info in videos:
        for q in video.gt.zoom["qa"]:
            if q["kind"] in FIELD:
                cases.append(Case(str(video.path), info, video.gt, q["kind"], q["question"],
                                  float(q["evidence_times_s"][0]), tuple(round(b, 2) for b in q["box"])))
    return cases


async def play_all(cases, root: Path, student=None, kb_types=None, kb_share: float = 0.0,
                   rng=None) -> list:
    """Play every case (concurrently, on one shared frame source); `kb_share` of them with
    `kb_types` as the search tool's enum."""
    from medclaw.kernels.frames import FrameSource

    specs = role_specs(root)
    frames = FrameSource()
    limit = asyncio.Semaphore(8 if student is None else 1)

    async def one(case):
        drawn = kb_share >= 1.0 or (rng is not None and rng.uniform() < kb_share)
        kb = kb_types if drawn else None
        async with limit:
            return await play(case, specs, str(root / "traces"), student=student, frames=frames,
                              kb_types=kb)

    try:
        return list(await asyncio.gather(*(one(c) for c in cases)))
    finally:
        frames.close()


def shipped_kb_types() -> list[str]:
    """The passage types of the shipped knowledge base (`medclaw demo` builds it): the search
    tool's enum, hence the system prompt, when a runtime has that KB."""
    from medclaw.kb.build import shipped_corpus_dir
    from medclaw.kb.passages import read_corpus

    passages, _ = read_corpus(shipped_corpus_dir())
    return sorted({p.type for p in passages})
