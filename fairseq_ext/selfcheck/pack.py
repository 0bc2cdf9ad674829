"""``fairseq-ext selfcheck-pack``: gather into one folder what ``fairseq-ext selfcheck`` needs
on a machine without a package registry (a GPU node of a cluster), on a machine with one.

    fairseq-ext selfcheck-pack --out pack                       # wheels for Python 3.12, both data sets
    fairseq-ext selfcheck-pack --out pack --python-version 3.11 --from ~/corpora
    fairseq-ext selfcheck-pack --out pack --datasets multi30k.en-de   # Multi30k only (a short GPU lease)

PACK/wheels   the packages a Python that already has torch (with numpy, cython, sacrebleu,
              sentencepiece, matplotlib, pytest, regex, tqdm) lacks: fairseq and what it
              needs, --no-deps, as wheels for --python-version where there are (else the
              source, built there by pip)
PACK/data     multi30k.en-de/ and iwslt15.en-vi/, prepared by the recipes (binarized, with
              their BPE codes, dictionaries and reference texts); --from takes local copies
              of the corpora ($FAIRSEQ_EXT_DATA by default), else they are downloaded
PACK/install.sh   `source PACK/install.sh` in the checkout on that machine: installs the wheels
              into /tmp/fairseq_ext-site without the registry (none with --no-wheels), sets PYTHONPATH
PACK/README.md    what is in the folder, with sizes

The total size is printed; over --max-mib (default 60) the command fails.
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys
from typing import List, Optional

from fairseq_ext.common.command_line import CommandParser, fail, setup_cli
from fairseq_ext.errors import CommandError
from fairseq_ext.selfcheck.stage_files import chosen

PROG = "fairseq-ext selfcheck-pack"
# what a GPU machine's Python with torch lacks; the versions fairseq 0.12 needs are pinned
WHEELS = ["fairseq-fixed==0.12.3.1", "hydra-core==1.3.2", "omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3",
          "bitarray", "subword-nmt", "sacremoses", "compare-mt", "nltk", "joblib", "click", "mock", "PyYAML"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"]
DATASETS = {  # folder -> (recipe, its flags, the corpus folder under --from)
    "multi30k.en-de": ("multi30k", ["--src", "en", "--tgt", "de", "--bpe-merges", "5000"], "multi30k"),
    "iwslt15.en-vi": ("iwslt15-en-vi", ["--src", "en", "--tgt", "vi"], "iwslt15-en-vi"),
}
SITE = "/tmp/fairseq_ext-site"
say = lambda message: print(f"{PROG}: {message}", file=sys.stderr, flush=True)  # noqa: E731  a line of progress
mib = lambda n: f"{n / 2 ** 20:.1f} MiB"  # noqa: E731


def download_wheels(target: str, python_version: str) -> None:
    os.makedirs(target, exist_ok=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    for i, spec in enumerate(WHEELS, 1):
        say(f"wheel {i} of {len(WHEELS)}: {spec} for Python {python_version}")
        base = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation", "-d", target]
        binary = base + ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
                         *platforms, spec]
        if subprocess.run(binary, capture_output=True, text=True).returncode != 0:
            source = subprocess.run(base + ["--no-binary=:all:", spec], capture_output=True, text=True)
            if source.returncode != 0:
                raise CommandError(f"pip download {spec}: {(source.stderr.strip().splitlines() or ['failed'])[-1]}")


def prepare_data(target: str, corpora: Optional[str], max_lines: int, workers: int, names: List[str]) -> None:
    os.makedirs(target, exist_ok=True)
    for i, folder in enumerate(names, 1):
        recipe, flags, corpus = DATASETS[folder]
        cmd = [sys.executable, "-m", "fairseq_ext", "prepare", recipe, "--out", os.path.join(target, folder), "--force",
               *flags, "--workers", str(workers)]
        if corpora:
            cmd += ["--from", os.path.join(corpora, corpus)]
        if max_lines:
            cmd += ["--max-lines", str(max_lines)]
        say(f"data set {i} of {len(names)}: preparing {folder} (the recipe's steps follow): {shlex.join(cmd)}")
        code = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode  # its steps, a line each, on stderr
        if code != 0:
            raise CommandError(f"preparing {folder} failed (exit {code}): the recipe's last lines above say why")


def write_install(out: str, python_version: str, wheels: bool) -> None:
    with open(os.path.join(out, "install.sh"), "w", encoding="utf-8") as f:
        f.write(f"""# source PACK/install.sh, from the root of the fairseq_ext checkout, on a machine without a
