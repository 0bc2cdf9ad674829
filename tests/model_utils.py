"""Shared helpers of the test folders: build models through fairseq's own parser
(fairseq_ext.model_builder), count their parameters, make batches, run a teacher-forced
forward and an incremental decode, make and train on a tiny synthetic task.

tests/ is on ``sys.path`` in every test (pytest puts the directory of the root conftest.py
there), so a test in any folder imports this module as ``model_utils``."""
import os
from types import SimpleNamespace

import torch
from fairseq import options
from fairseq.models.transformer import TransformerModel

import fairseq_ext  # noqa: F401  (registers the model)
from fairseq_ext.model_builder import USER_DIR, build_model, make_dictionary, parse_model_args  # noqa: F401
from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
FIXTURES = os.path.join(TESTS, "fixtures")
# local copies of the corpora (multi30k/, iwslt15-en-vi/): the one variable the recipes, the
# table runner and quickstart read; the suite points it at the copies beside the checkout
# unless it is set, and every subprocess inherits it
DATA = os.environ.setdefault("FAIRSEQ_EXT_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))
MULTI30K = os.path.join(DATA, "multi30k")


def count_parameters(module, matrices_only=False):
    """The number of parameters of ``module``; with ``matrices_only`` only weight matrices and
    convolution kernels (no biases, no LayerNorm gains), as the papers' d^2 formulas count."""
    return sum(p.numel() for p in module.parameters() if not matrices_only or p.dim() >= 2)


def build(arch: str = "multilayer_transformer_iwslt", *flags: str, dictionary=None, seed: int = 0,
          model_cls=MultilayerTransformerModel):
    return build_model(arch, *flags, dictionary=dictionary, seed=seed, model_cls=model_cls)


def write_checkpoint(path, *flags: str, num_updates: int = 7, arch: str = "multilayer_transformer") -> str:
    """A checkpoint as fairseq's trainer writes it (cfg as plain containers, cfg.model the
    Namespace of an add_args model) of the SMALL model with ``flags``, on make_dictionary()."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    model, args = build(arch, *SMALL, *flags, dictionary=make_dictionary())
    torch.save({"args": None, "cfg": OmegaConf.to_container(convert_namespace_to_omegaconf(args)),
                "model": model.state_dict(), "extra_state": {}, "last_optimizer_state": None,
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                                       "lr_scheduler_state": {"best": None}, "num_updates": num_updates}]}, path)
    return str(path)


def build_stock(arch: str = "transformer_iwslt_de_en", *flags: str, dictionary=None, seed: int = 0):
    return build(arch, *flags, dictionary=dictionary, seed=seed, model_cls=TransformerModel)


SMALL = ("--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
         "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--encoder-layers", "3", "--decoder-layers", "2", "--dropout", "0", "--attention-dropout", "0")


def random_batch(dictionary, bsz=3, src_len=7, tgt_len=5, seed=1, pad_source=True, beam=1):
    """Left-padded sources of different lengths (as fairseq batches them), targets starting
    with EOS. With ``beam`` > 1 every source is repeated ``beam`` times in a row, as in beam
    search (the targets differ)."""
    g = torch.Generator().manual_seed(seed)
    nspecial = dictionary.nspecial
    src = torch.randint(nspecial, len(dictionary), (bsz, src_len), generator=g)
    src[:, -1] = dictionary.eos()
    lengths = torch.full((bsz,), src_len)
    if pad_source:
        for b in range(1, bsz):
            cut = min(b * 2, src_len - 2)
            src[b, :cut] = dictionary.pad()
            lengths[b] = src_len - cut
    src, lengths = src.repeat_interleave(beam, dim=0), lengths.repeat_interleave(beam, dim=0)
    prev = torch.randint(nspecial, len(dictionary), (bsz * beam, tgt_len), generator=g)
    prev[:, 0] = dictionary.eos()
    return src, lengths, prev


def full_and_incremental(model, src, lengths, prev, permute_at=None, beam=1, **encoder_inputs):
    """Teacher-forced log-probs vs one-token-at-a-time log-probs (B x T x V each).

    With ``permute_at`` a step index, the hypotheses of each sentence (blocks of ``beam``
    rows, see random_batch) are reversed at that step through reorder_encoder_out and
    reorder_incremental_state, as beam search reorders them, and the incremental outputs
    are mapped back, so the comparison also covers the reordering. ``encoder_inputs`` go to
    the model and the encoder as extra net inputs (e.g. ``extra_src_tokens``)."""
    with torch.no_grad():
        full = model.get_normalized_probs(model(src, lengths, prev, **encoder_inputs), log_probs=True)
        encoder_out = model.encoder(src, src_lengths=lengths, **encoder_inputs)
        incremental_state = {}
        order = torch.arange(src.size(0), device=src.device)
        steps = []
        for t in range(prev.size(1)):
            if permute_at is not None and t == permute_at:
                new_order = torch.arange(src.size(0), device=src.device).view(-1, beam).flip(1).reshape(-1)
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
                model.decoder.reorder_incremental_state_scripting(incremental_state, new_order)
                order = order[new_order]
            out = model.decoder(prev[order, : t + 1], encoder_out=encoder_out, incremental_state=incremental_state)
            step = model.get_normalized_probs(out, log_probs=True)[:, -1]
            restored = torch.empty_like(step)
            restored[order] = step
            steps.append(restored)
    return full, torch.stack(steps, dim=1)


def strip_padding_columns(tokens, pad):
    """Drop the positions (last axis) that are padding in every row and source."""
    return tokens[..., tokens.ne(pad).reshape(-1, tokens.size(-1)).any(0)]


def beam_search_rescored(model, dictionary, src, lengths, beam_size=3, max_len_b=8,
                         eos_boosts=(4.0, -4.0, 2.0, -2.0, 8.0, -8.0, 1.5, -1.5), **encoder_inputs):
    """fairseq's beam search on the batch; then every returned hypothesis is rescored by a
    teacher-forced forward of its tokens on its own sentence without the batch's padding
    (extra sources too): its positional scores must be those log-probabilities. This holds
    only if padding is masked and every cache and encoder output followed beam search's
    reorders, including those that shrink the batch when sentences finish (EOS's output
    weights are scaled by the first of ``eos_boosts`` with which that happens, a negative
    factor flipping their sign, and restored at the end). ``encoder_inputs``: extra net
    inputs (B x ...). Returns the hypotheses."""
    from fairseq.sequence_generator import SequenceGenerator

    model.eval()
    eos_row = model.decoder.output_projection.weight[dictionary.eos()]
    saved_row = eos_row.detach().clone()
    sizes = []

    def recording_reorder(encoder_out, new_order):
        sizes.append(new_order.numel())
        return type(model.encoder).reorder_encoder_out(model.encoder, encoder_out, new_order)

    model.encoder.reorder_encoder_out = recording_reorder
    net_input = {"src_tokens": src, "src_lengths": lengths, **encoder_inputs}
    try:
        with torch.no_grad():
            for boost in eos_boosts:
                eos_row.copy_(saved_row * boost)
                sizes.clear()
                hypos = SequenceGenerator([model], dictionary, beam_size=beam_size, max_len_b=max_len_b).forward(
                    {"net_input": net_input})
                if min(sizes) < src.size(0) * beam_size:  # some sentences finished early: the batch shrank
                    break
            assert min(sizes) < src.size(0) * beam_size, "no sentence finished early"
            assert len(hypos) == src.size(0)
            for b, beam in enumerate(hypos):
                assert len(beam) == beam_size
                alone = src[b : b + 1, src[b].ne(dictionary.pad())]  # the sentence without its padding
                extra = {k: strip_padding_columns(v[b : b + 1], dictionary.pad()) for k, v in encoder_inputs.items()}
                for hypo in beam:
                    tokens = hypo["tokens"]
                    assert tokens[-1] == dictionary.eos()
                    prev = torch.cat([tokens.new_tensor([dictionary.eos()]), tokens[:-1]])[None]
                    lprobs = model.get_normalized_probs(model(alone, lengths[b : b + 1], prev, **extra),
                                                        log_probs=True)
                    rescored = lprobs[0].gather(-1, tokens[:, None])[:, 0]
                    torch.testing.assert_close(hypo["positional_scores"], rescored.to(hypo["positional_scores"]),
                                               atol=1e-4, rtol=0)
    finally:
        del model.encoder.reorder_encoder_out
        with torch.no_grad():
            eos_row.copy_(saved_row)
    return hypos


def make_tiny_parallel_data(directory, num_train=300, seed=0):
    """A tiny synthetic translation task (target = reversed source), binarized with
    fairseq-preprocess --joined-dictionary into ``directory/bin``."""
    import random

    rng = random.Random(seed)
    words = [f"w{i}" for i in range(24)]
    raw = os.path.join(directory, "raw")
    os.makedirs(raw, exist_ok=True)
    for split, count in (("train", num_train), ("valid", 30), ("test", 20)):
        with open(f"{raw}/{split}.src", "w") as fs, open(f"{raw}/{split}.tgt", "w") as ft:
            for _ in range(count):
                sent = [rng.choice(words) for _ in range(rng.randint(3, 8))]
                fs.write(" ".join(sent) + "\n")
                ft.write(" ".join(reversed(sent)) + "\n")
    bin_dir = os.path.join(directory, "bin")
    preprocess_in_process(["--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
                           "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test", "--destdir", bin_dir,
                           "--joined-dictionary", "--workers", "1"])
    return bin_dir


def preprocess_in_process(argv):
    """fairseq-preprocess ARGV by its own main, in this process (no interpreter and fairseq
    import per data set); the log file handler it adds is closed afterwards."""
    from fairseq_cli import preprocess

    handlers = list(preprocess.logger.handlers)
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    finally:
        for handler in set(preprocess.logger.handlers) - set(handlers):
            preprocess.logger.removeHandler(handler)
            handler.close()


TINY_TRAIN_FLAGS = ("--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
                    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
                    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--optimizer", "adam",
                    "--lr", "1e-3", "--max-tokens", "500", "--cpu", "--no-progress-bar", "--log-format", "simple",
                    "--seed", "1", "--no-epoch-checkpoints")


def train_tiny(bin_dir, save_dir, *flags, max_update=6, lr="5e-3"):
    """fairseq-train a tiny ``multilayer_transformer`` (TINY_TRAIN_FLAGS, then ``flags``) for
    ``max_update`` updates on ``bin_dir``, in this process (fairseq-train's own main, as
    :func:`train_recording_validation`; no interpreter and fairseq import per model); the path
    of its checkpoint_last.pt. ``lr=None`` keeps TINY_TRAIN_FLAGS' learning rate."""
    train_in_process([str(bin_dir), "--user-dir", USER_DIR, "--arch", "multilayer_transformer", *TINY_TRAIN_FLAGS,
                      *flags, "--max-update", str(max_update), *(["--lr", lr] if lr else []),
                      "--save-dir", str(save_dir)])
    return os.path.join(str(save_dir), "checkpoint_last.pt")


def train_in_process(argv):
    """fairseq-train ARGV by fairseq-train's own main, in this process. The best validation
    loss fairseq keeps from run to run in the process (``save_checkpoint.best``, which it logs
    and selects checkpoint_best.pt by) is forgotten first, as in a new fairseq-train."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    if hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best
    train.main(convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv)))


def generate_in_process(argv):
    """fairseq-generate ARGV by its own main, in this process; what it prints (S-, T-, H-, D-,
    P- lines and the BLEU line)."""
    import io

    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import generate

    printed = io.StringIO()
    generate._main(convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_generation_parser(), argv)),
                   printed)
    return printed.getvalue()


def clean_env():
    """The environment for CLI subprocesses, without any weights_only override."""
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
    return env  # one OpenMP thread, as every test subprocess (conftest sets it for the whole run)


def full_disk(directory):
    """The environment variables under which every file written below ``directory`` meets a full
    disk (tests/full_disk/sitecustomize.py), to add to clean_env()."""
    path = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "full_disk"), os.environ.get("PYTHONPATH")]
    return {"FULL_DISK": str(directory), "PYTHONPATH": os.pathsep.join(filter(None, path))}


# a tiny model and optimiser for short training runs on the Multi30k slice (conftest.multi30k_bin)
MULTI30K_TRAIN_FLAGS = (
    "--arch", "multilayer_transformer", "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
    "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-all-embeddings", "--dropout", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
    "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "40",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--max-tokens", "2000", "--max-update", "100", "--cpu", "--num-workers", "0",
    "--no-progress-bar", "--log-format", "simple", "--seed", "1", "--user-dir", USER_DIR)


def train_recording_validation(data_bin, save_dir, monkeypatch, *flags):
    """Run fairseq-train's own main in-process; return the validation loss of every epoch."""
    from fairseq_cli import train

    losses = []
    validate = train.validate

    def recording_validate(*args, **kwargs):
        result = validate(*args, **kwargs)
        losses.append(result[0])
        return result

    monkeypatch.setattr(train, "validate", recording_validate)
    train_in_process([data_bin, "--task", "translation", "--save-dir", str(save_dir), *flags])
    return losses
