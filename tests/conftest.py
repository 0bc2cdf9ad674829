"""Fixtures shared by the test folders: a binarized Multi30k slice, a tiny trained
checkpoint and a model of raw Multi30k text, each built once per run and shared by the
pytest-xdist workers (script_utils.built_once), and a Multi30k slice for the recipes, per
test. One thread for every model and subprocess of the suite."""
import collections
import gzip
import os
import re
import subprocess
import sys
import tempfile

import pytest
import torch
from fairseq import options

from model_utils import MULTI30K, TINY_TRAIN_FLAGS, USER_DIR, clean_env, make_tiny_parallel_data, train_tiny
from script_utils import (M30K_SMALL, RAW_TEXT_POSITIONS, built_once, fairseq_ext, head_gz, skip_without_multi30k,
                          write_lines)

# The models under test are tiny: one thread avoids the oversubscription that makes them
# several times slower on a 2-core machine. Every subprocess a test starts inherits one
# thread too: under `make test`'s two pytest-xdist workers, a 2-thread fairseq-train or
# -generate beside the other worker oversubscribed the 2 cores (one CI smoke test ran 20
# minutes instead of 1).
torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

TRAIN_LINES, VALID_LINES = 1500, 300


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", choices=["cpu", "cuda"],
                     help="where the tests that take the `device` fixture run their models "
                          "(tests/models/test_on_device.py; `fairseq-ext selfcheck --stage tests`): "
                          "cpu (default) or cuda")


def pytest_collection_modifyitems(config, items):
    """The files that hold an end-to-end run (marked slow) first, those with the fewest tests
    (one long run each) before those with many; each file's tests in their order. pytest-xdist
    hands the files to its workers in this order (`make test` passes --no-loadscope-reorder: its
    default order, the most tests first, started the one-test files of the longest runs last),
    so the long runs start early and the short files fill the end of the run."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    tests = collections.Counter(item.path for item in items)
    items.sort(key=lambda item: (item.path not in slow, tests[item.path] if item.path in slow else 0))  # stable


@pytest.fixture(scope="session", autouse=True)
def forkserver(tmp_path_factory):
    """Every Python command the tests start runs in a fork of a process that has torch and fairseq imported already
    (tests/forkserver), instead of importing them anew: about 3.5 CPU seconds a command. The server starts in the
    background and serves once its imports are done; FAIRSEQ_EXT_TEST_FORKSERVER=off runs every command in a new
    interpreter, FAIRSEQ_EXT_TEST_FRESH_PYTHON=1 in a command's environment that command."""
    if os.environ.get("FAIRSEQ_EXT_TEST_FORKSERVER") == "off":
        yield None
        return
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkserver")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))
    base = tmp_path_factory.getbasetemp()
    # the server's own start is never handed to a server; PYTHONWARNINGS is set per command
    env = {key: value for key, value in os.environ.items()
           if key not in ("FAIRSEQ_EXT_TEST_FORKSERVER", "PYTHONWARNINGS")}
    sock = str(base / "forkserver.sock")
    if len(sock) > 100:  # past what a Unix socket's path holds (a long --basetemp)
        sock = os.path.join(tempfile.mkdtemp(prefix="fork"), "sock")
    with open(base / "forkserver.log", "w") as log:  # the padding: room for a copy's command line (server.py)
        server = subprocess.Popen([sys.executable, os.path.join(folder, "server.py"), sock, " " * 8192], env=env,
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    os.environ["FAIRSEQ_EXT_TEST_FORKSERVER"] = sock
    yield server
    server.terminate()  # its commands end with it
    server.wait()


@pytest.fixture(scope="session")
def device(request):
    """The torch device of `pytest --device` (CPU by default). On CUDA, TF32 is off, so that
    fp32 means fp32 and the 1e-5 equivalences hold there as on the CPU."""
    chosen = torch.device(request.config.getoption("--device"))
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            pytest.exit("--device cuda: torch sees no GPU (torch.cuda.is_available() is False)", returncode=4)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return chosen


def tokenize(line):
    return " ".join(re.sub(r"([.,!?;:\"()\[\]])", r" \1 ", line.lower()).split())


@pytest.fixture(scope="session")
def multi30k_bin(tmp_path_factory):
    """A lowercased, punctuation-split slice of Multi30k en->de (1,500 training and 300
    validation pairs from $FAIRSEQ_EXT_DATA/multi30k), binarized with a joined dictionary."""
    skip_without_multi30k()

    def build(root):
        from fairseq_cli import preprocess

        for split, source, lines in (("train", "train", TRAIN_LINES), ("valid", "val", VALID_LINES)):
            for lang in ("en", "de"):
                with gzip.open(os.path.join(MULTI30K, f"{source}.{lang}.gz"), "rt", encoding="utf-8") as fin, \
                        open(root / f"{split}.{lang}", "w", encoding="utf-8") as fout:
                    for _, line in zip(range(lines), fin):
                        fout.write(tokenize(line) + "\n")
        parser = options.get_preprocessing_parser()
        preprocess.main(parser.parse_args([
            "--source-lang", "en", "--target-lang", "de", "--trainpref", str(root / "train"),
            "--validpref", str(root / "valid"), "--destdir", str(root / "bin"), "--joined-dictionary",
            "--thresholdsrc", "2", "--workers", "1",
        ]))

    return str(built_once(tmp_path_factory, "multi30k", build) / "bin")


@pytest.fixture(scope="session")
def tiny_trained(tmp_path_factory):
    """A real fairseq-train checkpoint (2 updates, `--arch multilayer_transformer`) on the
    tiny synthetic task of model_utils.make_tiny_parallel_data: (bin_dir, checkpoint path).
    Shared: a test that changes it copies it first."""
    import subprocess

    def build(root):
        bin_dir = make_tiny_parallel_data(str(root), num_train=61)
        subprocess.run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer",
                        *TINY_TRAIN_FLAGS, "--max-update", "2", "--save-dir", str(root / "ckpt")],
                       check=True, capture_output=True, env=clean_env())

    root = built_once(tmp_path_factory, "tiny_trained", build)
    return str(root / "bin"), str(root / "ckpt" / "checkpoint_last.pt")


