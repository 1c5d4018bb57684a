"""Decoders: exact frames (checked by the barcodes), agreement with each other, typed errors."""
from __future__ import annotations

import random
import shutil
import subprocess
import threading

import numpy as np
import pytest

from medclaw.errors import ConfigError
from medclaw.synth.barcode import read_frame_indices
from medclaw.kernels.decoders import (
    AUTO_ORDER, DECODERS, available_decoders, make_decoder, resolve,
)
from medclaw.kernels.decoders.base import (
    DecodeCancelled, DecodeJob, is_dense, run_segments, split_at_keyframes,
)
from medclaw.kernels.errors import CorruptVideoError

CPU_DECODERS = available_decoders("cpu")
PATTERNS = {
    "dense": tuple(range(0, 1500, 3)),
    "sparse": (0, 7, 260, 261, 900, 1250, 1499),
    "window": tuple(range(600, 700, 2)),
    "last": (1499,),
}


def _index(path):
    """The probe's index of `path` (None for names of files that do not exist)."""
    import os

    from medclaw.kernels.index import index_for
    from medclaw.kernels.probe import probe_video

    return index_for(probe_video(path)) if os.path.exists(str(path)) else None


def _job(path, indices, width=320, height=180, crop=None, rotation=0, chunk=32, threads=2,
         index=None):
    return DecodeJob(path=str(path), indices=tuple(indices), width=width, height=height, fps=25.0,
                     crop_px=crop, rotation=rotation, chunk=chunk, num_threads=threads,
                     index=index or _index(path))


def _decode(name, job):
    result = make_decoder(name, "cpu").decode(job)
    assert len(result.pts) == len(job.indices)
    return result.frames.numpy()


