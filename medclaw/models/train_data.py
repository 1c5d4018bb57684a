"""Training and evaluation samples for the trained miniature's VLM (`models.train_tiny`).

A sample is exactly what a tool sends the frame verifier, and what it should have answered:

    Sample(system, prompt, image (H, W, 3) uint8, target, meta)

- `select_video_frame`: the whole frame at the role's image budget (`tools.media.image_size`),
  `tools.prompts.frame_prompt(t, index, query)`; target `frame_target` (what is on screen).
- `crop_video_frame`: a normalised region cut from the full-resolution frame and sized like the
  tool sizes it (source resolution within the budget), `tools.prompts.region_prompt`; target
  `region_target` (what lies in the region).
- the one-shot baseline (`eval.oneshot`): the whole video planned as that baseline plans it
  (`kernels.planner.plan_frames` under the role's budgets), its instructions and a zoom question;
  target the answer and its `EVIDENCE:` window. The recipe scores it but does not train on it
  (`train_tiny.ONESHOT_SHARE`); `random_sample(..., oneshot_share)` can mix it in.

Pixels come from the synthetic videos decoded with PyAV and cut/resized with the kernels' own
`ops.crop_box_to_pixels` + `ops.resize_crop`, the path `FrameSource` takes. Targets come from the
ground truth (`synth.truth`, `synth.zoom`), never from pixels. The only way a description can be
right is by seeing: at the whole-frame size a look-alike's mark is about 2 pixels, in a region
about 6.

The training mix (`random_sample`) leaves the model no other way: answers are drawn balanced
(kind, then name, then visit), and the prompt names a random time of the video rather than the
frame's, because with a few dozen training visits the time stamp alone would identify each one.
Held-out samples (`frame_sample`, `region_sample` without `said`) carry the true time, as the
tools send it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from medclaw.synth.truth import spoken
from medclaw.synth.zoom import LOOK_ALIKES, QUESTION_KIND, SMALL_OBJECTS, VISIT_KIND, ZoomOptions
from medclaw.tools.prompts import VIDEO_EXPERT_SYSTEM

QUERIES = (                        # what an orchestrator asks a frame tool; the reply is the same
    "Which small object is there?",
    "Dissector or bipolar?",
    "Describe what is visible.",
    "Which instruments are visible?",
    "Is there a cautery flash?",
    "What is in this region?",
)
NOTHING = "nothing of note"
# A zoom question's kind -> the description field that names its object, and what the frame tools
# are asked about it (the orchestrator's zoom calls, the VLM's held-out scores).
FIELD = {"small_object": "small object", "look_alike": "left instrument"}
QUERY = {"small_object": QUERIES[0], "look_alike": QUERIES[1]}
# The training mix (`random_sample`): whole frames vs regions, samples centred on a zoom object,
# and how the object samples split between kinds (names within a kind are equally likely).
FRAME_SHARE = 0.1
OBJECT_SHARE = 0.8
KIND_SHARE = {"small": 0.4, "look_alike": 0.4, "flash": 0.2}
# Samples of an object's spot when nothing of its kind is there (`empty_spot_sample`). Off in
# the recipe, and 0 draws nothing, so the committed checkpoints' random stream is unchanged.
# Without them the VLM reads the empty small-object spot as a gauze tag; 0.1 mended that on
# one seed of three, 0.25 on all three but cost two of them a small object (so too with the
# gauze tag in another colour; at 3200 steps, one of the two; docs/tiny-trained.md).
EMPTY_SPOT_SHARE = 0.0
WIDTH, HEIGHT, FPS = 320, 180, 25
# `crop_video` requests (`random_clip_sample`): what is asked, clip lengths (s), share over a flash
CLIP_QUERY = "When is the cautery flash, and which instrument is brought in after it?"
CLIP_SECONDS = (4.0, 12.0)
CLIP_ON_FLASH = 0.7


@dataclass(slots=True)
class Sample:
    system: str
    prompt: str
    image: object                      # (H, W, 3) uint8 numpy; a video: (T, H, W, 3)
    target: str
    meta: dict = field(default_factory=dict)
    fps: float = 0.0                   # a video's sampling rate (its metadata for the processor)

    @property
    def is_video(self) -> bool:
        return self.image.ndim == 4

    def messages(self, **media) -> list[dict]:
        """The chat the tool sends: the system turn, then the image or video and the prompt.
        `media` adds keys to the media part (the engine's `uuid`); training renders it as is."""
        part = {"type": "video" if self.is_video else "image", **media}
        return [{"role": "system", "content": [{"type": "text", "text": self.system}]},
                {"role": "user", "content": [part, {"type": "text", "text": self.prompt}]}]


def _on(items, frame: int) -> list[dict]:
    return [v for v in items if v["start_frame"] <= frame < v["end_frame"]]


def _flash_on(gt, frame: int) -> bool:
    return any(f["frame"] <= frame < f["end_frame"] for f in gt.zoom.get("flashes", []))


def frame_target(gt, frame: int) -> str:
    """What the frame verifier should say about a whole frame."""
    visits = _on(gt.zoom.get("visits", []), frame)
    small = [spoken(v["name"]) for v in visits if v["kind"] == "small"]
    left = [spoken(v["name"]) for v in visits if v["kind"] == "look_alike"]
    instruments = [spoken(n) for n in gt.instruments_at(frame)]
    return "\n".join([
        f"phase: {gt.phase_at(frame)}",
        f"instruments: {', '.join(instruments) or 'none'}",
        f"small object: {', '.join(small) or 'none'}",
        f"left instrument: {', '.join(left) or 'none'}",
        f"flash: {'yes' if _flash_on(gt, frame) else 'no'}",
    ])


def _centre_in(box, region) -> bool:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return region[0] <= cx <= region[2] and region[1] <= cy <= region[3]


def region_target(gt, frame: int, region) -> str:
    """What lies in `region` (normalised x1, y1, x2, y2): the zoom objects centred in it."""
    lines = []
    for v in _on(gt.zoom.get("visits", []), frame):
        if _centre_in(v["box"], region):
            lines.append(f"{FIELD[QUESTION_KIND[v['kind']]]}: {spoken(v['name'])}")
    for f in gt.zoom.get("flashes", []):
        if f["frame"] <= frame < f["end_frame"] and _centre_in(f["box"], region):
            lines.append("flash: yes")
    return "\n".join(sorted(lines)) or NOTHING


def read_field(text: str, key: str) -> str | None:
    """The value after `key:` in a description (first such line), or None."""
    for line in (text or "").splitlines():
        head, _, value = line.partition(":")
        if head.strip().lower() == key:
            return value.strip().lower()
    return None


def render(out_dir, seeds, minutes: float = 0.5):
    """Render zoom videos for `seeds`; returns [(SynthVideo, frames (T, H, W, 3) uint8)]."""
    import av
    import numpy as np

    from medclaw.synth.video import synthesize

    videos = []
    for seed in seeds:
        video = synthesize(f"{out_dir}/train-{seed}.mp4", minutes=minutes, seed=seed, width=WIDTH,
                           height=HEIGHT, fps=FPS, zoom=ZoomOptions.all(), progress=False)
        with av.open(str(video.path)) as container:
            frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        if len(frames) != video.gt.num_frames:
            raise RuntimeError(f"decoded {len(frames)} frames of {video.gt.num_frames} in {video.path}")
        videos.append((video, frames))
    return videos


def view(frames, index: int, spec, box=None):
    """The pixels a frame tool sends for `frames[index]` (optionally a region), like
    `tools.media.load_frame` sizes them."""
    import torch

    from medclaw.kernels.ops import crop_box_to_pixels, resize_crop
    from medclaw.tools.media import image_size

    h, w = frames.shape[1:3]
    crop_px = crop_box_to_pixels(box, w, h) if box is not None else None
    src_w, src_h = (w, h) if box is None else ((box[2] - box[0]) * w, (box[3] - box[1]) * h)
    out_w, out_h = image_size(max(1, round(src_w)), max(1, round(src_h)),
                              spec.min_pixels, spec.max_pixels)
    clip = torch.from_numpy(frames[index:index + 1])                   # (1, H, W, 3)
    return resize_crop(clip, out_w, out_h, crop_px)[0].numpy()          # (h, w, 3)


def frame_sample(gt, frames, index: int, spec, query: str, said: int | None = None) -> Sample:
    """The whole frame `index`; the prompt names frame `said` (default: `index`)."""
    from medclaw.tools import prompts

    said = index if said is None else said
    return Sample(prompts.FRAME_VERIFIER_SYSTEM,
                  prompts.frame_prompt(said / gt.fps, said, query),
                  view(frames, index, spec), frame_target(gt, index),
                  {"tool": "select_video_frame", "frame": index})


def region_sample(gt, frames, index: int, spec, region, query: str, said: int | None = None) -> Sample:
    """A region of frame `index`; the prompt names frame `said` (default: `index`)."""
    from medclaw.tools import prompts

    said = index if said is None else said
    region = tuple(round(float(v), 2) for v in region)
    return Sample(prompts.FRAME_VERIFIER_SYSTEM,
                  prompts.region_prompt(said / gt.fps, said, region, query),
                  view(frames, index, spec, region), region_target(gt, index, region),
                  {"tool": "crop_video_frame", "frame": index, "region": region})


def planned_clip(video, frames, spec, max_tokens: int, start_s: float = 0.0,
                 end_s: float | None = None):
    """(VideoInfo, FramePlan, clip (T, h, w, 3) uint8): [start_s, end_s] of `video` (default:
    all of it) planned like the tools plan it (`kernels.planner.plan_frames` under the role's
    budgets, `max_tokens` of the context kept for the reply), cut from the decoded `frames`."""
    import torch

    from medclaw.kernels.ops import resize_crop
    from medclaw.kernels.planner import plan_frames
    from medclaw.kernels.probe import probe_video
    from medclaw.tools.media import TEXT_RESERVE_TOKENS

    info = probe_video(video.path)
    end_s = info.duration_s if end_s is None else end_s
    plan = plan_frames(info, start_s, end_s, fps=spec.fps,
                       max_frames=spec.max_frames, min_pixels=spec.min_pixels,
                       max_pixels=spec.max_pixels, total_pixels=spec.total_pixels,
                       max_visual_tokens=spec.max_model_len - max_tokens - TEXT_RESERVE_TOKENS)
    clip = resize_crop(torch.from_numpy(frames[list(plan.frame_indices)]), plan.width, plan.height)
    return info, plan, clip.numpy()


def oneshot_sample(video, frames, spec, kind: str, t: float) -> Sample:
    """The one-shot baseline's request about the `kind` zoom visit at `t` of `video` (a
    SynthVideo; `frames` its decoded frames), planned like `eval.oneshot` plans it."""
    from medclaw.eval import oneshot
    from medclaw.eval.synthetic import ZOOM_WINDOW_S
    from medclaw.synth.zoom import visible_at, zoom_question
    from medclaw.tools.timeline import Window

    gt = video.gt
    info, plan, clip = planned_clip(video, frames, spec, oneshot.MAX_TOKENS)
    names = visible_at(gt.zoom, VISIT_KIND[kind], gt.frame_at(t))
    answer = spoken(names[0]) if names else "none"
    question = zoom_question(kind, t)
    window = Window(max(0.0, t - ZOOM_WINDOW_S), t + ZOOM_WINDOW_S)     # the gold window
    return Sample(VIDEO_EXPERT_SYSTEM,
                  oneshot.instructions(info.duration_s) + f"Question: {question}",
                  clip, f"{answer}\nEVIDENCE: {window}",
                  {"tool": "oneshot", "kind": kind, "time_s": t,
                   "visual_tokens": plan.num_visual_tokens}, fps=plan.fps)


def _arrivals(gt, times, frames) -> list[tuple[int, str]]:
    """(k, instrument) for each instrument brought in between samples k - 1 and k and seen to
    arrive: absent at sample k - 1, on screen at sample k (one already on screen cannot be seen
    arriving)."""
    arrivals = []
    for event in gt.events_of("instrument_in"):
        name = event["instrument"]
        k = next((k for k in range(1, len(times))
                  if times[k - 1] < event["time_s"] <= times[k] + 1e-6), None)
        if k is not None and name in gt.instruments_at(frames[k]) \
                and name not in gt.instruments_at(frames[k - 1]):
            arrivals.append((k, name))
    return sorted(arrivals)


def clip_target(gt, times) -> str:
    """What `crop_video` should say about a clip sampled at `times` (video seconds) when asked
    CLIP_QUERY: for each cautery flash some sample shows, `[first-last sample showing it]
    cautery flash`, then the first instrument seen brought in after it, `[the sample before-the
    first sample showing it] <instrument> brought in`; NOTHING when no sample shows a flash.
    Times are clip time (0 = the first sample), what a Qwen2.5-VL reads off its video positions;
    the tool shifts them into video time (`timeline.resolve_clip_timeline`)."""
    from medclaw.tools.timeline import format_time

    frames = [gt.frame_at(t) for t in times]

    def span(a: int, b: int) -> str:
        return f"[{format_time(times[a] - times[0])}-{format_time(times[b] - times[0])}]"

    arrivals = _arrivals(gt, times, frames)
    lines = []
    for flash in gt.zoom.get("flashes", []):
        seen = [k for k, frame in enumerate(frames) if flash["frame"] <= frame < flash["end_frame"]]
        if not seen:
            continue
        lines.append(f"{span(seen[0], seen[-1])} cautery flash")
        after = next(((k, name) for k, name in arrivals if k > seen[-1]), None)
        if after is not None:
            lines.append(f"{span(after[0] - 1, after[0])} {spoken(after[1])} brought in")
    return "\n".join(lines) or NOTHING


def clip_sample(video, frames, spec, start_s: float, end_s: float) -> Sample:
    """`crop_video(start_s, end_s, CLIP_QUERY)` on `video`: the clip planned as the tool plans
    it, its prompt, and `clip_target` of the frames the plan samples."""
    from medclaw.tools import prompts
    from medclaw.tools.timeline import Window

    _, plan, clip = planned_clip(video, frames, spec, prompts.TIMELINE_MAX_TOKENS, start_s, end_s)
    window = Window(plan.start_s, plan.end_s)
    return Sample(VIDEO_EXPERT_SYSTEM, prompts.crop_video_prompt(window, CLIP_QUERY), clip,
                  clip_target(video.gt, list(plan.timestamps_s)),
                  {"tool": "crop_video", "window": [plan.start_s, plan.end_s],
                   "times": list(plan.timestamps_s)}, fps=plan.fps)


def random_clip_sample(videos, spec, rng) -> Sample:
    """A `crop_video` request of CLIP_SECONDS: over a flash (CLIP_ON_FLASH; the flash anywhere
    but the last second of it) or anywhere."""
    video, frames = _pick(rng, videos)
    gt = video.gt
    duration = gt.num_frames / gt.fps
    length = min(duration, rng.uniform(*CLIP_SECONDS))
    flashes = gt.zoom.get("flashes", [])
    if flashes and rng.uniform() < CLIP_ON_FLASH:
        start = _pick(rng, flashes)["time_s"] - rng.uniform(0.5, length - 1.0)
    else:
        start = rng.uniform(0.0, duration - length)
    start = round(max(0.0, min(start, duration - length)), 1)
    return clip_sample(video, frames, spec, start, round(start + length, 1))


def _jitter(box, rng, amount: float):
    x1, y1, x2, y2 = (b + rng.uniform(-amount, amount) for b in box)
    x1, y1 = max(0.0, x1), max(0.0, y1)
    x2, y2 = min(1.0, max(x2, x1 + 0.05)), min(1.0, max(y2, y1 + 0.05))
    return x1, y1, x2, y2


def _objects(videos) -> dict:
    """{kind: {name: [(video index, item)]}} over the zoom visits and flashes of `videos`."""
    table: dict = {}
    for k, (video, _) in enumerate(videos):
        zoom = video.gt.zoom
        items = zoom["visits"] + [dict(f, kind="flash", name="flash", start_frame=f["frame"])
                                  for f in zoom["flashes"]]
        for item in items:
            table.setdefault(item["kind"], {}).setdefault(item["name"], []).append((k, item))
    return table


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _pick_visit(rng, table: dict, kind: str):
    """(video index, item) of `kind` from an `_objects` table: a name first, then one of its
    items, so every name is equally likely however often it appears."""
    return _pick(rng, table[kind][_pick(rng, sorted(table[kind]))])


def _alone(gt, item, rng) -> int:
    """A frame of `item` on which no other object of its kind is on screen (in a short video two
    visits of a kind may overlap, and the later one is drawn over the earlier)."""
    same = [v for v in gt.zoom["visits"] if v["kind"] == item["kind"] and v is not item]
    frames = [f for f in range(item["start_frame"], item["end_frame"])
              if not any(v["start_frame"] <= f < v["end_frame"] for v in same)]
    return _pick(rng, frames or [item["start_frame"]])


def random_oneshot_sample(videos, spec, rng, table: dict | None = None) -> Sample:
    """The one-shot baseline's request about a zoom visit, drawn balanced like the frame samples
    (kind, then name, then visit) at a time when no other object of its kind is on screen."""
    table = table or _objects(videos)
    kind = _pick(rng, tuple(VISIT_KIND.values()))
    k, item = _pick_visit(rng, table, kind)
    video, frames = videos[k]
    t = round(_alone(video.gt, item, rng) / video.gt.fps, 1)
    return oneshot_sample(video, frames, spec, QUESTION_KIND[kind], t)


def random_sample(videos, spec, rng, oneshot_share: float = 0.0) -> Sample:
    """One training sample: the one-shot baseline's request about a zoom visit (`oneshot_share`), or
    a whole frame (FRAME_SHARE) or a region, centred on a zoom object (OBJECT_SHARE) or anywhere. Objects are drawn by kind (KIND_SHARE), then by name, then by
    visit, so every answer is equally frequent and the prior says nothing. The prompt names a
    random time of the video, not the frame's: with a few dozen training visits, the time stamp
    alone would identify the answer, and the model would learn that instead of looking."""
    if EMPTY_SPOT_SHARE and rng.uniform() < EMPTY_SPOT_SHARE:
        return empty_spot_sample(videos, spec, rng)
    table = _objects(videos)
    if rng.uniform() < oneshot_share:                # a visit's question, asked of the whole video
        return random_oneshot_sample(videos, spec, rng, table)
    if rng.uniform() < OBJECT_SHARE and table:
        kinds = [k for k in KIND_SHARE if k in table]
        kind = kinds[int(rng.choice(len(kinds), p=[KIND_SHARE[k] / sum(KIND_SHARE[j] for j in kinds)
                                                   for k in kinds]))]
        k, item = _pick_visit(rng, table, kind)
        video, frames = videos[k]
        index = _alone(video.gt, item, rng)
    else:
        item = None
        video, frames = _pick(rng, videos)
        index = int(rng.integers(video.gt.num_frames))
    gt = video.gt
    said = int(rng.integers(gt.num_frames))
    query = _pick(rng, QUERIES)
    if rng.uniform() < FRAME_SHARE:
        return frame_sample(gt, frames, index, spec, query, said)
    if item is not None:
        box = _jitter(item["box"], rng, 0.02)
    else:                                       # any other region: mostly nothing of note
        x1, y1 = rng.uniform(0, 0.8), rng.uniform(0.1, 0.8)
        box = (x1, y1, min(1.0, x1 + rng.uniform(0.08, 0.3)), min(1.0, y1 + rng.uniform(0.08, 0.3)))
    return region_sample(gt, frames, index, spec, box, query, said)


def empty_spot_sample(videos, spec, rng) -> Sample:
    """A region of a zoom object's box (jittered), on a frame (of every fifth) at which no object
    of its kind is on screen: target `NOTHING` unless another kind's object lies there."""
    from medclaw.synth.zoom import visible_at

    table = _objects(videos)
    kind = _pick(rng, [k for k in VISIT_KIND.values() if k in table])
    k, item = _pick_visit(rng, table, kind)
    video, frames = videos[k]
    gt = video.gt
    index = _pick(rng, [f for f in range(0, gt.num_frames, 5) if not visible_at(gt.zoom, kind, f)])
    box = _jitter(item["box"], rng, 0.02)
    query = _pick(rng, QUERIES)
    return region_sample(gt, frames, index, spec, box, query, int(rng.integers(gt.num_frames)))


def zoom_questions(videos):
    """(video, frames, question) for every question of `videos` about a zoom object (FIELD's
    kinds): the held-out items the VLM's scores read."""
    for video, frames in videos:
        for q in video.gt.zoom["qa"]:
            if q["kind"] in FIELD:
                yield video, frames, q


def corpus(clips: bool = False) -> list[str]:
    """Texts the miniature's tokenizer is trained on: the tools' prompts and the targets' words,
    so a prompt and a description are a handful of tokens each; with `clips`, also the
    `crop_video` request and timeline lines (`clip_sample`)."""
    from medclaw.synth.truth import INSTRUMENTS, PHASES
    from medclaw.tools import prompts

    texts = [prompts.FRAME_VERIFIER_SYSTEM, prompts.VIDEO_EXPERT_SYSTEM, *QUERIES, NOTHING]
    for k in range(40):
        t = k * 1.7
        texts.append(prompts.frame_prompt(t, int(t * FPS), QUERIES[k % len(QUERIES)]))
        texts.append(prompts.region_prompt(t, int(t * FPS), (0.61, 0.39, 0.71, 0.57),
                                           QUERIES[k % len(QUERIES)]))
    names = [spoken(n) for n in [*INSTRUMENTS, *SMALL_OBJECTS, *LOOK_ALIKES]]
    texts += [f"phase: {p}" for p in PHASES]
    texts += [f"instruments: {n}" for n in names] + [f"small object: {n}" for n in names]
    texts += [f"left instrument: {n}" for n in names] + ["flash: yes", "flash: no", "none"]
    if clips:
        from medclaw.tools.timeline import Window, format_time

        texts += [CLIP_QUERY] + [prompts.crop_video_prompt(Window(k * 2.3, k * 2.3 + 9.5), CLIP_QUERY)
                                 for k in range(10)]
        for k in range(30):
            span = f"[{format_time(k * 0.45)}-{format_time(k * 0.45 + 0.5)}]"
            texts += [f"{span} cautery flash", f"{span} {names[k % len(INSTRUMENTS)]} brought in"]
    return texts
