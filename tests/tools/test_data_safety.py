"""Data safety of the scripts and recipes: careless paths never delete data (--force replaces
only what a recipe wrote, never the checkout, the working directory, the input or another
script's output), results never look valid when they are not (an evaluation is complete or
absent), and bad input (BOM, CR, non-UTF-8) is normalised or named by file and line."""
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model_utils import train_in_process
from script_utils import M30K_SMALL, PACKAGE, REPO, SCRIPTS, TOOLS, needs_multi30k, run

from fairseq_ext.standalone import evaluations, outputs


def mark(directory, prog, *entries):
    """The marker ``prog`` writes: the manifest listing ``entries`` (exact paths; "SUB/" a
    nested output)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".fairseq_ext-output").write_text(
        f"# written by {prog} (fairseq_ext); it may replace this directory while it holds only:\n"
        "# manifest: exact paths\n" + "".join(e + "\n" for e in entries))


def error_lines(stderr):
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def prepare(src_dir, out, *flags, cwd=None):
    return run([SCRIPTS / "prepare-multi30k.sh", "--from", src_dir, "--out", out, "--bpe-merges", "100",
                "--workers", "1", *flags], cwd=cwd)


# --- --force replaces only what a recipe wrote -------------------------------------------
@needs_multi30k
def test_force_replaces_a_directory_the_recipe_wrote_and_nothing_else_wrote_into(m30k_small, tmp_path):
    out = tmp_path / "bin"
    assert prepare(m30k_small, out).returncode == 0
    marker = (out / ".fairseq_ext-output").read_text()
    assert marker.startswith("# written by prepare-multi30k.sh") and "\ndict.en.txt\n" in marker
    (out / "prep.env").write_text("edited")  # an entry the recipe wrote, changed: still its own
    res = prepare(m30k_small, out, "--force")
    assert res.returncode == 0, res.stderr
    assert (out / "prep.env").read_text().startswith("# written by") and (out / "dict.en.txt").is_file()
    # a user put another experiment into it (the recipe wrote --out data-bin once): kept
    (out / "run1").mkdir()
    (out / "run1" / "checkpoint_best.pt").write_text("weeks of training")
    res = prepare(m30k_small, out, "--force")
    assert res.returncode != 0 and "it holds run1, which prepare-multi30k.sh did not write there" in res.stderr
    assert (out / "run1" / "checkpoint_best.pt").read_text() == "weeks of training"
    assert (out / "dict.en.txt").is_file() and not list(tmp_path.glob(".bin.tmp.*"))


@needs_multi30k
def test_force_keeps_a_note_saved_inside_the_recipes_text_folder(m30k_small, tmp_path):
    """The recipe's marker is the exact manifest of what it wrote, text/ included: a file the
    user saved into text/ keeps the directory, which used to be replaced with it."""
    out = tmp_path / "bin"
    assert prepare(m30k_small, out).returncode == 0
    listed = outputs.owned_entries(str(out))
    assert "text/valid.tok.en" in listed and "text" not in listed and "prep.env" in listed
    (out / "text" / "note.txt").write_text("which references I checked by hand")
    res = prepare(m30k_small, out, "--force")
    assert res.returncode != 0
    assert [line for line in res.stderr.splitlines() if "error" in line] == [
        f"prepare-multi30k.sh: error: refusing to replace {out}: it holds text/note.txt, which prepare-multi30k.sh "
        f"did not write there; move it elsewhere, or remove {out} yourself"], res.stderr
    assert (out / "text" / "note.txt").read_text() == "which references I checked by hand"
    assert (out / "text" / "valid.tok.en").is_file() and not list(tmp_path.glob(".bin.tmp.*"))
    (out / "text" / "note.txt").unlink()
    res = prepare(m30k_small, out, "--force")
    assert res.returncode == 0, res.stderr


@needs_multi30k
def test_force_refuses_a_directory_it_did_not_write(m30k_small, tmp_path):
    out = tmp_path / "experiments"
    out.mkdir()
    (out / "checkpoint_best.pt").write_text("weeks of training")
    res = prepare(m30k_small, out, "--force")
    assert res.returncode != 0 and "was not written by a fairseq_ext script" in res.stderr
    assert (out / "checkpoint_best.pt").read_text() == "weeks of training"


@needs_multi30k
@pytest.mark.parametrize("where", ["cwd", "repo", "from_parent", "download_dir"])
def test_force_never_replaces_the_checkout_cwd_or_the_input(m30k_small, tmp_path, where):
    checkout = tmp_path / "checkout"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "README.md").write_text("mine")
    mark(checkout, "prepare-multi30k.sh", ".git", "README.md")  # a marker does not make it replaceable
    flags = ()
    if where == "cwd":
        out, cwd = Path("."), checkout
    elif where == "repo":
        out, cwd = checkout, tmp_path
    elif where == "from_parent":  # --out is a directory that contains the --from input
        inside = tmp_path / "data"
        shutil.copytree(m30k_small, inside / "m30k")
        outputs.mark_output(str(inside), prog="prepare-multi30k.sh")
        out, cwd, m30k_small = inside, tmp_path, inside / "m30k"
    else:  # --download-dir inside --out
        out, cwd = tmp_path / "data", tmp_path
        (out / "downloads").mkdir(parents=True)
        (out / "downloads" / "archive.tgz").write_text("slow to fetch")
        mark(out, "prepare-multi30k.sh", "downloads/archive.tgz")
        flags = ("--download-dir", out / "downloads")
    res = prepare(m30k_small, out, "--force", *flags, cwd=cwd)
    assert res.returncode != 0 and "refusing to replace" in res.stderr, res.stderr
    assert "is or contains" in res.stderr or "git repository" in res.stderr, res.stderr
    assert (checkout / ".git").is_dir() and (checkout / "README.md").read_text() == "mine"
    assert (m30k_small / "train.en.gz").is_file()
    if where == "download_dir":
        assert (out / "downloads" / "archive.tgz").read_text() == "slow to fetch"


@needs_multi30k
def test_quickstart_never_wipes_another_experiment(m30k_small, m30k_small_prepared, tmp_path):
    data = tmp_path / "data-bin"  # DATA_DIR=data-bin: the parent of every data set
    data.mkdir()
    (data / "other.bin").write_text("keep")
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra={"DATA_DIR": str(data), "MULTI30K_FROM": str(m30k_small),
                                                               "SAVE_DIR": str(tmp_path / "ck"), "BPE_MERGES": "100"})
    assert res.returncode != 0 and f"refusing to replace {data}" in res.stderr, res.stderr[-2000:]
    assert (data / "other.bin").read_text() == "keep"
    prepared = tmp_path / "m30k-bin"
    shutil.copytree(m30k_small_prepared, prepared, symlinks=True)
    experiments = tmp_path / "checkpoints"  # SAVE_DIR=checkpoints: other experiments live there
    (experiments / "run1").mkdir(parents=True)
    (experiments / "run1" / "checkpoint_best.pt").write_text("keep")
    env = {"DATA_DIR": str(prepared), "SAVE_DIR": str(experiments), "BPE_MERGES": "100"}
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra=env)
    assert res.returncode != 0 and f"refusing to replace {experiments}" in res.stderr, res.stderr[-2000:]
    assert "not written by a fairseq_ext script" in res.stderr
    # quickstart created checkpoints/ itself once (its marker), and run1 was put there later:
    # still refused; so is an earlier version's run, known only by its quickstart.settings
    for own in ("marker", "settings"):
        (experiments / "checkpoint_last.pt").write_text("quickstart's")
        if own == "marker":
            mark(experiments, "quickstart.sh", "checkpoint_last.pt", "train.log", "quickstart.settings", "eval-test/")
            want = "it holds run1, which quickstart.sh did not write there"
        else:
            (experiments / ".fairseq_ext-output").unlink()
            (experiments / "quickstart.settings").write_text("old settings")
            want = f"refusing to replace {experiments}: it was not written by a fairseq_ext script"
        res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra=env)
        assert res.returncode != 0 and want in res.stderr, res.stderr[-2000:]
        assert (experiments / "run1" / "checkpoint_best.pt").read_text() == "keep"
        assert (experiments / "checkpoint_last.pt").read_text() == "quickstart's"
    # quickstart changes into the repository; the directory the user started it in stays protected
    own = tmp_path / "qs"
    mark(own, "quickstart.sh", "checkpoint_last.pt", "train.log", "quickstart.settings", "eval-test/")
    (own / "train.log").write_text("x")
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra={**env, "SAVE_DIR": str(own)}, cwd=own)
    assert res.returncode != 0 and f"refusing to replace {own}: it is or contains {own}" in res.stderr
    assert (own / "train.log").read_text() == "x"


@needs_multi30k
def test_quickstart_with_other_settings_keeps_a_users_checkpoint_in_save_dir(m30k_small_prepared, tmp_path):
    """A rerun with other settings replaces SAVE_DIR; an averaged checkpoint_avg5.pt the user
    saved there keeps it. A SAVE_DIR an earlier version marked with the glob checkpoint*,
    without a manifest, is kept whole."""
    data = tmp_path / "m30k-bin"
    shutil.copytree(m30k_small_prepared, data, symlinks=True)
    # settings of a tiny model: had it trained (as it did before), it would have been over quickly
    env = {"DATA_DIR": str(data), "BPE_MERGES": "100", "LAYERS": "1", "EMBED_DIM": "16", "FFN_DIM": "32",
           "HEADS": "2", "MAX_UPDATE": "1", "MAX_TOKENS": "600", "BEAM": "1"}
    for how in ("legacy_marker", "manifest"):
        save = tmp_path / how
        save.mkdir()
        for f in ("checkpoint_best.pt", "checkpoint_last.pt", "train.log"):
            (save / f).write_text("quickstart's")
        (save / "quickstart.settings").write_text("other settings")
        if how == "manifest":
            outputs.mark_output(str(save), prog="quickstart.sh")
            want = f"refusing to replace {save}: it holds checkpoint_avg5.pt, which quickstart.sh did not write there"
        else:
            (save / ".fairseq_ext-output").write_text(
                "# written by quickstart.sh (fairseq_ext); it may replace this directory while it holds only:\n"
                "checkpoint*\ntrain.log\nquickstart.settings\neval-test\n")
            want = f"refusing to replace {save}: its .fairseq_ext-output holds no manifest of exact paths"
        (save / "checkpoint_avg5.pt").write_text("the average of my last five checkpoints")
        res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra={**env, "SAVE_DIR": str(save)})
        assert res.returncode != 0, res.stderr[-2000:]
        assert want in res.stderr, res.stderr[-2000:]
        assert (save / "checkpoint_avg5.pt").read_text() == "the average of my last five checkpoints"
        assert (save / "checkpoint_last.pt").read_text() == "quickstart's"


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


# --- text the recipes and the scorer read -----------------------------------------------
def test_bom_crlf_and_inner_cr_are_normalised(tmp_path):
    f = tmp_path / "ref.txt"
    f.write_bytes("\ufeffeine Katze\r\nein\rHund\r\n\u00e4 b\n".encode("utf-8"))
    res = subprocess.run(["python3", TOOLS / "corpus.py", "cat", f], capture_output=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode("utf-8") == "eine Katze\nein Hund\n\u00e4 b\n"
    wc = int(subprocess.run(["wc", "-l"], input=res.stdout, capture_output=True).stdout)
    assert wc == len(res.stdout.decode("utf-8").splitlines()) == 3


def test_non_utf8_input_names_the_file_and_line(tmp_path):
    f = tmp_path / "train.de"
    f.write_bytes(b"gut\nauch gut\nschlecht \xe4 Latin-1\n")
    res = subprocess.run(["python3", TOOLS / "corpus.py", "cat", f], capture_output=True, text=True)
    assert res.returncode == 1
    assert res.stderr.strip() == f"error: {f}: line 3 is not valid UTF-8 (byte 0xe4 at column 10)"
    gz = tmp_path / "train.de.gz"
    with gzip.open(gz, "wb") as out:
        out.write(b"ok\n\xff\n")
    res = subprocess.run(["python3", TOOLS / "corpus.py", "check-parallel", gz, gz], capture_output=True,
                         text=True)
    assert res.returncode == 1 and f"{gz}: line 2 is not valid UTF-8" in res.stderr and "Traceback" not in res.stderr


def dirty(lines):
    """The lines as bytes with a UTF-8 BOM, CR LF line ends and a CR inside line 6."""
    lines = list(lines)
    lines[5] = lines[5].replace(" ", "\r", 1)
    return "\ufeff".encode() + "\r\n".join(lines).encode("utf-8") + b"\r\n"


@needs_multi30k
def test_recipe_with_bom_crlf_and_inner_cr(m30k_small, tmp_path):
    for split, n in M30K_SMALL:
        for lang in ("en", "de"):
            f = m30k_small / f"{split}.{lang}.gz"
            lines = gzip.open(f, "rt", encoding="utf-8").read().splitlines()
            assert len(lines) == n
            with gzip.open(f, "wb") as out:
                out.write(dirty(lines))
    out = tmp_path / "bin"
    res = prepare(m30k_small, out)
    assert res.returncode == 0, res.stderr
    env = dict(line.split("=", 1) for line in (out / "prep.env").read_text().splitlines() if "=" in line)
    assert (env["train_pairs"], env["valid_pairs"], env["test_pairs"]) == ("61", "13", "13")
    for f in [*out.glob("dict.*.txt"), *(out / "text").iterdir()]:
        text = f.read_text(encoding="utf-8")
        assert "\ufeff" not in text and "\r" not in text, f
    for f in (out / "text").iterdir():
        n = 13
        assert len(f.read_text(encoding="utf-8").split("\n")) - 1 == n, f  # as wc -l counts
        assert len(f.read_text(encoding="utf-8").splitlines()) == n, f  # as Python counts


@needs_multi30k
def test_recipe_non_utf8_input_is_one_line_naming_file_and_line(m30k_small, tmp_path):
    with gzip.open(m30k_small / "val.de.gz", "ab") as f:
        f.write(b"caf\xe9\n")
    with gzip.open(m30k_small / "val.en.gz", "ab") as f:
        f.write(b"cafe\n")
    out = tmp_path / "bin"
    res = prepare(m30k_small, out)
    assert res.returncode != 0 and not out.exists()
    assert error_lines(res.stderr) == [f"prepare-multi30k.sh: error: {m30k_small / 'val.de.gz'}: line 14 is not "
                                       "valid UTF-8 (byte 0xe9 at column 4)"], res.stderr


# --- evaluate.sh and significance.sh, up to the point where fairseq-generate runs ----------
@pytest.fixture
def fake_eval_inputs(tmp_path):
    """A data directory and a checkpoint that pass evaluate.sh's checks (the checkpoint is
    not a real one: fairseq-generate fails on it)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "prep.env").write_text("# written by prepare-multi30k.sh\nrecipe=multi30k\nsrc=en\ntgt=de\nbpe=subword_nmt\n")
    (data / "test.en-de.en.idx").write_bytes(b"")
    ckpt = tmp_path / "ckpt" / "checkpoint_best.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"not a checkpoint")
    return data, ckpt