@pytest.fixture(scope="module")
def broken_videos(synth_video, tmp_path_factory):
    """(truncated, garbage-in-the-middle) copies of the synthetic video, index at the front."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("needs the ffmpeg binary")
    root = tmp_path_factory.mktemp("broken")
    faststart = root / "faststart.mp4"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(synth_video.path), "-c",
                    "copy", "-movflags", "+faststart", str(faststart)], check=True)
    data = faststart.read_bytes()
    truncated = root / "truncated.mp4"
    truncated.write_bytes(data[: len(data) // 2])
    rng = random.Random(0)
    garbled = bytearray(data)
    for i in range(len(data) // 2, len(data) // 2 + 30_000):
        garbled[i] = rng.randrange(256)
    garbage = root / "garbage.mp4"
    garbage.write_bytes(bytes(garbled))
    return truncated, garbage


def test_table_and_auto_choice():
    assert "torchcodec" in CPU_DECODERS and "pyav" in CPU_DECODERS
    assert resolve("auto", "cpu") == AUTO_ORDER["cpu"][0] == "torchcodec"
    for name, spec in DECODERS.items():
        assert ":" in spec.target and spec.devices
    with pytest.raises(ConfigError, match="unknown decoder"):
        resolve("nope", "cpu")
    with pytest.raises(ConfigError, match="does not run on cpu"):
        resolve("pynvc", "cpu")
    with pytest.raises(ConfigError, match="unknown device"):
        resolve("auto", "tpu")
    if "decord" not in CPU_DECODERS:
        with pytest.raises(ConfigError, match="not installed"):
            resolve("decord", "cpu")


def test_density_rule():
    assert is_dense(range(0, 15000, 19), gop=250)
    assert not is_dense(range(0, 15000, 234), gop=250)        # 64 frames over 10 min
    assert not is_dense([5], gop=250)


def test_split_at_keyframes_cuts_only_at_gop_starts():
    keyframes = [0, 250, 500, 750, 1000, 1250]
    indices = list(range(0, 1500, 3))
    runs = split_at_keyframes(indices, keyframes, 3)
    assert len(runs) == 3 and runs[0][0] == 0 and runs[-1][1] == len(indices)
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))            # contiguous, no overlap

    def gop(index):
        return max(k for k in keyframes if k <= index)

    for lo, _ in runs[1:]:
        assert gop(indices[lo - 1]) < gop(indices[lo])                  # no GOP is split
    # Every requested index inside one GOP, one part, or unknown keyframes: a single run.
    assert split_at_keyframes(list(range(260, 400, 2)), keyframes, 4) == [(0, 70)]
    assert split_at_keyframes(indices, keyframes, 1) == [(0, len(indices))]
    assert split_at_keyframes(indices, None, 4) == [(0, len(indices))]
    assert split_at_keyframes([], keyframes, 4) == []
    # More parts than GOPs: cuts collapse, never an empty run.
    runs = split_at_keyframes([10, 20, 300, 310], keyframes, 8)
    assert runs == [(0, 2), (2, 4)]


def test_run_segments_raises_the_real_error_and_stops_the_others():
    job = _job("v.mp4", range(10))
    started = []

    def decode_segment(lo, hi):
        started.append((lo, threading.current_thread().daemon))
        if lo == 5:
            raise CorruptVideoError("v.mp4: decoding failed at frame 5 (0.20 s): bad")
        for _ in range(200):                   # the healthy segment polls like a decoder does
            job.check_cancelled()
            job.cancel.wait(0.01)

    with pytest.raises(CorruptVideoError, match="frame 5"):
        run_segments(job, [(0, 5), (5, 10)], decode_segment)
    # Both ran, in daemon threads (a stuck decoder must not block exit), and the job is cancelled.
    assert sorted(started) == [(0, True), (5, True)] and job.cancel.is_set()

    cancelled = _job("v.mp4", range(10))
    cancelled.cancel.set()                     # a timeout: every segment stops, that is raised
    with pytest.raises(DecodeCancelled):
        run_segments(cancelled, [(0, 5), (5, 10)], lambda lo, hi: cancelled.check_cancelled())


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_parallel_segments_match_one_thread(synth_video, name):
    """Cutting a request into keyframe segments decoded in parallel changes no pixel."""
    indices = PATTERNS["dense"]
    one = _decode(name, _job(synth_video.path, indices, 448, 252, threads=1))
    many = _decode(name, _job(synth_video.path, indices, 448, 252, threads=3))
    assert read_frame_indices(many) == list(indices)
    assert np.array_equal(one, many)


@pytest.fixture(scope="module")
def open_gop_video(synth_video, tmp_path_factory):
    """The synthetic video re-encoded with open GOPs: B-frames shown before each keyframe are
    decoded after it and reference the previous GOP — the hard case for cutting at keyframes."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("needs the ffmpeg binary")
    path = tmp_path_factory.mktemp("opengop") / "open_gop.mp4"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(synth_video.path), "-t", "20",
                    "-c:v", "libx264", "-preset", "veryfast", "-bf", "3",
                    "-x264-params", "open-gop=1:keyint=60:min-keyint=60:scenecut=0",
                    str(path)], check=True)
    return path


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_segments_exact_on_open_gops(open_gop_video, name):
    # Every other frame, plus the frames just before the keyframes at 60, 120 and 180.
    indices = tuple(range(0, 500, 2)) + (57, 58, 59, 119, 179)
    indices = tuple(sorted(set(indices)))
    frames = _decode(name, _job(open_gop_video, indices, threads=4))
    assert read_frame_indices(frames) == list(indices)


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("name", CPU_DECODERS)
def test_exact_frames_at_native_size(synth_video, name, pattern):
    indices = PATTERNS[pattern]
    frames = _decode(name, _job(synth_video.path, indices))
    assert frames.shape == (len(indices), 180, 320, 3) and frames.dtype == np.uint8
    assert read_frame_indices(frames) == list(indices)


@pytest.mark.parametrize("size", [(448, 252), (112, 56), (168, 140)])
@pytest.mark.parametrize("name", CPU_DECODERS)
def test_exact_frames_after_resize(synth_video, name, size):
    indices = PATTERNS["sparse"] + tuple(range(300, 340, 4))
    frames = _decode(name, _job(synth_video.path, sorted(set(indices)), *size))
    assert frames.shape == (len(set(indices)), size[1], size[0], 3)
    assert read_frame_indices(frames) == sorted(set(indices))


@pytest.mark.parametrize("size,crop,exact", [((320, 180), None, True), ((448, 252), None, True),
                                             ((224, 112), (10, 20, 200, 150), True),
                                             ((112, 56), None, False)])
