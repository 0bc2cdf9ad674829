"""Loading a fairseq checkpoint must never run code from it (docs/trust.md, "Loading a
checkpoint never runs code from it"). :func:`install`: 1. torch's ``weights_only`` load allows
exactly the globals fairseq checkpoints hold (:data:`CHECKPOINT_SAFE_GLOBALS`), a refused pickle
said in one line; 2. every field fairseq would ``eval()`` (:data:`EVALUATED_FIELDS`) must match
its literal grammar on every load, and ``eval`` is :func:`literal_eval` in :data:`EVAL_MODULES`;
3. a model archive (``from_pretrained``) is extracted into a folder of its own with Python's
``data`` filter (:func:`extract_archive`), and the archive is kept.
"""
import argparse
import ast
import atexit
import contextlib
import errno
import importlib
import operator
import os
import pickle
import re
import shutil
import sys
import tarfile
import tempfile
from typing import Any, Callable, Dict, Iterator, Tuple

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fairseq_ext.errors import (CheckpointError, OutputFileError, UnsafeArchiveError, UnsafeCheckpointError,
                                 UnsafeConfigValue, UnsafePickleError)
from fairseq_ext.guards.patching import replace


# 1. the pickle: torch weights_only allowlist
def _numpy_globals():
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtypes = (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_, np.uint8, np.int8, np.int16)
    dtype_classes = {type(np.dtype(t)) for t in dtypes}
    return [_reconstruct, scalar, np.ndarray, np.dtype, *sorted(dtype_classes, key=lambda c: c.__name__)]


CHECKPOINT_SAFE_GLOBALS = [argparse.Namespace, *_numpy_globals()]


# 2a. a literal evaluator for the strings fairseq would eval()
MAX_LITERAL_LENGTH = 10_000  # characters of a configuration string
MAX_REPEAT = 10_000  # items produced by one ``list * int``

_BINARY = {ast.Add: operator.add, ast.Mult: operator.mul, ast.Sub: operator.sub}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def literal_eval(source, globals=None, locals=None):  # noqa: A002  (replaces builtins.eval)
    """``eval`` restricted to literals: numbers, strings, True/False/None, tuples, lists, dicts,
    unary +/-, and + / - / * between literals (``[(512, 3)] * 20``); anything else raises
    :class:`UnsafeConfigValue`. Non-strings raise ``TypeError`` as ``eval`` does."""
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
    raise UnsafeConfigValue(f"{source!r} is not a literal (numbers, strings, True/False/None, tuples, lists, dicts); "
                            f"refusing to evaluate {ast.dump(node)[:60]}")


# 2b. the grammar of every configuration field fairseq 0.12 evaluates
def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# grammar name -> (what the message calls it, check of the evaluated literal)
GRAMMARS: Dict[str, Tuple[str, Callable[[Any], bool]]] = {
    "int_list": ("a comma list of integers, e.g. '10000,50000'",
                 lambda v: _is_int(v) or (isinstance(v, (list, tuple)) and all(_is_int(x) for x in v))),
    "number_tuple": ("a tuple of numbers, e.g. '(0.9, 0.98)'",
                     lambda v: isinstance(v, (list, tuple)) and all(_is_number(x) or x is None for x in v)),
    "bool": ("a boolean, e.g. 'True' or '0'", lambda v: isinstance(v, (bool, int, float)) or v is None),
    "dict": ("a literal dict, e.g. \"{'name': 'scaled_dot_product'}\"",
             lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v)),
    # literal_eval already refused everything that is not a literal
    "literal": ("a Python literal (numbers, strings, tuples, lists, dicts)", lambda v: True),
}

