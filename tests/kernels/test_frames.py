"""FrameSource: exact planned frames, the cache spares re-decoding, typed timeouts and errors."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from medclaw.errors import ConfigError
from medclaw.synth.barcode import read_frame_indices
from medclaw.kernels.errors import (
    DecodeTimeoutError, FrameTooLargeError, InvalidCropError, TimeRangeError,
)
from medclaw.kernels.frames import FrameSource
from medclaw.kernels.planner import plan_frames


@pytest.fixture(scope="module")
def info(synth_video):
    from medclaw.kernels.probe import probe_video

    return probe_video(synth_video.path)


def test_plan_frames_are_exact(info):
    plan = plan_frames(info, fps=2.0)
    frames = FrameSource().get(info, plan)
    assert isinstance(frames, np.ndarray) and frames.dtype == np.uint8
    assert frames.shape == (plan.num_frames, plan.height, plan.width, 3)
    assert read_frame_indices(frames) == list(plan.frame_indices)


def test_second_request_decodes_only_missing_frames(info):
    src = FrameSource(cache_mb=256)
    stage1 = plan_frames(info, fps=2.0)                          # whole video
    src.get(info, stage1)
    assert src.frames_decoded == stage1.num_frames
    stage2 = plan_frames(info, 10.0, 20.0, fps=4.0, max_pixels=stage1.width * stage1.height)
    assert (stage2.width, stage2.height) == (stage1.width, stage1.height)
    overlap = set(stage1.frame_indices) & set(stage2.frame_indices)
    assert overlap and len(overlap) < stage2.num_frames
    before = src.stats()
    frames = src.get(info, stage2)
    after = src.stats()
    assert src.frames_decoded - before["frames_decoded"] == stage2.num_frames - len(overlap)
    assert after["hits"] - before["hits"] == len(overlap)
    assert read_frame_indices(frames) == list(stage2.frame_indices)
    again = src.get(info, stage2)                                # all cached now
    assert src.frames_decoded == after["frames_decoded"]
    assert np.array_equal(again, frames)


def test_frame_lookup_and_crop_share_cache(info):
    src = FrameSource(cache_mb=64)
    frame = src.get_frame(info, 321, 448, 252)
    assert frame.shape == (252, 448, 3) and read_frame_indices(frame[None]) == [321]
    crop = src.get_frame(info, 321, 112, 112, crop_box=(0.25, 0.25, 0.75, 0.75))
    assert crop.shape == (112, 112, 3)
    src.get_frame(info, 321, 112, 112, crop_box=(0.25, 0.25, 0.75, 0.75))
    assert src.frames_decoded == 2 and src.stats()["hits"] == 1
    # Cropping the top strip (the barcode's row) keeps it readable: the crop is of the right frame.
    top = src.get_frame(info, 321, 320, 90, crop_box=(0.0, 0.0, 1.0, 0.5))
    assert read_frame_indices(top[None]) == [321]


def test_duplicates_and_order_are_kept(info):
    src = FrameSource(cache_mb=64)
    frames = src.get_frames(info, [50, 10, 50, 30], 320, 180)
    assert read_frame_indices(frames) == [50, 10, 50, 30]
    assert src.frames_decoded == 3


def test_returned_arrays_are_read_only_and_copies_do_not_touch_the_cache(info):
    src = FrameSource(cache_mb=64)
    first = src.get_frames(info, [5, 6], 320, 180)
    with pytest.raises(ValueError):
        first[:] = 0
    mine = first.copy()
    mine[:] = 0
    tensor = src.get_frames(info, [5, 6], 320, 180, as_tensor=True)
    tensor.zero_()                                            # a tensor of the caller's own
    again = src.get_frames(info, [5, 6], 320, 180)
    assert read_frame_indices(again) == [5, 6]
    other = FrameSource(cache_mb=64)
    other.get_frames(info, [7, 8], 320, 180, as_tensor=True).zero_()   # first request
    assert read_frame_indices(other.get_frames(info, [7, 8], 320, 180)) == [7, 8]
    assert other.frames_decoded == 2                          # served from the intact cache


def test_as_tensor(info):
    import torch

    frames = FrameSource().get(info, plan_frames(info, num_frames=4, fps=None), as_tensor=True)
    assert isinstance(frames, torch.Tensor) and frames.dtype == torch.uint8 and frames.shape[0] == 4


def test_concurrent_overlapping_requests_decode_each_frame_once(info):
    src = FrameSource(cache_mb=256)
    plans = [plan_frames(info, s, s + 20.0, fps=2.0) for s in (0.0, 5.0, 10.0, 15.0)]
    union = set().union(*(p.frame_indices for p in plans))
    results, errors = {}, []

    def work(k):
        try:
            results[k] = src.get(info, plans[k])
        except Exception as err:   # surfaced by the assert below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert src.frames_decoded == len(union)
    for k, plan in enumerate(plans):
        assert read_frame_indices(results[k]) == list(plan.frame_indices)


def test_timeout_raises_and_worker_stops(info):
    src = FrameSource(timeout_s=1e-4, cache_mb=0)
    with pytest.raises(DecodeTimeoutError) as err:
        src.get_frames(info, range(0, 1500, 2), 320, 180)
    assert "\n" not in str(err.value) and "timeout_s" in str(err.value)
    workers = [t for t in threading.enumerate() if t.name == "medclaw-decode"]
    for t in workers:
        t.join(timeout=60)            # cancelled between chunks: it must finish, not run on
        assert not t.is_alive()


def test_waiting_for_a_busy_video_times_out(info):
    src = FrameSource(timeout_s=0.05)
    lock = src._video_lock(info.sha256)
    with lock:
        with pytest.raises(DecodeTimeoutError):
            src.get_frames(info, [0], 320, 180)


def test_bad_requests_raise_typed_errors(info):
    src = FrameSource()
    with pytest.raises(TimeRangeError):
        src.get_frames(info, [info.num_frames], 320, 180)
    with pytest.raises(TimeRangeError):
        src.get_frame(info, -1, 320, 180)
    with pytest.raises(FrameTooLargeError):
        src.get_frame(info, 0, 100_000, 100_000)
    with pytest.raises(InvalidCropError):
        src.get_frame(info, 0, 64, 64, crop_box=(0.9, 0.1, 0.2, 0.5))
    with pytest.raises(ConfigError):
        FrameSource(decoder="nope")
    with pytest.raises(ConfigError):
        FrameSource(timeout_s=0)
    with pytest.raises(ConfigError, match="interpolation"):
        FrameSource(interpolation="lanczos")


def test_corrupt_video_raises(info, tmp_path):
    from medclaw.kernels.errors import CorruptVideoError

    data = open(info.path, "rb").read()
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(data[:4096])              # header only: no frame data
    fake = dataclasses.replace(info, path=str(broken), sha256="broken")
    with pytest.raises(CorruptVideoError) as err:
        FrameSource().get_frames(fake, [0, 700], 320, 180)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("decoder", ["torchcodec", "pyav"])
def test_each_decoder_through_frame_source(info, decoder):
    plan = plan_frames(info, num_frames=16, fps=None)
    frames = FrameSource(decoder=decoder).get(info, plan)
    assert read_frame_indices(frames) == list(plan.frame_indices)


@pytest.mark.gpu
def test_gpu_frame_source_matches_cpu(info):
    plan = plan_frames(info, num_frames=16, fps=None)
    gpu = FrameSource(device="cuda").get(info, plan, as_tensor=True)
    assert gpu.is_cuda
    cpu = FrameSource().get(info, plan)
    assert read_frame_indices(gpu.cpu().numpy()) == list(plan.frame_indices)
    assert np.abs(gpu.cpu().numpy().astype(int) - cpu.astype(int)).mean() < 3.0


def test_close_stops_the_source_and_is_idempotent(info):
    import asyncio

    src = FrameSource(cache_mb=16)
    frame = asyncio.run(src.aget_frame(info, 10, 160, 90))
    assert read_frame_indices(frame[None]) == [10] and src._executor is not None
    src.close()
    src.close()
    assert src._executor is None and len(src.cache) == 0
    with pytest.raises(RuntimeError, match="closed"):
        src.get_frame(info, 11, 160, 90)


def test_waiting_decodes_hold_no_default_executor_thread(info):
    """Eight concurrent requests for one video: they queue on an asyncio lock and decode in the
    source's own threads; the loop's default executor is never used."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    class Forbidden(ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            raise AssertionError("the default executor was used")

    async def main():
        asyncio.get_running_loop().set_default_executor(Forbidden(1))
        src = FrameSource(cache_mb=64)
        plans = [plan_frames(info, 4.0 * k, 4.0 * k + 3.0, fps=2.0) for k in range(8)]
        out = await asyncio.gather(*(src.aget(info, plan) for plan in plans))
        src.close()
        return plans, out

    plans, out = asyncio.run(main())
    for plan, frames in zip(plans, out):
        assert read_frame_indices(frames) == list(plan.frame_indices)


