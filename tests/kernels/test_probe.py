"""probe_video: real figures for good videos, typed one-line errors for broken ones (made here)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import numpy as np
import pytest

from medclaw.errors import MedClawError
from medclaw.kernels.errors import (
    CorruptVideoError, FrameTooLargeError, NotAFileError, NotAVideoError, UnreadableVideoError,
    VideoError, ZeroDurationError,
)
from medclaw.kernels.probe import file_sha256, probe_video


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Each test gets its own MEDCLAW_HOME, so the on-disk sha cache is isolated."""
    import medclaw.kernels.probe as probe

    from medclaw.kernels.index import forget_memory

    monkeypatch.setenv("MEDCLAW_HOME", str(tmp_path / "home"))
    probe._SHA_CACHE.clear()
    forget_memory()                 # the per-video index too: each test builds its own


def _ffmpeg(*args):
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-y", *map(str, args)], check=True)


def _raises_one_line(error_type, path, **kwargs) -> str:
    with pytest.raises(error_type) as info:
        probe_video(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message and len(message) < 300
    assert os.path.basename(str(path)) in message
    assert isinstance(info.value, VideoError) and isinstance(info.value, MedClawError)
    return message


def test_probe_matches_the_synthesis_parameters(synth_video):
    info = probe_video(synth_video.path)
    gt = synth_video.gt
    assert info.num_frames == gt.num_frames == 1500
    assert info.fps == pytest.approx(25.0)
    assert info.duration_s == pytest.approx(60.0)
    assert (info.width, info.height) == (gt.width, gt.height) == (320, 180)
    assert info.codec == "h264" and info.rotation == 0 and not info.is_variable_fps
    assert info.sha256 == hashlib.sha256(synth_video.path.read_bytes()).hexdigest()
    assert info.to_dict()["num_frames"] == 1500


def test_frame_count_does_not_depend_on_the_container_header(synth_video, tmp_path):
    """Matroska stores no frame count: the probe counts the packets itself."""
    mkv = tmp_path / "copy.mkv"
    _ffmpeg("-i", synth_video.path, "-c", "copy", mkv)
    info = probe_video(mkv)
    assert info.num_frames == 1500 and info.duration_s == pytest.approx(60.0, abs=0.05)


def test_rotation_from_display_matrix_swaps_display_size(synth_video, tmp_path):
    rotated = tmp_path / "rotated.mp4"
    _ffmpeg("-i", synth_video.path, "-c", "copy", "-metadata:s:v", "rotate=90", rotated)
    info = probe_video(rotated)
    assert info.rotation in (90, 270)
    assert (info.width, info.height) == (180, 320)
    assert info.num_frames == 1500


def test_variable_frame_rate_is_detected(synth_video, tmp_path):
    vfr = tmp_path / "vfr.mkv"
    # Frame intervals grow with the frame number: not a constant rate.
    _ffmpeg("-i", synth_video.path, "-frames:v", "60", "-vf", "setpts='(N+N*N/100)/25/TB'",
            "-fps_mode", "vfr", "-c:v", "libx264", "-preset", "ultrafast", vfr)
    info = probe_video(vfr)
    assert info.is_variable_fps and info.num_frames == 60
    assert info.fps == pytest.approx(60 / info.duration_s)


def test_single_frame_video(synth_video, tmp_path):
    one = tmp_path / "one.mkv"
    _ffmpeg("-i", synth_video.path, "-frames:v", "1", "-c", "copy", one)
    info = probe_video(one)
    assert info.num_frames == 1 and info.duration_s == pytest.approx(0.04)


def test_max_pixels(synth_video):
    assert probe_video(synth_video.path, max_pixels=320 * 180).num_frames == 1500
    message = _raises_one_line(FrameTooLargeError, synth_video.path, max_pixels=320 * 180 - 1)
    assert "320x180" in message


def test_sha256_cache_is_keyed_by_path_size_and_mtime(synth_video, tmp_path):
    copy = tmp_path / "copy.mp4"
    shutil.copyfile(synth_video.path, copy)
    truth = hashlib.sha256(copy.read_bytes()).hexdigest()
    assert file_sha256(copy) == truth
    cache = tmp_path / "home" / "cache" / "sha256.json"
    assert cache.is_file() and truth in cache.read_text()
    # Same size and mtime, different bytes: the cache answers (proof it was used) …
    stat = copy.stat()
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0xFF
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file_sha256(copy) == truth
    assert file_sha256(copy, use_cache=False) != truth
    # … a new mtime invalidates it.
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert file_sha256(copy) == hashlib.sha256(bytes(data)).hexdigest()


def test_sha256_cache_survives_a_new_process_via_disk(synth_video, tmp_path):
    import json

    import medclaw.kernels.probe as probe

    first = file_sha256(synth_video.path)
    cache = tmp_path / "home" / "cache" / "sha256.json"
    data = json.loads(cache.read_text())
    entry = data[os.path.realpath(synth_video.path)]
    assert entry["sha256"] == first
    entry["sha256"] = "f" * 64                                # tamper: proves the disk is read
    cache.write_text(json.dumps(data))
    probe._SHA_CACHE.clear()                                  # as if a new process started
    assert file_sha256(synth_video.path) == "f" * 64
    assert file_sha256(synth_video.path, use_cache=False) == first


# ------------------------------------------------------------------------------- bad input


def test_missing_file(tmp_path):
    assert "no such file" in _raises_one_line(NotAFileError, tmp_path / "nope.mp4")


def test_directory(tmp_path):
    folder = tmp_path / "folder.mp4"
    folder.mkdir()
    assert "directory" in _raises_one_line(NotAFileError, folder)


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    assert "empty" in _raises_one_line(NotAVideoError, empty)


def test_random_bytes(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8).tobytes())
    _raises_one_line(NotAVideoError, junk)


