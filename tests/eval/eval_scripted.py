"""Scripted models for evaluation and distillation tests (agent-logic fakes, docs/architecture.md
"Testing"): the orchestrator answers from a table, the judge scores from a table, the VLM gives a
one-shot answer. Everything else — probing, frames, episodes, traces, the results log, reports,
the CLI — is the real code. `install()` makes `open_runtime` build such a runtime, also inside a
subprocess (the kill -9 test runs the real `medclaw eval` in one)."""
from __future__ import annotations

import asyncio
import json

from medclaw.engine.backends.fake import ScriptedBackend
from medclaw.requests.conversation import message_text as text_of


def question_of(request) -> str:
    """The question of an episode (its first user turn ends with `Question: …`)."""
    first = next(m for m in request.messages if m["role"] == "user")
    return text_of(first).rsplit("Question:", 1)[1].strip()


def system_of(request) -> str:
    return text_of(request.messages[0]) if request.messages[0]["role"] == "system" else ""


class SlowScripted(ScriptedBackend):
    """A scripted backend that takes `delay_s` per request (so a test can kill a run mid-way)."""

    def __init__(self, script, delay_s: float = 0.0, **kw):
        super().__init__(script, **kw)
        self.delay_s = delay_s

    async def generate(self, requests):
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return await super().generate(requests)


def answering_orchestrator(answer_for):
    """final_answer at once, with `answer_for(question, system_prompt)` as the text."""

    def reply(request) -> str:
        answer = answer_for(question_of(request), system_of(request))
        return json.dumps({"thought": "", "tool": "final_answer",
                           "args": {"text": answer, "evidence_times": [1.0, 2.0]}})

    return reply


def scoring_judge(score_for):
    """The judge: `score_for(question, answer) -> int` on every dimension."""

    def reply(request) -> str:
        prompt = text_of(request.messages[0])
        question = prompt.split("\nQuestion: ", 1)[1].split("\n", 1)[0]
        answer = prompt.split("\nCandidate answer: ", 1)[1].split("\nCandidate evidence", 1)[0]
        score = score_for(question, answer)
        return json.dumps({"rationale": "scripted", "CI": score, "DO": score, "CU": score, "TU": score})

    return reply


def oneshot_vlm(request) -> str:
    return "The grasper is in view.\nEVIDENCE: [00:01.0-00:03.0]"


def scripted_specs(folder) -> dict:
    from medclaw.models.spec import ModelSpec

    vlm = dict(backend="fake", fps=1.0, max_frames=16, min_pixels=4 * 28 * 28,
               max_pixels=64 * 28 * 28, total_pixels=512 * 28 * 28, max_model_len=32768)
    return {"orchestrator": ModelSpec(name="scripted-llm", path=str(folder), backend="fake"),
            "judge": ModelSpec(name="scripted-judge", path=str(folder), backend="fake"),
            "video_expert": ModelSpec(name="scripted-vlm", path=str(folder), **vlm),
            "frame_verifier": ModelSpec(name="scripted-vlm", path=str(folder), **vlm)}


def scripted_runtime(folder, orchestrator, judge, vlm=None, skills=None):
    from medclaw.engine.runtime import Runtime
    from medclaw.skills.library import SkillLibrary

    vlm = vlm or ScriptedBackend(oneshot_vlm, model_name="scripted-vlm", model_revision="v1")
    return Runtime(scripted_specs(folder), skills=skills if skills is not None else SkillLibrary(),
                   backends={"orchestrator": orchestrator, "judge": judge, "video_expert": vlm,
                             "frame_verifier": vlm})


def install(folder, delay_s: float = 0.0, vlm_revision: str = "v1"):
    """Make `open_runtime` (what the CLI calls) build a scripted runtime. Returns the opened list."""
    import medclaw.engine.runtime as runtime_module
    from medclaw.skills.library import SkillLibrary

    opened = []

    def fake_open_runtime(**kwargs):
        orchestrator = SlowScripted(answering_orchestrator(lambda q, s: "the grasper"), delay_s,
                                    model_name="scripted-llm", model_revision="r1")
        judge = SlowScripted(scoring_judge(lambda q, a: 4 if "grasper" in a else 2), delay_s,
                             model_name="scripted-judge", model_revision="j1")
        vlm = SlowScripted(oneshot_vlm, delay_s, model_name="scripted-vlm", model_revision=vlm_revision)
        skills = SkillLibrary([kwargs["skills_dir"]] if kwargs.get("skills_dir") else None)
        runtime = scripted_runtime(folder, orchestrator, judge, vlm, skills)
        opened.append(runtime)
        return runtime

    runtime_module.open_runtime = fake_open_runtime
    return opened
