"""The model tests of the test suite's device: ``pytest --device cuda`` runs them on a GPU
(``fairseq-ext selfcheck --stage tests`` does), the CPU runs them by default. For every row
of the strategy table and every option set (DC, MMA, MS, AIF, the pre-classifier projection,
one combination of all of them, and serial with AIF in pre-norm layers with activation
checkpointing):

* a few steps of fairseq's own ``Trainer`` on one batch, in fp32, ``--fp16``,
  ``--memory-efficient-fp16``, ``--bf16`` (the plugin's guard keeps it off fairseq's TPU
  path) and ``--amp``: the parameters are in the precision the flag asks for, every loss is
  finite, and the loss falls. ``--fp16`` trains on CUDA only; on the CPU the other three run
  for two option sets (on CUDA for every one);
* incremental decoding equals the teacher-forced forward across a beam reorder: to 1e-5 in
  fp32 (TF32 off), within 0.02 in fp16 and 0.1 in bf16 (log-probabilities; fairseq's
  log-softmax runs in fp32, the layers below it in half precision), and in half precision the
  model's outputs are the fp32 model's within the same tolerance;
* fairseq's beam search gives a sentence the same hypotheses in a padded batch as alone: the
  same tokens and scores to 1e-4 in fp32. In half precision rounding may keep a candidate at
  the beam's cutoff in one run and prune it in the other, so the n-best lists may differ:
  there, each hypothesis of the padded batch has, token by token, the log-probability the
  model gives it for the sentence alone (a teacher-forced forward), within the tolerances
  above.
"""
import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from joint_attention_reference import OPTION_SETS as EVERY_OPTION_SET
from model_utils import SMALL, USER_DIR, build, full_and_incremental, make_tiny_parallel_data, random_batch

OPTION_SETS = {
    **EVERY_OPTION_SET,  # the strategy table and the option sets beside it
    # pre-norm layers and activation checkpointing with the sublayers that run after self-attention
    "pre-norm-checkpointed": ("--encoder-normalize-before", "--decoder-normalize-before", "--checkpoint-activations",
                              "--joint-attention", "serial", "--aux-decoder-layers", "1", "--aux-fusion"),
}
# fairseq's flag -> the dtype of the parameters it trains
PRECISIONS = {
    "fp32": ((), torch.float32),
    "fp16": (("--fp16",), torch.float16),
    "memory-efficient-fp16": (("--memory-efficient-fp16",), torch.float16),
    "bf16": (("--bf16",), torch.bfloat16),
    "amp": (("--amp",), torch.float32),
}
DECODING_DTYPES = {"fp32": (torch.float32, 1e-5), "fp16": (torch.float16, 0.02), "bf16": (torch.bfloat16, 0.1)}
TRAIN_STEPS = 12
# the CPU takes fairseq's other optimizers (bf16, memory-efficient fp16, AMP's) through these
# option sets only: the precision machinery is fairseq's, and the CPU's time is the suite's
CPU_PRECISION_SETS = ("none", "combined")


@pytest.fixture(scope="module")
def tiny_bin(tmp_path_factory):
    return make_tiny_parallel_data(str(tmp_path_factory.mktemp("on_device")), num_train=61)


