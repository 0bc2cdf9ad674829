"""docs/trust.md's "Everything `import fairseq_ext` changes" is complete and exact: a fresh
process imports fairseq-train's module first (as fairseq-train does), then the plugin, and
what changed (replaced attributes, modules whose ``eval`` is the literal-only evaluator,
globals allowed in torch's weights_only load, warning filters) equals the page's lists. The
plugin imported before fairseq loads neither fairseq nor torch, and makes the same changes the
moment fairseq is imported, whichever of its modules comes first."""
import json
import re
import subprocess
import sys

import pytest

from model_utils import REPO, clean_env

FAIRSEQ_FIRST = r"""
import json, sys, warnings
import torch
import fairseq_cli.train  # fairseq-train imports it before the plugin
safe_before = set(torch.serialization.get_safe_globals())
filters_before = list(warnings.filters)
import fairseq_ext
"""
PLUGIN_FIRST = r"""
import json, sys, warnings
filters_before = list(warnings.filters)
import fairseq_ext
assert not {"fairseq", "torch"} & set(sys.modules), "import fairseq_ext loaded fairseq or torch"
added = [f for f in warnings.filters if f not in filters_before]
import torch
safe_before = set(torch.serialization.get_safe_globals())
assert "fairseq" not in sys.modules
import fairseq_cli.train
filters_before = [f for f in warnings.filters if f not in added]  # torch's and fairseq's own
"""
REPORT = r"""
from fairseq_ext.guards.checkpoint_safety import literal_eval
from fairseq_ext.guards.patching import REPLACED

def dotted(owner, attribute):
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}.{attribute}"
    return f"{owner.__name__}.{attribute}"

def global_name(obj):
    return f"{obj.__module__}.{obj.__qualname__}".replace("numpy._core.", "numpy.core.")

print(json.dumps({
    "replaced": [dotted(owner, attribute) for owner, attribute in REPLACED],
    "eval": sorted(name for name, module in list(sys.modules.items())
                   if module is not None and vars(module).get("eval") is literal_eval),
    "globals": sorted(global_name(g) for g in set(torch.serialization.get_safe_globals()) - safe_before),
    "warnings": [f[1].pattern for f in warnings.filters if f not in filters_before],
}))
"""


def documented():
    """The four bullet lists of the section, in order."""
    text = open(f"{REPO}/docs/trust.md", encoding="utf-8").read()
    section = text.split("## Everything `import fairseq_ext` changes", 1)[1].split("\n## ", 1)[0]
    groups, current = [], None
    for line in section.splitlines():
        if line.startswith("- "):
            if current is None:
                current = []
                groups.append(current)
            current.append(line[2:])
        else:
            current = None
    assert len(groups) == 4, groups
    first_code = [[re.match(r"`([^`]+)`", item).group(1) for item in group] for group in groups[:3]]
    return {"replaced": first_code[0], "eval": first_code[1], "globals": first_code[2], "warnings": groups[3]}


def plain(pattern):
    """A warning filter's regex as the page writes its message."""
    return pattern.replace(r"\s*", "").replace("\\", "")


def changes(first: str) -> dict:
    res = subprocess.run([sys.executable, "-c", first + REPORT], capture_output=True, text=True, env=clean_env(),
                         cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("first", ["fairseq", "plugin"])
def test_trust_md_lists_everything_the_import_changes(first):
    changed = changes(FAIRSEQ_FIRST if first == "fairseq" else PLUGIN_FIRST)
    page = documented()
    if first == "plugin":  # fairseq_cli.train was half imported when fairseq's import ended
        page["replaced"] = [name for name in page["replaced"] if not name.startswith("fairseq_cli.train.")]
    assert page["replaced"] == changed["replaced"]  # in installation order
    assert sorted(page["eval"]) == changed["eval"]
    assert sorted(page["globals"]) == changed["globals"]
    assert sorted(page["warnings"]) == sorted(plain(p) for p in changed["warnings"])


REGISTERED = r"""
import importlib, sys
importlib.import_module(sys.argv[1])
from fairseq import checkpoint_utils
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.tasks import TASK_REGISTRY
from fairseq_ext.guards.patching import is_guard
assert is_guard(checkpoint_utils.load_checkpoint_to_cpu), "guards not installed"
assert "multilayer_transformer_iwslt" in ARCH_MODEL_REGISTRY, "model not registered"
assert "multi_output_label_smoothed_cross_entropy" in CRITERION_REGISTRY, "criterion not registered"
assert "multi_source_translation" in TASK_REGISTRY, "task not registered"
"""


@pytest.mark.parametrize("module", ["fairseq_ext.guards.resume", "fairseq_ext.modules.attention_utils",
                                    "fairseq_ext.models.multilayer_transformer_config", "fairseq_ext.strip_aux"])
def test_any_module_imported_first_registers_the_plugin(module):
    """A module of the guards, of the core, or a command, imported first in a fresh process:
    fairseq's import, which it starts, ends with the guards installed and the core registered
    (none of the registration's modules is met half imported)."""
    res = subprocess.run([sys.executable, "-c", REGISTERED, module], capture_output=True, text=True,
                         env=clean_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]


def test_commands_that_need_no_model_load_neither_fairseq_nor_torch():
    """``fairseq-ext user-dir``, ``prepare``/``train`` (bash recipes), ``evaluate`` (which runs
    fairseq-generate as its own process), ``significance`` and ``config-dir`` start without
    fairseq and torch: their modules import neither."""
    probe = ("import sys\nfrom fairseq_ext.cli import main\nassert main(['user-dir']) == 0\n"
             "import fairseq_ext.tools.evaluate, fairseq_ext.tools.compare, fairseq_ext.tools.hydra_configs\n"
             "loaded = {'fairseq', 'torch'} & set(sys.modules)\nassert not loaded, loaded\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=clean_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