def evaluate(data, ckpt, out, *flags):
    return run([SCRIPTS / "evaluate.sh", "--checkpoint", ckpt, "--data", data, "--out", out, "--cpu", *flags])


def test_evaluate_missing_reference_is_an_error(fake_eval_inputs, tmp_path):
    data, ckpt = fake_eval_inputs
    for opt in ("--ref-detok", "--ref-tok"):
        missing = tmp_path / f"missing{opt}.de"
        res = evaluate(data, ckpt, tmp_path / "eval", opt, missing)
        assert res.returncode != 0 and f"error: {opt} {missing}: no such file" in res.stderr, res.stderr
        assert not (tmp_path / "eval").exists()


def test_evaluate_replaces_only_its_own_output(fake_eval_inputs, tmp_path):
    data, ckpt = fake_eval_inputs
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "hyp.tok").write_text("my own hypotheses")
    res = evaluate(data, ckpt, mine)
    assert res.returncode != 0 and "was not written by a fairseq_ext script" in res.stderr, res.stderr
    assert (mine / "hyp.tok").read_text() == "my own hypotheses"
    # never the directory of the checkpoint, even one a script of this package wrote
    mark(ckpt.parent, "quickstart.sh", "checkpoint_best.pt")
    res = evaluate(data, ckpt, ckpt.parent)
    assert res.returncode != 0 and f"it is or contains {ckpt}" in res.stderr, res.stderr
    assert ckpt.read_bytes() == b"not a checkpoint"
    res = run([SCRIPTS / "evaluate.sh", "--checkpoint", ckpt, "--data", data, "--out", ".", "--cpu"], cwd=mine)
    assert res.returncode != 0 and "refusing to replace" in res.stderr
    assert (mine / "hyp.tok").read_text() == "my own hypotheses"


