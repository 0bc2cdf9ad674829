"""The data and command helpers that fairseq's test files import from ``tests.utils``.

fairseq's sdist ships ``tests/test_*.py`` but not ``tests/utils.py``, so ``run_fairseq_tests.py``
installs this module in its place. It is written here from what the test files ask of each
helper (their arguments and the files they expect), not taken from fairseq: it makes random
parallel data, binarizes it with fairseq's preprocessing parser, and trains, validates and
generates through fairseq's own parsers and ``fairseq_cli`` entry points, as
``fairseq-preprocess``, ``fairseq-train``, ``fairseq-validate`` and ``fairseq-generate`` do.

Only the command helpers are here. fairseq's unit-test fixtures of ``tests/utils.py`` (a fake
translation task and incremental decoder with hand-set probabilities, ``dummy_dictionary``,
``sequence_generator_setup``, ...) carry the numbers their tests assert, so they cannot be
rewritten without copying them: asking for one raises an AttributeError that says so, and
the tests that need them are in ``expected-failures.txt``.
"""
import os
import random

from fairseq import distributed_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

SPLITS = ("train", "valid", "test")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def __getattr__(name):
    raise AttributeError(f"tests.utils.{name}: fairseq's sdist does not ship tests/utils.py and "
                         f"tests/fairseq_compat/sdist_test_helpers.py rewrites only its command helpers")


def create_dummy_data(data_dir, num_examples=100, maxlen=20, alignment=False):
    """``{train,valid,test}.{in,out}``: ``num_examples`` lines of 1..``maxlen`` random letters
    each (seeded, so a data folder made twice is the same), and with ``alignment``
    ``{split}.align`` pairs ``i-j`` inside both lengths."""
    rng = random.Random(f"{num_examples}-{maxlen}")
    for split in SPLITS:
        lines = {"in": [], "out": []}
        aligns = []
        for _ in range(num_examples):
            lengths = {}
            for lang in lines:
                lengths[lang] = rng.randint(1, maxlen)
                lines[lang].append(" ".join(rng.choice(LETTERS) for _ in range(lengths[lang])))
            pairs = sorted({(rng.randrange(lengths["in"]), rng.randrange(lengths["out"]))
                            for _ in range(min(lengths.values()))})
            aligns.append(" ".join(f"{i}-{j}" for i, j in pairs))
        for lang, text in lines.items():
            _write(os.path.join(data_dir, f"{split}.{lang}"), text)
        if alignment:
            _write(os.path.join(data_dir, f"{split}.align"), aligns)


def _write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _preprocess(flags):
    from fairseq_cli import preprocess

    preprocess.main(options.get_preprocessing_parser().parse_args(flags))


def _prefixes(data_dir, lang=None):
    flags = []
    for split in SPLITS:
        prefix = os.path.join(data_dir, split)
        flags += [f"--{split}pref", f"{prefix}.{lang}" if lang else prefix]
    return flags


def preprocess_translation_data(data_dir, extra_flags=None):
    """Binarize ``in`` -> ``out`` into ``data_dir`` (``dict.in.txt``, ``dict.out.txt``, ...)."""
    _preprocess(["--source-lang", "in", "--target-lang", "out", "--destdir", data_dir, "--workers", "1",
                 "--thresholdsrc", "0", "--thresholdtgt", "0"] + _prefixes(data_dir) + (extra_flags or []))


def preprocess_lm_data(data_dir):
    """Binarize the ``out`` side alone for language modeling (``dict.txt``, ``train.bin``, ...)."""
    _preprocess(["--only-source", "--destdir", data_dir, "--workers", "1"] + _prefixes(data_dir, "out"))


def _train(flags):
    from fairseq_cli import train

    args = options.parse_args_and_arch(options.get_training_parser(), flags)
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)


def _validate(flags):
    from fairseq_cli import validate

    args = options.parse_args_and_arch(options.get_validation_parser(), flags)
    validate.main(convert_namespace_to_omegaconf(args))


def train_translation_model(data_dir, arch, extra_flags=None, task="translation", run_validation=False,
                            lang_flags=None, extra_valid_flags=None, world_size=1):
    """One epoch of ``fairseq-train`` into ``data_dir`` (``checkpoint_last.pt``); then, with
    ``run_validation``, ``fairseq-validate`` of that checkpoint on ``valid``."""
    if lang_flags is None:
        lang_flags = ["--source-lang", "in", "--target-lang", "out"]
    common = ["--task", task, data_dir, "--max-tokens", "500", "--no-progress-bar", "--num-workers", "0"]
    _train(common + ["--save-dir", data_dir, "--arch", arch, "--optimizer", "nag", "--lr", "0.05",
                     "--max-epoch", "1", "--distributed-world-size", str(world_size)]
           + lang_flags + (extra_flags or []))
    if run_validation:
        _validate(common + ["--path", os.path.join(data_dir, "checkpoint_last.pt"), "--valid-subset", "valid"]
                  + lang_flags + (extra_valid_flags or []))


def train_language_model(data_dir, arch, extra_flags=None, run_validation=False):
    """One epoch of ``fairseq-train --task language_modeling`` into ``data_dir``; then, with
    ``run_validation``, ``fairseq-validate`` on ``valid``."""
    common = ["--task", "language_modeling", data_dir, "--max-tokens", "500", "--tokens-per-sample", "500",
              "--no-progress-bar", "--num-workers", "0"]
    _train(common + ["--save-dir", data_dir, "--arch", arch, "--optimizer", "adam", "--lr", "0.0001",
                     "--max-epoch", "1", "--distributed-world-size", "1", "--ddp-backend", "no_c10d"]
           + (extra_flags or []))
    if run_validation:
        _validate(common + ["--path", os.path.join(data_dir, "checkpoint_last.pt"), "--valid-subset", "valid"])


def generate_main(data_dir, extra_flags=None, path=None):
    """``fairseq-generate`` of ``valid`` with ``checkpoint_last.pt`` (or ``path``), beam 3."""
    from fairseq_cli import generate

    args = options.parse_args_and_arch(options.get_generation_parser(), [
        data_dir, "--path", path or os.path.join(data_dir, "checkpoint_last.pt"), "--beam", "3",
        "--batch-size", "64", "--max-len-b", "5", "--gen-subset", "valid", "--no-progress-bar",
        "--num-workers", "0"] + (extra_flags or []))
    generate.main(args)


def _not_shipped(name):
    def helper(*args, **kwargs):
        raise NotImplementedError(f"tests.utils.{name}: not rewritten from fairseq's tests/utils.py, "
                                  f"which its sdist does not ship")

    helper.__name__ = name
    return helper


# imported by name at the top of test_binaries.py, used by its LASER and summarization tests only
create_laser_data_and_config_json = _not_shipped("create_laser_data_and_config_json")
preprocess_summarization_data = _not_shipped("preprocess_summarization_data")