def test_decoders_agree(synth_video, size, crop, exact):
    """Same ops path → identical pixels; FFmpeg-side downscales differ by interpolation only."""
    indices = PATTERNS["sparse"] + tuple(range(601, 700, 7))
    indices = tuple(sorted(set(indices)))
    ref = _decode("torchcodec", _job(synth_video.path, indices, *size, crop=crop))
    for name in CPU_DECODERS:
        other = _decode(name, _job(synth_video.path, indices, *size, crop=crop))
        diff = np.abs(other.astype(int) - ref.astype(int))
        if exact:
            assert diff.max() == 0, name
        else:
            assert diff.mean() < 3.0, name


def test_chunking_does_not_change_output(synth_video):
    indices = PATTERNS["window"]
    a = _decode("torchcodec", _job(synth_video.path, indices, 448, 252, chunk=7))
    b = _decode("torchcodec", _job(synth_video.path, indices, 448, 252, chunk=64))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("rotation", [90, 270])
def test_rotation_applied_like_torchcodec(synth_video, tmp_path, rotation):
    if shutil.which("ffmpeg") is None:
        pytest.skip("needs the ffmpeg binary")
    rotated = tmp_path / f"rot{rotation}.mp4"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(synth_video.path), "-t", "4",
                    "-c", "copy", "-metadata:s:v:0", f"rotate={rotation}", str(rotated)],
                   check=True)
    from medclaw.kernels.probe import probe_video

    info = probe_video(rotated)
    assert info.rotation == rotation and (info.width, info.height) == (180, 320)
    indices = (0, 30, 77)
    frames = {name: _decode(name, _job(rotated, indices, 180, 320, rotation=rotation))
              for name in CPU_DECODERS}
    for name, got in frames.items():
        assert got.shape == (3, 320, 180, 3)
        assert np.array_equal(got, frames["torchcodec"]), name


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_truncated_and_corrupt_data_raise_with_frame_and_time(broken_videos, synth_video, name):
    truncated, garbage = broken_videos
    whole = _index(synth_video.path)              # what the file held before it was damaged
    for path in (truncated, garbage):
        with pytest.raises(CorruptVideoError) as err:
            _decode(name, _job(path, range(0, 1500, 10), index=whole))
        message = str(err.value)
        assert "\n" not in message and str(path) in message
        assert "decoding failed at frame" in message and " s)" in message


def test_not_a_video_raises_corrupt(tmp_path, synth_video):
    bogus = tmp_path / "bogus.mp4"
    bogus.write_bytes(b"\x00" * 4096)
    for name in CPU_DECODERS:
        with pytest.raises(CorruptVideoError):
            _decode(name, _job(bogus, [0], index=_index(synth_video.path)))


@pytest.mark.gpu
def test_nvdec_agrees_with_cpu(synth_video):
    """NVDEC (torchcodec device='cuda', and PyNvVideoCodec if installed) returns the same frames."""
    indices = PATTERNS["sparse"] + tuple(range(601, 700, 7))
    indices = tuple(sorted(set(indices)))
    cpu = _decode("torchcodec", _job(synth_video.path, indices, 448, 252))
    for name in available_decoders("cuda"):
        gpu = make_decoder(name, "cuda").decode(_job(synth_video.path, indices, 448, 252))
        assert gpu.is_cuda
        gpu = gpu.cpu().numpy()
        assert read_frame_indices(gpu) == list(indices), name
        # NVDEC's YUV->RGB conversion differs from swscale's by rounding only.
        assert np.abs(gpu.astype(int) - cpu.astype(int)).mean() < 3.0, name


def test_chunks_are_bounded_by_full_resolution_bytes():
    from medclaw.kernels.decoders.base import CHUNK_MAX_BYTES

    job = _job("v.mp4", range(100), chunk=32)
    assert [len(c) for _, c in job.chunks()] == [32, 32, 32, 4]
    job.src_width, job.src_height = 3840, 2160                # 4K: ~25 MB per RGB frame
    sizes = [len(c) for _, c in job.chunks()]
    assert sum(sizes) == 100 and max(sizes) * 3840 * 2160 * 3 <= CHUNK_MAX_BYTES