def test_failed_evaluation_leaves_no_result(fake_eval_inputs, tmp_path):
    """A rerun that fails removes the previous evaluation: significance.sh cannot compare
    stale hypotheses."""
    data, ckpt = fake_eval_inputs
    ev = tmp_path / "eval"
    entries = ("hyp.tok", "ref.tok", "bleu.txt", "bleu.json", "generate-test.txt")
    mark(ev, "evaluate.sh", *entries, ".evaluation-complete")
    for f in entries:
        (ev / f).write_text("an earlier checkpoint's\n")
    (ev / ".evaluation-complete").write_text("checkpoint=old.pt\n")
    res = evaluate(data, ckpt, ev)
    assert res.returncode != 0 and "fairseq-generate failed" in res.stderr, res.stderr
    assert sorted(p.name for p in ev.iterdir()) == [".fairseq_ext-output", "generate-test.cmd", "generate-test.log"]
    assert not list(tmp_path.glob(".eval.tmp.*"))
    res = run([SCRIPTS / "significance.sh", "--eval-a", ev, "--eval-b", ev, "--out", tmp_path / "sig"])
    assert res.returncode != 0 and f"{ev} holds no complete evaluation" in res.stderr
    assert not (tmp_path / "sig").exists()


def test_significance_reads_clean_lines_and_names_bad_input(tmp_path):
    rows = [f"word{i} is here ." for i in range(13)]
    (tmp_path / "ref").write_bytes(dirty(rows))  # BOM, CRLF, a CR inside line 6
    (tmp_path / "a").write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "b").write_text("".join(r.replace("here", "there") + "\n" for r in rows), encoding="utf-8")
    sig = [SCRIPTS / "significance.sh", "--ref", tmp_path / "ref", "--sys-a", tmp_path / "a", "--sys-b",
           tmp_path / "b", "--samples", "50"]
    res = run([*sig, "--out", tmp_path / "sig"])
    assert res.returncode == 0, res.stderr
    assert "Aggregate Scores" in (tmp_path / "sig" / "report.txt").read_text()
    # an existing --out it did not write is refused; its own is replaced
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    res = run([*sig, "--out", mine])
    assert res.returncode != 0 and "was not written by a fairseq_ext script" in res.stderr
    assert (mine / "notes.txt").read_text() == "keep"
    res = run([*sig, "--out", tmp_path / "sig"])
    assert res.returncode == 0, res.stderr
    (tmp_path / "b").write_bytes(b"ok\n" * 6 + b"\xff\n" + b"ok\n" * 6)
    res = run([*sig, "--out", tmp_path / "sig2"])
    assert res.returncode != 0 and not (tmp_path / "sig2").exists()
    assert error_lines(res.stderr) == [f"fairseq-ext significance: error: {tmp_path / 'b'}: line 7 is not valid UTF-8 "
                                       "(byte 0xff at column 1)"], res.stderr


