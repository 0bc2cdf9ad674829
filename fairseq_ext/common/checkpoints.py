"""Checkpoints as the package's commands read them: a model with its task, the saved
configuration, one description (size, technique, parameters, updates), and the languages and
subword kind of a model on a data directory. Every load goes through fairseq's checkpoint_utils,
which :mod:`fairseq_ext.guards.checkpoint_safety` guards.
"""
import functools
import os
import re
import zipfile
from typing import Dict, Optional, Tuple

import torch

from fairseq_ext.common.data_text import read_prep_env
from fairseq_ext.errors import CheckpointError, DataError
from fairseq_ext.models.multilayer_transformer_config import parse_options

# the model configuration fields that give a model's size
SHAPE_KEYS = ("encoder_layers", "decoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim",
              "encoder_attention_heads")


def device(cpu: bool) -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() and not cpu else torch.device("cpu")


def _check_checkpoint_file(checkpoint: str) -> None:
    """A checkpoint file in one of torch's formats (a zip archive, or the legacy pickle of
    protocol 2), so that anything else is one line and not torch's unpickler failing on it."""
    if not os.path.exists(checkpoint):
        raise CheckpointError(f"--checkpoint {checkpoint}: no such file")
    if os.path.isdir(checkpoint):
        raise CheckpointError(f"--checkpoint {checkpoint} is a folder: name a checkpoint file in it (e.g. "
                              f"{os.path.join(checkpoint, 'checkpoint_best.pt')})")
    with open(checkpoint, "rb") as f:
        legacy = f.read(2) == b"\x80\x02"
    if not (legacy or zipfile.is_zipfile(checkpoint)):
        raise CheckpointError(f"--checkpoint {checkpoint} is not a checkpoint (neither torch's zip format nor its "
                              "legacy pickle)")


def load_model(checkpoint: str, data: str, split: Optional[str] = None, overrides: Optional[dict] = None,
               cpu: bool = False):
    """(model in eval mode, task) of ``checkpoint`` on ``data`` (``split`` loaded if given;
    ``overrides`` as --model-overrides), on the GPU unless ``cpu``."""
    from fairseq import checkpoint_utils

    _check_checkpoint_file(checkpoint)
    if not os.path.isdir(data):
        raise DataError(f"--data {data}: no such directory")
    if not any(name.startswith("dict.") and name.endswith(".txt") for name in os.listdir(data)):
        # fairseq would infer the language pair from them and say only "Could not infer language pair"
        raise DataError(f"--data {data} has no dict.*.txt: name the directory fairseq-preprocess (or fairseq-ext "
                        "prepare) wrote for this model, with its dict.SRC.txt and dict.TGT.txt")
    arg_overrides = {"data": os.path.abspath(data)}
    arg_overrides.update(overrides or {})
    try:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=arg_overrides)
    except FileNotFoundError as e:
        missing = str(e.filename or "")
        if os.path.dirname(os.path.abspath(missing)) != os.path.abspath(data) or \
                not os.path.basename(missing).startswith("dict."):
            raise
        raise DataError(f"--data {data} has no {os.path.basename(missing)}: name the directory fairseq-preprocess "
                        "(or fairseq-ext prepare) wrote for this model, with its dict.SRC.txt and "
                        "dict.TGT.txt") from None
    except RuntimeError as e:
        mismatch = _size_mismatch(str(e))
        if mismatch is None:
            raise
        raise DataError(f"--checkpoint {checkpoint} was not trained on --data {data}: {mismatch}; name the data "
                        "directory the model was trained on") from None
    model = models[0].eval().to(device(cpu))
    if split is not None:
        task.load_dataset(split)
    return model, task


_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[(\d+)[^\]]*\]\) from "
                       r"checkpoint, the shape in current model is torch\.Size\(\[(\d+)")


def _size_mismatch(message: str) -> Optional[str]:
    """What torch's ``load_state_dict`` size mismatch says, in words (of the vocabulary: which
    dictionary differs); None for another error."""
    match = _MISMATCH.search(message)
    if match is None:
        return None
    name, saved, built = match.groups()
    side = ("source" if name.startswith("encoder.") else "target" if name.startswith("decoder.") else None)
    if side and ("embed_tokens" in name or "output_projection" in name):
        return (f"its {side} vocabulary has {saved} entries ({name}), the {side} dictionary of --data has {built} "
                "(another preprocessing or language pair)")
    return f"{name} has {saved} rows in the checkpoint and {built} in the model built for --data"


def load_state(checkpoint: str) -> dict:
    """The state saved in ``checkpoint`` (fairseq's upgrade of old checkpoints applied)."""
    from fairseq import checkpoint_utils

    _check_checkpoint_file(checkpoint)
    return checkpoint_utils.load_checkpoint_to_cpu(checkpoint)


def saved_config(state: dict, checkpoint: str, part: str = "model"):
    """One part (``model``, ``task``, ...) of the configuration in a loaded ``state``; the
    whole ``args`` namespace of a checkpoint saved before fairseq's dataclass configs."""
    cfg = state.get("cfg")
    config = cfg.get(part) if cfg is not None else state.get("args")
    if config is None:
        raise CheckpointError(f"--checkpoint {checkpoint}: no {part} configuration in the checkpoint")
    return config


def checkpoint_config(checkpoint: str, part: str = "model"):
    return saved_config(load_state(checkpoint), checkpoint, part)


