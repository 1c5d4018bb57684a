"""Every frame is the frame asked for, on the containers and codecs hospital archives hold.

Each format of `medclaw.synth.formats` is built here with ffmpeg (tiny barcoded clips). For every
decoder MedClaw can be configured with, `FrameSource` must return exactly the planned frames —
checked by barcode and against a sequential reference decode — or serve that format on the safe
path. Decoders that return a wrong frame are caught by the pts check, never passed through.
"""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from medclaw.kernels.decoders import available_decoders, make_decoder
from medclaw.kernels.decoders.base import DecodeJob
from medclaw.kernels.frames import FrameSource
from medclaw.kernels.index import index_for
from medclaw.kernels.planner import plan_frames
from medclaw.kernels.probe import probe_video
from medclaw.kernels.verify import mismatches, reference_decode
from medclaw.synth.barcode import read_frame_indices
from medclaw.synth.formats import FORMATS, make_format, missing_encoder

CPU_DECODERS = available_decoders("cpu")
PATTERN = (0, 1, 7, 23, 24, 25, 50, 51, 77, 98, 99)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("formats")


def _barcodes(frames, rotation: int) -> list[int]:
    """Barcodes of display-oriented frames: turned back first (the strip is on the source's top)."""
    frames = np.asarray(frames)
    if rotation % 360:
        frames = np.rot90(frames, k=-(rotation // 90), axes=(1, 2))
    return read_frame_indices(np.ascontiguousarray(frames))


def _video(name, folder):
    why = missing_encoder(name)
    if why:
        pytest.skip(why)
    path = make_format(name, folder)
    return path, probe_video(path)


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_decoder_returns_the_planned_frames(name, folder):
    path, info = _video(name, folder)
    index = index_for(info)
    indices = [i for i in PATTERN if i < info.num_frames]
    reference, ref_pts = reference_decode(path, index)
    # The reference is the ground truth: sequential decode, in output order (frame i shows
    # barcode i, except after frames lost in a damaged file).
    ref_codes = _barcodes(reference, info.rotation)
    if not name.startswith("trunc_"):
        assert ref_codes == list(range(info.num_frames))
    assert ref_pts[: info.num_frames] == [int(p) for p in index.pts]
    # Sparse (seeks), and the bench's sparse case: 64 of 100 frames (dense: decodes through,
    # skipping the unwanted frames it may skip).
    dense = sorted(set(plan_frames(info, fps=None, num_frames=64).frame_indices))
    for indices in (indices, dense):
        expected = [ref_codes[i] for i in indices]
        for decoder in CPU_DECODERS:
            src = FrameSource(decoder=decoder, cache_mb=0)
            frames = src.get_frames(info, indices, info.width, info.height)
            assert _barcodes(frames, info.rotation) == expected, (name, decoder)
            diff = np.abs(frames.astype(int) - reference[indices].astype(int)).mean()
            assert diff < 2.0, (name, decoder, diff)
            src.close()


@pytest.mark.parametrize("name", ["ts", "vfr", "hevc10", "av1", "mpeg4"])
def test_decoders_that_return_wrong_frames_are_caught_by_pts(name, folder):
    """Raw decoder output either carries the planned pts, or the check flags it — no silent
    wrong frame: a frame whose pts matches must also show the planned barcode."""
    path, info = _video(name, folder)
    index = index_for(info)
    indices = tuple(i for i in PATTERN if i < info.num_frames)
    for decoder in ("torchcodec", "pyav"):
        job = DecodeJob(path=str(path), indices=indices, width=info.width, height=info.height,
                        fps=info.fps, rotation=info.rotation, index=index)
        try:
            result = make_decoder(decoder, "cpu").decode(job)
        except Exception:
            continue                                   # an error is not a wrong frame
        bad = set(mismatches(index, indices, result.pts))
        got = _barcodes(result.frames.numpy(), info.rotation)
        for slot, want in enumerate(indices):
            if slot not in bad:
                assert got[slot] == want, (name, decoder, slot)


def test_torchcodec_on_mpegts_is_served_on_the_safe_path(folder, caplog):
    path, info = _video("ts", folder)
    src = FrameSource(decoder="torchcodec")
    frames = src.get_frames(info, [0, 60, 99], info.width, info.height)
    assert read_frame_indices(frames) == [0, 60, 99]
    assert src._choose(index_for(info)).name == "pyav"


def _ffprobe_pts(path) -> list[float]:
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                          "frame=pts_time", "-of", "json", str(path)],
                         capture_output=True, text=True, check=True)
    return sorted(float(f["pts_time"]) for f in json.loads(out.stdout)["frames"])