# Field name (the last component, wherever it sits in cfg / args) -> grammar. From every
# eval() of a configuration string in fairseq 0.12.3.1 (fairseq/ and fairseq_cli/;
# tests/guards/test_checkpoint_safety.py re-derives the call sites from the installed source).
EVALUATED_FIELDS: Dict[str, str] = {
    # utils.eval_str_list(..., type=int)
    **dict.fromkeys(("adaptive_softmax_cutoff", "adaptive_input_cutoff", "encoder_kernel_size_list",
                     "decoder_kernel_size_list", "pipeline_balance", "pipeline_devices", "pipeline_encoder_balance",
                     "pipeline_encoder_devices", "pipeline_decoder_balance", "pipeline_decoder_devices"), "int_list"),
    # utils.eval_str_dict
    **dict.fromkeys(("xformers_att_config", "encoder_xformers_att_config", "decoder_xformers_att_config",
                     "model_overrides"), "dict"),
    # eval() of optimizer options
    **dict.fromkeys(("adam_betas", "adamax_betas", "lamb_betas", "adafactor_eps"), "number_tuple"),
    # utils.eval_bool / bool(eval(...))
    **dict.fromkeys(("left_pad_source", "left_pad_target", "encoder_glu", "decoder_glu", "weight_softmax"), "bool"),
    # eval() in fconv / fconv_self_att / lstm / character-CNN models and the ctc criterion; wav2vec / hubert /
    # speech-to-text feature extractors ("[(512, 10, 5)] + [(512, 3, 2)] * 4")
    **dict.fromkeys(("encoder_layers", "decoder_layers", "encoder_attention", "decoder_attention", "self_attention",
                     "project_input", "gated_attention", "downsample", "pretrained", "character_filters", "wer_args",
                     "conv_feature_layers", "conv_aggregator_layers", "feature_encoder_spec"), "literal"),
}

# fairseq modules that call eval() on configuration strings; their ``eval`` becomes literal_eval (module globals shadow
# builtins). fairseq.utils holds eval_str_list, eval_str_dict and eval_bool, which every other caller goes through.
EVAL_MODULES = (
    "fairseq.utils", "fairseq.optim.adam", "fairseq.optim.cpu_adam", "fairseq.optim.adamax",
    "fairseq.optim.adafactor", "fairseq.optim.fused_lamb", "fairseq.criterions.ctc", "fairseq.models.fconv",
    "fairseq.models.fconv_lm", "fairseq.models.fconv_self_att", "fairseq.models.lightconv_lm",
    "fairseq.models.transformer_lm", "fairseq.models.hubert.hubert", "fairseq.models.wav2vec.wav2vec",
    "fairseq.models.wav2vec.wav2vec2", "fairseq.models.speech_to_text.s2t_wav_transformer",
    "fairseq.data.audio.raw_audio_dataset", "fairseq_cli.validate", "fairseq_cli.eval_lm",
)


def check_field(name: str, value: Any) -> None:
    """Raise UnsafeConfigValue unless ``value`` (a string fairseq would evaluate as field
    ``name``) matches its grammar."""
    grammar = EVALUATED_FIELDS.get(name)
    if grammar is None or not isinstance(value, str):
        return
    description, accepts = GRAMMARS[grammar]
    try:
        ok = accepts(literal_eval(value))
    except UnsafeConfigValue:
        ok = False
    if not ok:
        raise UnsafeConfigValue(f"{value!r} is not {description}; fairseq would pass it to eval()")


def _config_items(obj: Any, path: str, depth: int = 0) -> Iterator[Tuple[str, str, Any]]:
    """(dotted path, field name, value) of every field under a cfg / args object."""
    if depth > 8:
        return
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
    """Refuse a loaded checkpoint in which a field fairseq evaluates does not match its grammar."""
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


def _checked(path, load: Callable[[], Any]) -> Any:
    """``load()`` of the checkpoint ``path``: a refused pickle as one line, then the configuration check."""
    try:
        state = load()
    except pickle.UnpicklingError as error:
        raise refused_pickle(str(path), error) from None
    check_checkpoint_config(state, str(path))
    return state


def load_checkpoint_state(path: str) -> dict:
    """A checkpoint file as it is on disk, for the plugin's own tools (strip-aux, checkpoint
    averaging), loaded with weights_only and checked; fairseq need not be imported."""
    _allow_checkpoint_globals()
    return _checked(path, lambda: torch.load(path, map_location="cpu", weights_only=True))


@contextlib.contextmanager
def staged_file(path: str, suffix: str = ".tmp") -> Iterator[str]:
    """A new file ``.NAME.XXXXXXXX{suffix}`` beside ``path`` with its mode (else a new file's), renamed onto it when the
    block ends without an exception: a crash leaves the old ``path`` or the complete new one. On an exception it is
    removed, and a full disk (ENOSPC, EDQUOT; also as the context of torch's error) is an OutputFileError naming it."""
    fd, tmp = tempfile.mkstemp(suffix, f".{os.path.basename(path)}.", os.path.dirname(os.path.abspath(path)))
    os.umask(mask := os.umask(0))  # reads the umask
    os.fchmod(fd, os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o666 & ~mask)  # not mkstemp's 0600
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except Exception as error:
        cause = error
        while cause is not None and getattr(cause, "errno", None) not in (errno.ENOSPC, errno.EDQUOT):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise OutputFileError(f"cannot write {path}: no space left on device (nothing partial left behind)") from error
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_atomically(state: Dict, output: str) -> None:
    """``torch.save`` into a :func:`staged_file` through a Python file, whose full disk torch's error keeps as context."""
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with staged_file(output) as tmp, open(tmp, "wb") as f:
        torch.save(state, f)


