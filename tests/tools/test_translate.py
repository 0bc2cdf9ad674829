"""``fairseq-ext translate`` on raw text (fairseq_ext/tools/translate.py): bad input never
ends the run (a line that is not UTF-8 is skipped, a line longer than the model's positions
is cut, each with one warning naming the line, and output line N stays input line N's
translation), ``--strict`` refuses instead, one summary line closes the run, and the
progress bar never writes to stdout. The model: a few dozen updates on a few hundred
Multi30k lines prepared by the multi30k recipe (Moses tokenization, subword-nmt BPE), with
128 source positions (conftest's ``raw_text_model``, shared with test_score.py and test_comet.py)."""
import os
import random
import re
import shutil
import stat
import subprocess
import sys

import pytest

from model_utils import MULTI30K, clean_env, full_disk
from script_utils import RAW_TEXT_POSITIONS as MAX_POSITIONS
from script_utils import SENTENCE, fairseq_ext, head_gz, needs_multi30k, run, write_lines

WORDS = "a man woman in red blue shirt is riding bike down the street with two dogs playing park".split()


def long_line(words=2000, seed=0):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


@pytest.fixture(scope="module")
def model(raw_text_model):
    return raw_text_model


def translate(model, *args, stdin=None):
    data, checkpoint = model
    return fairseq_ext("translate", "--checkpoint", checkpoint, "--data", data, "--cpu", "--beam", "2", *args,
                       stdin=stdin)


@pytest.mark.slow
@needs_multi30k
def test_a_bad_line_and_a_2000_token_line_never_end_the_run(model, tmp_path):
    source = tmp_path / "in.en"
    source.write_bytes(b"\n".join([SENTENCE.encode(), b"caf\xe9 au lait", long_line().encode(), b"",
                                   SENTENCE.encode()]) + b"\n")
    res = translate(model, "--input", source, "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "sentences/s" not in res.stderr
    out = res.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == 5, res.stdout  # one output line per input line
    # the skipped line and the empty line are empty; the same sentence on lines 1 and 5 has the same
    # translation, so no line moved
    assert out[1] == "" and out[3] == ""
    assert out[0] and out[2] and out[4] == out[0]
    skipped = [line for line in res.stderr.splitlines() if "not valid UTF-8" in line and "warning" in line]
    assert skipped == [f"fairseq-ext translate: warning: {source}: line 2 is not valid UTF-8 (byte 0xe9 at column 4): "
                       "skipped, an empty output line in its place"]
    cut = [line for line in res.stderr.splitlines() if "positions: cut" in line]
    assert len(cut) == 1 and cut[0].startswith("fairseq-ext translate: warning: line 3: "), res.stderr
    assert int(re.search(r"line 3: (\d+) source tokens", cut[0]).group(1)) > 2000  # BPE splits words further
    assert res.stderr.splitlines()[-1] == (
        "fairseq-ext translate: 4 lines translated, 1 skipped (not UTF-8: line 2; an empty output line for each), "
        f"1 cut (longer than the model's {MAX_POSITIONS} source positions: line 3)")


@pytest.mark.slow
@needs_multi30k
def test_strict_refuses_a_line_that_is_not_utf8_with_one_line(model, tmp_path):
    source = tmp_path / "in.en"
    source.write_bytes(SENTENCE.encode() + b"\ncaf\xe9 au lait\n")
    res = translate(model, "--input", source, "--strict")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"fairseq-ext translate: error: {source}: line 2 is not valid UTF-8 (byte 0xe9 at column 4) (--strict)"]