def test_png_image(tmp_path):
    from PIL import Image

    png = tmp_path / "still.png"
    Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(png)
    assert "image" in _raises_one_line(NotAVideoError, png)


def test_audio_only(tmp_path):
    audio = tmp_path / "voice.m4a"
    _ffmpeg("-f", "lavfi", "-i", "sine=d=1", "-c:a", "aac", audio)
    assert "no video stream" in _raises_one_line(NotAVideoError, audio)


def test_video_stream_without_frames(tmp_path):
    avi = tmp_path / "noframes.avi"
    _ffmpeg("-f", "lavfi", "-i", "testsrc=s=64x48:d=1", "-frames:v", "0", "-c:v", "mpeg4", avi)
    assert "no frames" in _raises_one_line(ZeroDurationError, avi)


def test_truncated_mp4_without_moov(synth_video, tmp_path):
    """ffmpeg writes the index ('moov') last: cutting the file loses it. Say what and where."""
    data = synth_video.path.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 2])
    message = _raises_one_line(CorruptVideoError, cut)
    assert "truncated" in message and "moov" in message and f"{len(data) // 2:,}" in message


def _served_up_to_the_cut(cut, caplog) -> str:
    """A cut file ffmpeg still decodes is served: its decodable frames, the damage said once."""
    from medclaw.kernels.frames import FrameSource
    from medclaw.kernels.index import index_for
    from medclaw.kernels.verify import reference_decode

    with caplog.at_level("WARNING", logger="medclaw.kernels.probe"):
        info = probe_video(cut)
        assert probe_video(cut) == info                       # the second probe: no warning
    warnings = [r.getMessage() for r in caplog.records if r.name == "medclaw.kernels.probe"]
    assert len(warnings) == 1 and info.damage in warnings[0] and "\n" not in info.damage
    assert 0 < info.num_frames < 1500 and f"serving the {info.num_frames} frames" in info.damage
    # Frame identity: the served frames are the sequential reference decode's, pts for pts
    # (a frame lost before the cut shifts the barcodes, not the identity).
    index = index_for(info)
    last = info.num_frames - 1
    frames = FrameSource(cache_mb=0).get_frames(info, [0, last - 1, last], info.width,
                                                info.height)
    reference, pts = reference_decode(cut, index, keep=[0, last - 1, last])
    assert pts == [int(index.pts[i]) for i in (0, last - 1, last)]
    assert np.abs(frames.astype(int) - reference.astype(int)).mean() < 1.0
    return info.damage


