"""Checkpoint safety (fairseq_ext/guards/checkpoint_safety.py): checkpoints load under torch's
weights_only=True with the types fairseq writes, and a pickle that would run code is refused;
no checkpoint runs code through the configuration strings fairseq 0.12 passes to eval(), on
any load path; honest checkpoints of every option still load."""
import argparse
import builtins
import os
import pickle
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

import fairseq_ext.guards.checkpoint_safety as safety
from fairseq_ext.guards.checkpoint_safety import EVAL_MODULES, EVALUATED_FIELDS, check_field, literal_eval
from fairseq_ext.errors import UnsafeCheckpointError, UnsafeConfigValue
from fairseq_ext.models.joint_attention_strategies import STRATEGY_NAMES
from model_utils import (SMALL, TINY_TRAIN_FLAGS, USER_DIR, build, clean_env, full_disk, make_dictionary,
                         random_batch)

FAIRSEQ_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(utils.__file__)))


def payload(marker):
    return f"__import__('os').system('touch {marker}') or [100000]"


# --- checkpoints under torch's weights_only=True -------------------------------------------
class _RunsCode:
    """A pickle that would call os.system on load."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _fairseq_like_state(args):
    return {
        "args": None,
        "cfg": {"model": args, "common": {"seed": 1}},
        "model": {"w": torch.zeros(2)},
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 3}],
        "extra_state": {"best": np.float64(1.5), "counts": np.array([1, 2, 3])},
        "last_optimizer_state": None,
    }


def test_fairseq_checkpoint_types_load_with_weights_only(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save(_fairseq_like_state(argparse.Namespace(arch="multilayer_transformer")), path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))  # torch.load default: weights_only=True
    assert state["cfg"]["model"].arch == "multilayer_transformer"
    assert float(state["extra_state"]["best"]) == 1.5


def test_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    state = _fairseq_like_state(argparse.Namespace(arch="multilayer_transformer"))
    state["extra_state"]["payload"] = _RunsCode(marker)
    torch.save(state, path)
    with pytest.raises(pickle.UnpicklingError, match="system"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()


def test_a_refused_pickle_is_one_line_naming_the_global(tmp_path, tiny_trained, monkeypatch):
    """torch's refusal is a 10-line message ending in advice to pass weights_only=False;
    fairseq-generate (and every load path of the plugin) says it in one line instead, also with
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 in the environment (which turns fairseq's own
    ``torch.load(f)`` into a full unpickling)."""
    import subprocess

    from fairseq_ext.errors import UnsafePickleError
    from fairseq_ext.guards.checkpoint_safety import load_checkpoint_state
    from model_utils import USER_DIR, clean_env

    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    state = _fairseq_like_state(argparse.Namespace(arch="multilayer_transformer"))
    state["extra_state"]["payload"] = _RunsCode(marker)
    torch.save(state, path)
    expected = f"refusing checkpoint {path}: its pickle would import posix.system, which no fairseq checkpoint holds"
    for forced in (None, "1"):
        if forced:
            monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", forced)
        for load in (checkpoint_utils.load_checkpoint_to_cpu, load_checkpoint_state):
            with pytest.raises(UnsafePickleError) as refused:
                load(str(path))
            assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)
    bin_dir, _ = tiny_trained
    source = tmp_path / "src.txt"
    source.write_text("w1 w2\n")
    commands = {"fairseq-generate": ["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--path", str(path), "--cpu"],
                "fairseq-ext translate": ["fairseq-ext", "translate", "--checkpoint", str(path), "--data", bin_dir,
                                          "--input", str(source), "--cpu"]}
    for prog, command in commands.items():
        for env in (clean_env(), {**clean_env(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}):
            res = subprocess.run(command, capture_output=True, text=True, env=env)
            assert res.returncode != 0 and not marker.exists(), res.stderr[-2000:]
            assert res.stderr.strip().splitlines()[-1].startswith(f"{prog}: error: {expected}"), res.stderr[-2000:]
            assert "Traceback" not in res.stderr


# --- the literal grammar ------------------------------------------------------------------
@pytest.mark.parametrize("text,value", [
    ("10000,50000", (10000, 50000)), ("[10000, 50000]", [10000, 50000]), ("(0.9, 0.98)", (0.9, 0.98)),
    ("(1e-30, 1e-3)", (1e-30, 1e-3)), ("True", True), ("0", 0), ("{'name': 'x', 'p': -0.5}", {"name": "x", "p": -0.5}),
    ("[(512, 3)] * 2 + [(1024, 3)]", [(512, 3), (512, 3), (1024, 3)]), ("None", None), ("'a'", "a"),
])
def test_literal_eval_accepts_the_literals_fairseq_documents(text, value):
    assert literal_eval(text) == value == eval(text)


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "open('/etc/passwd').read()", "(lambda: 1)()", "[x for x in (1, 2)]",
    "().__class__.__bases__[0]", "exec", "a.b", "{**{}}", "[0] * 10 ** 9", "[0] * 100000000", "1 if 1 else 2",
])
def test_literal_eval_refuses_everything_else(text):
    with pytest.raises(UnsafeConfigValue):
        literal_eval(text)


def test_literal_eval_refuses_non_strings_like_eval():
    with pytest.raises(TypeError):  # utils.eval_bool relies on eval's TypeError
        literal_eval(True)
    assert utils.eval_bool(True, default=False) is False  # as stock fairseq 0.12


@pytest.mark.parametrize("field,good", [
    ("adaptive_softmax_cutoff", "10000,50000"), ("adam_betas", "(0.9, 0.98)"), ("left_pad_source", "True"),
    ("xformers_att_config", "{'name': 'scaled_dot_product'}"), ("decoder_layers", "[(512, 3)] * 20"),
])
def test_field_grammars_accept_honest_values(field, good):
    check_field(field, good)


@pytest.mark.parametrize("field,bad", [
    ("adaptive_softmax_cutoff", "(0.5, 1)"), ("adaptive_softmax_cutoff", "{'a': 1}"), ("adam_betas", "'x'"),
    ("xformers_att_config", "[1]"), ("left_pad_source", "'yes'"),
])
def test_field_grammars_refuse_wrong_shapes(field, bad):
    with pytest.raises(UnsafeConfigValue, match="fairseq would pass it to eval"):
        check_field(field, bad)


# --- completeness against the installed fairseq -------------------------------------------
EVAL_CALL = re.compile(r"(?<![\w.])eval\(")
FIELD_CALL = re.compile(r"(?<!\w)eval(?:_str_list|_str_dict|_bool)?\(\s*(?:self\.)?(?:cfg|args|\w+_args)\.((?:\w+\.)*\w+)")
# eval( call sites that never see a configuration string
NOT_CONFIG = {
    "fairseq.data.codedataset",  # eval() of a data line of a code dataset
}


def _fairseq_sources():
    for package in ("fairseq", "fairseq_cli"):
        for root, dirs, files in os.walk(os.path.join(FAIRSEQ_ROOT, package)):
            dirs[:] = [d for d in dirs if d not in ("examples", "__pycache__")]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    module = os.path.relpath(path, FAIRSEQ_ROOT)[:-3].replace(os.sep, ".")
                    yield module.removesuffix(".__init__"), open(path, encoding="utf-8").read()


def test_every_eval_call_site_of_fairseq_is_guarded():
    unguarded, fields = [], set()
    for module, source in _fairseq_sources():
        code = "\n".join(line.split("#")[0] for line in source.splitlines())
        if EVAL_CALL.search(code) and module not in EVAL_MODULES and module not in NOT_CONFIG:
            unguarded.append(module)
        fields.update(dotted.split(".")[-1] for dotted in FIELD_CALL.findall(code))
    assert not unguarded, f"fairseq modules calling eval() that checkpoint_safety does not cover: {unguarded}"
    missing = sorted(f for f in fields if f not in EVALUATED_FIELDS)
    assert not missing, f"evaluated configuration fields without a grammar: {missing}"
    assert {"adaptive_softmax_cutoff", "adam_betas", "wer_args", "pipeline_balance"} <= fields  # the scan works


def test_eval_is_shadowed_in_every_guarded_module(tmp_path):
    marker = tmp_path / "pwned"
    for name in EVAL_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue  # optional dependency missing: the module cannot run
        assert module.eval is literal_eval, name
    from fairseq.optim import adam
    with pytest.raises(UnsafeConfigValue):
        adam.eval(f"__import__('os').system('touch {marker}')")
    with pytest.raises(UnsafeConfigValue):
        utils.eval_str_list(payload(marker), type=int)
    assert not marker.exists()


# --- crafted checkpoints, field by field ---------------------------------------------------
SECTION_OF = {
    "adam_betas": "optimizer", "adamax_betas": "optimizer", "lamb_betas": "optimizer", "adafactor_eps": "optimizer",
    "left_pad_source": "task", "left_pad_target": "task", "model_overrides": "common_eval", "wer_args": "criterion",
}


def honest_state(model=None, args=None):
    """A checkpoint as fairseq's trainer writes it (cfg as plain containers, cfg.model the
    Namespace of an add_args model)."""
    if model is None:
        model, args = build("multilayer_transformer", *SMALL)
    cfg = convert_namespace_to_omegaconf(args)
    return {
        "args": None,
        "cfg": OmegaConf.to_container(cfg),
        "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "extra_state": {}, "last_optimizer_state": None,
    }


@pytest.fixture(scope="module")
def honest():
    return honest_state()


def test_honest_checkpoint_loads(tmp_path, honest):
    path = tmp_path / "ok.pt"
    torch.save(honest, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert state["cfg"]["model"].arch == "multilayer_transformer"


@pytest.mark.parametrize("field", sorted(EVALUATED_FIELDS))
def test_crafted_field_is_refused_on_load(tmp_path, honest, field):
    marker = tmp_path / "pwned"
    section = SECTION_OF.get(field, "model")
    state = {**honest, "cfg": {**honest["cfg"]}}
    if section == "model":
        model_args = argparse.Namespace(**vars(honest["cfg"]["model"]))
        setattr(model_args, field, payload(marker))
        state["cfg"]["model"] = model_args
    else:
        state["cfg"][section] = {**(state["cfg"].get(section) or {}), field: payload(marker)}
    path = tmp_path / "evil.pt"
    torch.save(state, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert str(path) in str(info.value) and f"cfg.{section}.{field}" in str(info.value)
    with pytest.raises(UnsafeCheckpointError):
        safety.load_checkpoint_state(str(path))
    assert not marker.exists()


def test_legacy_args_namespace_is_checked_too(tmp_path, honest):
    marker = tmp_path / "pwned"
    args = argparse.Namespace(**{**vars(honest["cfg"]["model"]), "adaptive_softmax_cutoff": payload(marker)})
    state = {**honest, "args": args}
    state.pop("cfg")
    path = tmp_path / "legacy.pt"
    torch.save(state, path)
    with pytest.raises(UnsafeCheckpointError, match=r"(args|cfg\.model)\.adaptive_softmax_cutoff"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()


def test_nested_and_interpolated_fields_are_checked(tmp_path, honest):
    marker = tmp_path / "pwned"
    state = {**honest, "cfg": {**honest["cfg"], "task": {"hidden": payload(marker)},
                               "model": {"_name": "x", "decoder": {"xformers_att_config": "${task.hidden}"}}}}
    path = tmp_path / "nested.pt"
    torch.save(state, path)
    with pytest.raises(UnsafeCheckpointError, match=r"cfg\.model\.decoder\.xformers_att_config"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()


def test_the_attack_is_real_without_the_guards(tmp_path, honest, monkeypatch):
    """What the guards prevent: with the load check and the eval shadowing undone, loading
    the crafted checkpoint runs its command while fairseq builds the decoder."""
    marker = tmp_path / "pwned"
    model_args = argparse.Namespace(**vars(honest["cfg"]["model"]))
    model_args.adaptive_softmax_cutoff = payload(marker)
    path = tmp_path / "evil.pt"
    torch.save({**honest, "cfg": {**honest["cfg"], "model": model_args}}, path)
    dictionary = make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary,
                           build_model=lambda cfg, from_checkpoint=False: build_from(cfg))

    def build_from(cfg):
        from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel
        return MultilayerTransformerModel.build_model(cfg, task)

    with pytest.raises(UnsafeCheckpointError):
        checkpoint_utils.load_model_ensemble([str(path)], task=task)
    assert not marker.exists()
    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu", checkpoint_utils.load_checkpoint_to_cpu.__wrapped__)
    with pytest.raises(UnsafeConfigValue):  # the eval shadowing alone still refuses it
        checkpoint_utils.load_model_ensemble([str(path)], task=task)
    assert not marker.exists()
    monkeypatch.setattr(utils, "eval", builtins.eval)
    try:
        checkpoint_utils.load_model_ensemble([str(path)], task=task)
    except Exception:
        pass  # the cutoff exceeds the vocabulary; the command has run by then
    assert marker.exists()


# --- honest checkpoints of every option combination --------------------------------------
OPTION_SETS = [
    (), *[("--joint-attention", s) for s in STRATEGY_NAMES if s != "none"],
    ("--joint-attention", "m-10", "--joint-attention-layers", "2", "--mask-source-layer", "1"),
    ("--aux-decoder-layers", "1,2", "--aux-fusion"), ("--aux-decoder-layers", "1", "--decode-from", "aux1"),
    ("--encoder-self-attention", "dc", "--decoder-self-attention", "dc", "--dc-kernel-size", "2",
     "--dc-encoder-layers", "1-2"),
    ("--encoder-self-attention", "mma", "--mma-heads", "G,L", "--decoder-self-attention", "mma",
     "--decoder-mma-heads", "L,B", "--mma-window", "2"),
    ("--pre-classifier-projection", "--share-all-embeddings"), ("--adaptive-softmax-cutoff", "20,30"),
]


@pytest.mark.parametrize("flags", OPTION_SETS)
def test_honest_checkpoints_of_every_option_load_and_translate_identically(tmp_path, flags):
    dictionary = make_dictionary()
    model, args = build("multilayer_transformer", *SMALL, *flags, dictionary=dictionary)
    state = honest_state(model, args)
    path = tmp_path / "checkpoint.pt"
    torch.save(state, path)
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    task.build_model = lambda cfg, from_checkpoint=False: type(model).build_model(cfg, task)
    (loaded,), _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(src, lengths, prev)[0], model(src, lengths, prev)[0])


# --- every load path, end to end -----------------------------------------------------------
def craft(checkpoint, out, marker, section="model", field="adaptive_softmax_cutoff"):
    state = torch.load(checkpoint, weights_only=True)
    if section == "model":
        setattr(state["cfg"]["model"], field, payload(marker))
    else:
        state["cfg"][section][field] = payload(marker)
    torch.save(state, out)
    return out


def hydra_train(bin_dir, path):
    """fairseq-hydra-train resuming from ``path``, with the package's quickstart YAML."""
    from fairseq_ext.tools import hydra_configs

    root = os.path.dirname(path)
    hydra_configs.write_config_dir(os.path.join(root, "cfg"))
    return ["fairseq-hydra-train", "--config-dir", os.path.join(root, "cfg"), "--config-name", "quickstart",
            f"task.data={bin_dir}", "task.source_lang=src", "task.target_lang=tgt", "common.cpu=true",
            "dataset.max_tokens=500", "optimization.max_update=4", f"checkpoint.restore_file={path}",
            f"checkpoint.save_dir={os.path.join(root, 'hydra')}", f"hydra.run.dir={os.path.join(root, 'hydra-out')}"]


