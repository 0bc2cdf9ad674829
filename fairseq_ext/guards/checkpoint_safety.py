"""Loading a fairseq checkpoint must never run code from it.

Two ways a fairseq 0.12 checkpoint could run code, and what :func:`install` (run when
``fairseq_ext`` is imported, e.g. by ``--user-dir fairseq_ext``) does about each:

1. **The pickle.** torch >= 2.6 unpickles with ``weights_only=True``, which refuses every
   global that is not allowlisted; fairseq checkpoints hold a few such globals, so stock
   ``fairseq-generate`` fails on them. We allowlist exactly those types (never the blanket
   ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``): ``argparse.Namespace`` (the legacy ``args`` and
   the ``cfg.model`` of models configured through ``add_args``, ours included) and numpy
   arrays/scalars (metric state such as ``--eval-bleu``'s n-gram counts). A pickle that
   would call anything else (``os.system``, ...) is still refused by torch.

2. **The configuration.** fairseq 0.12 passes some configuration strings to Python's
   ``eval()`` while it builds the model, task, criterion or optimizer
   (``utils.eval_str_list`` for ``adaptive_softmax_cutoff``, ``utils.eval_str_dict`` for
   ``xformers_att_config``, ``eval(adam_betas)``, ...); ``weights_only`` cannot see that,
   so a checkpoint made only of allowlisted types could set
   ``adaptive_softmax_cutoff = "__import__('os').system(...) or [1]"``. Two guards:

   - every checkpoint fairseq loads passes ``checkpoint_utils.load_checkpoint_to_cpu``
     (fairseq-generate, fairseq-interactive, fairseq-validate, ``--restore-file`` /
     resume, ``from_pretrained``); we wrap it so that each field in
     :data:`EVALUATED_FIELDS` found anywhere in the checkpoint's ``cfg`` or ``args`` must
     match its literal grammar (a comma list of integers, a tuple of numbers, a literal
     dict, ...); anything else raises :class:`UnsafeCheckpointError` naming the file and
     the field, before fairseq reads the field. :func:`load_checkpoint_state` does the
     same for the plugin's own tools (strip-aux, checkpoint averaging);
   - in the fairseq modules that call ``eval()`` on configuration strings
     (:data:`EVAL_MODULES`), the name ``eval`` is bound to :func:`literal_eval`, which
     evaluates exactly the literals fairseq documents for those fields (numbers, strings,
     booleans, None, tuples, lists, dicts, and ``list * int`` / ``+`` as in fconv's layer
     specs) and raises :class:`UnsafeConfigValue` for anything else. This also covers
     strings that reach those calls other than from a checkpoint file.

Not covered: checkpoints loaded without importing the plugin (stock fairseq without
``--user-dir fairseq_ext``), and plain ``torch.load(path, weights_only=False)`` by other
code.
"""
import argparse
import ast
import importlib
import operator
import os
import pickle
import re
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, Tuple

import numpy as np
import torch

from fairseq_ext.errors import UnsafeCheckpointError, UnsafeConfigValue, UnsafePickleError
from fairseq_ext.guards.patching import replace


# ----------------------------------------------------------------------------------------
# 1. the pickle: torch weights_only allowlist
# ----------------------------------------------------------------------------------------
def _numpy_globals():
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = {
        type(np.dtype(t))
        for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_, np.uint8, np.int8, np.int16)
    }
    return [_reconstruct, scalar, np.ndarray, np.dtype, *sorted(dtype_classes, key=lambda c: c.__name__)]


CHECKPOINT_SAFE_GLOBALS = [argparse.Namespace, *_numpy_globals()]


# ----------------------------------------------------------------------------------------
# 2a. a literal evaluator for the strings fairseq would eval()
# ----------------------------------------------------------------------------------------
MAX_LITERAL_LENGTH = 10_000  # characters of a configuration string
MAX_REPEAT = 10_000  # items produced by one ``list * int``

_BINARY = {ast.Add: operator.add, ast.Mult: operator.mul, ast.Sub: operator.sub}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def literal_eval(source, globals=None, locals=None):  # noqa: A002  (replaces builtins.eval)
    """``eval`` restricted to literals: numbers, strings, True/False/None, tuples, lists,
    dicts, unary +/-, and + / - / * between literals (``[(512, 3)] * 20``). Raises
    :class:`UnsafeConfigValue` for names, calls, attributes, subscripts, comprehensions,
    lambdas and anything else. Non-strings raise ``TypeError`` as ``eval`` does."""
    if not isinstance(source, str):
        raise TypeError(f"eval() arg 1 must be a string, not {type(source).__name__}")
    if len(source) > MAX_LITERAL_LENGTH:
        raise UnsafeConfigValue(f"refusing to evaluate a {len(source)}-character configuration string")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as err:
        raise UnsafeConfigValue(f"{source!r} is not a Python literal ({err.msg})") from None
    return _evaluate(tree.body, source)