@pytest.fixture(scope="session")
def raw_text_model(tmp_path_factory):
    """(data directory, checkpoint): ``fairseq-ext prepare multi30k`` on the first 300 training
    lines of the local Multi30k copy (200 BPE merges), then 40 updates of a tiny
    ``multilayer_transformer`` with RAW_TEXT_POSITIONS source and target positions."""
    skip_without_multi30k()

    def build(root):
        corpus = root / "m30k"
        for split, n in (("train", 300), ("val", 13), ("test_2016_flickr", 13)):
            for lang in ("en", "de"):
                write_lines(corpus / f"{split}.{lang}", head_gz(os.path.join(MULTI30K, f"{split}.{lang}.gz"), n),
                            gz=True)
        res = fairseq_ext("prepare", "multi30k", "--from", corpus, "--out", root / "bin", "--bpe-merges", "200",
                          "--workers", "1")
        assert res.returncode == 0, res.stderr[-3000:]
        train_tiny(root / "bin", root / "ckpt", "--max-source-positions", str(RAW_TEXT_POSITIONS),
                   "--max-target-positions", str(RAW_TEXT_POSITIONS), max_update=40)

    root = built_once(tmp_path_factory, "raw_text_model", build)
    return root / "bin", root / "ckpt" / "checkpoint_last.pt"


def write_m30k_small(directory):
    """M30K_SMALL's lines of the local Multi30k copy, gzipped into ``directory`` as the recipes
    read them; ``directory``."""
    for split, n in M30K_SMALL:
        for lang in ("en", "de"):
            write_lines(directory / f"{split}.{lang}", head_gz(os.path.join(MULTI30K, f"{split}.{lang}.gz"), n), gz=True)
    return directory


@pytest.fixture(scope="session")
def m30k_small_prepared(tmp_path_factory):
    """M30K_SMALL (as m30k_small) prepared once by prepare-multi30k.sh with 100 BPE merges, the
    recipe's output as it leaves it; a test that writes into it copies it first (shutil.copytree)."""
    skip_without_multi30k()

    def build(root):
        res = fairseq_ext("prepare", "multi30k", "--from", write_m30k_small(root / "m30k"), "--out", root / "bin", "--bpe-merges", "100",
                          "--workers", "1")
        assert res.returncode == 0, res.stderr[-3000:]

    return built_once(tmp_path_factory, "m30k_small_prepared", build) / "bin"


@pytest.fixture(scope="session")
def smoke_data_root(tmp_path_factory):
    """A --data-root holding reproduce/multi30k-en-de.smoke as `fairseq-ext reproduce --smoke`
    prepares it (its own command), prepared once per run; the end-to-end reproductions copy it
    into their --data-root, where the runner finds it prepared."""
    skip_without_multi30k()

    from fairseq_ext.reproduce.tables import load_setups

    smoke = load_setups()["smoke"]  # the smoke cut the runner asks the recipe for

    def build(root):
        res = fairseq_ext("prepare", "multi30k", "--src", "en", "--tgt", "de", "--out",
                          root / "reproduce" / "multi30k-en-de.smoke", "--max-lines", smoke["max_lines"],
                          "--bpe-merges", smoke["bpe_merges"])
        assert res.returncode == 0, res.stderr[-3000:]

    return built_once(tmp_path_factory, "smoke_data_root", build)


@pytest.fixture
def m30k_small(tmp_path):
    """The first 61/13/13 lines (M30K_SMALL) of the local Multi30k copy's en and de
    train/val/test_2016_flickr files, gzipped as the recipes read them (the test is skipped
    where there is no local copy, as the tests marked needs_multi30k are)."""
    skip_without_multi30k()
    return write_m30k_small(tmp_path / "m30k")
