"""What a user installing the package gets: the license and metadata, `__version__`, the
top-level names, the gin configs as package data (resolved from an installed copy, not the
checkout), and `--help` listing each job's macros with their defaults."""

from __future__ import annotations

import email
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

import speculative
from speculative.config import gin_flags
from speculative.errors import JobError

ROOT = pathlib.Path(__file__).resolve().parents[1]
JOB_DEFAULTS = {
    "infer": "configs/runs/infer.gin",
    "benchmark": "configs/runs/benchmark.gin",
    "train": "configs/train/ende_base.gin",
    "train_head": "configs/train/qwen_coder_head.gin",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    pytest.importorskip("setuptools")  # the venv's own build backend (no download)
    # Built from a copy of what the package is made of: a checkout's build/ may hold files
    # since deleted, which a build there would ship.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for name in ("speculative", "configs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        check=True, cwd=source,
    )  # fmt: skip
    (path,) = out.glob("speculative-*.whl")
    return path


def test_wheel_metadata_license_and_configs(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(z.read(meta_name))
        license_text = z.read(meta_name.replace("METADATA", "licenses/LICENSE")).decode()
    assert meta["Version"] == speculative.__version__
    assert meta["License"] == "Apache-2.0" and "Apache License" in license_text
    assert meta["Requires-Python"] == ">=3.10" and meta["Description-Content-Type"]
    assert any("Apache Software License" in c for c in meta.get_all("Classifier"))
    shipped = {n.removeprefix("speculative/") for n in names if n.endswith(".gin")}
    in_checkout = {str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.gin")}
    assert shipped == in_checkout


def test_installed_package_resolves_configs_without_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    command = [
        sys.executable, "-m", "speculative.infer", "--gin_file=configs/runs/infer.gin",
        "--gin_file=configs/demo/tiny_random_models.gin", "--gin.OUTPUT_DIR='out'",
        "--gin.INPUT_FILE='in.jsonl'", "--print_config",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "TARGET_FORMAT = 'random'" in done.stdout
    probe = (
        "import speculative.config.gin_flags as g; print(g.find_config('configs/runs/infer.gin'))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=run_dir, env=env, capture_output=True, text=True
    )
    assert found.stdout.strip() == str(site / "speculative/configs/runs/infer.gin")


def test_help_lists_every_jobs_macros_with_defaults():
    for job, defaults in JOB_DEFAULTS.items():
        assert gin_flags.find_config(defaults) is not None, (job, defaults)
    text = gin_flags.macro_help("configs/runs/infer.gin")
    assert "  GAMMA = 4\n      Draft tokens per round, or 'auto'" in text
    assert "  TARGET_FORMAT = (required)\n      'gguf'" in text  # from the header's list
    assert "  TEMPERATURE = 0.0" in text
    done = subprocess.run(
        [sys.executable, "-m", "speculative.benchmark", "--help"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "macros of configs/runs/benchmark.gin" in done.stdout
    assert "  NUM_EXAMPLES = 8" in done.stdout


def test_macros_parser():
    gin_text = (
        "# Header.\n# - A_X, B_Y: two things\n#   that wrap\n\nA_X = %gin.REQUIRED\n"
        "# Above C. More.\nC = 3  # inline wins\nD = 'd'\n# Above E. More.\nE = None\n"
        "scope/thing.x = 1\n"
    )
    assert gin_flags.macros(gin_text) == [
        ("A_X", "%gin.REQUIRED", "two things that wrap"),
        ("C", "3", "inline wins"),
        ("D", "'d'", ""),
        ("E", "None", "Above E"),
    ]


def test_top_level_names_are_lazy_and_real():
    done = subprocess.run(
        [sys.executable, "-c", "import sys, speculative; print('jax' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "False"  # `import speculative` pulls in no JAX
    from speculative import decoding
    from speculative.decoding import sampling

    assert speculative.speculative_decode is decoding.speculative_decode
    assert speculative.SamplingConfig is sampling.SamplingConfig
    assert {"load_pair", "ModelSpec", "__version__"} <= set(dir(speculative))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        speculative.nope  # noqa: B018


def test_demo_shows_whole_lines_and_no_ansi_codes_in_a_file(capsys):
    from speculative.data import inputs
    from speculative.jobs.demo import run as demo

    prompt = "import math\n\n\ndef area(r):\n    " + "x" * 400 + "\n    return math.pi * r ** 2\n"
    assert demo.prompt_tail(prompt) == "...\n    return math.pi * r ** 2\n"
    assert demo.prompt_tail("def f():\n    return 1\n") == "def f():\n    return 1\n"
    row = {"task_id": "T/0", "alpha": 0.5, "tau": 2.0, "identical_to_plain": True}
    demo.print_completion(inputs.Example(0, "def f():\n"), {**row, "completion": "    pass"})
    out = capsys.readouterr().out  # not a terminal: no bold escape codes
    assert "def f():\n    pass" in out and "\033" not in out


def test_demo_asks_chat_questions_through_the_template():
    """--chat: each question a user turn rendered by the template, tokenized as rendered; a
    vocabulary without a template is one line naming how to give one."""
    import argparse

    from speculative.jobs.demo import run as demo
    from tests.test_cross_vocab import TARGET_TEXT, _trained

    bpe = _trained(TARGET_TEXT, 300, "<|endoftext|>")
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
    args = argparse.Namespace(chat=["Hi?", "Two primes."], chat_template=template, prompts=2)
    asked = demo.prompts(args, bpe)
    assert [e.inputs for e in asked] == [
        "[user] Hi?\n[assistant]",
        "[user] Two primes.\n[assistant]",
    ]
    assert [list(e.ids) for e in asked] == [bpe.encode_rendered(e.inputs) for e in asked]
    with pytest.raises(JobError, match="chat template"):
        demo.prompts(argparse.Namespace(chat=["Hi?"], chat_template=None, prompts=1), bpe)


def test_a_job_leaves_gin_open_for_modules_imported_after_it(tmp_path):
    """A notebook runs one job, then imports another job's module (which registers gin
    configurables): gin must not still be locked by the first job."""
    probe = (
        "from speculative import train\n"
        "train.main(['--gin_file=configs/train/ende_tiny.gin', \"--gin.OUTPUT_DIR='x'\", "
        "'--print_config'])\n"
        "import speculative.infer, speculative.train_head\n"
        "print('imported')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("imported"), done.stderr[-2000:]


def test_every_command_shares_the_one_line_boundary(capsys, tmp_path):
    """memory, fit_ngram (and demo, ende_data, the gin jobs) end a user's mistake with one line
    on stderr and exit status 2; --debug shows the traceback instead."""
    from speculative import fit_ngram, memory

    assert gin_flags.run_job(memory.main, ["--batch_size", "0"]) == 2
    assert capsys.readouterr().err == "error: --batch_size must be >= 1, got 0\n"
    argv = ["--vocab_kind=byte", f"--input_file={tmp_path / 'no.jsonl'}", f"--out={tmp_path / 'x'}"]
    assert fit_ngram.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: input ") and err.count("\n") == 1
    assert fit_ngram.main([*argv, "--debug"]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err
