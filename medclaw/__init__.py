"""MedClaw: an on-premise engine that answers questions about long surgical videos.

Importing this package is cheap (no torch, no vLLM, no CUDA) and makes the process offline by
construction: every library that could reach a model hub or send telemetry is told not to, before
any of them is imported. Model references are local folders only (see `medclaw.models`).
`medclaw.airgap` proves it: a socket guard that refuses every non-loopback connection in this
process and in every Python process it starts (`medclaw doctor --airgap -- COMMAND`).
"""
import os as _os

# Set before transformers / huggingface_hub / vLLM are imported anywhere in this process (they read
# these at import time). Overwritten, not `setdefault`: a hospital deployment must not talk to the
# outside world whatever the environment says. (Tokenizer threads are off so that forked engine
# workers do not deadlock or warn.)
# VLLM_HOST_IP: without it every vLLM engine process "discovers" its own IP by connecting a UDP
# socket to 8.8.8.8 (vllm.utils.network_utils.get_ip); in-process engines live on this host, so
# loopback is their address. (Multi-node serving is `vllm serve`, started outside medclaw.)
# FLASHINFER_CUBINS_REPOSITORY: on Hopper/Blackwell GPUs vLLM probes NVIDIA's artifactory over
# HTTPS (vllm.utils.flashinfer.has_nvidia_artifactory) to decide whether FlashInfer may download
# TRT-LLM kernels; pointed at a closed loopback port the probe fails at once and nothing leaves.
# (Install the `flashinfer-cubin` package to have those kernels without any probe.)
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_USE_MODELSCOPE": "False",
    "FLASHINFER_CUBINS_REPOSITORY": "http://127.0.0.1:9/",
}
# What the environment said before we overwrote it (`medclaw doctor` reports the difference).
ENVIRONMENT_AT_IMPORT = {_key: _os.environ.get(_key) for _key in OFFLINE_ENV}
for _key, _value in OFFLINE_ENV.items():
    _os.environ[_key] = _value

__version__ = "0.1.0"
