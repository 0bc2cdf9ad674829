"""Every option runs in fp16 and bf16 (as under fairseq's --fp16 / --bf16): finite outputs,
close to the fp32 model, incremental decoding consistent, beam search runs."""
import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_ext.models.joint_attention_strategies import STRATEGIES
from model_utils import SMALL, build, full_and_incremental, random_batch

CONFIGS = [("--joint-attention", s) for s in STRATEGIES if s != "none"] + [
    ("--encoder-self-attention", "dc", "--decoder-self-attention", "dc", "--dc-kernel-size", "2"),
    ("--encoder-self-attention", "mma", "--decoder-self-attention", "mma"),
    ("--aux-decoder-layers", "1", "--aux-fusion", "--pre-classifier-projection"),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("flags", CONFIGS)
def test_half_precision(dtype, flags):
    model, _ = build("multilayer_transformer", *SMALL, *flags)
    src, lengths, prev = random_batch(model.decoder.dictionary, beam=2)
    reference, _ = full_and_incremental(model, src, lengths, prev)
    model = model.to(dtype)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    assert full.dtype == torch.float32  # fairseq's log-softmax runs in fp32
    assert torch.isfinite(full).all() and torch.isfinite(incremental).all()
    tolerance = 0.1 if dtype == torch.bfloat16 else 0.02
    assert (full - reference).abs().max() < tolerance
    assert (full - incremental).abs().max() < tolerance
    hypos = SequenceGenerator([model], model.decoder.dictionary, beam_size=2, max_len_b=5).forward(
        {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hypos) == src.size(0)