@pytest.mark.parametrize("name", ["vfr", "ts", "mp4"])
def test_timestamps_are_the_real_pts(name, folder):
    """Plans (hence observations and traces) time each frame by its pts, as ffprobe prints it."""
    path, info = _video(name, folder)
    truth = _ffprobe_pts(path)
    assert info.start_s == pytest.approx(truth[0], abs=1e-6)
    plan = plan_frames(info, fps=2.0)
    for i, t in zip(plan.frame_indices, plan.timestamps_s):
        assert info.start_s + t == pytest.approx(truth[i], abs=1e-5)
    frames = FrameSource().get(info, plan)
    assert read_frame_indices(frames) == list(plan.frame_indices)


def test_vfr_is_sampled_by_time(folder):
    """10 / 30 / 5 fps segments: 2 samples per second of *time*, each the frame then on screen."""
    _, info = _video("vfr", folder)
    assert info.is_variable_fps and info.duration_s == pytest.approx(8.0)
    plan = plan_frames(info, fps=2.0)
    assert plan.num_frames == 16
    gaps = np.diff(plan.timestamps_s)
    assert gaps.max() - gaps.min() < 0.25       # evenly spaced in time, not in index
    # Frame 240-style bug: frame 80 is at 4.0 s (start of the 5 fps part), not at 80 / 12.5 s.
    src = FrameSource()
    from medclaw.kernels.planner import frame_at_time, frame_time_s

    assert frame_time_s(info, 80) == pytest.approx(4.0)
    assert frame_at_time(info, 4.1) == 80 and frame_at_time(info, 2.5) == 35
    assert read_frame_indices(src.get_frames(info, [35, 80], 160, 90)) == [35, 80]


def test_raw_h264_is_decoded_at_an_assumed_rate_the_user_can_override(folder):
    path, info = _video("h264", folder)
    assert info.fps_is_assumed and info.num_frames == 100 and info.fps == pytest.approx(25.0)
    faster = probe_video(path, assumed_fps=50.0)
    assert faster.fps_is_assumed and faster.duration_s == pytest.approx(2.0)
    plan = plan_frames(faster, 1.0, 2.0, fps=4.0)
    assert plan.frame_indices[0] == 50
    assert read_frame_indices(FrameSource().get(faster, plan)) == list(plan.frame_indices)
    # The index stored at 50 fps is not an answer for a probe that gives no rate: the stream's
    # declared 25 fps is (the full suite found a 50 left by an earlier probe of the same bytes)
    assert probe_video(path).fps == pytest.approx(25.0)
    assert probe_video(path, assumed_fps=50.0).fps == pytest.approx(50.0)
    # The stored index gone (evicted, new process): rebuilt at the rate this probe assumed,
    # not at the stream's declared 25 fps.
    from medclaw.kernels import index as index_mod

    index_mod.forget_memory()
    (index_mod._index_dir() / f"{faster.sha256}.npz").unlink()
    again = index_for(faster)
    assert again.time_s(50) == pytest.approx(1.0) and again.num_frames == 100


def test_truncated_ts_is_served_up_to_its_last_decodable_frame(folder):
    path, info = _video("trunc_ts", folder)
    assert 0 < info.num_frames < 100
    reference, _ = reference_decode(path, index_for(info))
    decodable = read_frame_indices(reference)
    expected = sorted(i for i in decodable if i >= 0)[: info.num_frames]
    frames = FrameSource().get_frames(info, list(range(info.num_frames)), 160, 90)
    assert read_frame_indices(frames) == expected