# --- each script replaces only its own kind of directory ----------------------------------
def quick_prepare(out, *flags, cwd=None, script=SCRIPTS / "prepare-multi30k.sh", env_extra=None):
    """A recipe run that stops at the output check or fails right after it (its --from holds
    no corpus): enough to see whether --out would have been replaced."""
    src = Path(out).parent / "no-corpus"
    src.mkdir(exist_ok=True)
    return run([script, "--from", src, "--out", out, "--force", *flags], cwd=cwd, env_extra=env_extra)


def test_force_refuses_another_scripts_directory(tmp_path, fake_eval_inputs):
    """A recipe never replaces quickstart's checkpoints or another recipe's data; evaluate.sh
    never replaces a data directory."""
    save = tmp_path / "qs"
    mark(save, "quickstart.sh", "checkpoint_best.pt", "train.log", "quickstart.settings", "eval-test/")
    (save / "checkpoint_best.pt").write_text("days of training")
    res = quick_prepare(save)
    assert res.returncode != 0 and f"refusing to replace {save}: it was written by quickstart.sh, and " \
        "prepare-multi30k.sh replaces only its own output" in res.stderr, res.stderr
    assert (save / "checkpoint_best.pt").read_text() == "days of training"
    # another recipe's output: refused too
    other = tmp_path / "iwslt"
    mark(other, "prepare-iwslt14.sh", "prep.env", "dict.de.txt")
    (other / "prep.env").write_text("# written by prepare-iwslt14.sh; read by evaluate.sh\nrecipe=iwslt14\n")
    (other / "dict.de.txt").write_text("x 1\n")
    res = quick_prepare(other)
    assert res.returncode != 0 and "it was written by prepare-iwslt14.sh" in res.stderr, res.stderr
    assert (other / "dict.de.txt").is_file()
    # evaluate.sh --out naming a data directory other than --data
    data, ckpt = fake_eval_inputs
    res = evaluate(data, ckpt, other)
    assert res.returncode != 0 and "it was written by prepare-iwslt14.sh, and evaluate.sh replaces only its own " \
        "output" in res.stderr, res.stderr
    assert (other / "dict.de.txt").is_file() and (other / "prep.env").is_file()