def test_lock_table_is_bounded():
    import medclaw.kernels.frames as frames

    src = FrameSource()
    for k in range(frames.MAX_VIDEO_LOCKS + 50):
        src._video_lock(f"{k:064x}")
    assert len(src._video_locks) == frames.MAX_VIDEO_LOCKS


def test_resource_failures_are_not_called_corrupt():
    from medclaw.kernels.decoders.base import DecodeJob
    from medclaw.kernels.errors import CorruptVideoError, DecodeResourceError

    job = DecodeJob(path="v.mp4", indices=(3,), width=64, height=64, fps=25.0)
    for err in (MemoryError(), RuntimeError("CUDA error: out of memory"),
                RuntimeError("cuvid decode failed: CUDA_ERROR_NO_DEVICE"), OSError(12, "ENOMEM")):
        made = job.corrupt(3, err)
        assert isinstance(made, DecodeResourceError) and not isinstance(made, CorruptVideoError)
        assert "not at fault" in str(made)
    made = job.corrupt(3, RuntimeError("Invalid data found when processing input"))
    assert isinstance(made, CorruptVideoError) and "frame 3" in str(made)


def test_large_sources_wanted_small_decode_on_the_pyav_path():
    """4K H.264 wanted at VLM size goes to PyAV (skips unwanted non-reference frames, one swscale
    pass); small sources and full-size requests keep the configured decoder."""
    import numpy as np

    from medclaw.kernels.index import VideoIndex

    def index(width, height, codec="h264"):
        return VideoIndex("0" * 64, np.arange(10), np.array([0]), 1, 25, 10, "mp4", codec,
                          meta={"width": width, "height": height, "rotation": 0})

    src = FrameSource(decoder="torchcodec")
    assert src._choose(index(3840, 2160), 1008, 560).name == "pyav"
    assert src._choose(index(3840, 2160), 3840, 2160).name == "torchcodec"     # full size
    assert src._choose(index(640, 360), 448, 252).name == "torchcodec"
    assert src._choose(index(3840, 2160, "vp9"), 1008, 560).name == "torchcodec"
