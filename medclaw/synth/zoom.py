"""Optional content worth zooming into: what one low-resolution pass cannot resolve but a crop can.

`ZoomOptions` (all off by default: a video made without it is byte-for-byte what it always was)
adds, on a random stream of its own (`seed`, 101), so the base schedule is never disturbed:

- small instruments (`small_instruments`): tiny objects (`SMALL_OBJECTS`, a few pixels at
  the video's size) that lie in a fixed spot of the field for a few seconds each;
- look-alike instruments (`look_alikes`): two instruments of one colour and one shape
  (`LOOK_ALIKES`), told apart only by a small mark at the tip of one of them (`MARK_PATTERN`:
  a white square, or one-pixel stripes that a downscaled whole frame averages away);
- short events (`short_events`): cautery flashes lasting `FLASH_S` seconds, shorter than the
  gap between frames of a whole-video pass, each followed by an instrument brought in.

Ground truth goes to `GroundTruth.zoom` (absent from the JSON when no option is on):
    options      the ZoomOptions as a dict
    mark_pattern "stripes" when the look-alike mark is striped (absent: the solid white mark)
    visits       [{kind: "small" | "look_alike", name, start_s, end_s, start_frame, end_frame,
                   box: [x1, y1, x2, y2]}]   box: normalised to the frame, where the object is drawn
    flashes      [{time_s, frame, end_frame, box, instrument_in_after: {instrument, time_s} | None}]
    qa           [{id, kind, question, answer, answer_value, evidence_times_s, box?}]
                 kinds: small_object, look_alike, short_event (before/after a flash)
Intervals are half-open in frames, like the rest of the ground truth. Pure and deterministic.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from medclaw.synth.truth import spoken

# name -> RGB. Far from every scene tone and from the base instruments' colours.
SMALL_OBJECTS: dict[str, tuple[int, int, int]] = {
    "needle": (255, 255, 255),
    "bulldog_clamp": (0, 0, 128),
    "gauze_tag": (170, 255, 0),
}
LOOK_ALIKE_COLOR = (150, 0, 255)
MARK_COLOR = (255, 255, 255)
# How the mark is drawn. "solid": a white square (MARK_COLOR) on the marked one. "stripes"
# (`mark_columns`): on the marked one, a square of one-pixel columns, light and dark grey
# (MARK_STRIPES); on the other, the same square flat in their mean grey. Any downscale that
# averages pixels - the whole frame at 140x84 is 0.44 of a 320x180 video - sees the same grey
# square on both, while a crop at more than a pixel per pixel resolves the columns. Grey, so the
# columns differ in luma only (~172 levels), which H.264 keeps at full resolution; a first try
# in the instrument's own colour could differ in red only (~54 levels), and the encoder left
# ~a tenth of that in a region. Off: trained on grey stripes, the VLM read look-alikes only from
# the region, as meant, but read needles as gauze tags (docs/tiny-trained.md, striped mark).
MARK_PATTERN = "solid"
MARK_STRIPES = ((228, 228, 228), (28, 28, 28))
MARK_FLAT = tuple((a + b) // 2 for a, b in zip(*MARK_STRIPES))
MARK_WORDS = {"solid": "a white mark", "stripes": "a striped mark"}
# name -> carries the mark. Same colour, same shape ("fork").
LOOK_ALIKES: dict[str, bool] = {"dissector": False, "bipolar": True}
FLASH_COLOR = (255, 255, 150)
FLASH_S = 0.6

# Fixed spots (centre, fractions of the scene below the barcode): nothing else is drawn there.
SMALL_XY = (0.66, 0.42)
LOOK_ALIKE_XY = (0.34, 0.40)
FLASH_XY = (0.44, 0.86)
SMALL_FRACTION = 0.05         # of the scene height: a few pixels at 320x180
MARK_FRACTION = 0.07          # the look-alike mark, of the scene height: ~5 px of a whole frame seen at 140x84, ~18 px of a region
LOOK_ALIKE_FRACTION = 0.16    # the look-alike sprite, of the scene height
FLASH_FRACTION = 0.05         # flash radius, of the scene height
# A visit's box (a question's `box`: what a well-aimed crop covers) pads the object by these
# fractions of its size on each side.
SMALL_PAD = 1.5
LOOK_ALIKE_PAD = 0.15
VISITS_PER_KIND = 2
FLASHES = 2


@dataclass(slots=True, frozen=True)
class ZoomOptions:
    small_instruments: bool = False
    short_events: bool = False
    look_alikes: bool = False

    @classmethod
    def all(cls) -> "ZoomOptions":
        return cls(True, True, True)

    @property
    def any(self) -> bool:
        return self.small_instruments or self.short_events or self.look_alikes

    def to_dict(self) -> dict:
        return asdict(self)


def geometry(width: int, height: int) -> dict:
    """Pixel geometry shared by the schedule (boxes) and the renderer: top of the scene, sizes."""
    from medclaw.synth.barcode import strip_height
    from medclaw.synth.draw import even

    top = even(strip_height(height) + 0.5)
    scene_h = height - top
    return {"top": top, "scene_h": scene_h,
            "small": max(4, even(SMALL_FRACTION * scene_h)),
            "mark": max(4, even(MARK_FRACTION * scene_h)),
            "look_alike": max(12, even(LOOK_ALIKE_FRACTION * scene_h)),
            "flash_r": max(3, even(FLASH_FRACTION * scene_h))}


def corner(xy: tuple[float, float], size: int, width: int, height: int) -> tuple[int, int]:
    """Top-left (x, y) of a `size` square centred on a scene spot, snapped to even pixels."""
    from medclaw.synth.draw import even

    g = geometry(width, height)
    return even(xy[0] * width - size / 2), even(g["top"] + xy[1] * g["scene_h"] - size / 2)


def _box(x: int, y: int, w: int, h: int, width: int, height: int, pad: float) -> list[float]:
    """The object's box, padded by `pad` of its size, normalised and clamped to the frame."""
    px, py = pad * w, pad * h
    return [round(max(0.0, (x - px) / width), 4), round(max(0.0, (y - py) / height), 4),
            round(min(1.0, (x + w + px) / width), 4), round(min(1.0, (y + h + py) / height), 4)]