LOAD_PATHS = {
    "hydra-train": hydra_train,
    "generate": lambda b, p: ["fairseq-generate", b, "--user-dir", USER_DIR, "--cpu", "--path", p],
    "interactive": lambda b, p: ["fairseq-interactive", b, "--user-dir", USER_DIR, "--cpu", "--path", p],
    "validate": lambda b, p: ["fairseq-validate", b, "--user-dir", USER_DIR, "--cpu", "--path", p,
                              "--task", "translation", "--batch-size", "5"],
    "restore-file": lambda b, p: ["fairseq-train", b, "--user-dir", USER_DIR, "--arch", "multilayer_transformer",
                                  *TINY_TRAIN_FLAGS, "--max-update", "4", "--restore-file", p,
                                  "--save-dir", os.path.join(os.path.dirname(p), "resumed")],
    "average": lambda b, p: ["fairseq-ext-average-checkpoints", "--inputs", p, "--output", p + ".avg.pt"],
    "strip-aux": lambda b, p: ["fairseq-ext-strip-aux", p, p + ".stripped.pt"],
}


# one crafted field a path (the check reads the whole cfg on every path): the optimizer's on the paths that build an
# optimizer from it or rewrite the checkpoint, the model's on the others
OPTIMIZER_FIELD_PATHS = {"hydra-train", "restore-file", "strip-aux"}


