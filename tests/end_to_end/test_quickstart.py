"""The newcomer's path of README: `make quickstart` (here with a tiny model and a slice of
Multi30k), then "Translate your own text" with fairseq-interactive and from_pretrained."""
import shlex
import subprocess
import sys

import pytest

from script_utils import SCRIPTS, needs_multi30k, run

pytestmark = pytest.mark.slow

TINY = {"LAYERS": "1", "EMBED_DIM": "16", "FFN_DIM": "32", "HEADS": "2", "MAX_UPDATE": "6", "TRAIN_MINUTES": "5",
        "BPE_MERGES": "100", "MAX_TOKENS": "600", "BEAM": "2"}


@needs_multi30k
def test_quickstart_then_translate_your_own_text(m30k_small, tmp_path):
    data, save = tmp_path / "data-bin" / "multi30k.en-de", tmp_path / "checkpoints" / "quickstart.en-de"
    env = {**TINY, "MULTI30K_FROM": str(m30k_small), "DATA_DIR": str(data), "SAVE_DIR": str(save)}
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "reported BLEU [detok-cased]" in res.stdout + res.stderr
    last = res.stderr.strip().splitlines()[-1]  # the closing line: updates done of planned, the BLEU
    assert "quickstart done: 6 of 6 updates in " in last and " min of training, BLEU " in last, last
    assert (save / "eval-test" / ".evaluation-complete").is_file()
    assert (save / ".fairseq_ext-output").is_file() and (data / ".fairseq_ext-output").is_file()
    # a rerun with the same settings reuses data and checkpoint
    again = run(["bash", SCRIPTS / "quickstart.sh"], env_extra=env)
    assert again.returncode == 0 and "reusing" in again.stderr

    # README's warm start, as written, in the folder quickstart ran in
    with open(SCRIPTS.parent / "README.md", encoding="utf-8") as f:
        block = f.read().split("**Start from a trained model.**", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    command = " ".join(block.replace("\\\n", " ").split())  # the block's lines joined as the shell does
    assert command.startswith("fairseq-ext train ") and "--init-from" in command, command
    res = run(shlex.split(command), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stderr + res.stdout
    assert "checkpoints/quickstart.en-de/checkpoint_best.pt: 41 tensors taken as they are, 6 moved" in log, log[-3000:]
    assert (tmp_path / "checkpoints" / "m10-warm" / "checkpoint_last.pt").is_file()

    sentence = "A man in a red shirt is riding a bike.\n"
    res = run(["fairseq-interactive", data, "--user-dir", SCRIPTS.parent / "fairseq_ext", "--path",
               save / "checkpoint_best.pt", "--source-lang", "en", "--target-lang", "de", "--tokenizer", "moses",
               "--bpe", "subword_nmt", "--bpe-codes", data / "code", "--beam", "2", "--cpu"], stdin=sentence)
    assert res.returncode == 0, res.stderr[-2000:]
    assert [line for line in res.stdout.splitlines() if line.startswith("D-0\t")]
    hub = ("from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel as M\n"
           f"m = M.from_pretrained({str(save)!r}, checkpoint_file='checkpoint_best.pt', "
           f"data_name_or_path={str(data)!r}, tokenizer='moses', bpe='subword_nmt', bpe_codes={str(data / 'code')!r}, "
           "source_lang='en', target_lang='de')\n"
           f"print('OUT', m.translate({sentence.strip()!r}, beam=2))\n")
    res = subprocess.run([sys.executable, "-c", hub], capture_output=True, text=True)
    assert res.returncode == 0 and "OUT " in res.stdout, res.stderr[-2000:]


@needs_multi30k
def test_a_run_cut_by_the_time_cap_says_so_and_continues_and_a_users_file_survives(m30k_small, tmp_path):
    """The closing line of a run cut by the time cap names the updates done of planned and the
    command that trains on; that command continues the run to MAX_UPDATE; a rerun with other
    settings over a save dir that holds a user's averaged checkpoint refuses and keeps it."""
    import shlex

    data, save = tmp_path / "data-bin" / "multi30k.en-de", tmp_path / "checkpoints" / "quickstart.en-de"
    env = {**TINY, "MULTI30K_FROM": str(m30k_small), "DATA_DIR": str(data), "SAVE_DIR": str(save),
           "MAX_UPDATE": "150", "TRAIN_MINUTES": "0.01", "LOG_INTERVAL": "10", "THREADS": "1"}
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra=env, cwd=SCRIPTS.parent)
    assert res.returncode == 0, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert "quickstart done, but the time cap cut training: " in last and " of 150 updates in " in last, last
    done = int(last.split("cut training: ")[1].split(" of ")[0])
    assert 1 <= done < 150
    assert "BLEU " in last and "(detok-cased, nrefs:1|case:mixed|" in last
    command = last.split("and score again, run: ")[1]
    assert command.startswith("CONTINUE=1 ") and f"SAVE_DIR={shlex.quote(str(save))}" in command
    assert "THREADS=1 " in command  # the run's settings, the threads it was given among them
    # fairseq-train's own closing line says the same, naming no temporary directory
    ended = [line for line in (res.stdout + res.stderr).splitlines() if "training ended: " in line]
    assert len(ended) == 1 and ended[0].endswith(f"To continue it to 150 updates, run: {command}"), ended
    assert ".tmp." not in ended[0]
    # what it says to run (without the cap it was given: the printed command does not repeat it)
    words = shlex.split(command)
    given = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("/"))
    assert "TRAIN_MINUTES" not in given
    continue_env = {**{k: v for k, v in env.items() if k != "TRAIN_MINUTES"}, **given}
    # a continuation that fails (here: both checkpoints damaged, so fairseq-train has nothing to
    # resume from) says so, and the run stays as it was: the old log's "done training" does not
    # pass for the continuation's
    good = {f: (save / f).read_bytes() for f in ("checkpoint_last.pt", "checkpoint_best.pt")}
    for f, content in good.items():
        (save / f).write_bytes(content[:1000])
    log = (save / "train.log").read_bytes()
    res = run(words[len(given):], env_extra=continue_env, cwd=SCRIPTS.parent)
    assert res.returncode != 0, res.stderr[-3000:]
    said = [line for line in res.stderr.splitlines() if line.startswith("quickstart.sh: error: ")]
    assert said == [f"quickstart.sh: error: fairseq-train failed to continue the run (its last lines above); {save} "
                    "is kept as it was"], res.stderr[-2000:]
    assert (save / "train.log").read_bytes() == log
    assert all((save / f).read_bytes() == content[:1000] for f, content in good.items())
    for f, content in good.items():
        (save / f).write_bytes(content)
    res = run(words[len(given):], env_extra=continue_env, cwd=SCRIPTS.parent)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "continuing" in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "quickstart done: 150 of 150 updates in " in last and "BLEU " in last, last
    assert (save / "eval-test" / ".evaluation-complete").is_file()

    # a user's averaged checkpoint in the save dir: a rerun with other settings refuses, keeps it
    (save / "checkpoint_avg5.pt").write_bytes(b"user's model")
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra={**env, "SEED": "2"}, cwd=SCRIPTS.parent)
    assert res.returncode != 0 and "checkpoint_avg5.pt" in res.stderr.strip().splitlines()[-1], res.stderr[-2000:]
    assert (save / "checkpoint_avg5.pt").read_bytes() == b"user's model"
    assert (save / "checkpoint_last.pt").is_file()


