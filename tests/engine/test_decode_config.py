"""NVDEC from config: `decode: {device: cuda}` and `--decode-device` reach FrameSource; a CUDA
device is refused in one line on a host without one (before any engine starts); codecs NVDEC
does not decode go to the CPU with the reason logged once."""
from __future__ import annotations

import json
import logging
import shutil
import subprocess

import pytest

from medclaw.engine.config import DecodeConfig, load_decode_config
from medclaw.errors import ConfigError


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "medclaw.yaml"
    path.write_text(text)
    return str(path)


def test_decode_section_and_flag(tmp_path):
    path = _config(tmp_path, "profile: tiny-cpu\ndecode: {device: 'cuda:1', cache_mb: 256}\n")
    decode = load_decode_config(path)
    assert (decode.device, decode.decoder, decode.cache_mb) == ("cuda:1", "auto", 256)
    assert load_decode_config(path, device="cpu").device == "cpu"             # the flag wins
    assert load_decode_config(None) == DecodeConfig()                          # cpu, auto, 1024
    for text, match in (("decode: {device: gpu}\n", "cpu, cuda or cuda:N"),
                        ("decode: {devices: cuda}\n", "unknown key"),
                        ("decode: {decoder: ffmpeg}\n", "unknown decoder"),
                        ("decode: cuda\n", "must be a mapping")):
        with pytest.raises(ConfigError, match=match):
            load_decode_config(_config(tmp_path, text))


def test_runtime_frame_source_gets_the_device(tiny_models, tmp_path, monkeypatch):
    from medclaw.engine.runtime import open_runtime

    path = _config(tmp_path, "profile: tiny-cpu\ndecode: {device: cuda, cache_mb: 64}\n")
    # as on a host with a GPU: the check passes, and the FrameSource is built for CUDA
    monkeypatch.setattr(DecodeConfig, "check_available", lambda self: None)
    runtime = open_runtime(config_path=path)
    assert runtime.frames.device == "cuda"
    assert runtime.frames.cache.capacity_bytes == 64 * 2 ** 20
    assert runtime.live_backends() == {}                                       # nothing started
    runtime.frames.close()
    cpu = open_runtime(config_path=path, decode_device="cpu")
    assert cpu.frames.device == "cpu"
    cpu.frames.close()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU host accepts cuda")
@pytest.mark.parametrize("how", ["flag", "config"])
def test_cuda_decoding_is_refused_on_a_cpu_host_before_engines_start(how, synth_video, tmp_path,
                                                                     monkeypatch, capsys):
    import medclaw.engine.backends as backends_module
    from medclaw import cli

    def no_engine(kind):
        raise AssertionError("an engine was built although the input was refused")

    monkeypatch.setattr(backends_module, "backend_class", no_engine)
    argv = ["ask", str(synth_video.path), "What happens?", "--trace-dir", str(tmp_path)]
    if how == "flag":
        argv += ["--decode-device", "cuda"]
    else:
        argv += ["--config", _config(tmp_path, "profile: tiny-cpu\ndecode: {device: cuda}\n")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has no CUDA GPU" in err and "--decode-device cpu" in err


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU host accepts cuda")
@pytest.mark.parametrize("command", ["eval", "distill", "serve"])
def test_every_command_that_decodes_takes_decode_device(command, synth_video, tmp_path,
                                                        monkeypatch, capsys):
    """--decode-device reaches the frame source of eval, distill and serve too (not only ask):
    on this CPU host `cuda` is refused by the runtime's check, not by argparse."""
    import medclaw.engine.backends as backends_module
    from medclaw import cli
    from medclaw.eval.dataset import EvalRecord, write_dataset

    monkeypatch.setattr(backends_module, "backend_class", lambda kind: pytest.fail("engine built"))
    records = [EvalRecord(id=f"q{i}", video=str(synth_video.path), question="Which instrument?",
                          gold="grasper", type="VPR", split="test") for i in range(2)]
    data = str(write_dataset(tmp_path / "data.jsonl", records))
    argv = {"eval": ["eval", data, "--out", str(tmp_path / "run")],
            "distill": ["distill", "--mine", data, "--val", data, "--library", str(tmp_path / "lib"),
                        "--out", str(tmp_path / "distill")],
            "serve": ["serve", "--port", "0", "--data-dir", str(tmp_path / "server")]}[command]
    assert cli.main([*argv, "--decode-device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any("has no CUDA GPU" in line and "--decode-device cpu" in line for line in err), err


def test_nvdec_declines_mpeg4_part2_and_says_so_once(caplog):
    from medclaw.kernels.decoders.base import NVDEC_CODECS
    from medclaw.kernels.decoders.pynvc_decoder import PyNvDecoder
    from medclaw.kernels.decoders.torchcodec_decoder import TorchcodecDecoder
    from medclaw.kernels.index import VideoIndex

    import numpy as np

    def index(codec: str) -> VideoIndex:
        return VideoIndex(sha256="0" * 64, pts=np.arange(4), keyframes=np.arange(1), tb_num=1,
                          tb_den=25, end_pts=4, container="mov,mp4,m4a,3gp,3g2,mj2", codec=codec)

    assert "h264" in NVDEC_CODECS and "mpeg4" not in NVDEC_CODECS
    with caplog.at_level(logging.WARNING, logger="medclaw.kernels.decoders"):
        for decoder in (TorchcodecDecoder(device="cuda"), PyNvDecoder(device="cuda:0")):
            assert decoder.supports(index("h264")) is None
            why = decoder.supports(index("mpeg4"))
            assert "NVDEC does not decode mpeg4" in why and "CPU" in why
            assert decoder.supports(index("mpeg4")) == why                    # asked again
        assert TorchcodecDecoder(device="cpu").supports(index("mpeg4")) is None
    logged = [r.getMessage() for r in caplog.records if "mpeg4" in r.getMessage()]
    assert len(logged) == 2 and {m.split(":")[0] for m in logged} == {"torchcodec", "pynvc"}


@pytest.mark.gpu
def test_nvdec_frames_and_mpeg4_fallback_are_exact(synth_video, tmp_path):
    """On a GPU: H.264 decodes on NVDEC, an MPEG-4 Part 2 copy of the same video on the CPU;
    both give exactly the planned frames (barcodes)."""
    from medclaw.kernels.frames import FrameSource
    from medclaw.kernels.probe import probe_video
    from medclaw.synth.barcode import read_frame_indices

    mpeg4 = tmp_path / "procedure-mpeg4.mp4"
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i",
                    str(synth_video.path), "-c:v", "mpeg4", "-q:v", "2", str(mpeg4)], check=True)
    indices = [0, 7, 250, 251, 900, 1499]
    source = FrameSource(device="cuda")
    try:
        for path in (synth_video.path, mpeg4):
            info = probe_video(path)
            frames = source.get_frames(info, indices, 448, 252, as_tensor=True)
            assert frames.is_cuda
            assert read_frame_indices(frames.cpu().numpy()) == indices, json.dumps(source.stats())
    finally:
        source.close()