@pytest.mark.slow
@pytest.mark.parametrize("path_name,section,field", [
    (path, *(("optimizer", "adam_betas") if path in OPTIMIZER_FIELD_PATHS else ("model", "adaptive_softmax_cutoff")))
    for path in sorted(LOAD_PATHS)])
def test_every_load_path_refuses_the_crafted_checkpoint(tiny_trained, tmp_path, path_name, section, field):
    bin_dir, checkpoint = tiny_trained
    marker = tmp_path / "pwned"
    evil = str(craft(checkpoint, tmp_path / "evil.pt", marker, section, field))
    result = subprocess.run(LOAD_PATHS[path_name](bin_dir, evil), capture_output=True, text=True,
                            env=clean_env(), input="w1 w2 w3\n", timeout=300)
    assert result.returncode != 0
    assert f"cfg.{section}.{field}" in result.stderr and evil in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr  # one line, not a traceback
    assert not marker.exists()


def test_from_pretrained_refuses_the_crafted_checkpoint(tiny_trained, tmp_path):
    from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel
    bin_dir, checkpoint = tiny_trained
    marker = tmp_path / "pwned"
    craft(checkpoint, tmp_path / "evil.pt", marker)
    with pytest.raises(UnsafeCheckpointError, match=r"cfg\.model\.adaptive_softmax_cutoff"):
        MultilayerTransformerModel.from_pretrained(str(tmp_path), checkpoint_file="evil.pt", data_name_or_path=bin_dir)
    assert not marker.exists()
    hub = MultilayerTransformerModel.from_pretrained(os.path.dirname(checkpoint), checkpoint_file="checkpoint_last.pt",
                                                     data_name_or_path=bin_dir)
    assert isinstance(hub.translate("w1 w2 w3"), str)


