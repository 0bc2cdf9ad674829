"""docs/trust.md's "Everything `import fairseq_ext` changes" is complete and exact: a fresh
process imports fairseq-train's module first (as fairseq-train does), then the plugin, and
what changed (replaced attributes, modules whose ``eval`` is the literal-only evaluator,
globals allowed in torch's weights_only load, warning filters) equals the page's lists."""
import json
import re
import subprocess
import sys

from model_utils import REPO, clean_env

PROBE = r"""
import json, sys, warnings
import torch
import fairseq_cli.train  # fairseq-train imports it before the plugin
safe_before = set(torch.serialization.get_safe_globals())
filters_before = list(warnings.filters)
import fairseq_ext
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


def test_trust_md_lists_everything_the_import_changes():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=clean_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    changed = json.loads(res.stdout.strip().splitlines()[-1])
    page = documented()
    assert page["replaced"] == changed["replaced"]  # in installation order
    assert sorted(page["eval"]) == changed["eval"]
    assert sorted(page["globals"]) == changed["globals"]
    assert sorted(page["warnings"]) == sorted(plain(p) for p in changed["warnings"])