def _evaluate(node, source):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex, str, bytes, bool, type(None))):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_evaluate(e, source) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_evaluate(k, source): _evaluate(v, source) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        operand = _evaluate(node.operand, source)
        if isinstance(operand, (int, float)):
            return _UNARY[type(node.op)](operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, source), _evaluate(node.right, source)
        if isinstance(node.op, ast.Mult):
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (list, tuple, str)) and isinstance(count, int) and not isinstance(count, bool):
                    if len(seq) * max(count, 0) > MAX_REPEAT:
                        raise UnsafeConfigValue(f"{source!r}: repetition longer than {MAX_REPEAT}")
        if isinstance(left, (int, float)) == isinstance(right, (int, float)) or isinstance(node.op, ast.Mult):
            try:
                return _BINARY[type(node.op)](left, right)
            except TypeError:
                pass
    raise UnsafeConfigValue(
        f"{source!r} is not a literal (numbers, strings, True/False/None, tuples, lists, dicts); "
        f"refusing to evaluate {ast.dump(node)[:60]}"
    )


# ----------------------------------------------------------------------------------------
# 2b. the grammar of every configuration field fairseq 0.12 evaluates
# ----------------------------------------------------------------------------------------
def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int_list(v):
    return _is_int(v) or (isinstance(v, (list, tuple)) and all(_is_int(x) for x in v))


def _number_tuple(v):
    return isinstance(v, (list, tuple)) and all(_is_number(x) or x is None for x in v)


def _bool_like(v):
    return isinstance(v, (bool, int, float)) or v is None


def _literal_dict(v):
    return isinstance(v, dict) and all(isinstance(k, str) for k in v)


def _any_literal(v):
    return True  # literal_eval already refused everything that is not a literal


# grammar name -> (what the message calls it, check of the evaluated literal)
GRAMMARS: Dict[str, Tuple[str, Callable[[Any], bool]]] = {
    "int_list": ("a comma list of integers, e.g. '10000,50000'", _int_list),
    "number_tuple": ("a tuple of numbers, e.g. '(0.9, 0.98)'", _number_tuple),
    "bool": ("a boolean, e.g. 'True' or '0'", _bool_like),
    "dict": ("a literal dict, e.g. \"{'name': 'scaled_dot_product'}\"", _literal_dict),
    "literal": ("a Python literal (numbers, strings, tuples, lists, dicts)", _any_literal),
}

# Field name (the last component, wherever it sits in cfg / args) -> grammar. From every
# eval() of a configuration string in fairseq 0.12.3.1 (fairseq/ and fairseq_cli/;
# tests/guards/test_checkpoint_safety.py re-derives the call sites from the installed source).
EVALUATED_FIELDS: Dict[str, str] = {
    # utils.eval_str_list(..., type=int)
    "adaptive_softmax_cutoff": "int_list",
    "adaptive_input_cutoff": "int_list",
    "encoder_kernel_size_list": "int_list",
    "decoder_kernel_size_list": "int_list",
    "pipeline_balance": "int_list",
    "pipeline_devices": "int_list",
    "pipeline_encoder_balance": "int_list",
    "pipeline_encoder_devices": "int_list",
    "pipeline_decoder_balance": "int_list",
    "pipeline_decoder_devices": "int_list",
    # utils.eval_str_dict
    "xformers_att_config": "dict",
    "encoder_xformers_att_config": "dict",
    "decoder_xformers_att_config": "dict",
    "model_overrides": "dict",
    # eval() of optimizer options
    "adam_betas": "number_tuple",
    "adamax_betas": "number_tuple",
    "lamb_betas": "number_tuple",
    "adafactor_eps": "number_tuple",
    # utils.eval_bool / bool(eval(...))
    "left_pad_source": "bool",
    "left_pad_target": "bool",
    "encoder_glu": "bool",
    "decoder_glu": "bool",
    "weight_softmax": "bool",
    # eval() in fconv / fconv_self_att / lstm / character-CNN models and the ctc criterion
    "encoder_layers": "literal",
    "decoder_layers": "literal",
    "encoder_attention": "literal",
    "decoder_attention": "literal",
    "self_attention": "literal",
    "project_input": "literal",
    "gated_attention": "literal",
    "downsample": "literal",
    "pretrained": "literal",
    "character_filters": "literal",
    "wer_args": "literal",
    # wav2vec / hubert / speech-to-text feature extractors: "[(512, 10, 5)] + [(512, 3, 2)] * 4"
    "conv_feature_layers": "literal",
    "conv_aggregator_layers": "literal",
    "feature_encoder_spec": "literal",
}