@pytest.mark.slow
@needs_multi30k
def test_output_never_replaces_an_input_and_a_failed_run_leaves_it_as_it_was(model, tmp_path):
    """--output naming the checkpoint, a dictionary of --data, the --input file, a folder or a
    file in a missing folder is refused before the model loads; a run that fails (--strict on
    a line that is not UTF-8) leaves an existing --output file as it was; a run that succeeds
    replaces it."""
    data, checkpoint = model
    source = tmp_path / "in.en"
    source.write_text(SENTENCE + "\n")
    kept = {path: path.read_bytes() for path in (checkpoint, data / "dict.de.txt", source)}
    from fairseq_ext.common.output_file import OutputFileError, check_output_file

    for output, message in [(checkpoint, "is the checkpoint: the model would be replaced by the output"),
                            (data / "dict.de.txt", f"is inside the data directory {data}"),
                            (source, "is the --input file: it would be replaced by the output"),
                            (tmp_path, "is a folder: name a file"),
                            (tmp_path / "nowhere" / "out.de", f"the folder {tmp_path / 'nowhere'} does not exist")]:
        separator = ": " if message.startswith("the folder") else " "
        with pytest.raises(OutputFileError) as refused:
            check_output_file(str(output), inputs={"--input": str(source)}, checkpoints=f"other.pt:{checkpoint}",
                              data=str(data))
        assert str(refused.value).startswith(f"--output {output}{separator}{message}")
    # the command says it in one line, before the model loads
    res = translate(model, "--input", source, "--output", checkpoint)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        f"fairseq-ext translate: error: --output {checkpoint} is the checkpoint: the model would be replaced by the "
        "output"]
    assert all(path.read_bytes() == content for path, content in kept.items())
    output = tmp_path / "out.de"
    output.write_text("an earlier translation\n")
    source.write_bytes(SENTENCE.encode() + b"\ncaf\xe9 au lait\n")
    res = translate(model, "--input", source, "--output", output, "--strict")
    assert res.returncode == 1 and output.read_text() == "an earlier translation\n"
    assert sorted(os.listdir(tmp_path)) == ["in.en", "out.de"]  # no temporary file left beside it
    source.write_text(SENTENCE + "\n")
    res = translate(model, "--input", source, "--output", output)
    assert res.returncode == 0 and output.read_text() != "an earlier translation\n"
    assert len(output.read_text().splitlines()) == 1


@pytest.mark.slow
@needs_multi30k
def test_the_progress_bar_goes_to_stderr_and_stdout_holds_the_translations_only(model, tmp_path):
    lines = head_gz(os.path.join(MULTI30K, "val.en.gz"), 40)
    plain = translate(model, stdin="\n".join(lines) + "\n")  # stderr is no terminal: no bar
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert len(plain.stdout.splitlines()) == 40
    assert "sentences/s" not in plain.stderr
    assert plain.stderr.splitlines()[-1] == "fairseq-ext translate: 40 lines translated, 0 skipped, 0 cut"

    shown = translate(model, "--progress", stdin="\n".join(lines) + "\n")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert shown.stdout == plain.stdout
    # standard input: no total
    assert re.search(r"translating: 40 sentences \[[^]]*, +[\d.]+ sentences/s\]", shown.stderr), shown.stderr

    source = write_lines(tmp_path / "val.en", lines)
    with_total = translate(model, "--progress", "--input", source)
    assert with_total.stdout == plain.stdout
    assert re.search(r"translating: 100%.* 40/40 \[", with_total.stderr), with_total.stderr


def test_count_lines_counts_what_read_input_reads(tmp_path):
    from fairseq_ext.tools.translate import count_lines, read_input

    for content in (b"", b"a\n", b"a\nb", b"\n\n", b"a\r\n\xffb\n"):
        path = tmp_path / "f"
        path.write_bytes(content)
        with open(path, "rb") as f:
            assert count_lines(str(path)) == len(list(read_input(f, "f"))), content


def test_a_line_without_words_is_empty():
    """NUL, U+200B, a BOM, tabs: nothing to translate, so an empty output line (the model
    would invent a sentence); any letter, digit or symbol is something to translate."""
    from fairseq_ext.tools.translate import has_words

    for empty in ("", " \t ", "\x00", "\u200b", "\ufeff \u200b\u200d", "\x00\x01\x7f", "\u2028"):
        assert not has_words(empty), repr(empty)
    for text in ("a", " 1 ", "\u200bx", "€", "日本", "\x00.", "\ue000"):
        assert has_words(text), repr(text)


def test_the_summary_names_the_first_few_lines():
    from fairseq_ext.tools.translate import Tally

    assert Tally(lines=1).summary() == "1 line translated, 0 skipped, 0 cut"
    tally = Tally(lines=20, skipped=[2, 4, 6, 8, 10, 12, 14], cut=[3], max_source=1024)
    assert tally.summary() == ("13 lines translated, 7 skipped (not UTF-8: lines 2, 4, 6, 8, 10 and 2 more; an empty "
                               "output line for each), 1 cut (longer than the model's 1024 source positions: line 3)")


def test_a_checkpoint_that_is_a_folder_or_not_a_checkpoint_is_one_line(tmp_path):
    from fairseq_ext.common import checkpoints
    from fairseq_ext.errors import CheckpointError

    (tmp_path / "notes.txt").write_text("hi\n")
    folder = f"is a folder: name a checkpoint file in it (e.g. {tmp_path}/checkpoint_best.pt)"
    for path, message in [(tmp_path, folder),
                          (tmp_path / "notes.txt", "is not a checkpoint (neither torch's zip format nor its legacy "
                                                   "pickle)")]:
        for load in (checkpoints.load_state, lambda c: checkpoints.load_model(c, str(tmp_path))):
            with pytest.raises(CheckpointError) as refused:
                load(str(path))
            assert str(refused.value) == f"--checkpoint {path} {message}"


