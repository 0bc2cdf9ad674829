"""The output-directory rules (docs/trust.md, "Output directories"), called directly from
Python (fairseq_ext/standalone/outputs.py), one test per rule; and the bash side (common.sh),
which calls the same file, giving the same messages. ``manifest`` writes the marker every
script writes: the exact manifest of what the directory holds."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_ext.standalone import evaluations, outputs
from fairseq_ext.standalone.outputs import OutputError, check_replaceable

TOOLS = Path(outputs.__file__).resolve().parent
COMMON = TOOLS.parent / "recipes" / "lib" / "common.sh"


def manifest(directory, prog, *files):
    """``directory`` holding ``files`` (relative paths; "x/" an empty directory), marked by
    ``prog`` with the exact manifest of what it holds."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in files:
        if f.endswith("/"):
            (directory / f).mkdir(parents=True, exist_ok=True)
        else:
            (directory / f).parent.mkdir(parents=True, exist_ok=True)
            (directory / f).write_text(f"{prog} wrote {f}")
    outputs.mark_output(str(directory), prog=prog)


def bash(command, *args, env_extra=None):
    """``command`` run by bash with common.sh sourced (as quickstart.sh, the running script)."""
    env = dict(os.environ, PYTHON=sys.executable, **(env_extra or {}))
    return subprocess.run(["bash", "-c", f'FSX_PY="$PYTHON"; source {COMMON}; {command}', "quickstart.sh",
                           *map(str, args)], capture_output=True, text=True, env=env)


def refused(directory, *inputs, prog="prepare-multi30k.sh", **kw):
    with pytest.raises(OutputError) as e:
        check_replaceable(str(directory), [str(p) for p in inputs], prog=prog, **kw)
    return str(e.value)


def allowed(directory, *inputs, prog="prepare-multi30k.sh", **kw):
    check_replaceable(str(directory), [str(p) for p in inputs], prog=prog, **kw)


