"""Issue 8, items 4, 5 and 7 (data): careless paths never delete data, results never look
valid when they are not, and bad input is named by file and line."""
import gzip
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from test_recipes import SCRIPTS, head_gz, needs_multi30k, run, write_lines, MULTI30K

M30K_SMALL = (("train", 61), ("val", 13), ("test_2016_flickr", 13))


@pytest.fixture
def m30k_small(tmp_path):
    d = tmp_path / "m30k"
    for split, n in M30K_SMALL:
        for lang in ("en", "de"):
            write_lines(d / f"{split}.{lang}", head_gz(MULTI30K / f"{split}.{lang}.gz", n), gz=True)
    return d


def prepare(src_dir, out, *flags, cwd=None):
    return run([SCRIPTS / "prepare-multi30k.sh", "--from", src_dir, "--out", out, "--bpe-merges", "100",
                "--workers", "1", *flags], cwd=cwd)


# --- item 4: --force replaces only what a recipe wrote ------------------------------------
@needs_multi30k
def test_force_replaces_a_directory_the_recipe_wrote(m30k_small, tmp_path):
    out = tmp_path / "bin"
    assert prepare(m30k_small, out).returncode == 0
    assert (out / ".fairseq_ext-output").is_file()
    (out / "old").write_text("x")
    res = prepare(m30k_small, out, "--force")
    assert res.returncode == 0, res.stderr
    assert not (out / "old").exists() and (out / "dict.en.txt").is_file()


@needs_multi30k
def test_force_refuses_a_directory_it_did_not_write(m30k_small, tmp_path):
    out = tmp_path / "experiments"
    out.mkdir()
    (out / "checkpoint_best.pt").write_text("weeks of training")
    res = prepare(m30k_small, out, "--force")
    assert res.returncode != 0 and "was not written by a fairseq_ext script" in res.stderr
    assert (out / "checkpoint_best.pt").read_text() == "weeks of training"


@needs_multi30k
@pytest.mark.parametrize("where", ["cwd", "repo", "from_parent"])
def test_force_never_replaces_the_checkout_cwd_or_the_input(m30k_small, tmp_path, where):
    checkout = tmp_path / "checkout"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "README.md").write_text("mine")
    (checkout / ".fairseq_ext-output").write_text("a marker does not make it replaceable")
    if where == "cwd":
        out, cwd = Path("."), checkout
    elif where == "repo":
        out, cwd = checkout, tmp_path
    else:  # --out is a directory that contains the --from input
        inside = tmp_path / "data"
        shutil.copytree(m30k_small, inside / "m30k")
        (inside / ".fairseq_ext-output").write_text("")
        out, cwd, m30k_small = inside, tmp_path, inside / "m30k"
    res = prepare(m30k_small, out, "--force", cwd=cwd)
    assert res.returncode != 0 and "refusing to replace" in res.stderr, res.stderr
    assert (checkout / ".git").is_dir() and (checkout / "README.md").read_text() == "mine"
    assert (m30k_small / "train.en.gz").is_file()


@needs_multi30k
def test_quickstart_never_wipes_another_experiment(m30k_small, tmp_path):
    data = tmp_path / "data-bin"  # DATA_DIR=data-bin: the parent of every data set
    data.mkdir()
    (data / "other.bin").write_text("keep")
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra={"DATA_DIR": str(data), "MULTI30K_FROM": str(m30k_small),
                                                               "SAVE_DIR": str(tmp_path / "ck"), "BPE_MERGES": "100"})
    assert res.returncode != 0 and f"refusing to replace {data}" in res.stderr, res.stderr[-2000:]
    assert (data / "other.bin").read_text() == "keep"
    prepared = tmp_path / "m30k-bin"
    assert prepare(m30k_small, prepared).returncode == 0
    experiments = tmp_path / "checkpoints"  # SAVE_DIR=checkpoints: other experiments live there
    (experiments / "run1").mkdir(parents=True)
    (experiments / "run1" / "checkpoint_best.pt").write_text("keep")
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra={"DATA_DIR": str(prepared), "SAVE_DIR": str(experiments),
                                                               "BPE_MERGES": "100"})
    assert res.returncode != 0 and f"refusing to replace {experiments}" in res.stderr, res.stderr[-2000:]
    assert (experiments / "run1" / "checkpoint_best.pt").read_text() == "keep"


def test_strip_aux_refuses_to_overwrite_its_input(tmp_path, tiny_trained):
    _, checkpoint = tiny_trained
    ckpt = tmp_path / "checkpoint_last.pt"
    shutil.copy(checkpoint, ckpt)
    before = ckpt.read_bytes()
    (tmp_path / "alias.pt").symlink_to(ckpt)
    for out in (ckpt, tmp_path / "alias.pt", tmp_path / "." / "checkpoint_last.pt"):
        res = run(["fairseq-ext-strip-aux", ckpt, out])
        assert res.returncode != 0 and "is the input checkpoint" in res.stderr, res.stderr
    assert ckpt.read_bytes() == before
    res = run(["fairseq-ext-strip-aux", ckpt, tmp_path / "stripped.pt"])
    assert res.returncode == 0, res.stderr
    assert torch.load(tmp_path / "stripped.pt")["model"].keys() == torch.load(ckpt)["model"].keys()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