# installation (by fairseq_ext.guards.install, when the plugin and fairseq are both imported)
def _checking_config(load_checkpoint_to_cpu):
    def load_checking_config(path, arg_overrides=None, load_on_all_ranks=False):
        return _checked(path, lambda: load_checkpoint_to_cpu(path, arg_overrides, load_on_all_ranks))

    return load_checking_config


def _shadow_eval() -> None:
    # Not a wrapper: the modules call the builtin through a global name they do not define,
    # and binding ``eval`` in their namespace is all it takes (idempotent by itself).
    for name in EVAL_MODULES:
        module = sys.modules.get(name)
        if module is None:
            try:
                module = importlib.import_module(name)
            except Exception:  # optional dependency missing (e.g. deepspeed): never evaluated then
                continue
        module.eval = literal_eval


def _allow_checkpoint_globals() -> None:
    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4
        torch.serialization.add_safe_globals(CHECKPOINT_SAFE_GLOBALS)


def extract_archive(path: str) -> str:
    """The model archive ``path`` extracted into a new temporary folder (removed when the process ends) with Python's
    ``data`` filter, which refuses a member named ``/abs/...`` or ``../...``, a link out of the folder and a device; the
    archive itself is kept (fairseq 0.12's ``load_archive_file`` extracts without a filter, then deletes the archive and
    moves the folder to its name). Returns the archive's one top folder, or the folder itself."""
    if not hasattr(tarfile, "data_filter"):
        raise CheckpointError(f"cannot extract model archive {path} safely: this Python's tarfile has no data "
                              "filter (3.9.17, 3.10.12, 3.11.4 or later has it); extract it and pass the folder")
    folder = tempfile.mkdtemp(prefix="fairseq_ext-archive-")
    atexit.register(shutil.rmtree, folder, True)
    try:
        with tarfile.open(path) as archive:
            names = archive.getnames()
            outside = next((n for n in names if n.startswith(("/", "\\")) or ".." in re.split(r"[/\\]", n)), None)
            if outside is not None:  # the data filter would strip a leading "/": refused all the same
                raise UnsafeArchiveError(f"refusing model archive {path}: its member {outside!r} would be written "
                                         "outside the archive's folder; nothing of it was kept")
            archive.extractall(folder, filter="data")
    except BaseException as error:  # nothing of it stays, said in one line
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(error, tarfile.FilterError):
            raise UnsafeArchiveError(f"refusing model archive {path}: {error}; nothing of it was kept") from None
        if isinstance(error, (tarfile.TarError, OSError)):
            raise CheckpointError(f"cannot extract model archive {path}: {error}") from None
        raise
    tops = {name.split("/", 1)[0] for name in names}
    top = os.path.join(folder, tops.pop()) if len(tops) == 1 else folder
    return top if os.path.isdir(top) else folder


def _extracting_safely(load_archive_file):
    def load_archive_file_safely(archive_file):
        from fairseq.file_utils import cached_path

        try:
            resolved = cached_path(archive_file, cache_dir=None)
        except EnvironmentError:
            return load_archive_file(archive_file)  # fairseq's own message, and None
        return resolved if os.path.isdir(resolved) else extract_archive(resolved)

    return load_archive_file_safely


class _WeightsOnlyTorch:
    """``fairseq.checkpoint_utils``' own name ``torch``: torch, except that its ``load`` is always
    ``weights_only=True``. fairseq calls ``torch.load(f)`` without the argument, which
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` in the environment turns into ``weights_only=False``;
    an explicit ``True`` holds whatever the environment says."""

    def __init__(self, module):
        self.__wrapped__ = module

    def __getattr__(self, name):
        return getattr(self.__wrapped__, name)

    def load(self, f, *args, **kwargs):
        kwargs["weights_only"] = True
        return self.__wrapped__.load(f, *args, **kwargs)


def install() -> None:
    _allow_checkpoint_globals()
    from fairseq import checkpoint_utils, file_utils

    replace(checkpoint_utils, "load_checkpoint_to_cpu", _checking_config)
    replace(checkpoint_utils, "torch", _WeightsOnlyTorch)
    replace(file_utils, "load_archive_file", _extracting_safely)
    _shadow_eval()
