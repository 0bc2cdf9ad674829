"""The package stands on its own: its wheel, installed into a fresh virtual environment that
reuses this environment's torch and fairseq (a ``.pth`` line, not this checkout's editable
install), works from a directory that is not the checkout. From there: ``fairseq-ext
user-dir`` names the installed package; fairseq-train trains a tiny model with it as
``--user-dir``; fairseq-generate and ``fairseq-ext translate`` translate; the table runner
lists and dry-runs from the configs shipped in the wheel; the self-check's environment stage
and the benchmark run; the analysis report runs an analysis that decodes with fairseq-generate
and one that reads the attention in process, on data binarized with plain fairseq-preprocess (no
recipe, no prep.env). tests/analysis/test_analysis_plain_data.py runs all four on such data from
the checkout."""
import glob
import json
import os
import subprocess
import sys
import sysconfig
import venv
from importlib import metadata

import pytest

from model_utils import REPO, TINY_TRAIN_FLAGS

pytestmark = [pytest.mark.slow, pytest.mark.release]


def _fairseq_console_scripts():
    """fairseq's own commands (fairseq-preprocess, -train, -generate, ...) as declared by its
    distribution: name -> 'module:function'."""
    for dist in ("fairseq-fixed", "fairseq"):
        try:
            eps = metadata.distribution(dist).entry_points
        except metadata.PackageNotFoundError:
            continue
        return {ep.name: ep.value for ep in eps if ep.group == "console_scripts"}
    pytest.skip("fairseq is not installed as a distribution")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(environment variables, bin directory, a work directory outside the checkout) of a new
    venv holding only the wheel of fairseq_ext, with this environment's packages visible."""
    root = tmp_path_factory.mktemp("installed")
    dist = root / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(dist), REPO], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    wheels = glob.glob(str(dist / "fairseq_ext-*.whl"))
    assert len(wheels) == 1, wheels

    env_dir = root / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages (torch, fairseq, sacrebleu, ...) without its .pth files,
    # so the checkout's editable fairseq_ext stays invisible
    with open(os.path.join(site, "outer.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    # the new environment's own pip run (this environment's, through the .pth line), so that
    # the console scripts start the new environment's Python; --ignore-installed: pip sees
    # this environment's fairseq_ext through the .pth line and would otherwise uninstall it
    outer = sorted(glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "*fairseq_ext*")))
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed",
                              "-q", wheels[0]], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]
    assert sorted(glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "*fairseq_ext*"))) == outer
    bindir = env_dir / "bin"
    assert (bindir / "fairseq-ext").exists(), sorted(os.listdir(bindir))
    for name, target in _fairseq_console_scripts().items():
        module, function = target.split(":")
        (bindir / name).write_text(f"#!{python}\nimport sys\nfrom {module} import {function}\n"
                                   f"sys.exit({function}())\n")
        (bindir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = str(bindir) + os.pathsep + "/usr/bin:/bin"
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    work = root / "elsewhere"
    work.mkdir()
    return env, bindir, work


def run(cmd, env, cwd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=str(cwd), **kw)
    assert proc.returncode == 0, f"{cmd[:3]}...\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def test_the_wheel_trains_translates_reproduces_and_analyses_outside_the_checkout(installed):
    env, bindir, work = installed
    user_dir = run(["fairseq-ext", "user-dir"], env, work).stdout.strip()
    assert os.path.isdir(user_dir) and not user_dir.startswith(REPO + os.sep), user_dir
    assert str(bindir.parent) in user_dir
    for shipped in ("recipes/train.sh", "recipes/lib/common.sh", "configs/quickstart.args",
                    "configs/tables/setups.yaml"):
        assert os.path.isfile(os.path.join(user_dir, shipped)), shipped

    # data binarized with plain fairseq-preprocess: no prep.env, no text/ folder
    raw = work / "raw"
    raw.mkdir()
    words = [f"w{i}" for i in range(20)]
    for split, count in (("train", 203), ("valid", 21), ("test", 13)):
        with open(raw / f"{split}.de", "w") as fs, open(raw / f"{split}.en", "w") as ft:
            for i in range(count):
                sent = [words[(i * 7 + j * 3) % len(words)] for j in range(3 + i % 6)]
                fs.write(" ".join(sent) + "\n")
                ft.write(" ".join(reversed(sent)) + "\n")
    run(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--trainpref", raw / "train",
         "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", "bin", "--joined-dictionary",
         "--workers", "1"], env, work)
    assert not (work / "bin" / "prep.env").exists()

    run(["fairseq-train", "bin", "--user-dir", user_dir, "--arch", "multilayer_transformer",
         "--joint-attention", "m-10", *TINY_TRAIN_FLAGS, "--max-update", "8", "--save-dir", "ck",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"], env, work)
    checkpoint = work / "ck" / "checkpoint_last.pt"
    assert checkpoint.exists()

    gen = run(["fairseq-generate", "bin", "--user-dir", user_dir, "--path", checkpoint, "--beam", "2",
               "--batch-size", "5", "--cpu"], env, work).stdout
    assert sum(line.startswith("H-") for line in gen.splitlines()) == 13  # every test sentence, 13 % 5 != 0

    translated = run(["fairseq-ext", "translate", "--checkpoint", checkpoint, "--data", "bin", "--beam", "2",
                      "--cpu"], env, work, input="w1 w2 w3\n\nw4 w5\n").stdout.split("\n")
    assert len(translated) == 4 and translated[1] == "" and translated[3] == ""  # an empty line stays empty

    listing = run(["fairseq-ext", "reproduce", "--list"], env, work).stdout
    assert "thesis-3.2" in listing and "mma-2" in listing
    dry = run(["fairseq-ext", "reproduce", "thesis-3.2", "--rows", "m-10", "--dry-run", "--smoke"], env, work).stdout
    assert "fairseq-ext train " in dry and "--joint-attention m-10" in dry and REPO not in dry

    # the self-check from the wheel: the environment stage runs; the tests stage needs a checkout's suite
    run(["fairseq-ext", "selfcheck", "--out", "sc", "--device", "cpu", "--stage", "env"], env, work)
    assert json.loads((work / "sc" / "env.json").read_text())["packages"]["fairseq_ext"]
    no_suite = subprocess.run([str(bindir / "fairseq-ext"), "selfcheck", "--out", "sc", "--device", "cpu", "--stage",
                               "tests"], capture_output=True, text=True, env=env, cwd=str(work))
    assert no_suite.returncode == 1 and "an installed wheel has no test suite" in no_suite.stderr
    bench = run(["fairseq-ext", "benchmark", "--config", "tiny", "--configs", "M-10:--joint-attention m-10",
                 "--batch", "2", "--steps", "2", "--min-pairs", "1", "--max-pairs", "1", "--vocab", "100",
                 "--device", "cpu"], env, work).stdout
    assert "| M-10 |" in bench

    out = work / "rep"
    run(["fairseq-ext", "report", "--checkpoint", checkpoint, "--data", "bin", "--split", "test", "--cpu",
         "--run", "length_buckets", "attention_maps", "--out", out], env, work)
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'class="failed"' not in page
    for analysis in ("length_buckets", "attention_maps"):
        written = glob.glob(str(out / analysis / "**" / "*.*"), recursive=True)
        assert any(f.endswith(".png") for f in written), (analysis, written)
        assert any(f.endswith(".json") for f in written) or analysis == "attention_maps", (analysis, written)
    for path in glob.glob(str(out / "**" / "*.json"), recursive=True):
        json.load(open(path, encoding="utf-8"))
