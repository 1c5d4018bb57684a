"""The video tools against the REAL vLLM CPU engine on the tiny VLM (random weights).

Random weights write garbage, so the stage-1 reply text is replaced by a scripted one *after* the
real engine has run the request (`ReplaceText`): the engine still computes and caches the real
prompt, which is what these tests check — stage 2 extends stage 1 so its prefix comes from the
cache, and a second question on the same video reuses the whole-video prefix. Frame tools check
that image media built by the tools go through the real processor.
"""
from __future__ import annotations

import pytest

from medclaw.engine.backends.base import Backend
from medclaw.tools.base import ToolContext
from medclaw.tools.registry import default_registry

pytestmark = [pytest.mark.engine, pytest.mark.slow]

P = 28 * 28
BLOCK = 32          # vllm_local.CPU_BLOCK_SIZE: prefix caching reuses whole blocks only
STAGE1 = "[00:00-00:20] preparation\n[00:20-00:40] clipping\n[00:40-01:00] closure\nWINDOW: [00:20-00:30]"


class ReplaceText(Backend):
    """Runs every request on the real engine, then swaps the text for scripted replies."""

    supports_media = True

    def __init__(self, engine, replies):
        self.engine, self.replies, self.results = engine, list(replies), []

    async def generate(self, requests):
        results = await self.engine.generate(requests)
        for result in results:
            if self.replies:
                result.text = self.replies.pop(0)
            self.results.append(result)
        return results


@pytest.fixture(scope="module")
def video(synth_video):
    from medclaw.kernels.probe import probe_video

    return probe_video(synth_video.path)


def make_ctx(video, backend, engine):
    from medclaw.kernels.frames import FrameSource
    from medclaw.models.spec import ModelSpec

    spec = ModelSpec(name="tiny-vlm", path=str(engine.spec.path), max_model_len=8192, fps=0.5,
                     max_frames=32, min_pixels=4 * P, max_pixels=64 * P, total_pixels=512 * P)
    return ToolContext(video=video, question="q", backends={"video_expert": backend,
                                                            "frame_verifier": backend},
                       specs={"video_expert": spec, "frame_verifier": spec}, frames=FrameSource())


async def test_stage2_and_second_question_hit_the_prefix_cache(vlm_engine, video):
    registry = default_registry()
    first = ReplaceText(vlm_engine, [STAGE1, "WINDOW: [00:22-00:26]"])
    obs = await registry.run(make_ctx(video, first, vlm_engine), "view_full_video",
                             {"query": "when is the vessel clipped?"})
    assert obs.error is None, obs.error
    stage1, stage2 = first.results
    assert stage1.num_prompt_tokens > 100                      # the whole video went in
    # stage 2's prompt starts with stage 1's prompt: all its full blocks come from the cache
    assert stage2.num_prompt_tokens > stage1.num_prompt_tokens
    assert stage2.num_cached_tokens >= stage1.num_prompt_tokens - BLOCK, (stage1, stage2)

    second = ReplaceText(vlm_engine, [STAGE1, "WINDOW: [00:22-00:26]"])
    await registry.run(make_ctx(video, second, vlm_engine), "view_full_video",
                       {"query": "is there any bleeding?"})
    again = second.results[0]
    print(f"\nstage1 prompt {stage1.num_prompt_tokens} cached {stage1.num_cached_tokens}; "
          f"stage2 prompt {stage2.num_prompt_tokens} cached {stage2.num_cached_tokens}; "
          f"2nd question stage1 prompt {again.num_prompt_tokens} cached {again.num_cached_tokens}")
    # a new question on the same video: everything up to the query is reused (query ≈ 10 tokens)
    assert again.num_cached_tokens >= again.num_prompt_tokens - 2 * BLOCK, again


async def test_frame_tools_run_on_the_engine(vlm_engine, video):
    backend = ReplaceText(vlm_engine, [])
    ctx = make_ctx(video, backend, vlm_engine)
    registry = default_registry()
    for name, args in [("select_video_frame", {"time_s": 12.0, "query": "what is visible?"}),
                       ("crop_video_frame", {"time_s": 12.0, "x1": 0.1, "y1": 0.2, "x2": 0.6,
                                             "y2": 0.8, "query": "zoom"}),
                       ("crop_video", {"start_s": 10.0, "end_s": 20.0, "query": "describe"})]:
        obs = await registry.run(ctx, name, args)
        # random weights may answer only whitespace: then the tool says so plainly
        assert obs.error is None or "empty description" in obs.error, obs.error
    assert len(backend.results) == 3
    assert all(r.num_prompt_tokens > 10 and r.model_name == "tiny-vlm" for r in backend.results)
    assert ctx.visual_tokens_used > 0