def test_truncated_faststart_mp4_is_served_up_to_the_cut(synth_video, tmp_path, caplog):
    """Index first ('faststart'): the header survives but promises frames the file lacks."""
    faststart = tmp_path / "fs.mp4"
    _ffmpeg("-i", synth_video.path, "-c", "copy", "-movflags", "+faststart", faststart)
    data = faststart.read_bytes()
    cut = tmp_path / "fs_cut.mp4"
    cut.write_bytes(data[: int(len(data) * 0.6)])
    damage = _served_up_to_the_cut(cut, caplog)
    assert damage.startswith("truncated") and "indexes 1500 frames" in damage


def test_truncated_matroska_is_served_up_to_the_cut(synth_video, tmp_path, caplog):
    """Matroska has no frame count; the declared duration gives the truncation away."""
    mkv = tmp_path / "whole.mkv"
    _ffmpeg("-i", synth_video.path, "-c", "copy", mkv)
    data = mkv.read_bytes()
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(data[: len(data) // 2])
    damage = _served_up_to_the_cut(cut, caplog)
    assert damage.startswith("truncated") and "declares 60.0 s" in damage


def test_mp4_with_garbage_after_the_header(synth_video, tmp_path):
    data = bytearray(synth_video.path.read_bytes())
    data[40:4096] = np.random.default_rng(1).integers(0, 256, 4056, dtype=np.uint8).tobytes()
    bad = tmp_path / "garbage.mp4"
    bad.write_bytes(bytes(data))
    _raises_one_line(CorruptVideoError, bad)


def test_undecodable_frames(tmp_path):
    """A sound container whose frames are garbage: the probe decodes the first one and says so."""
    good = tmp_path / "mjpeg.mkv"
    _ffmpeg("-f", "lavfi", "-i", "testsrc=s=64x48:d=1:r=10", "-c:v", "mjpeg", good)
    assert probe_video(good).num_frames == 10
    data = bytearray(good.read_bytes())
    rng = np.random.default_rng(0)
    start = data.find(b"\xff\xd8\xff")                      # each JPEG frame starts with SOI
    assert start > 0
    while start >= 0:
        data[start:start + 300] = rng.integers(0, 256, 300, dtype=np.uint8).tobytes()
        start = data.find(b"\xff\xd8\xff", start + 300)
    bad = tmp_path / "mjpeg_bad.mkv"
    bad.write_bytes(bytes(data))
    assert "decode the first frame" in _raises_one_line(CorruptVideoError, bad)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(synth_video, tmp_path):
    locked = tmp_path / "locked.mp4"
    shutil.copyfile(synth_video.path, locked)
    locked.chmod(0)
    try:
        _raises_one_line(UnreadableVideoError, locked)
    finally:
        locked.chmod(0o644)


def test_index_is_built_once_and_reused_from_disk(synth_video, monkeypatch):
    """The packet scan happens on the first probe only; a new process reads the stored index."""
    import medclaw.kernels.index as index_mod
    import medclaw.kernels.probe as probe

    first = probe_video(synth_video.path)
    stored = list((index_mod._index_dir()).glob("*.npz"))
    assert [p.name for p in stored] == [f"{first.sha256}.npz"]
    index_mod.forget_memory()
    probe._SHA_CACHE.clear()

    def no_scan(*args, **kwargs):
        raise AssertionError("the file was scanned again")

    monkeypatch.setattr(probe, "_scan", no_scan)
    again = probe_video(synth_video.path)
    assert again == first
    assert index_mod.load_index(first.sha256).num_frames == 1500

    # With the sha256 cached too, FFmpeg does not open the file at all (its stream analysis
    # decodes frames: a 4K keyframe per open).
    import av

    def no_open(*args, **kwargs):
        raise AssertionError("FFmpeg opened the file again")

    monkeypatch.setattr(av, "open", no_open)
    assert probe_video(synth_video.path) == first
    with pytest.raises(FrameTooLargeError):
        probe_video(synth_video.path, max_pixels=320 * 180 - 1)


def test_sha_memory_cache_is_bounded(tmp_path, monkeypatch):
    import medclaw.kernels.probe as probe

    monkeypatch.setattr(probe, "_SHA_CACHE_MAX", 5)
    for k in range(12):
        f = tmp_path / f"f{k}"
        f.write_bytes(bytes([k]))
        file_sha256(f)
    assert len(probe._SHA_CACHE) == 5
