"""`medclaw bench decode`: runs end to end on a small synthetic video and reports honest JSON."""
from __future__ import annotations

import argparse
import json
import shutil

import pytest

from medclaw.bench import decode as bench_decode
from medclaw.bench.decode import case_request, has_ground_truth, run_benchmark

KEYS = {"ours_s", "baseline_s", "speedup", "ffmpeg_all_s", "ratio_to_ffmpeg", "ours_peak_mb",
        "baseline_peak_mb", "frame_accuracy"}


def test_cases_define_the_same_request_for_both_sides(synth_video):
    from medclaw.kernels.probe import probe_video

    info = probe_video(synth_video.path)
    window = case_request("window", info)
    assert window["plan"]["start_s"] == window["ele"]["video_start"]
    assert window["range"][1] - window["range"][0] == pytest.approx(30.0)
    assert case_request("sparse", info)["plan"]["num_frames"] == case_request(
        "sparse", info)["ele"]["nframes"] == 64
    with pytest.raises(ValueError):
        case_request("nope", info)


@pytest.mark.slow
def test_full_benchmark_on_synthetic_video(synth_video):
    if shutil.which("ffmpeg") is None:
        pytest.skip("needs the ffmpeg binary")
    assert has_ground_truth(str(synth_video.path))
    # Two cases: one compared with the baseline reader, and the seek case that has none. Every
    # case costs fresh subprocesses (one per measured side); the requests are checked above.
    result = run_benchmark(str(synth_video.path), "cpu", ("sparse", "seek"), repeat=1,
                           baseline=True, progress=False)
    assert result["device"] == "cpu" and set(result["cases"]) == {"sparse", "seek"}
    seek = result["cases"].pop("seek")
    assert seek["num_frames"] == 1 and seek["frame_accuracy"] == 1.0 and seek["baseline_s"] is None
    assert seek["ours_s"] > 0 and seek["ffmpeg_all_s"] > 0
    assert seek["ratio_to_ffmpeg"] == pytest.approx(seek["ours_s"] / seek["ffmpeg_all_s"], rel=0.02)
    for case, row in result["cases"].items():
        assert KEYS <= set(row), case
        assert row["frame_accuracy"] == 1.0 and row["baseline_frame_accuracy"] == 1.0
        assert row["same_frames_as_baseline"] and row["baseline_reader"] == "torchcodec"
        assert row["ours_s"] > 0 and row["baseline_s"] > 0 and row["ffmpeg_all_s"] > 0
        assert row["speedup"] == pytest.approx(row["baseline_s"] / row["ours_s"], rel=0.02)
        assert row["ours_peak_mb"] >= 0 and row["baseline_peak_mb"] >= 0
    assert result["cases"]["sparse"]["num_frames"] == 64


def test_cli_without_ground_truth_reports_null_accuracy(synth_video, tmp_path, capsys):
    if shutil.which("ffmpeg") is None:
        pytest.skip("needs the ffmpeg binary")
    plain = tmp_path / "plain.mp4"
    shutil.copy(synth_video.path, plain)                      # no JSON beside it
    parser = argparse.ArgumentParser()
    bench_decode.register(parser)
    args = parser.parse_args([str(plain), "--json", "--cases", "sparse", "--no-baseline",
                              "--threads", "1"])
    assert args.handler(args) == 0
    out = json.loads(capsys.readouterr().out)
    row = out["cases"]["sparse"]
    assert row["frame_accuracy"] is None and row["baseline_s"] is None
    assert row["num_frames"] == 64 and row["ours_s"] > 0
    # One thread count for ours and for the ffmpeg speed limit, recorded with the result.
    assert out["method"]["threads"] == 1 and "-threads 1 " in out["method"]["ffmpeg"]


def test_unknown_case_is_a_config_error(synth_video):
    from medclaw.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown case"):
        run_benchmark(str(synth_video.path), cases=("nope",), progress=False)
    with pytest.raises(ConfigError, match="--threads must be >= 1"):
        run_benchmark(str(synth_video.path), progress=False, threads=0)


def test_check_all_counts_wrong_frames_per_decoder(tmp_path):
    """--check-all on an MPEG-TS file: FrameSource returns 0 wrong frames; raw decoders are
    counted (torchcodec 0.14 seeks to wrong frames there) or their error is reported."""
    from medclaw.kernels.decoders import available_decoders
    from medclaw.kernels.probe import probe_video
    from medclaw.synth.formats import make_format, missing_encoder

    if missing_encoder("ts"):
        pytest.skip(missing_encoder("ts"))
    video = make_format("ts", tmp_path)
    info = probe_video(video)
    checked = bench_decode.check_all(str(video), info, ("sparse", "seek"))
    for case in ("sparse", "seek"):
        row = checked[case]
        assert row["checked_frames"] == (64 if case == "sparse" else 1)
        assert row["wrong_frames"]["frame_source"] == 0
        assert set(row["wrong_frames"]) == {"frame_source", *available_decoders("cpu")}
    raw = checked["sparse"]["wrong_frames"]["torchcodec"]
    assert isinstance(raw, str) or raw > 0          # the failure FrameSource protects us from
