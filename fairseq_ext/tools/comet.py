"""COMET (Rei et al. 2020; ``unbabel-comet``) beside sacreBLEU's metrics, run in the Python of
``--comet-python`` (its pins, numpy < 2 and protobuf < 5, do not fit this environment) on the
model of ``--comet-model``: docs/evaluation.md, "COMET". :func:`score` gives the system score
(as ``comet-score``) with a signature like sacreBLEU's; :func:`compare` runs ``comet-compare``.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from fairseq_ext.errors import FairseqExtError

ENV_MODEL, ENV_PYTHON = "FAIRSEQ_EXT_COMET_MODEL", "FAIRSEQ_EXT_COMET_PYTHON"
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "comet_worker.py")
COMPARE = "from comet.cli.compare import compare_command; compare_command()"


class CometError(FairseqExtError):
    pass


@dataclass(frozen=True)
class Comet:
    python: str  # the Python with unbabel-comet
    version: str  # unbabel-comet's version there
    model: str  # a .ckpt file, or a name COMET downloads
    name: str  # the model's name in the signature
    batch_size: int = 16
    gpus: int = 1  # 0: the CPU (--cpu)

    def signature(self, nrefs: int = 1, lowercase: bool = False) -> str:
        """sacreBLEU's way: model, references, casing of the texts scored and COMET's version."""
        return f"model:{self.name}|nrefs:{nrefs}|case:{'lc' if lowercase else 'mixed'}|version:{self.version}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("COMET (docs/evaluation.md)")
    group.add_argument("--comet-model", default=os.environ.get(ENV_MODEL), metavar="DIR|CKPT|NAME",
                       help=f"also score with this COMET model (default ${ENV_MODEL}): its directory "
                            "(DIR/checkpoints/model.ckpt), a .ckpt, or a name COMET downloads")
    group.add_argument("--comet-python", default=os.environ.get(ENV_PYTHON), metavar="PATH",
                       help=f"the Python of an environment with unbabel-comet (default ${ENV_PYTHON}, "
                            "else this Python; make comet-env makes .comet-venv/bin/python)")
    group.add_argument("--comet-batch-size", type=int, default=16, metavar="N", help="segments a batch (16)")


def model_name(model: str) -> str:
    """The name a signature gives the model: a hub cache's ``models--ORG--NAME`` as ORG/NAME,
    a model directory by its name, a name as given."""
    found = re.search(r"models--([^/]+?)--([^/]+)", model)
    if found:
        return f"{found.group(1)}/{found.group(2)}"
    path = os.path.abspath(model)
    if path.endswith(".ckpt"):  # DIR/checkpoints/model.ckpt
        path = os.path.dirname(os.path.dirname(path))
    return os.path.basename(path) if os.path.exists(model) else model


def resolve_model(model: str) -> str:
    """The checkpoint COMET loads: absolute (the worker runs in a folder of its own), or a
    name COMET downloads as it is."""
    if os.path.isdir(model):
        checkpoint = os.path.join(model, "checkpoints", "model.ckpt")
        if not os.path.isfile(checkpoint):
            raise CometError(f"--comet-model {model}: no checkpoints/model.ckpt in it (a COMET model directory "
                             "holds checkpoints/model.ckpt and hparams.yaml)")
        return os.path.abspath(checkpoint)
    if model.endswith(".ckpt"):
        if not os.path.isfile(model):
            raise CometError(f"--comet-model {model}: no such file")
        return os.path.abspath(model)
    return model


def comet_version(python: str, flag: str) -> str:
    """unbabel-comet's version in ``python``; a one-line CometError naming ``flag`` if none."""
    try:
        proc = subprocess.run([python, "-c", "from importlib.metadata import version; "
                                             "import comet; print(version('unbabel-comet'))"],
                              capture_output=True, text=True)
    except OSError as e:
        raise CometError(f"{flag} {python}: cannot run it ({e.strerror})")
    if proc.returncode != 0 or not proc.stdout.strip():
        why = (proc.stderr.strip().splitlines() or ["it printed no version"])[-1]
        raise CometError(f"{flag} {python}: no unbabel-comet there ({why}); make comet-env makes an environment "
                         "with it: --comet-python .comet-venv/bin/python")
    return proc.stdout.strip()


def from_args(args: argparse.Namespace) -> Optional[Comet]:
    """The COMET settings of the command line, checked (None without --comet-model)."""
    if not getattr(args, "comet_model", None):
        return None
    flag = "--comet-python" if args.comet_python else "--comet-model (this Python)"
    python = (shutil.which(args.comet_python) or args.comet_python) if args.comet_python else sys.executable
    model = resolve_model(args.comet_model)
    return Comet(python=python, version=comet_version(python, flag), model=model, name=model_name(args.comet_model),
                 batch_size=args.comet_batch_size, gpus=0 if getattr(args, "cpu", False) else 1)