def test_data_without_dictionaries_or_of_another_preprocessing_is_one_line(tiny_trained, tmp_path):
    """Every command that loads a model on --data (translate, score, the analyses): a data
    directory without the dictionaries, or with dictionaries the model was not trained with,
    is one line naming it, not fairseq's FileNotFoundError or torch's size-mismatch report."""
    bin_dir, checkpoint = tiny_trained
    bare, other = tmp_path / "bare", tmp_path / "other"
    shutil.copytree(bin_dir, bare, ignore=shutil.ignore_patterns("dict.*"))
    shutil.copytree(bin_dir, other)
    with open(other / "dict.tgt.txt", "a", encoding="utf-8") as f:
        f.write("extra1 1\nextra2 1\n")
    words = sum(1 for _ in open(os.path.join(bin_dir, "dict.tgt.txt"), encoding="utf-8"))
    (tmp_path / "in.txt").write_text("w1 w2 w3\n")
    for data, message in [
            (bare, f"--data {bare} has no dict.*.txt: name the directory fairseq-preprocess (or fairseq-ext "
                   f"prepare) wrote for this model, with its dict.SRC.txt and dict.TGT.txt"),
            (other, f"--checkpoint {checkpoint} was not trained on --data {other}: its target vocabulary has "
                    f"{words + 4} entries (decoder.embed_tokens.weight), the target dictionary of --data has "
                    f"{words + 6} (another preprocessing or language pair); name the data directory the model was "
                    f"trained on")]:
        res = fairseq_ext("translate", "--checkpoint", checkpoint, "--data", data, "--input", tmp_path / "in.txt",
                          "--cpu")
        errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
        assert res.returncode == 1 and errors == [f"fairseq-ext translate: error: {message}"], res.stderr[-2000:]
        assert "Traceback" not in res.stderr


def test_an_output_on_a_full_disk_is_one_line_and_leaves_the_file_as_it_was(tiny_trained, tmp_path):
    bin_dir, checkpoint = tiny_trained
    output = tmp_path / "full" / "out.txt"
    output.parent.mkdir()
    output.write_text("an earlier translation\n")
    (tmp_path / "in.txt").write_text("w1 w2 w3\n")
    res = run([sys.executable, "-m", "fairseq_ext", "translate", "--checkpoint", checkpoint, "--data", bin_dir, "--cpu",
               "--input", tmp_path / "in.txt", "--output", output], env_extra=full_disk(output.parent))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.splitlines()[-1] == (f"fairseq-ext translate: error: cannot write {output}: no space left on "
                                           "device (nothing partial left behind)"), res.stderr[-2000:]
    assert os.listdir(output.parent) == ["out.txt"] and output.read_text() == "an earlier translation\n"


def test_an_output_file_is_never_a_checkpoint_and_special_files_are_written_through(tmp_path):
    """Another checkpoint of the save dir is refused as --output; a link's target is written
    and the link kept; a FIFO's reader and /dev/null get the text, never a renamed file."""
    import threading

    from fairseq_ext.common.output_file import OutputFileError, check_output_file, staged_output_file

    import gzip

    import torch

    # by what the file holds, whatever its name: torch's zip format, the legacy pickle, other bytes
    for name, legacy in (("checkpoint_best.pt", False), ("best.bak", False), ("old-format.txt", True)):
        torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / name, _use_new_zipfile_serialization=not legacy)
        with pytest.raises(OutputFileError, match=r"is a checkpoint \(torch's zip or pickle format\): it would be "
                                                  "replaced by the output"):
            check_output_file(str(tmp_path / name), checkpoints=str(tmp_path / "checkpoint_last.pt"))
    (tmp_path / "blob.out").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(OutputFileError, match="is a binary file, not text"):
        check_output_file(str(tmp_path / "blob.out"))
    (tmp_path / "hyp.txt").write_text("ab à\n" * 20000, encoding="utf-8")  # "à" cut at 64 KiB (6-byte lines)
    with gzip.open(tmp_path / "hyp.txt.gz", "wt", encoding="utf-8") as f:
        f.write("xin chào\n" * 30000)
    check_output_file(str(tmp_path / "hyp.txt"))  # text a command could have written: replaced
    check_output_file(str(tmp_path / "hyp.txt.gz"))
    target = tmp_path / "target.txt"
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with staged_output_file(str(link)) as f:
        f.write("new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    with staged_output_file(str(fifo)) as f:
        f.write("through\n")
    reader.join(10)
    assert got == ["through\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with staged_output_file("/dev/null") as f:
        f.write("nothing\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