def test_a_second_quickstart_into_one_save_dir_is_refused_before_it_starts(tmp_path):
    """Two quickstarts into one SAVE_DIR: the second stops at once, naming the first, and
    prepares no data (run A's model and score stay A's)."""
    save, data = tmp_path / "checkpoints" / "qs", tmp_path / "data"
    hold = ("import sys, time; from fairseq_ext.standalone.outputs import OutputLock; "
            "OutputLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)")
    first = subprocess.Popen([sys.executable, "-c", hold, str(save)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra={**TINY, "SAVE_DIR": str(save), "DATA_DIR": str(data)})
    finally:
        first.kill()
        first.wait()
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].startswith(
        f"quickstart.sh: error: SAVE_DIR {save} is being written by another command (pid {first.pid} on "), res.stderr
    assert not data.exists()


def test_relative_paths_are_the_callers_and_the_directory_it_runs_in_is_never_replaced(tmp_path):
    """Run from another directory, quickstart reads relative paths from there (it never changes
    directory), and DATA_DIR=. is refused there: the directory the user started in."""
    start = tmp_path / "work"
    (start / "notes.txt").parent.mkdir()
    (start / "notes.txt").write_text("mine")
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra={**TINY, "SAVE_DIR": "ck", "DATA_DIR": "."}, cwd=start)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        f"prepare-multi30k.sh: error: refusing to replace {start}: it is or contains {start}"), res.stderr[-2000:]
    assert (start / "notes.txt").read_text() == "mine" and not (SCRIPTS.parent / "ck").exists()