def test_one_frame_video_plans_and_decodes_two_copies(folder):
    _, info = _video("one", folder)
    plan = plan_frames(info, fps=2.0)
    frames = FrameSource().get(info, plan)
    assert plan.frame_indices == (0, 0) and read_frame_indices(frames) == [0, 0]


@pytest.mark.parametrize("name", ["mjpeg", "mpeg4"])
def test_reduced_resolution_decode_returns_the_planned_frames(name, folder):
    """MJPEG / MPEG-4 Part 2 wanted at half of each side decode at FFmpeg's lowres: same frames
    (barcodes), pixels close to a full decode resized."""
    from medclaw.kernels.decoders.pyav_decoder import lowres_for

    path, info = _video(name, folder)
    assert lowres_for(info.codec, info.width, info.height, 40, 22) == 2
    assert lowres_for(info.codec, info.width, info.height, 80, 44) == 1
    assert lowres_for("h264", info.width, info.height, 40, 22) == 0      # H.264 has no lowres
    src = FrameSource(cache_mb=0)
    small = src.get_frames(info, list(PATTERN), 80, 44)
    assert src._choose(index_for(info), 80, 44).name == "pyav"
    full = FrameSource(cache_mb=0).get_frames(info, list(PATTERN), 160, 90)
    assert read_frame_indices(small) == list(PATTERN)
    from medclaw.kernels.ops import resize_crop
    import torch

    ref = resize_crop(torch.from_numpy(full.copy()), 80, 44).numpy()
    assert np.abs(small.astype(int) - ref.astype(int)).mean() < 12


@pytest.mark.parametrize("name", ["trunc_mp4", "trunc_mkv"])
def test_cut_files_ffmpeg_decodes_are_probed_and_served(name, folder, capsys):
    """A faststart MP4 or a Matroska file cut short: `medclaw video probe` answers (exit 0) and
    says what is damaged; every frame it counts decodes, as the sequential reference decodes it
    (frame identity by pts); an MP4 cut before its 'moov' index is refused in one line."""
    from medclaw import cli

    path, info = _video(name, folder)
    index = index_for(info)
    assert info.damage.startswith("truncated") and 0 < info.num_frames < 100
    reference, ref_pts = reference_decode(path, index)
    assert ref_pts[: info.num_frames] == [int(p) for p in index.pts]
    every = list(range(info.num_frames))
    frames = FrameSource(decoder="pyav", cache_mb=0).get_frames(info, every, info.width,
                                                                info.height)
    assert np.abs(frames.astype(int) - reference[: info.num_frames].astype(int)).mean() < 1.0
    # The last frames alone: one GOP, decoded without frame threads (they would lose the frames
    # in flight where the cut packet fails).
    last = [info.num_frames - 2, info.num_frames - 1]
    frames = FrameSource(decoder="pyav", cache_mb=0).get_frames(info, last, info.width,
                                                                info.height)
    assert np.abs(frames.astype(int) - reference[last].astype(int)).mean() < 1.0
    assert cli.main(["video", "probe", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"frames    {info.num_frames}" in out and f"damage    {info.damage}" in out
    if name == "trunc_mp4":                  # the plain MP4 keeps its index at the end
        data = make_format("mp4", folder).read_bytes()
        no_index = folder / "no_moov.mp4"
        no_index.write_bytes(data[: len(data) * 6 // 10])
        assert cli.main(["video", "probe", str(no_index)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "'moov' index is missing" in err


def test_decoders_open_without_ffmpegs_analysis_decode(folder):
    """`open_input` skips FFmpeg's stream-analysis decode (a 4K keyframe per open); the codec
    context starts with the reorder depth the probe learned and decodes what a plain open does."""
    import av

    from medclaw.kernels.decoders.pyav_decoder import open_input

    path, info = _video("ts", folder)
    index = index_for(info)
    with av.open(str(path)) as plain:
        depth = plain.streams.video[0].codec_context.reorder_depth
        want = [f.pts for f in plain.decode(video=0)]
    assert index.meta["reorder_depth"] == depth == 2
    with open_input(path, index) as fast:
        assert fast.streams.video[0].codec_context.reorder_depth == depth
        assert [f.pts for f in fast.decode(video=0)] == want