@pytest.mark.parametrize("where", ["home", "root_of_checkout", "deep_git"])
def test_force_never_replaces_home_the_checkout_or_a_git_repository(tmp_path, where):
    victim = tmp_path / "victim"
    mark(victim, "prepare-multi30k.sh", "README.md")  # a marker does not make these replaceable
    (victim / "README.md").write_text("mine")
    env, script = None, SCRIPTS / "prepare-multi30k.sh"
    if where == "home":
        env = {"HOME": str(victim)}
        out = victim
    elif where == "root_of_checkout":  # a copy of the package: the directory holding it is victim
        shutil.copytree(PACKAGE, victim / "fairseq_ext", ignore=shutil.ignore_patterns("__pycache__"))
        script, out = victim / "fairseq_ext" / "recipes" / "prepare-multi30k.sh", victim
    else:  # a git repository five levels down
        (victim / "a" / "b" / "c" / "d" / "e" / ".git").mkdir(parents=True)
        out = victim
    res = quick_prepare(out, script=script, env_extra=env)
    assert res.returncode != 0, res.stderr
    if where == "deep_git":
        assert f"refusing to replace {victim}: it contains a git repository ({victim}/a/b/c/d/e/.git)" in res.stderr
    else:
        assert f"refusing to replace {victim}: it is or contains {victim}" in res.stderr, res.stderr
    assert (victim / "README.md").read_text() == "mine" and (victim / ".fairseq_ext-output").is_file()