def trainer_losses(bin_dir, flags, precision_flags, device):
    """The loss of TRAIN_STEPS steps of fairseq's Trainer on the first batch of ``bin_dir``,
    as fairseq-train sets it up (parser, task, model, criterion, optimizer, precision), and
    the dtype of the trained parameters. A step fairseq skipped (fp16 overflow) is left out."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer", *SMALL, *flags, *precision_flags,
        "--criterion", "multi_output_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "3e-3", "--max-tokens", "300", "--required-batch-size-multiple", "1",
        "--seed", "1", "--num-workers", "0", *(["--cpu"] if device.type == "cpu" else [])])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train", combine=False, epoch=1)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    batch = next(trainer.get_train_iterator(epoch=1, load_dataset=False).next_epoch_itr(shuffle=False))
    losses = []
    for _ in range(TRAIN_STEPS):
        out = trainer.train_step([batch])
        if out is not None:
            losses.append(float(out["loss"]))
    parameter = next(trainer.model.parameters())
    return losses, parameter.dtype, parameter.device


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_fairseq_trainer_steps_lower_the_loss(option_set, precision, device, tiny_bin):
    flags, dtype = PRECISIONS[precision]
    if precision == "fp16" and device.type != "cuda":
        pytest.skip("fairseq's FP16Optimizer keeps its fp32 copy on CUDA: --fp16 trains on CUDA only")
    if precision != "fp32" and device.type != "cuda" and option_set not in CPU_PRECISION_SETS:
        pytest.skip(f"on the CPU, {flags[0]} trains the sets {', '.join(CPU_PRECISION_SETS)} (every set on CUDA)")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    losses, trained_dtype, trained_device = trainer_losses(tiny_bin, OPTION_SETS[option_set], flags, device)
    assert trained_dtype == dtype and trained_device.type == device.type
    assert len(losses) >= TRAIN_STEPS // 2, f"fairseq skipped {TRAIN_STEPS - len(losses)} of {TRAIN_STEPS} steps"
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert sum(losses[-3:]) / 3 < losses[0], f"the loss did not fall: {losses}"


def device_model(option_set, dtype, device):
    model, _ = build("multilayer_transformer", *SMALL, *OPTION_SETS[option_set])
    return model.to(device=device, dtype=dtype).eval()


@pytest.mark.parametrize("dtype_name", list(DECODING_DTYPES))
@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_incremental_decoding_equals_the_full_forward(option_set, dtype_name, device):
    dtype, tolerance = DECODING_DTYPES[dtype_name]
    model = device_model(option_set, torch.float32, device)
    src, lengths, prev = (t.to(device) for t in random_batch(model.decoder.dictionary, beam=2))
    reference = None
    if dtype != torch.float32:
        reference, _ = full_and_incremental(model, src, lengths, prev)
        model = model.to(dtype)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    assert full.dtype == torch.float32  # fairseq's log-softmax runs in fp32
    assert torch.isfinite(full).all() and torch.isfinite(incremental).all()
    assert (incremental - full).abs().max().item() <= tolerance
    if reference is not None:
        assert (full - reference).abs().max().item() <= tolerance


@pytest.mark.parametrize("dtype_name", list(DECODING_DTYPES))
@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_beam_search_gives_the_same_hypotheses_batched_and_alone(option_set, dtype_name, device):
    dtype, tolerance = DECODING_DTYPES[dtype_name]
    model = device_model(option_set, dtype, device)
    dictionary = model.decoder.dictionary
    src, lengths, _ = (t.to(device) for t in random_batch(dictionary, bsz=3))
    generator = SequenceGenerator([model], dictionary, beam_size=3, max_len_b=6)
    with torch.no_grad():
        batched = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
        for b in range(src.size(0)):
            alone_src = src[b: b + 1, src[b].ne(dictionary.pad())]
            if dtype == torch.float32:
                alone = generator.forward({"net_input": {"src_tokens": alone_src,
                                                         "src_lengths": lengths[b: b + 1]}})[0]
                assert [h["tokens"].tolist() for h in batched[b]] == [h["tokens"].tolist() for h in alone]
                torch.testing.assert_close(torch.stack([h["score"] for h in batched[b]]),
                                           torch.stack([h["score"] for h in alone]), atol=1e-4, rtol=0)
            else:
                for hypothesis in batched[b]:
                    alone_scores = forced_log_probs(model, alone_src, lengths[b: b + 1], hypothesis["tokens"])
                    gap = (hypothesis["positional_scores"].float() - alone_scores).abs().max().item()
                    assert gap <= tolerance, (hypothesis["tokens"].tolist(), gap)


def forced_log_probs(model, src, lengths, tokens):
    """The model's log-probability of each token of ``tokens`` (ending in EOS) given the
    sentence ``src``: one teacher-forced forward, fairseq's log-softmax in fp32."""
    eos = model.decoder.dictionary.eos()
    prev = torch.cat([tokens.new_tensor([eos]), tokens[:-1]])[None]
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    return lprobs[0].float().gather(-1, tokens[:, None]).squeeze(-1)