def make_zoom_truth(options: ZoomOptions, seed: int, num_frames: int, fps: float, width: int,
                    height: int, arrivals: list[dict]) -> dict:
    """The `zoom` section of a ground truth (see the module docstring). `arrivals` are the base
    schedule's `instrument_in` events (for the instrument brought in after a flash)."""
    import numpy as np

    rng = np.random.default_rng([seed, 101])
    g = geometry(width, height)
    duration = num_frames / fps
    visits: list[dict] = []
    # Visits sit in disjoint slots of the middle 90 % of the video, so no two of one kind overlap.
    kinds = []
    if options.small_instruments:
        kinds.append(("small", list(SMALL_OBJECTS), SMALL_XY, g["small"], SMALL_PAD))
    if options.look_alikes:
        kinds.append(("look_alike", list(LOOK_ALIKES), LOOK_ALIKE_XY, g["look_alike"], LOOK_ALIKE_PAD))
    for kind, names, xy, size, pad in kinds:
        slots = rng.permutation(6)[:VISITS_PER_KIND]
        for slot in sorted(int(s) for s in slots):
            lo = 0.05 + slot * 0.15
            start_s = (lo + rng.uniform(0.01, 0.05)) * duration
            length_s = max(2.0, rng.uniform(0.05, 0.08) * duration)
            start, end = int(round(start_s * fps)), min(num_frames, int(round((start_s + length_s) * fps)))
            name = names[int(rng.integers(len(names)))]
            x, y = corner(xy, size, width, height)
            visits.append({"kind": kind, "name": name, "start_s": start / fps, "end_s": end / fps,
                           "start_frame": start, "end_frame": end,
                           "box": _box(x, y, size, size, width, height, pad)})
    flashes: list[dict] = []
    if options.short_events:
        r = g["flash_r"]
        x, y = corner(FLASH_XY, 2 * r, width, height)
        for k in range(FLASHES):
            t = (0.15 + 0.40 * k + rng.uniform(0.0, 0.30)) * duration
            frame = int(round(t * fps))
            end = min(num_frames, frame + max(1, int(round(FLASH_S * fps))))
            after = [a for a in arrivals if a["frame"] > frame]
            flashes.append({"time_s": frame / fps, "frame": frame, "end_frame": end,
                            "box": _box(x, y, 2 * r, 2 * r, width, height, 0.5),
                            "instrument_in_after": ({"instrument": after[0]["instrument"],
                                                     "time_s": after[0]["time_s"]} if after else None)})
    zoom = {"options": options.to_dict(), "visits": visits, "flashes": flashes}
    if MARK_PATTERN != "solid":               # the solid mark's truth stays as it always was
        zoom["mark_pattern"] = MARK_PATTERN
    zoom["qa"] = _zoom_qa(zoom, rng)
    return zoom


def mark_square(width: int, height: int) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1) of the look-alike mark: at the tip of the shaft, where the jaws meet."""
    g = geometry(width, height)
    size, m = g["look_alike"], g["mark"]
    x, y = corner(LOOK_ALIKE_XY, size, width, height)
    x0, y0 = x + even_int(0.55 * size) - m // 2, y + even_int(0.5 * size) - m // 2
    return y0, y0 + m, x0, x0 + m


def mark_columns(size: int):
    """(size, 3) uint8 RGB, column by column, of the striped mark: MARK_STRIPES alternating, the
    first and last column half-way to their mean. Without that taper a downscale's window that
    takes in an edge column and not its partner leaves the edge ~27 levels off the flat square's;
    with it, under 8 (`tests/synth/test_zoom.py`)."""
    import numpy as np

    light, dark = (np.asarray(c, np.float64) for c in MARK_STRIPES)
    columns = np.stack([light if k % 2 == 0 else dark for k in range(size)])
    mean = (light + dark) / 2
    columns[[0, -1]] = (columns[[0, -1]] + mean) / 2
    return np.round(columns).astype(np.uint8)


def visible_at(zoom: dict, kind: str, frame: int) -> list[str]:
    """Names of the `kind` visits on screen at `frame`."""
    return sorted(v["name"] for v in zoom.get("visits", [])
                  if v["kind"] == kind and v["start_frame"] <= frame < v["end_frame"])


EMPTY_SHIFTS_S = (-5, 5, -8, 8, -12, 12, -3, 3)    # tried in order from a question's time


def empty_time(gt, kind: str, t: float) -> float | None:
    """The first of t + EMPTY_SHIFTS_S inside the video at which no `kind` visit is on screen:
    when a crop of a question's spot shows nothing of its kind (None if there is none)."""
    return next((t + d for d in EMPTY_SHIFTS_S if 0 <= t + d < gt.duration_s
                 and not visible_at(gt.zoom, kind, gt.frame_at(t + d))), None)