@needs_multi30k
def test_quickstart_failed_training_leaves_no_checkpoint(m30k_small_prepared, tmp_path):
    """SAVE_DIR is built beside itself and moved into place only when training succeeded: a
    failed retraining leaves train.log, never the old checkpoint looking current."""
    data = tmp_path / "m30k-bin"
    shutil.copytree(m30k_small_prepared, data, symlinks=True)
    save = tmp_path / "qs"
    mark(save, "quickstart.sh", "checkpoint_last.pt", "train.log", "quickstart.settings", "eval-test/")
    (save / "checkpoint_last.pt").write_text("trained with other settings")
    (save / "quickstart.settings").write_text("other settings")
    env = {"DATA_DIR": str(data), "SAVE_DIR": str(save), "BPE_MERGES": "100", "EXTRA_TRAIN_ARGS": "--no-such-option"}
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra=env)
    assert res.returncode != 0 and f"fairseq-train failed (log: {save}/train.log)" in res.stderr, res.stderr[-2000:]
    assert sorted(p.name for p in save.iterdir()) == [".fairseq_ext-output", "train.log"]
    assert outputs.owned_entries(str(save)) == ["train.log"]  # its manifest: replaceable
    assert "--no-such-option" in (save / "train.log").read_text()
    assert not list(tmp_path.glob(".qs.tmp.*"))


def test_quickstart_replaces_only_data_prepare_multi30k_wrote(tmp_path):
    """DATA_DIR holding another recipe's en-de data with the same settings is neither reused
    as Multi30k nor replaced."""
    data = tmp_path / "iwslt14.en-de"
    mark(data, "prepare-iwslt14.sh", "prep.env", "train.en-de.en.bin")
    (data / "prep.env").write_text("# written by prepare-iwslt14.sh; read by evaluate.sh\nrecipe=iwslt14\n"
                                   "src=en\ntgt=de\nbpe=subword_nmt\nbpe_merges=100\n")
    (data / "train.en-de.en.bin").write_text("hours of preprocessing")
    (tmp_path / "no-corpus").mkdir()
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra={"DATA_DIR": str(data), "SAVE_DIR": str(tmp_path / "ck"),
                                                               "BPE_MERGES": "100",
                                                               "MULTI30K_FROM": str(tmp_path / "no-corpus")})
    assert res.returncode != 0 and "reusing" not in res.stderr
    assert f"refusing to replace {data}: it was written by prepare-iwslt14.sh" in res.stderr, res.stderr[-2000:]
    assert (data / "train.en-de.en.bin").read_text() == "hours of preprocessing"
    assert not (tmp_path / "ck").exists()


# --- significance.sh reads only complete, unchanged evaluations ----------------------------
def fake_evaluation(directory, lines):
    """An evaluation directory as evaluate.sh leaves it (its files and .evaluation-complete)."""
    directory.mkdir(parents=True)
    for f in ("hyp.tok", "hyp.detok", "ref.tok", "ref.detok", "src.tok"):
        (directory / f).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    evaluations.write_evaluation_complete(str(directory), [f"sentences={len(lines)}"])


