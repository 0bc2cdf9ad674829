"""The package's training configs as fairseq-hydra-train YAML (``fairseq-ext config-dir``).

Each ``fairseq_ext/configs/NAME.args`` (the flags ``fairseq-ext train --config NAME`` reads)
becomes ``NAME.yaml`` in a directory this command writes: every flag of the file put under
the group fairseq's own conversion gives it (``convert_namespace_to_omegaconf``: common,
dataset, optimization, checkpoint, model, task, criterion, optimizer, lr_scheduler), the
preset of its ``--arch`` as ``model._name``, and ``common.user_dir`` set to this package, so
that fairseq-hydra-train loads the plugin::

    fairseq-hydra-train --config-dir "$(fairseq-ext config-dir)" --config-name iwslt \\
        task.data=data-bin/iwslt15.en-vi +model.joint_attention=m-10 checkpoint.save_dir=ckpt/m10

A plugin option the YAML does not name is added with hydra's ``+`` (``+model.aux_decoder_layers=1``), one it names is
overridden without (``model._name=multilayer_transformer_mlmha_iwslt``). The files are written from the ``.args`` files
each time, so they never differ from what ``fairseq-ext train --config NAME`` trains; the same options give the same
model and the same losses either way (tests/models/test_hydra.py).

    fairseq-ext config-dir [--out DIR]     write the YAML files (default: a cache directory), print DIR
"""
import argparse
import importlib.metadata
import logging
import os
import shlex
import sys
from typing import Dict, List, Optional

import yaml

from fairseq_ext import resources
from fairseq_ext.common.command_line import fail
from fairseq_ext.errors import FairseqExtError

GROUPS = ("common", "dataset", "optimization", "checkpoint", "distributed_training", "model", "task", "criterion",
          "optimizer", "lr_scheduler", "generation", "bpe", "tokenizer")
# the placeholders of what a config cannot know: where the data is (task.data) and the languages
PLACEHOLDER_DATA = "DATA_BIN"


def config_dict(name: str) -> Dict[str, dict]:
    """The YAML content of config ``name``: {group: {field: value}}."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    with open(resources.config_path(name), encoding="utf-8") as f:
        flags = shlex.split(f.read(), comments=True)
    task = ["--task", "translation"] if "--task" not in flags else []
    argv = [PLACEHOLDER_DATA, "--user-dir", resources.user_dir(), *task, *flags]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=argv)  # adds the model's and task's options to parser
    converted = convert_namespace_to_omegaconf(args)
    cfg = OmegaConf.to_container(converted, resolve=True)
    # the groups hydra builds from the YAML alone: every field written (interpolations such
    # as lr_scheduler.lr: ${optimization.lr} kept), so that each can be overridden without +
    typed = {g: OmegaConf.to_container(converted[g], resolve=False) for g in ("task", "criterion", "optimizer",
                                                                           "lr_scheduler")}
    if isinstance(cfg.get("model"), argparse.Namespace):  # a model without a dataclass: its args
        cfg["model"] = vars(cfg["model"])
    out: Dict[str, dict] = {"common": {"user_dir": resources.user_dir()}}
    # the model last: a model without a dataclass holds every argument
    lookup = [g for g in GROUPS if g != "model"] + ["model"]
    # the destinations of the options the file names (--max-tokens -> max_tokens)
    by_option = {option: action.dest for action in parser._actions for option in action.option_strings}
    for dest in (by_option[flag] for flag in flags if flag in by_option):
        group = next((g for g in lookup if isinstance(cfg.get(g), dict) and dest in cfg[g]), None)
        if group is None or dest in ("arch", "task", "criterion", "optimizer", "lr_scheduler", "user_dir"):
            continue
        out.setdefault(group, {})[dest] = cfg[group][dest]
    out["model"] = {"_name": args.arch, **out.get("model", {})}
    for group, fields in typed.items():
        if isinstance(fields, dict) and fields.get("_name"):
            linked = _interpolations(group, fields["_name"])
            out[group] = {"_name": fields["_name"], **{k: linked.get(k, v) for k, v in fields.items() if k != "_name"}}
    out["task"]["data"] = PLACEHOLDER_DATA
    return {g: out[g] for g in [*GROUPS] if g in out}


def _interpolations(group: str, name: str) -> Dict[str, str]:
    """The fields of a group's dataclass that default to another group's value (``lr:
    ${optimization.lr}``), so that an override of optimization.lr still reaches the optimizer."""
    import fairseq.criterions
    import fairseq.optim
    import fairseq.optim.lr_scheduler
    import fairseq.tasks
    from omegaconf import OmegaConf

    registry = {"task": fairseq.tasks.TASK_DATACLASS_REGISTRY,
                "criterion": fairseq.criterions.CRITERION_DATACLASS_REGISTRY,
                "optimizer": fairseq.optim.OPTIMIZER_DATACLASS_REGISTRY,
                "lr_scheduler": fairseq.optim.lr_scheduler.LR_SCHEDULER_DATACLASS_REGISTRY}[group]
    if name not in registry:
        return {}
    defaults = OmegaConf.to_container(OmegaConf.structured(registry[name]), resolve=False)
    return {k: v for k, v in defaults.items() if isinstance(v, str) and v.startswith("${")}


HEADER = "# fairseq-hydra-train config written by `fairseq-ext config-dir`"


def write_config_dir(out: str) -> List[str]:
    """Write NAME.yaml for every config into ``out``; the paths written. A NAME.yaml there that
    this command did not write (by its first line) is refused, not replaced."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise FairseqExtError(f"--out {out}: exists and is not a folder")
    for name in resources.config_names():
        path = os.path.join(out, f"{name}.yaml")
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                if not f.readline().startswith(HEADER):
                    raise FairseqExtError(f"--out {out}: {name}.yaml there was not written by fairseq-ext config-dir "
                                          "(it would be replaced): choose another folder")
    os.makedirs(out, exist_ok=True)
    paths = []
    for name in resources.config_names():
        path = os.path.join(out, f"{name}.yaml")
        text = (f"{HEADER} from fairseq_ext/configs/{name}.args\n"
                f"# (set task.data; add a plugin option with +model.NAME=VALUE)\n"
                + yaml.safe_dump(config_dict(name), sort_keys=False, default_flow_style=None))
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def default_dir() -> str:
    """~/.cache/fairseq_ext/hydra-configs-VERSION (XDG_CACHE_HOME respected): the files name the
    installed version's configs and directory."""
    try:
        version = importlib.metadata.version("fairseq_ext")
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        version = "checkout"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "fairseq_ext", f"hydra-configs-{version}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="fairseq-ext config-dir", description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="", metavar="DIR", help="where to write the YAML files (default: "
                        "~/.cache/fairseq_ext/hydra-configs-VERSION)")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out or default_dir())
    logging.disable(logging.INFO)  # fairseq's and hydra's INFO and DEBUG lines while it builds the configs
    try:
        write_config_dir(out)
    except FairseqExtError as e:
        return fail(parser.prog, e)
    finally:
        logging.disable(logging.NOTSET)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