def options(checkpoint: str):
    """The plugin's typed options (``MultilayerOptions``) of the model saved in ``checkpoint``."""
    cfg = checkpoint_config(checkpoint, "model")
    return parse_options(cfg, getattr(cfg, "num_source_sentences", 1) or 1)


def count_parameters(state: dict) -> int:
    """Trainable parameters of a loaded ``state``, as the papers count them: a shared tensor (a
    tied embedding) once, buffers and integer tensors not at all."""
    seen, total = set(), 0
    for name, tensor in state.get("model", {}).items():
        if not torch.is_tensor(tensor):
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen or not tensor.is_floating_point() or name.endswith("_float_tensor") \
                or name.endswith(".version"):
            continue
        seen.add(key)
        total += tensor.numel()
    return total


def _value(cfg, name: str):
    value = cfg.get(name) if isinstance(cfg, dict) else getattr(cfg, name, None)
    return value if isinstance(value, (int, float, str)) else None


def shape(cfg) -> Dict[str, object]:
    return {k: _value(cfg, k) for k in SHAPE_KEYS}


@functools.lru_cache(maxsize=None)
def describe_row(checkpoint: str) -> Dict[str, str]:
    """A model's cells in a table of models: layers, d_model, FFN, heads, technique (the plugin's
    options that are on, in words), parameters (millions, :func:`count_parameters`), updates."""
    state = load_state(checkpoint)
    cfg = saved_config(state, checkpoint, "model")
    get = functools.partial(_value, cfg)
    techniques = []
    if get("joint_attention") not in (None, "none"):
        techniques.append(f"joint attention {get('joint_attention')}")
    if get("encoder_self_attention") not in (None, "standard"):
        techniques.append(f"encoder self-attention {get('encoder_self_attention')}")
    if str(get("aux_decoder_layers") or "").strip():
        techniques.append(f"auxiliary decoders on layers {get('aux_decoder_layers')}"
                          + (" with AIF" if get("aux_fusion") else ""))
    if get("no_encoder_positional_embeddings"):
        techniques.append("no encoder positions")
    size, updates = shape(cfg), (state.get("optimizer_history") or [{}])[-1].get("num_updates")
    return {"layers": f"{size['encoder_layers']}+{size['decoder_layers']}",
            "d_model": str(size["encoder_embed_dim"]), "FFN": str(size["encoder_ffn_embed_dim"]),
            "heads": str(size["encoder_attention_heads"]), "technique": ", ".join(techniques) or "none (Transformer)",
            "parameters": f"{count_parameters(state) / 1e6:.2f}M",
            "updates": f"{updates:,}" if updates is not None else "–"}


def summary(checkpoint: str) -> str:
    """"3+3 layers, d_model 128, FFN 512, 4 heads, 800 updates": a model's size and training."""
    row = describe_row(checkpoint)
    return (f"{row['layers']} layers, d_model {row['d_model']}, FFN {row['FFN']}, {row['heads']} heads"
            + (f", {row['updates']} updates" if row["updates"] != "–" else ""))


def languages(checkpoint: str, data: str, split: str = "test", src: Optional[str] = None,
              tgt: Optional[str] = None) -> Tuple[str, str]:
    """(source, target) language of ``checkpoint`` translating ``split`` of ``data``: ``src`` /
    ``tgt`` when given, else DATA/prep.env, else the checkpoint's task configuration, else the
    one language pair of the binarized split (SPLIT.SRC-TGT.LANG.idx)."""
    if src and tgt:
        return src, tgt
    env = read_prep_env(data)
    found = env.get("src"), env.get("tgt")
    if not all(found):
        task = checkpoint_config(checkpoint, "task")
        found = getattr(task, "source_lang", None), getattr(task, "target_lang", None)
    if not all(found):
        pattern = re.compile(rf"{re.escape(split)}\.([^.-]+)-([^.-]+)\.([^.]+)\.idx")
        pairs = set()
        for name in os.listdir(data) if os.path.isdir(data) else []:
            m = pattern.fullmatch(name)
            if m and m.group(3) in m.group(1, 2):
                pairs.add(m.group(1, 2))
        if len(pairs) == 1:
            found = pairs.pop()
        else:
            held = ("the language pairs " + ", ".join("-".join(p) for p in sorted(pairs))) if pairs \
                else "no language pair"
            raise DataError(f"cannot tell the languages of {checkpoint} on {data}: no prep.env, none in the "
                            f"checkpoint's task configuration, and split '{split}' has {held}; "
                            "pass --src L --tgt L")
    return src or found[0], tgt or found[1]


def subword_kind(data: str, tgt: str) -> str:
    """The subword segmentation of a data directory without prep.env, as evaluation's ``--bpe``
    names it: by the recipes' model file (DATA/code, DATA/spm.model), else by the target
    dictionary's units ("@@" ends: subword_nmt; "▁" starts: sentencepiece; neither: none)."""
    if os.path.exists(os.path.join(data, "code")):
        return "subword_nmt"
    if os.path.exists(os.path.join(data, "spm.model")):
        return "sentencepiece"
    words = []
    path = os.path.join(data, f"dict.{tgt}.txt")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            words = [line.split(" ", 1)[0] for line in f]
    # a BPE dictionary holds thousands of such units; a word list may hold a stray one
    least = max(1, len(words) // 100)
    if sum(w.endswith("@@") for w in words) >= least:
        return "subword_nmt"
    if sum(w.startswith("\u2581") for w in words) >= least:
        return "sentencepiece"
    return "none"