# package registry whose Python {python_version} has torch: installs PACK/wheels there (no
# dependencies resolved, nothing downloaded) and puts them and the checkout on PYTHONPATH.
_pack="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target {SITE} "$_pack"/wheels/* \\
  && export PYTHONPATH={SITE}:$PWD${{PYTHONPATH:+:$PYTHONPATH}} && export PATH={SITE}/bin:$PATH
# then: python3 -m fairseq_ext selfcheck --out selfcheck --stage env   (tests, bench, train --data "$_pack"/data)
""" if wheels else """# source PACK/install.sh in the checkout. No wheels (--no-wheels): Python needs its own fairseq.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
""")


def main(argv: Optional[List[str]] = None) -> int:
    setup_cli()
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--python-version", default="3.12", help="the Python of the machine without internet (default 3.12)")
    p.add_argument("--from", dest="corpora", metavar="DIR", default=os.environ.get("FAIRSEQ_EXT_DATA"),
                   help="local copies of the corpora (multi30k/, iwslt15-en-vi/; default $FAIRSEQ_EXT_DATA), "
                        "else downloaded")
    p.add_argument("--no-wheels", action="store_true", help="the data only")
    p.add_argument("--no-data", action="store_true", help="the wheels only")
    p.add_argument("--datasets", default="all", metavar="LIST",
                   help=f"the data sets to prepare, a comma list of {', '.join(DATASETS)} (default all; "
                        "Multi30k alone takes a minute, IWSLT'15 En-Vi about four)")
    p.add_argument("--max-lines", type=int, default=0, help="only the first N training pairs (tests); 0 = all")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--max-mib", type=float, default=60.0, help="fail when the folder is larger (default 60)")
    try:
        args = p.parse_args(argv)
        datasets = chosen(args.datasets, DATASETS, "--datasets", "data set")
        is_pack = os.path.exists(os.path.join(args.out, "install.sh"))
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise CommandError(f"--out {args.out}: exists and is not a folder")
        if os.path.exists(args.out) and os.listdir(args.out) and not is_pack:
            raise CommandError(f"--out {args.out}: exists and is not a pack (no install.sh): choose another folder")
        os.makedirs(args.out, exist_ok=True)
        if not args.no_wheels:
            shutil.rmtree(os.path.join(args.out, "wheels"), ignore_errors=True)
            download_wheels(os.path.join(args.out, "wheels"), args.python_version)
        if not args.no_data:
            prepare_data(os.path.join(args.out, "data"), args.corpora, args.max_lines, args.workers, datasets)
        wheels = bool(glob.glob(os.path.join(args.out, "wheels", "*")))  # this run's, or an earlier one's
        write_install(args.out, args.python_version, wheels)
    except CommandError as e:
        return fail(PROG, e, p.format_usage())
    paths = [p for folder in ("wheels", "data") for p in sorted(glob.glob(os.path.join(args.out, folder, "*")))]
    sizes = [os.path.getsize(p) if os.path.isfile(p) else sum(os.path.getsize(os.path.join(d, f)) for d, _, files
                                                              in os.walk(p) for f in files) for p in paths]
    total, rows = sum(sizes), [f"| {os.path.relpath(p, args.out)} | {mib(n)} |" for p, n in zip(paths, sizes)]
    readme = ["# The self-check's pack", "", f"Made by `{PROG}` for Python {args.python_version}. On the machine "
              "without a registry, from the checkout's root:" if wheels else f"Made by `{PROG} --no-wheels`: data "
              "only, for a Python with fairseq and its dependencies (e.g. the checkout's `.venv`), from the checkout's "
              "root:", "", "```bash", "source PACK/install.sh",
              "python3 -m fairseq_ext selfcheck --out selfcheck --stage env,tests,bench",
              "python3 -m fairseq_ext selfcheck --out selfcheck --stage train --data PACK/data", "```", "",
              "| file | size |", "|---|---:|", *rows, f"| **total** | **{mib(total)}** |"]
    with open(os.path.join(args.out, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(readme) + "\n")
    print("\n".join(readme) + "\n")
    print(f"{PROG}: {args.out}: {mib(total)}")
    if total > args.max_mib * 2 ** 20:
        print(f"{PROG}: error: {args.out} is {mib(total)}, over --max-mib {args.max_mib:g}", file=sys.stderr)
        return 1
    return 0