def test_significance_refuses_an_evaluation_changed_afterwards(tmp_path):
    rows = [f"word{i} is here ." for i in range(13)]
    a, b = tmp_path / "a", tmp_path / "b"
    fake_evaluation(a, rows)
    fake_evaluation(b, rows)
    sig = [SCRIPTS / "significance.sh", "--eval-a", a, "--eval-b", b, "--samples", "50"]
    res = run([*sig, "--out", tmp_path / "sig"])
    assert res.returncode == 0, res.stderr
    (a / "hyp.tok").write_text("".join(r.replace("here", "there") + "\n" for r in rows))  # copied in by hand
    res = run([*sig, "--out", tmp_path / "sig2"])
    assert res.returncode != 0 and f"{a} holds no complete evaluation: hyp.tok is not the file evaluate.sh " \
        "wrote" in res.stderr, res.stderr
    (a / "hyp.tok").unlink()
    res = run([*sig, "--out", tmp_path / "sig2"])
    assert res.returncode != 0 and f"{a} holds no complete evaluation: hyp.tok is missing" in res.stderr
    (b / ".evaluation-complete").write_text("sentences=13\n")  # a marker without checksums
    res = run([SCRIPTS / "significance.sh", "--eval-a", b, "--eval-b", b, "--out", tmp_path / "sig2"])
    assert res.returncode != 0 and f"{b} holds no complete evaluation: .evaluation-complete records no checksum " \
        "of hyp.tok" in res.stderr, res.stderr
    assert not (tmp_path / "sig2").exists()


# --- evaluate.sh reads the references first, with the one reader --------------------------
def test_evaluate_non_utf8_reference_names_file_and_line(fake_eval_inputs, tmp_path):
    data, ckpt = fake_eval_inputs
    ref = tmp_path / "ref.de"
    ref.write_bytes(b"gut\n" * 4 + b"Stra\xdfe\n" + b"gut\n" * 8)
    res = evaluate(data, ckpt, tmp_path / "eval", "--ref-tok", ref)
    assert res.returncode != 0 and "fairseq-generate" not in res.stderr  # before the decoding
    assert error_lines(res.stderr) == [f"fairseq-ext evaluate: error: {ref}: line 5 is not valid UTF-8 (byte 0xdf at "
                                       "column 5)"], res.stderr


# --- every text filter of the helpers reads lines as wc -l counts them ---------------------
def helper(script, *args, stdin=b""):
    return subprocess.run([sys.executable, TOOLS / script, *map(str, args)], input=stdin,
                          capture_output=True)


def test_helpers_read_lines_as_wc_counts_them(tmp_path):
    text = "\ufeffein Hund\r\nzwei\rKatzen\r\ndrei\n".encode("utf-8")  # 3 lines for wc -l
    for args in (("corpus.py", "tokenize", "-l", "de"), ("corpus.py", "lowercase"),
                 ("corpus.py", "detokenize", "-l", "de"), ("corpus.py", "strip-tags")):
        res = helper(*args, stdin=text)
        assert res.returncode == 0, res.stderr
        out = res.stdout.decode("utf-8")
        assert out.count("\n") == 3 and "\r" not in out and "\ufeff" not in out, (args, out)
        assert out.split("\n")[1].lower() == "zwei katzen", (args, out)
    (tmp_path / "spm.txt").write_text("".join(f"wort{i} und noch ein satz\n" for i in range(61)))
    res = helper("spm.py", "train", "--model-prefix", tmp_path / "spm", "--vocab-size", "60", tmp_path / "spm.txt")
    assert res.returncode == 0, res.stderr
    res = helper("spm.py", "encode", "--model", tmp_path / "spm.model", stdin=text)
    assert res.returncode == 0 and res.stdout.count(b"\n") == 3 and b"\r" not in res.stdout, res
    res = helper("spm.py", "encode", "--model", tmp_path / "spm.model", stdin=b"wort1\nwort\xff\n")
    assert res.returncode == 1
    assert res.stderr.decode() == "error: <standard input>: line 2 is not valid UTF-8 (byte 0xff at column 5)\n"


