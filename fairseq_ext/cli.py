"""``fairseq-ext``: one command for everything around the models, in the style of
fairseq's own ``fairseq-*`` commands. Each subcommand is also ``python -m fairseq_ext ...``.

    fairseq-ext user-dir                      the directory to pass to fairseq's --user-dir
    fairseq-ext config-dir [--out DIR]        the training configs as fairseq-hydra-train YAML
    fairseq-ext prepare NAME [options]        a data recipe: multi30k, iwslt14, iwslt15-en-vi,
                                              iwslt-fr-ro, wmt14-en-de (--help lists its options)
    fairseq-ext train DATA SAVE_DIR [--config NAME] [--nproc N ...] -- FAIRSEQ_TRAIN_FLAGS
    fairseq-ext evaluate --checkpoint CKPT --data DATA [--split test] [generate options]
    fairseq-ext significance (--eval-a DIR --eval-b DIR | --ref R --sys-a A --sys-b B) --out DIR
    fairseq-ext translate --checkpoint CKPT --data DATA < raw.txt > translations.txt
    fairseq-ext score --checkpoint CKPT --data DATA --src raw.en --ref raw.de [--output hyp.de]
    fairseq-ext analyze NAME [options]        an analysis (fairseq_ext.analysis.NAME)
    fairseq-ext report [options]              several analyses into one HTML report
    fairseq-ext reproduce [TABLE] [options]   the papers' tables (--list)
    fairseq-ext benchmark [options]           speed, FLOPs, memory against the stock Transformer
    fairseq-ext selfcheck --out DIR [--stage env,tests,bench,train] [--device cuda|cpu] [--data DIR]
                                              does the plugin work on this GPU, and at what cost
    fairseq-ext selfcheck-pack --out DIR      the wheels and data selfcheck needs, for a machine
                                              without internet
    fairseq-ext average-checkpoints | strip-aux [options]

Data preparation and training are bash recipes shipped inside the package (``fairseq_ext/recipes``).
"""
import importlib
import os
import sys
from typing import List, NoReturn, Optional

from fairseq_ext import resources
from fairseq_ext.analysis import registry
from fairseq_ext.errors import error_line
from fairseq_ext.standalone import cpu

COMMANDS = {  # subcommand -> module with main(argv), or "module:function"
    "evaluate": "fairseq_ext.tools.evaluate",
    "significance": "fairseq_ext.tools.compare",
    "report": "fairseq_ext.analysis.report",
    "reproduce": "fairseq_ext.reproduce.__main__",
    "translate": "fairseq_ext.tools.translate",
    "score": "fairseq_ext.tools.score",
    "benchmark": "fairseq_ext.selfcheck.benchmark",
    "selfcheck": "fairseq_ext.selfcheck.main",
    "selfcheck-pack": "fairseq_ext.selfcheck.pack",
    "config-dir": "fairseq_ext.tools.hydra_configs",
    "average-checkpoints": "fairseq_ext.average_checkpoints:cli_main",
    "strip-aux": "fairseq_ext.strip_aux:cli_main",
}
USAGE = __doc__.split("\n\n")[1]
DECODING = ("translate", "score", "evaluate")  # CPU threads picked as training picks them (standalone/cpu.py)


def run_recipe(name: str, args: List[str], command: str) -> NoReturn:
    """Run the bash recipe ``name``; ``command`` is what the user typed (its --help names it)."""
    path = resources.recipe_path(name)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe("bash", ["bash", path, *args], {**resources.command_environment(), "FSX_COMMAND": command})


def resolve_train_config(args: List[str]) -> List[str]:
    """``--config NAME`` of train: a file, or a config shipped with the package."""
    out = list(args)
    end = out.index("--") if "--" in out else len(out)
    for i in range(end):
        if out[i] == "--config" and i + 1 < end:
            out[i + 1] = resources.config_path(out[i + 1])
        elif out[i].startswith("--config="):
            out[i] = "--config=" + resources.config_path(out[i].split("=", 1)[1])
    return out


def _fail(message: str) -> int:
    print(error_line("fairseq-ext", message), file=sys.stderr)
    return 2


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "user-dir":
        print(resources.user_dir())
        return 0
    if command in ("prepare", "analyze"):  # fairseq-ext prepare RECIPE / analyze ANALYSIS [options]
        what, names = (("data recipe", resources.DATA_RECIPES) if command == "prepare"
                       else ("analysis", sorted(registry.analyses())))
        if not rest or rest[0] in ("-h", "--help"):
            print(f"usage: fairseq-ext {command} NAME [options]  (NAME --help: its options)\n  NAME: "
                  + ", ".join(names))
            return 0 if rest else 2
        if rest[0] not in names:
            return _fail(f"{command}: unknown {what} {rest[0]!r} (choose from {', '.join(names)})")
        if command == "prepare":
            run_recipe(f"prepare-{rest[0]}.sh", rest[1:], f"fairseq-ext prepare {rest[0]}")
        sys.argv[0] = f"fairseq-ext analyze {rest[0]}"
        return importlib.import_module(registry.get(rest[0]).module).main(rest[1:]) or 0
    if command == "train":
        run_recipe("train.sh", resolve_train_config(rest), "fairseq-ext train")
    if command in DECODING and "OMP_NUM_THREADS" not in os.environ and not {"-h", "--help"} & set(rest):
        threads, why = cpu.threads_per_process()
        os.environ["OMP_NUM_THREADS"] = str(threads)  # before torch loads; fairseq-generate inherits it
        print(f"[fairseq-ext {command}] CPU: {threads} thread(s) ({why}; OMP_NUM_THREADS=N to choose)", file=sys.stderr)
    if command in COMMANDS:
        sys.argv[0] = f"fairseq-ext {command}"
        module, _, function = COMMANDS[command].partition(":")
        return getattr(importlib.import_module(module), function or "main")(rest) or 0
    return _fail(f"unknown command {command!r}\n{USAGE}")


if __name__ == "__main__":
    sys.exit(main())