# The question kinds that name a moment, and the kind of visit each asks about (and back).
VISIT_KIND = {"small_object": "small", "look_alike": "look_alike"}
QUESTION_KIND = {visit: question for question, visit in VISIT_KIND.items()}


def zoom_question(kind: str, t: float) -> str:
    """The question about the `kind` visit ("small_object" | "look_alike") on screen at `t`."""
    if kind == "small_object":
        return (f"Which small object lies in the field at {t:g} s: "
                + ", ".join(spoken(n) for n in SMALL_OBJECTS) + "?")
    return (f"At {t:g} s, is the instrument on the left the dissector or the bipolar (the one "
            f"with {MARK_WORDS[MARK_PATTERN]} at its tip)?")


def _zoom_qa(zoom: dict, rng) -> list[dict]:
    items: list[dict] = []

    def qa(kind, question, answer, times, box=None):
        item = {"id": f"z{len(items)}", "kind": kind, "question": question, "answer": answer,
                "answer_value": answer, "evidence_times_s": [round(t, 3) for t in times]}
        if box is not None:
            item["box"] = box
        items.append(item)

    for v in zoom["visits"]:
        # a time well inside the visit, on a frame boundary
        t = round(v["start_s"] + (0.3 + 0.4 * float(rng.uniform())) * (v["end_s"] - v["start_s"]), 1)
        kind = QUESTION_KIND[v["kind"]]
        qa(kind, zoom_question(kind, t), spoken(v["name"]), [t], v["box"])
    for k, flash in enumerate(zoom["flashes"]):
        after = flash["instrument_in_after"]
        if after is None:
            continue
        nth = ("first", "second", "third")[k] if k < 3 else f"#{k + 1}"
        qa("short_event", f"Which instrument was brought in just after the {nth} cautery flash?",
           spoken(after["instrument"]), [flash["time_s"], after["time_s"]])
    return items


class ZoomPainter:
    """Draws a ground truth's `zoom` section on the renderer's canvas, frame by frame."""

    def __init__(self, zoom: dict, width: int, height: int, num_frames: int):
        import numpy as np

        from medclaw.synth.draw import Mask, sprite

        self.np = np
        g = geometry(width, height)
        self.items = []                              # (start_frame, end_frame, draw)
        small_mask = Mask.of(np.ones((g["small"], g["small"]), bool))
        fork = sprite("fork", g["look_alike"])
        for v in zoom.get("visits", []):
            if v["kind"] == "small":
                x, y = corner(SMALL_XY, g["small"], width, height)
                self.items.append((v["start_frame"], v["end_frame"],
                                   ("paint", y, x, small_mask, SMALL_OBJECTS[v["name"]])))
            else:
                size = g["look_alike"]
                x, y = corner(LOOK_ALIKE_XY, size, width, height)
                self.items.append((v["start_frame"], v["end_frame"],
                                   ("paint", y, x, Mask.of(fork), LOOK_ALIKE_COLOR)))
                square = mark_square(width, height)
                if LOOK_ALIKES[v["name"]]:
                    draw = {"solid": ("fill", *square, MARK_COLOR),
                            "stripes": ("stripes", *square, mark_columns(square[3] - square[2]))}
                    self.items.append((v["start_frame"], v["end_frame"], draw[MARK_PATTERN]))
                elif MARK_PATTERN == "stripes":
                    # The other one's tip is the stripes' mean, flat: the square itself is no cue.
                    self.items.append((v["start_frame"], v["end_frame"],
                                       ("fill", *square, MARK_FLAT)))
        r = g["flash_r"]
        yy, xx = np.ogrid[0:2 * r, 0:2 * r]
        disc = Mask.of((xx + 0.5 - r) ** 2 + (yy + 0.5 - r) ** 2 <= r * r)
        for flash in zoom.get("flashes", []):
            x, y = corner(FLASH_XY, 2 * r, width, height)
            self.items.append((flash["frame"], flash["end_frame"], ("paint", y, x, disc, FLASH_COLOR)))

    def draw(self, canvas, frame: int) -> None:
        for start, end, (op, *args) in self.items:
            if start <= frame < end:
                getattr(canvas, op)(*args)


def even_int(value: float) -> int:
    from medclaw.synth.draw import even

    return even(value)