# fairseq modules that call eval() on configuration strings; their ``eval`` becomes
# literal_eval (module globals shadow builtins). fairseq.utils holds eval_str_list,
# eval_str_dict and eval_bool, which every other caller goes through.
EVAL_MODULES = (
    "fairseq.utils",
    "fairseq.optim.adam",
    "fairseq.optim.cpu_adam",
    "fairseq.optim.adamax",
    "fairseq.optim.adafactor",
    "fairseq.optim.fused_lamb",
    "fairseq.criterions.ctc",
    "fairseq.models.fconv",
    "fairseq.models.fconv_lm",
    "fairseq.models.fconv_self_att",
    "fairseq.models.lightconv_lm",
    "fairseq.models.transformer_lm",
    "fairseq.models.hubert.hubert",
    "fairseq.models.wav2vec.wav2vec",
    "fairseq.models.wav2vec.wav2vec2",
    "fairseq.models.speech_to_text.s2t_wav_transformer",
    "fairseq.data.audio.raw_audio_dataset",
    "fairseq_cli.validate",
    "fairseq_cli.eval_lm",
)


def check_field(name: str, value: Any) -> None:
    """Raise UnsafeConfigValue unless ``value`` (a string fairseq would evaluate as field
    ``name``) matches the field's grammar."""
    grammar = EVALUATED_FIELDS.get(name)
    if grammar is None or not isinstance(value, str):
        return
    description, accepts = GRAMMARS[grammar]
    try:
        evaluated = literal_eval(value)
    except UnsafeConfigValue:
        evaluated, ok = None, False
    else:
        ok = accepts(evaluated)
    if not ok:
        raise UnsafeConfigValue(f"{value!r} is not {description}; fairseq would pass it to eval()")


def _config_items(obj: Any, path: str, depth: int = 0) -> Iterator[Tuple[str, str, Any]]:
    """(dotted path, field name, value) of every field under a cfg / args object."""
    if depth > 8:
        return
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover (omegaconf is a fairseq dependency)
        DictConfig = ()
    if isinstance(obj, DictConfig):
        try:
            obj = OmegaConf.to_container(obj, resolve=True)
        except Exception:  # unresolvable interpolation: check the raw strings
            obj = OmegaConf.to_container(obj, resolve=False)
    if isinstance(obj, argparse.Namespace):
        obj = vars(obj)
    if isinstance(obj, dict):
        for key, value in obj.items():
            child = f"{path}.{key}"
            yield child, str(key), value
            yield from _config_items(value, child, depth + 1)


def check_checkpoint_config(state: Any, path: str = "<checkpoint>") -> None:
    """Refuse a loaded checkpoint (the dict torch.load returned, or fairseq's upgraded
    state) in which a field fairseq evaluates does not match its literal grammar."""
    if not isinstance(state, dict):
        return
    for section in ("cfg", "args"):
        for dotted, name, value in _config_items(state.get(section), section):
            try:
                check_field(name, value)
            except UnsafeConfigValue as err:
                raise UnsafeCheckpointError(f"refusing checkpoint {path}: {dotted} = {err}") from None


def refused_pickle(path: str, error: pickle.UnpicklingError) -> UnsafePickleError:
    """torch's refusal of a global (10 lines advising weights_only=False) as one line naming it."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    what = f"would import {found.group(1)}" if found else "holds a global"
    return UnsafePickleError(f"refusing checkpoint {path}: its pickle {what}, which no fairseq checkpoint holds "
                             "(torch's weights_only load stopped it; loading it with weights_only=False could run "
                             "code)")


def load_checkpoint_state(path: str) -> dict:
    """torch.load(weights_only=True) and the configuration check: how the plugin's own
    tools (strip-aux, checkpoint averaging) read a checkpoint file as it is on disk."""
    with open(path, "rb") as f:
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            raise refused_pickle(path, error) from None
    check_checkpoint_config(state, path)
    return state


def save_atomically(state: Dict, output: str) -> None:
    """torch.save to a temporary file beside ``output``, renamed into place: a crash never
    leaves a half-written checkpoint, and never destroys the file it replaces."""
    directory = os.path.dirname(os.path.abspath(output))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".average-", suffix=".pt", dir=directory)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, output)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# ----------------------------------------------------------------------------------------
# installation (by fairseq_ext.guards.install, when the plugin is imported)
# ----------------------------------------------------------------------------------------
def _checking_config(load_checkpoint_to_cpu):
    def load_checking_config(path, arg_overrides=None, load_on_all_ranks=False):
        try:
            state = load_checkpoint_to_cpu(path, arg_overrides, load_on_all_ranks)
        except pickle.UnpicklingError as error:
            raise refused_pickle(str(path), error) from None
        check_checkpoint_config(state, str(path))
        return state

    return load_checking_config


def _shadow_eval(module_names=EVAL_MODULES) -> None:
    # Not a wrapper: the modules call the builtin through a global name they do not define,
    # and binding ``eval`` in their namespace is all it takes (idempotent by itself).
    for name in module_names:
        module = sys.modules.get(name)
        if module is None:
            try:
                module = importlib.import_module(name)
            except Exception:  # optional dependency missing (e.g. deepspeed): never evaluated then
                continue
        module.eval = literal_eval


def install() -> None:
    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4
        torch.serialization.add_safe_globals(CHECKPOINT_SAFE_GLOBALS)
    from fairseq import checkpoint_utils

    replace(checkpoint_utils, "load_checkpoint_to_cpu", _checking_config)
    _shadow_eval()