def test_absent_or_empty_directory_may_be_written(tmp_path):
    allowed(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    allowed(tmp_path / "empty")


def test_marker_is_the_exact_manifest_of_what_the_writer_wrote(tmp_path):
    """Every file, symlink and empty directory, at any depth, as a relative path; a
    subdirectory holding its own marker (another script's output) as SUB/."""
    d = tmp_path / "out"
    manifest(d / "eval", "evaluate.sh", "hyp.tok")
    for f in ("b.txt", "a.txt", "text/valid.tok.en", "text/test.raw.de", "empty/"):
        manifest(d, "x", f)
    (d / "link").symlink_to("a.txt")
    outputs.mark_output(str(d), prog="prepare-iwslt14.sh")
    assert (d / outputs.MARKER).read_text() == (
        "# written by prepare-iwslt14.sh (fairseq_ext); it may replace this directory while it holds only:\n"
        "# manifest: exact paths\n"
        "a.txt\nb.txt\nempty\neval/\nlink\ntext/test.raw.de\ntext/valid.tok.en\n")
    assert outputs.dir_writer(str(d)) == "prepare-iwslt14.sh"
    assert outputs.owned_entries(str(d)) == [
        "a.txt", "b.txt", "empty", "eval/", "link", "text/test.raw.de", "text/valid.tok.en"]
    allowed(d, prog="prepare-iwslt14.sh")


def test_directory_without_a_marker_is_never_replaced(tmp_path):
    d = tmp_path / "experiments"
    d.mkdir()
    (d / "checkpoint_best.pt").write_text("weeks of training")
    assert refused(d) == (f"refusing to replace {d}: it was not written by a fairseq_ext script (no "
                          ".fairseq_ext-output in it); remove it yourself or choose another directory")


def test_only_the_writers_own_directory_is_replaced(tmp_path):
    d = tmp_path / "qs"
    manifest(d, "quickstart.sh", "checkpoint_best.pt")
    assert refused(d) == (f"refusing to replace {d}: it was written by quickstart.sh, and prepare-multi30k.sh "
                          "replaces only its own output; remove it yourself or choose another directory")
    allowed(d, prog="quickstart.sh")


def test_an_entry_the_marker_does_not_list_keeps_the_directory(tmp_path):
    d = tmp_path / "bin"
    manifest(d, "prepare-multi30k.sh", "dict.en.txt", "text/")
    allowed(d)
    (d / "run1").mkdir()
    assert refused(d) == (f"refusing to replace {d}: it holds run1, which prepare-multi30k.sh did not write there; "
                          f"move it elsewhere, or remove {d} yourself")


@pytest.mark.parametrize("where, named", [("text/note.txt", "text/note.txt"), ("note.txt", "note.txt"),
                                          ("text/deeper/note.txt", "text/deeper")])
def test_a_users_file_anywhere_in_a_manifest_directory_keeps_it(tmp_path, where, named):
    """The manifest lists every file, so a note saved inside text/ is named and kept."""
    d = tmp_path / "bin"
    manifest(d, "prepare-multi30k.sh", "dict.en.txt", "prep.env", "text/valid.tok.en", "text/test.raw.de")
    allowed(d)
    (d / "text" / "valid.tok.en").unlink()  # removing what the writer wrote keeps it replaceable
    allowed(d)
    (d / where).parent.mkdir(parents=True, exist_ok=True)
    (d / where).write_text("mine")
    assert refused(d) == (f"refusing to replace {d}: it holds {named}, which prepare-multi30k.sh did not write "
                          f"there; move it elsewhere, or remove {d} yourself")
    assert (d / where).read_text() == "mine"


@pytest.mark.parametrize("what", ["symlink", "empty_dir", "symlink_to_dir", "dir_for_a_file"])
def test_a_symlink_or_an_empty_directory_the_writer_did_not_make_keeps_it(tmp_path, what):
    d = tmp_path / "bin"
    manifest(d, "prepare-multi30k.sh", "dict.en.txt", "text/valid.tok.en", "made-empty/")
    allowed(d)
    keep = tmp_path / "elsewhere"
    keep.mkdir()
    if what == "symlink":
        where = "text/latest"
        (d / where).symlink_to(keep)
    elif what == "empty_dir":
        where = "text/run2"
        (d / where).mkdir()
    elif what == "symlink_to_dir":  # not followed: the symlink itself is the stray entry
        where = "made-empty/data"
        (d / where).symlink_to(keep)
    else:  # a listed file replaced by a directory of the user's
        where = "dict.en.txt/notes"
        (d / "dict.en.txt").unlink()
        (d / where).mkdir(parents=True)
    assert refused(d) == (f"refusing to replace {d}: it holds {where}, which prepare-multi30k.sh did not write "
                          f"there; move it elsewhere, or remove {d} yourself")
    assert keep.is_dir()


def test_a_users_checkpoint_in_quickstarts_directory_keeps_it(tmp_path):
    """The manifest lists each checkpoint quickstart wrote: a user's averaged
    checkpoint_avg5.pt beside them keeps the directory."""
    d = tmp_path / "qs"
    manifest(d, "quickstart.sh", "checkpoint_best.pt", "checkpoint_last.pt", "train.log", "quickstart.settings")
    allowed(d, prog="quickstart.sh")
    for name in ("checkpoint_avg5.pt", "checkpoint_best.pt.bak", "checkpoints"):
        (d / name).write_text("the user's")
        assert refused(d, prog="quickstart.sh") == (
            f"refusing to replace {d}: it holds {name}, which quickstart.sh did not write there; move it elsewhere, "
            f"or remove {d} yourself")
        (d / name).unlink()


def test_a_nested_output_is_owned_when_listed_and_its_own_check_passes(tmp_path):
    """quickstart lists SAVE_DIR/eval-test/ (fsx_add_output_entries), which evaluation wrote
    with its own manifest; a user's evaluation beside it, or a file inside it, keeps SAVE_DIR."""
    d = tmp_path / "qs"
    manifest(d, "quickstart.sh", "checkpoint_last.pt", "train.log")
    res = bash('fsx_add_output_entries "$1" eval-test/', d)
    assert res.returncode == 0, res.stderr
    allowed(d, prog="quickstart.sh")  # listed, not there yet
    manifest(d / "eval-test", "evaluate.sh", "hyp.tok", "bleu.json", ".evaluation-complete")
    allowed(d, prog="quickstart.sh")
    assert outputs.owned_entries(str(d))[-1] == "eval-test/"
    outputs.mark_output(str(d), prog="quickstart.sh")  # a manifest written after it lists it so too
    assert "\neval-test/\n" in (d / outputs.MARKER).read_text()
    allowed(d, prog="quickstart.sh")
    # a file of the user's inside the nested output
    (d / "eval-test" / "notes.txt").write_text("mine")
    assert refused(d, prog="quickstart.sh") == (
        f"refusing to replace {d}: it holds eval-test/notes.txt, which evaluate.sh did not write there; move it "
        f"elsewhere, or remove {d} yourself")
    (d / "eval-test" / "notes.txt").unlink()
    # the user's own `fairseq-ext evaluate --out SAVE_DIR/eval-mine`: not listed
    manifest(d / "eval-mine", "evaluate.sh", "hyp.tok")
    want = (f"refusing to replace {d}: it holds eval-mine, evaluate.sh's output that quickstart.sh did not write; "
            f"move it elsewhere, or remove {d} yourself")
    assert refused(d, prog="quickstart.sh") == want
    res = bash('fsx_check_replaceable "$1"', d)
    assert res.returncode == 1 and res.stderr == f"quickstart.sh: error: {want}\n", res.stderr
    # the nested output lost its marker: no longer known as a script's output
    (d / "eval-mine" / outputs.MARKER).unlink()
    assert refused(d, prog="quickstart.sh").endswith("it holds eval-mine, which quickstart.sh did not write there; "
                                                     f"move it elsewhere, or remove {d} yourself")
    shutil.rmtree(d / "eval-mine")
    for f in (outputs.MARKER, ".evaluation-complete"):  # nothing left that names its writer
        (d / "eval-test" / f).unlink()
    assert "it holds eval-test, which quickstart.sh did not write there" in refused(d, prog="quickstart.sh")


OLD_VERSION = {  # what an earlier version left without a manifest, and who it was
    "quickstart.settings": ("quickstart.sh", ["quickstart.settings", "checkpoint_last.pt", "train.log"]),
    "prep.env": ("prepare-iwslt14.sh", ["prep.env", "dict.de.txt", "train.de-en.de.bin"]),
    ".evaluation-complete": ("evaluate.sh", [".evaluation-complete", "hyp.tok", "bleu.json"]),
}


@pytest.mark.parametrize("kind", [*OLD_VERSION, "marker_of_names"])
def test_a_directory_without_a_manifest_is_the_users_refused_and_kept(tmp_path, kind):
    """A directory is never replaced without a manifest marker, however much it looks like a
    script's output: an earlier version's run, known only by its files, or marked with the
    names and globs of its top level; nothing can be added to its marker either."""
    d = tmp_path / "old"
    d.mkdir()
    writer, files = OLD_VERSION.get(kind, OLD_VERSION["quickstart.settings"])
    for f in files:
        (d / f).write_text("an earlier version's")
    if kind == "marker_of_names":
        (d / outputs.MARKER).write_text(f"# written by {writer} (fairseq_ext); it may replace this directory while "
                                        "it holds only:\ncheckpoint*\ntrain.log\nquickstart.settings\neval-test\n")
        why = "its .fairseq_ext-output holds no manifest of exact paths (a marker of an earlier version)"
    else:
        why = "it was not written by a fairseq_ext script (no .fairseq_ext-output in it)"
    want = f"refusing to replace {d}: {why}; remove it yourself or choose another directory"
    assert outputs.dir_writer(str(d)) is None and outputs.owned_entries(str(d)) == []
    assert refused(d, prog=writer) == want
    res = bash('fsx_check_replaceable "$1"', d)
    assert res.returncode == 1 and res.stderr == f"quickstart.sh: error: {want}\n", res.stderr
    res = bash('fsx_add_output_entries "$1" eval-test/', d)
    assert res.returncode == 1 and res.stderr == f"quickstart.sh: error: cannot add to the marker of {d}: {why}\n"
    assert sorted(p.name for p in d.iterdir()) == sorted(files + [outputs.MARKER] * (kind == "marker_of_names"))
    assert all((d / f).read_text() == "an earlier version's" for f in files)


def test_bad_entries_are_not_added(tmp_path):
    d = tmp_path / "qs"
    manifest(d, "quickstart.sh", "checkpoint_last.pt")
    for bad in ("../x", "/abs", "a//b", "./a"):
        res = bash('fsx_add_output_entries "$1" "$2"', d, bad)
        assert res.returncode == 1 and "is not a relative path inside the directory" in res.stderr, res.stderr
    assert outputs.owned_entries(str(d)) == ["checkpoint_last.pt"]
    res = bash('fsx_add_output_entries "$1" x', tmp_path / "nobody")
    assert res.returncode == 1 and "no .fairseq_ext-output in it" in res.stderr, res.stderr


@pytest.mark.parametrize("what", ["home", "cwd", "install_dir", "input", "root"])
def test_never_the_home_working_directory_install_directory_or_an_input(tmp_path, monkeypatch, what):
    d = tmp_path / "victim"
    inner = d / "inner"
    manifest(d, "prepare-multi30k.sh", "inner/")  # a marker does not make these replaceable
    kw, inputs = {}, ()
    if what == "home":
        monkeypatch.setenv("HOME", str(inner))
    elif what == "cwd":
        monkeypatch.chdir(inner)
    elif what == "install_dir":
        kw["install_dir"] = str(inner)
    elif what == "input":
        inputs = (inner / "data.bin",)
    elif what == "root":
        with pytest.raises(OutputError, match="^refusing to replace /: it is or contains /$"):
            check_replaceable("/", prog="prepare-multi30k.sh")
        return
    message = refused(d, *inputs, **kw)
    want = inner / "data.bin" if what == "input" else inner
    assert message == f"refusing to replace {d}: it is or contains {want}"


def test_never_a_directory_holding_a_git_repository(tmp_path):
    d = tmp_path / "victim"
    manifest(d, "prepare-multi30k.sh", "a/b/c/.git/")  # a marker does not make it replaceable
    assert refused(d) == f"refusing to replace {d}: it contains a git repository ({d}/a/b/c/.git)"


def test_never_a_file(tmp_path):
    f = tmp_path / "out"
    f.write_text("x")
    assert refused(f) == f"refusing to replace {f}: it is not a directory"


def evaluation(directory, n=3):
    directory.mkdir()
    for f in evaluations.EVAL_FILES:
        (directory / f).write_text("line\n" * n)


def test_evaluation_complete_records_checksums_and_check_evaluation_reads_them(tmp_path):
    d = tmp_path / "eval"
    with pytest.raises(OutputError) as e:
        evaluations.check_evaluation(str(d))
    assert str(e.value) == (f"{d} holds no complete evaluation (no .evaluation-complete: evaluate.sh did not "
                            "finish there); rerun scripts/evaluate.sh into it")
    evaluation(d)
    evaluations.write_evaluation_complete(str(d), ["checkpoint=x.pt", "sentences=3"])
    lines = (d / ".evaluation-complete").read_text().splitlines()
    assert lines[:2] == ["checkpoint=x.pt", "sentences=3"]
    assert [line.split("=")[0] for line in lines[2:]] == [f"sha256.{f}" for f in evaluations.EVAL_FILES]
    evaluations.check_evaluation(str(d))
    (d / "hyp.tok").write_text("changed\n" * 3)
    with pytest.raises(OutputError, match="hyp.tok is not the file evaluate.sh wrote \\(changed since\\); rerun"):
        evaluations.check_evaluation(str(d))
    (d / "hyp.tok").unlink()
    with pytest.raises(OutputError, match="holds no complete evaluation: hyp.tok is missing; rerun"):
        evaluations.check_evaluation(str(d))


def test_evaluation_without_checksums_is_refused(tmp_path):
    d = tmp_path / "eval"
    evaluation(d)
    (d / ".evaluation-complete").write_text("checkpoint=x.pt\nsentences=3\n")
    with pytest.raises(OutputError) as e:
        evaluations.check_evaluation(str(d))
    assert str(e.value) == (f"{d} holds no complete evaluation: .evaluation-complete records no checksum of "
                            "hyp.tok; rerun scripts/evaluate.sh into it")


def test_staged_output_replaces_on_success_and_keeps_only_the_logs_on_failure(tmp_path):
    out = tmp_path / "eval"
    with outputs.StagedOutput(str(out), prog="evaluate.sh", log=lambda m: None) as staged:
        (Path(staged.stage) / "hyp.tok").write_text("new\n")
        staged.finish()
    assert sorted(p.name for p in out.iterdir()) == [".fairseq_ext-output", "hyp.tok"]
    assert (out / ".fairseq_ext-output").read_text().startswith("# written by evaluate.sh (fairseq_ext)")
    # a failure after the old output was discarded: only the logs, under a marker
    with pytest.raises(RuntimeError):
        with outputs.StagedOutput(str(out), prog="evaluate.sh", keep_on_failure=["generate-test.log"],
                                  log=lambda m: None) as staged:
            staged.discard_old()
            (Path(staged.stage) / "generate-test.log").write_text("it failed")
            (Path(staged.stage) / "hyp.tok").write_text("half\n")
            raise RuntimeError("fairseq-generate failed")
    assert sorted(p.name for p in out.iterdir()) == [".fairseq_ext-output", "generate-test.log"]
    assert outputs.owned_entries(str(out)) == ["generate-test.log"]  # its manifest
    assert not list(tmp_path.glob(".eval.tmp.*"))
    allowed(out, prog="evaluate.sh")
    # a failure with the old output still there: it stays untouched, no log mixed into it
    with outputs.StagedOutput(str(out), prog="evaluate.sh", log=lambda m: None) as staged:
        (Path(staged.stage) / "hyp.tok").write_text("old\n")
        staged.finish()
    with pytest.raises(RuntimeError):
        with outputs.StagedOutput(str(out), prog="evaluate.sh", keep_on_failure=["generate-test.log"],
                                  log=lambda m: None) as staged:
            (Path(staged.stage) / "generate-test.log").write_text("it failed")
            raise RuntimeError("failed")
    assert (out / "hyp.tok").read_text() == "old\n" and not (out / "generate-test.log").exists()
    with pytest.raises(OutputError, match="already exists \\(use --force to replace it\\)"):
        outputs.StagedOutput(str(out), prog="evaluate.sh", force=False).__enter__()


def test_bash_and_python_give_the_same_message(tmp_path):
    """common.sh's fsx_check_replaceable is a call of outputs.py: the same rule, the same line."""
    d = tmp_path / "qs"
    manifest(d, "quickstart.sh", "checkpoint_last.pt")
    (d / "run1").mkdir()
    env = dict(os.environ, PYTHON=sys.executable)
    res = subprocess.run(["bash", "-c", f'FSX_PY="$PYTHON"; source {COMMON}; fsx_check_replaceable "$1"', "quickstart.sh",
                         d], capture_output=True, text=True, env=env)
    want = (f"refusing to replace {d}: it holds run1, which quickstart.sh did not write there; move it elsewhere, "
            f"or remove {d} yourself")
    assert res.returncode == 1 and res.stderr == f"quickstart.sh: error: {want}\n", res.stderr
    assert refused(d, prog="quickstart.sh") == want
    # as a plain file, without the package
    res = subprocess.run([sys.executable, "-S", TOOLS / "outputs.py", "--prog", "quickstart.sh", "check-replaceable",
                          d], capture_output=True, text=True)
    assert res.returncode == 1 and res.stderr == f"quickstart.sh: error: {want}\n", res.stderr


@pytest.mark.parametrize("name", [".eval-test.tmp.Ab3xZ9", ".eval-test.tmp.k2_x9qaz"])  # mktemp's, mkdtemp's
def test_a_killed_runs_temporary_directory_is_named_with_the_command_that_clears_it(tmp_path, name):
    """A run killed while evaluating leaves SAVE_DIR/.eval-test.tmp.XXXXXX behind: the refusal
    says whose it is and how to clear it, instead of "no fairseq_ext script wrote" it; once it
    is removed, the directory is replaceable again."""
    d = tmp_path / "quickstart"
    manifest(d, "quickstart.sh", "checkpoint_last.pt")
    outputs.add_output_entries(str(d), ["eval-test/"])
    stale = d / name
    (stale / "out").mkdir(parents=True)
    message = refused(d, prog="quickstart.sh")
    assert message == (f"refusing to replace {d}: it holds {name}, evaluate.sh's temporary directory "
                       f"for {d}/eval-test left by a run that was interrupted; nothing in it is a result: remove it "
                       f"with  rm -rf {stale}  and run again")
    subprocess.run(["rm", "-rf", str(stale)], check=True)
    allowed(d, prog="quickstart.sh")


@pytest.mark.parametrize("where", ["top", "nested"])
def test_a_killed_runs_temporary_directory_in_a_manifest_directory(tmp_path, where):
    """The stale-staging message at any level: in SAVE_DIR, or in a subdirectory the writer made."""
    d = tmp_path / "quickstart"
    manifest(d, "quickstart.sh", "checkpoint_last.pt", "evals/readme.txt")
    outputs.add_output_entries(str(d), ["eval-test/", "evals/eval-a/"])
    parent = d if where == "top" else d / "evals"
    name = ".eval-test.tmp.Ab3xZ9" if where == "top" else ".eval-a.tmp.Xy12Zq"
    stale = parent / name
    (stale / "out").mkdir(parents=True)
    (stale / "out" / "hyp.tok").write_text("half")
    rel = name if where == "top" else f"evals/{name}"
    target = parent / name[1:-len(".tmp.Ab3xZ9")]
    assert refused(d, prog="quickstart.sh") == (
        f"refusing to replace {d}: it holds {rel}, evaluate.sh's temporary directory for {target} left by a run that "
        f"was interrupted; nothing in it is a result: remove it with  rm -rf {stale}  and run again")
    shutil.rmtree(stale)
    allowed(d, prog="quickstart.sh")


# --- one writer at a time ------------------------------------------------------------------
HOLD = ("import sys, time; from fairseq_ext.standalone.outputs import OutputLock; "
        "OutputLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)")


def holder(directory):
    """Another command holding ``directory``'s lock, until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def busy_message(what, directory, pid):
    return f"{what} {directory} is being written by another command (pid {pid} on "


def test_a_second_writer_is_refused_naming_the_first_and_a_killed_ones_file_blocks_nobody(tmp_path):
    out = tmp_path / "eval"
    other = holder(out)
    try:
        # Python (fairseq-ext evaluate, significance): before anything is written
        with pytest.raises(outputs.OutputBusyError) as e:
            outputs.StagedOutput(str(out), prog="evaluate.sh", log=lambda m: None).__enter__()
        assert str(e.value).startswith(busy_message("output directory", out, other.pid))
        assert f"{HOLD[:40]}" in str(e.value) or "-c" in str(e.value)  # its command line
        assert str(e.value).endswith("; wait for it to finish, or write elsewhere")
        assert not list(tmp_path.glob(".eval.tmp.*")) and not out.exists()
        # bash (the recipes, quickstart.sh): the same line, as the script's error
        res = bash('fsx_lock_output "$1" SAVE_DIR; echo took it', out)
        assert res.returncode == 1 and "took it" not in res.stdout
        assert res.stderr.startswith(f"quickstart.sh: error: {busy_message('SAVE_DIR', out, other.pid)}"), res.stderr
        assert res.stderr.count("\n") == 1
        # nothing in the environment opens another command's lock
        res = bash('fsx_lock_output "$1"; echo took it', out,
                   env_extra={"FSX_HELD_LOCKS": outputs.lock_path(out), "FSX_CALLER_PWD": str(tmp_path)})
        assert res.returncode == 1 and "took it" not in res.stdout, res.stderr
    finally:
        other.kill()
        other.wait()
    assert os.path.exists(outputs.lock_path(out))  # its file, not its lock
    res = bash('fsx_lock_output "$1"; fsx_lock_output "$1"; head -c 4 "$(dirname "$1")/.eval.lock"; echo', out)
    assert res.returncode == 0 and res.stdout == "pid \n", res.stderr
    assert not os.path.exists(outputs.lock_path(out))  # removed by its holder at exit
    with outputs.StagedOutput(str(out), prog="evaluate.sh", log=lambda m: None) as staged:
        assert outputs.lock_path(out) in outputs._HELD
        # a command it starts (evaluate.sh under fairseq-ext evaluate), and one that command
        # starts, write on under its lock, and leave its file to it
        res = bash('fsx_lock_output "$1"; bash -c "source $2; fsx_lock_output $1" quickstart.sh; echo took it', out,
                   COMMON)
        assert res.returncode == 0 and res.stdout == "took it\n", res.stderr
        assert os.path.exists(outputs.lock_path(out))
        staged.finish()
    assert outputs.lock_path(out) not in outputs._HELD and not os.path.exists(outputs.lock_path(out))


def test_a_stale_lock_file_of_a_nested_output_does_not_keep_its_parent(tmp_path):
    """quickstart's SAVE_DIR/.eval-test.lock, left by an evaluation killed with SIGKILL, is
    part of the nested output eval-test/: SAVE_DIR stays replaceable; a user's file of that
    shape elsewhere still keeps it."""
    d = tmp_path / "quickstart"
    manifest(d, "quickstart.sh", "checkpoint_last.pt")
    outputs.add_output_entries(str(d), ["eval-test/"])
    (d / ".eval-test.lock").write_text("pid 1 on host since then: evaluate\n")
    allowed(d, prog="quickstart.sh")
    (d / ".notes.lock").write_text("mine")
    assert refused(d, prog="quickstart.sh").startswith(f"refusing to replace {d}: it holds .notes.lock, which")


def test_the_temporary_directories_of_killed_runs_are_named_when_the_output_is_written_again(tmp_path):
    out = tmp_path / "data"
    stale = tmp_path / ".data.tmp.Ab3xZ9"
    (stale / "out").mkdir(parents=True)
    (tmp_path / ".data.tmp.notours").mkdir()  # not mktemp's shape
    want = (f"1 temporary directory of earlier runs that wrote {out} and were stopped before they finished "
            f"(killed, or --keep-tmp): nothing in it is a result; remove with  rm -rf {stale}")
    logged = []
    with outputs.StagedOutput(str(out), prog="quickstart.sh", log=logged.append) as staged:
        staged.finish()
    assert logged[0] == f"WARNING: {want}"
    res = bash('FSX_OUT="$1"; FSX_FORCE=1; fsx_begin_output; fsx_finish_output', out)
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines()[0] == f"[quickstart.sh] WARNING: {want}"
    assert stale.is_dir()  # named, never removed: --keep-tmp keeps one on purpose


def test_stale_staging_finds_the_folders_of_killed_runs_of_bash_and_python(tmp_path):
    """A killed run leaves .NAME.tmp.XXXXXX (the recipes' mktemp) or .NAME.tmp.XXXXXXXX (Python's
    mkdtemp, as `fairseq-ext evaluate` stages): both are reported, nothing else is."""
    import tempfile

    target = tmp_path / "eval-test"
    bash_like = tmp_path / ".eval-test.tmp.Ab3dE9"
    bash_like.mkdir()
    python_like = tempfile.mkdtemp(prefix=".eval-test.tmp.", dir=tmp_path)
    (tmp_path / ".eval-test.tmp.notours-at-all").mkdir()
    (tmp_path / ".other.tmp.Ab3dE9").mkdir()
    assert outputs.stale_staging(str(target)) == sorted([str(bash_like), python_like])
    assert "2 temporary directories of earlier runs" in outputs.stale_staging_warning(str(target))