def test_helpers_name_the_file_and_line_of_bad_utf8(tmp_path):
    good, bad = tmp_path / "good.de", tmp_path / "bad.de"
    good.write_text("a b\n" * 13)
    bad.write_bytes(b"a b\n" * 12 + b"a \xc3\n")
    for args in (("clean", bad, good, tmp_path / "o1", tmp_path / "o2"),
                 ("split", good, bad, "--every", "5", "--rest-src", tmp_path / "r1", "--rest-tgt", tmp_path / "r2",
                  "--heldout-src", tmp_path / "h1", "--heldout-tgt", tmp_path / "h2"),
                 ("head", "0", bad, tmp_path / "o3"), ("extract-gen", bad, tmp_path / "gen")):
        res = helper("corpus.py", *args)
        err = res.stderr.decode()
        assert res.returncode == 1 and err == f"error: {bad}: line 13 is not valid UTF-8 (byte 0xc3 at column 3)\n", \
            (args, err)
    res = helper("corpus.py", "tokenize", "-l", "de", stdin=b"gut\n\xff\n")
    assert res.returncode == 1
    assert res.stderr.decode() == "error: <standard input>: line 2 is not valid UTF-8 (byte 0xff at column 1)\n"
    res = helper("spm.py", "encode", "--model", tmp_path / "missing.model")
    assert res.returncode == 1 and res.stderr.decode().startswith(f"error: cannot load the SentencePiece model "
                                                                  f"{tmp_path / 'missing.model'}")


@pytest.mark.slow
@needs_multi30k
def test_evaluation_is_complete_or_absent(m30k_small_prepared, tmp_path):
    """A real evaluation: references with a BOM and CRs give the same lines and scores; a
    failed rerun leaves no result that significance.sh would take for current."""
    out = tmp_path / "bin"
    shutil.copytree(m30k_small_prepared, out, symlinks=True)
    ckpt_dir = tmp_path / "ckpt"
    train_in_process([str(out), "--user-dir", str(REPO_FAIRSEQ_EXT), "--arch", "multilayer_transformer",
                      "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
                      "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
                      "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--optimizer", "adam",
                      "--lr", "1e-3", "--max-tokens", "500", "--max-update", "2", "--cpu", "--save-dir", str(ckpt_dir),
                      "--no-progress-bar"])
    ev = tmp_path / "eval"
    base = [SCRIPTS / "evaluate.sh", "--checkpoint", ckpt_dir / "checkpoint_last.pt", "--data", out, "--cpu",
            "--beam", "1", "--max-len-b", "5"]
    evaluate = [*base, "--out", ev]
    res = run(evaluate)
    assert res.returncode == 0, res.stderr
    assert (ev / ".evaluation-complete").is_file() and (ev / "bleu.json").is_file()
    assert not list(ev.glob(".evaluate.tmp.*"))
    # the same references with a BOM, CR LF line ends and a CR inside a line: the same lines
    for kind in ("raw", "tok"):
        (tmp_path / f"ref.{kind}").write_bytes(dirty((out / "text" / f"test.{kind}.de").read_text().splitlines()))
    ev2 = tmp_path / "eval2"
    res = run([*base, "--out", ev2, "--ref-detok", tmp_path / "ref.raw", "--ref-tok", tmp_path / "ref.tok"])
    assert res.returncode == 0, res.stderr
    for f in ("ref.tok", "ref.detok"):
        assert (ev2 / f).read_bytes() == (ev / f).read_bytes()
        assert len((ev2 / f).read_text().split("\n")) - 1 == len((ev2 / f).read_text().splitlines()) == 13
    scores = [{k: v["score"] for k, v in json.loads((d / "bleu.json").read_text()).items() if isinstance(v, dict)}
              for d in (ev, ev2)]
    assert scores[0] == scores[1] and len(scores[0]) == 4
    sig = [SCRIPTS / "significance.sh", "--eval-a", ev, "--eval-b", ev2, "--samples", "50"]
    res = run([*sig, "--out", tmp_path / "sig"])
    assert res.returncode == 0, res.stderr
    # a rerun that fails: no result is left that significance.sh would take for current
    res = run([*evaluate, "--model-overrides", "{'no_such_option': 1}", "--path-typo"])  # generate fails
    assert res.returncode != 0
    assert sorted(p.name for p in ev.iterdir()) == [".fairseq_ext-output", "generate-test.cmd", "generate-test.log"]
    res = run([*sig, "--out", tmp_path / "sig"])
    assert res.returncode != 0 and f"{ev} holds no complete evaluation" in res.stderr
    assert (tmp_path / "sig" / "report.txt").is_file()  # the earlier report is kept


REPO_FAIRSEQ_EXT = REPO / "fairseq_ext"