def _run(comet: Comet, texts: Dict[str, Sequence[str]], command: Callable[[Dict[str, str], str], List[str]],
         what: str) -> dict:
    """Write ``texts`` (name -> lines) to files in a folder of ours, run ``command(files, result)`` there (with
    ``python -c`` the current folder comes first on the path: ours, not one that would shadow COMET's ``comet``) and
    return the JSON it wrote to ``result``. Off a terminal COMET's output is kept, and a failure is its last line."""
    with tempfile.TemporaryDirectory(prefix="fairseq-ext-comet.") as tmp:
        files = {name: os.path.join(tmp, f"{name}.txt") for name in texts}
        for name, lines in texts.items():
            with open(files[name], "w", encoding="utf-8") as f:
                f.writelines(line.replace("\n", " ") + "\n" for line in lines)
        result = os.path.join(tmp, "result.json")
        cmd = command(files, result)
        if sys.stderr.isatty():
            if subprocess.run(cmd, stdout=subprocess.DEVNULL, cwd=tmp).returncode != 0:
                raise CometError(f"{what} failed (its messages above)")
        else:
            with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
                if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp).returncode != 0:
                    log.seek(0)
                    raise CometError(f"{what} failed: {failure_line(log.read())}")
        if not os.path.isfile(result):
            raise CometError(f"{what}: {comet.python} wrote no result (is it a Python with COMET?)")
        with open(result, encoding="utf-8") as f:
            return json.load(f)


def failure_line(output: str) -> str:
    """The line that says why a Python program failed: its exception's line (the last one
    naming an Error or Exception), not a traceback's caret or code line."""
    lines = [line.strip() for line in output.splitlines() if line.strip(" ^~\t")]
    named = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Exit)\b", line)]
    return (named or lines or ["no output"])[-1]


def text_flavour(lowercase: bool) -> str:
    return "detok-lc" if lowercase else "detok-cased"


def score(comet: Comet, src: Sequence[str], hyp: Sequence[str], ref: Sequence[str], lowercase: bool = False) -> dict:
    """COMET's system score of ``hyp`` as a metric entry beside sacreBLEU's (bleu.more_metrics),
    with ``segment_scores``. ``lowercase``: all three texts lowercased (as the data were)."""
    if not (len(src) == len(hyp) == len(ref)):
        raise CometError(f"COMET: {len(src)} sources, {len(hyp)} translations and {len(ref)} references")
    if lowercase:
        src, hyp, ref = ([line.lower() for line in lines] for lines in (src, hyp, ref))

    def worker(files: Dict[str, str], result: str) -> List[str]:
        request = os.path.join(os.path.dirname(result), "request.json")
        with open(request, "w", encoding="utf-8") as f:
            json.dump({"model": comet.model, **files, "batch_size": comet.batch_size, "gpus": comet.gpus,
                       "progress": sys.stderr.isatty()}, f)
        with open(WORKER, encoding="utf-8") as f:
            return [comet.python, "-c", f.read(), request, result]

    out = _run(comet, {"src": src, "hyp": hyp, "ref": ref}, worker, f"COMET ({comet.name})")
    sig = comet.signature(lowercase=lowercase)
    return {"score": round(out["system_score"], 4), "signature": sig, "flavour": text_flavour(lowercase),
            "line": f"COMET|{sig} = {out['system_score']:.4f}", "model": comet.name,
            "segment_scores": out["segment_scores"]}


def compare(comet: Comet, src: Sequence[str], baseline: Sequence[str], system: Sequence[str],
            ref: Sequence[str], num_splits: int = 300, sample_ratio: float = 0.4) -> dict:
    """``comet-compare`` of ``system`` against ``baseline``: its paired t-test over the segment scores and its bootstrap
    resampling ({p_value, baseline_mean, system_mean, wins, ties, losses, signature})."""
    found = _run(comet, {"src": src, "baseline": baseline, "system": system, "ref": ref}, lambda files, out: [
        comet.python, "-c", COMPARE, "-s", files["src"], "-t", files["baseline"], files["system"], "-r", files["ref"],
        "--model", comet.model, "--batch_size", str(comet.batch_size), "--gpus", str(comet.gpus),
        "--num_splits", str(num_splits), "--sample_ratio", str(sample_ratio), "--to_json", out],
        f"comet-compare ({comet.name})")["statistical_results"][0]
    boot, t_test = found["bootstrap_resampling"], found["paired_t-test"]
    return {"p_value": float(t_test["p_value"]), "t_statistic": float(t_test["statistic"]),
            "baseline_mean": boot["x-mean"], "system_mean": boot["y-mean"], "system_wins": boot["y_wins (%)"],
            "baseline_wins": boot["x_wins (%)"], "ties": boot["ties (%)"], "num_splits": num_splits,
            "sample_ratio": sample_ratio, "signature": comet.signature(), "model": comet.name}
