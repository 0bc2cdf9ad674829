"""Strip the auxiliary decoders from a multi-level supervision (MS) checkpoint.

Without AIF the auxiliary decoders only shape training (thesis 4.2): the stripped checkpoint loads as a plain
main-decoder model and translates identically, at the baseline's speed and size.

    fairseq-ext-strip-aux checkpoints/checkpoint_best.pt checkpoints/checkpoint_best.stripped.pt
    (or: python -m fairseq_ext.strip_aux IN OUT)
"""
import argparse
import os
import sys

from fairseq_ext.guards.checkpoint_safety import load_checkpoint_state, save_atomically
from fairseq_ext.errors import FairseqExtError

AUX_PREFIX = "decoder.aux_decoders."


def strip_aux_decoders(state: dict) -> int:
    """Remove the auxiliary decoders from a loaded checkpoint in place; the number of parameters
    removed. Refuses AIF models, whose main decoder needs them."""
    model_cfg = (state.get("cfg") or {}).get("model")
    cfg = model_cfg if model_cfg is not None else state.get("args")
    if cfg is None:
        raise ValueError("checkpoint has no model configuration (cfg.model / args)")
    cfg = cfg if isinstance(cfg, dict) else vars(cfg)  # cfg.model, or the legacy args (a Namespace)
    if cfg.get("aux_fusion", False):
        raise ValueError("this model uses --aux-fusion: its main decoder reads the auxiliary decoders, "
                         "which therefore cannot be stripped")
    removed = 0
    for key in [k for k in state["model"] if k.startswith(AUX_PREFIX)]:
        tensor = state["model"].pop(key)
        # shared embeddings / output projection appear under the aux prefix too
        if not any(tensor is v for v in state["model"].values()):
            removed += tensor.numel()
    cfg.update(aux_decoder_layers="", decode_from="main")
    # the optimizer state still describes the removed parameters: drop it
    state["last_optimizer_state"] = None
    return removed


def cli_main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    args = parser.parse_args(argv)
    if os.path.realpath(args.output) == os.path.realpath(args.checkpoint) or (
            os.path.exists(args.output) and os.path.samefile(args.output, args.checkpoint)):
        sys.exit(f"fairseq-ext-strip-aux: error: {args.output} is the input checkpoint; write the stripped "
                 f"model to another file")
    try:
        state = load_checkpoint_state(args.checkpoint)  # weights_only + the config check
        removed = strip_aux_decoders(state)
    except (ValueError, FairseqExtError) as err:
        sys.exit(f"fairseq-ext-strip-aux: error: {err}")
    save_atomically(state, args.output)
    print(f"removed {removed:,} auxiliary-decoder parameters -> {args.output}")


if __name__ == "__main__":
    cli_main()