# --- item 5 and 7: text the recipes and the scorer read ------------------------------------
def test_bom_crlf_and_inner_cr_are_normalised(tmp_path):
    f = tmp_path / "ref.txt"
    f.write_bytes("\ufeffeine Katze\r\nein\rHund\r\n\u00e4 b\n".encode("utf-8"))
    res = subprocess.run(["python3", SCRIPTS / "lib" / "corpus_tools.py", "cat", f], capture_output=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode("utf-8") == "eine Katze\nein Hund\n\u00e4 b\n"
    wc = int(subprocess.run(["wc", "-l"], input=res.stdout, capture_output=True).stdout)
    assert wc == len(res.stdout.decode("utf-8").splitlines()) == 3


def test_non_utf8_input_names_the_file_and_line(tmp_path):
    f = tmp_path / "train.de"
    f.write_bytes(b"gut\nauch gut\nschlecht \xe4 Latin-1\n")
    res = subprocess.run(["python3", SCRIPTS / "lib" / "corpus_tools.py", "cat", f], capture_output=True, text=True)
    assert res.returncode == 1
    assert res.stderr.strip() == f"error: {f}: line 3 is not valid UTF-8 (byte 0xe4 at column 10)"
    gz = tmp_path / "train.de.gz"
    with gzip.open(gz, "wb") as out:
        out.write(b"ok\n\xff\n")
    res = subprocess.run(["python3", SCRIPTS / "lib" / "corpus_tools.py", "check-parallel", gz, gz], capture_output=True,
                         text=True)
    assert res.returncode == 1 and f"{gz}: line 2 is not valid UTF-8" in res.stderr and "Traceback" not in res.stderr


@needs_multi30k
def test_recipe_with_bom_crlf_and_a_bad_byte(m30k_small, tmp_path):
    for lang in ("en", "de"):
        lines = gzip.open(m30k_small / f"train.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
        lines[0] = "\ufeff" + lines[0]
        lines[5] = lines[5].replace(" ", "\r", 1)
        with gzip.open(m30k_small / f"train.{lang}.gz", "wb") as f:
            f.write("\r\n".join(lines).encode("utf-8") + b"\r\n")
    out = tmp_path / "bin"
    res = prepare(m30k_small, out)
    assert res.returncode == 0, res.stderr
    assert "\ufeff" not in (out / "dict.en.txt").read_text(encoding="utf-8")
    assert "\r" not in (out / "dict.de.txt").read_text(encoding="utf-8")
    with gzip.open(m30k_small / "val.de.gz", "ab") as f:
        f.write(b"caf\xe9\n")
    with gzip.open(m30k_small / "val.en.gz", "ab") as f:
        f.write(b"cafe\n")
    res = prepare(m30k_small, tmp_path / "bin2")
    assert res.returncode != 0
    assert "val.de.gz: line 14 is not valid UTF-8" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
@needs_multi30k
def test_evaluation_is_complete_or_absent(m30k_small, tmp_path):
    """A failed rerun leaves no result that significance.sh would take for current; a
    missing --ref-* file is an error."""
    out = tmp_path / "bin"
    assert prepare(m30k_small, out).returncode == 0
    ckpt_dir = tmp_path / "ckpt"
    res = run(["fairseq-train", out, "--user-dir", REPO_FAIRSEQ_EXT, "--arch", "multilayer_transformer",
               "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
               "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
               "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--optimizer", "adam",
               "--lr", "1e-3", "--max-tokens", "500", "--max-update", "2", "--cpu", "--save-dir", ckpt_dir,
               "--no-progress-bar"])
    assert res.returncode == 0, res.stderr[-2000:]
    ev = tmp_path / "eval"
    evaluate = [SCRIPTS / "evaluate.sh", "--checkpoint", ckpt_dir / "checkpoint_last.pt", "--data", out,
                "--out", ev, "--cpu", "--beam", "1", "--max-len-b", "5"]
    res = run(evaluate)
    assert res.returncode == 0, res.stderr
    assert (ev / ".evaluation-complete").is_file() and (ev / "bleu.json").is_file()
    assert not list(ev.glob(".evaluate.tmp.*"))
    res = run([*evaluate, "--ref-detok", tmp_path / "missing.de"])
    assert res.returncode != 0 and f"--ref-detok {tmp_path / 'missing.de'}: no such file" in res.stderr
    res = run([*evaluate, "--model-overrides", "{'no_such_option': 1}", "--path-typo"])  # generate fails
    assert res.returncode != 0
    assert not (ev / ".evaluation-complete").exists() and not (ev / "bleu.json").exists()
    assert not (ev / "hyp.tok").exists()
    res = run([SCRIPTS / "significance.sh", "--eval-a", ev, "--eval-b", ev, "--out", tmp_path / "sig"])
    assert res.returncode != 0 and "holds no complete evaluation" in res.stderr


REPO_FAIRSEQ_EXT = Path(__file__).resolve().parents[1] / "fairseq_ext"