def test_averaging_onto_a_full_disk_is_one_line_and_leaves_nothing(tiny_trained, tmp_path):
    """torch writes the averaged checkpoint through a Python file, so that a full disk is said as such (torch's own
    writer says "unexpected pos 64 vs 0"); the partial file is removed."""
    _, checkpoint = tiny_trained
    output = tmp_path / "full" / "averaged.pt"
    output.parent.mkdir()
    result = subprocess.run(["fairseq-ext-average-checkpoints", "--inputs", checkpoint, "--output", str(output)],
                            capture_output=True, text=True, env={**clean_env(), **full_disk(output.parent)})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.splitlines()[1:] == [f"fairseq-ext-average-checkpoints: error: cannot write {output}: no space "
                                              "left on device (nothing partial left behind)"], result.stderr[-2000:]
    assert list(output.parent.iterdir()) == []


# --- the guards hold whatever the import order, import hooks and reloads ----------------------
LOAD_CRAFTED = r"""
import sys
from fairseq import checkpoint_utils
from fairseq_ext.errors import UnsafeCheckpointError, UnsafePickleError
try:
    checkpoint_utils.load_model_ensemble_and_task([sys.argv[1]], arg_overrides={"data": sys.argv[2]})
except UnsafeCheckpointError as error:
    print("refused:", error)
try:
    checkpoint_utils.load_checkpoint_to_cpu(sys.argv[3])
except UnsafePickleError as error:
    print("refused pickle:", error)
"""
PASS_THROUGH_HOOK = """
import importlib.abc, importlib.machinery, sys
class PassThrough(importlib.abc.MetaPathFinder):  # as profilers and type checkers put in front
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, path, target)
sys.meta_path.insert(0, PassThrough())
"""
IMPORT_ORDERS = {  # the plugin first, then whatever looks fairseq up before its import
    "find_spec": "import fairseq_ext, importlib.util\nimportlib.util.find_spec('fairseq')\n"
                 "importlib.util.find_spec('fairseq')\n",
    "import_module": "import fairseq_ext, importlib\nimportlib.import_module('fairseq.checkpoint_utils')\n",
    "a submodule first": "import fairseq_ext\nimport fairseq.checkpoint_utils\n",
    "reload": "import fairseq_ext, importlib\nimport fairseq\nimportlib.reload(fairseq)\n",
    "an import hook in front": "import fairseq_ext\n" + PASS_THROUGH_HOOK + "import fairseq\n",
    "an import hook, then import_module": "import fairseq_ext, importlib\n" + PASS_THROUGH_HOOK
                                           + "importlib.import_module('fairseq')\n",
    "checkpoint_utils reloaded": "import fairseq_ext, importlib\nimport fairseq.checkpoint_utils\n"
                                 "importlib.reload(fairseq.checkpoint_utils)\n",
    "hook, then reload": PASS_THROUGH_HOOK + "import fairseq, importlib, fairseq_ext\n"
                         "importlib.reload(fairseq.checkpoint_utils)\n",
}


@pytest.mark.parametrize("order", sorted(IMPORT_ORDERS))
def test_the_guards_hold_whatever_looks_fairseq_up_first(tiny_trained, tmp_path, order):
    """A crafted configuration and a pickle that runs code, the latter with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (which
    makes fairseq's own torch.load unpickle everything): both refused in one line, nothing run."""
    bin_dir, checkpoint = tiny_trained
    marker = tmp_path / "pwned"
    evil = craft(checkpoint, tmp_path / "evil.pt", marker)
    torch.save({"model": _RunsCode(tmp_path / "pickled")}, tmp_path / "pickle.pt")
    res = subprocess.run([sys.executable, "-c", IMPORT_ORDERS[order] + LOAD_CRAFTED, str(evil), bin_dir,
                          str(tmp_path / "pickle.pt")], capture_output=True, text=True,
                         env={**clean_env(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "refused:" in res.stdout and "cfg.model.adaptive_softmax_cutoff" in res.stdout, res.stdout[-2000:]
    assert "refused pickle:" in res.stdout and "posix.system" in res.stdout, res.stdout[-2000:]
    assert not marker.exists() and not (tmp_path / "pickled").exists()


# --- model archives stay inside their folder ----------------------------------------------
def test_a_model_archive_is_extracted_inside_its_folder_and_kept(tiny_trained, tmp_path):
    """from_pretrained's archive: a member named /abs/... or ../... or a link out of the folder
    is refused in one line and nothing is written outside; an honest archive loads and stays."""
    import io
    import tarfile

    from fairseq import file_utils

    from fairseq_ext.errors import UnsafeArchiveError
    from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel

    bin_dir, checkpoint = tiny_trained
    outside = tmp_path / "outside"
    outside.mkdir()
    for name, member in (("absolute", str(outside / "evil.pth")), ("dotdot", "model/../../outside/evil.pth"),
                         ("link", "model/link")):
        archive = tmp_path / f"{name}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            info = tarfile.TarInfo(member)
            if name == "link":
                info.type, info.linkname = tarfile.SYMTYPE, str(outside)
            else:
                info.size = 6
            tar.addfile(info, io.BytesIO(b"import") if name != "link" else None)
        with pytest.raises(UnsafeArchiveError, match=f"refusing model archive {archive}: ") as refused:
            file_utils.load_archive_file(str(archive))
        assert "\n" not in str(refused.value) and archive.is_file()
        assert os.listdir(outside) == [] and not (tmp_path / "evil.pth").exists()
    honest = tmp_path / "model.tar.gz"
    with tarfile.open(honest, "w:gz") as tar:
        tar.add(checkpoint, arcname="model/model.pt")
        for f in os.listdir(bin_dir):
            if f.startswith("dict."):
                tar.add(os.path.join(bin_dir, f), arcname=f"model/{f}")
    hub = MultilayerTransformerModel.from_pretrained(str(honest), checkpoint_file="model.pt", source_lang="src",
                                                     target_lang="tgt")
    assert isinstance(hub.translate("w1 w2 w3"), str) and honest.is_file()
