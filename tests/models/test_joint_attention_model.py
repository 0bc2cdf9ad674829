"""The joint-attention strategies in the assembled model: one collected layer is the stock
Transformer, the whole model's forward equals the equations (encoder memory and every
decoder layer), a padded batch equals each sentence alone, --mask-source-layer, settings
refused at build naming the option, the strategy table as the one place a strategy is
defined, deep copies, the attention weights every strategy reports, and (slow) a short
training run per strategy on a slice of Multi30k."""
import re

import pytest
import torch

from fairseq_ext.models import joint_attention_strategies as table
from fairseq_ext.models.joint_attention_strategies import Memory
from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel
from fairseq_ext.models.multilayer_transformer_config import parse_options
from fairseq_ext.modules.multi_source_attention import FlatCrossAttention, ParallelCrossAttention
from joint_attention_reference import (
    AGGREGATION,
    ALL_OPTIONS,
    L_SMALL,
    MLMHA,
    MULTI_SOURCE,
    NOT_STOCK_WITH_ONE_LAYER,
    SHARES_STATIC_ROWS,
    STACKED,
    STRATEGIES,
    perturb,
    ref_aggregation,
    ref_decoder_features,
    ref_memories,
    small_model,
)
from model_utils import (
    MULTI30K_TRAIN_FLAGS,
    SMALL,
    beam_search_rescored,
    build,
    build_stock,
    full_and_incremental,
    make_dictionary,
    parse_model_args,
    random_batch,
    train_recording_validation,
)


# ----------------------------------------------------------------------------------------
# 1. n = 1 is exactly the standard cross-attention
# ----------------------------------------------------------------------------------------
def stock_name(key):
    key = key.replace(".encoder_attn.attentions.0.", ".encoder_attn.")
    return re.sub(r"\.(q_proj|k_proj|v_proj)\.0\.", r".\1.", key)


@pytest.mark.parametrize("strategy", [s for s in STACKED if s not in NOT_STOCK_WITH_ONE_LAYER])
def test_one_collected_layer_is_the_stock_transformer(strategy):
    dictionary = make_dictionary()
    stock, _ = build_stock("transformer", *SMALL, dictionary=dictionary, seed=3)
    perturb(stock.double(), seed=5)
    ours, args, _ = small_model(strategy, n=1, dictionary=dictionary)
    assert args.joint_attention_layers == 1
    stock_state = stock.state_dict()
    renamed = {key: stock_name(key) for key in ours.state_dict()}
    assert sorted(renamed.values()) == sorted(stock_state)  # same parameters, nothing more
    ours.load_state_dict({key: stock_state[name] for key, name in renamed.items()})
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        expected, actual = stock(src, lengths, prev), ours(src, lengths, prev)
    torch.testing.assert_close(actual[0], expected[0], atol=1e-6, rtol=0)  # logits
    torch.testing.assert_close(actual[1]["attn"][0], expected[1]["attn"][0], atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------
# 2. the whole model against the equations
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy,n", [(s, L_SMALL) for s in ALL_OPTIONS] + [(s, 2) for s in STRATEGIES if s != "transparent"])
def test_model_forward_equals_the_equations(strategy, n):
    """Whole model: encoder memory (Collector + aggregation / transparent / stacking) and
    every decoder layer (query = output of the self-attention sublayer, the strategy's
    cross-attention sublayer(s) with residual and LayerNorm, FFN) against the references.
    For serial this is the chain x = LN_i(x + Att_i(x, f^i)), i = 1..n, in every layer."""
    model, args, dictionary = small_model(strategy, n=None if strategy == "none" else n)
    if strategy == "transparent":
        with torch.no_grad():
            model.encoder.transparent.weight.normal_(0.0, 1.0)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        memories = ref_memories(model, encoder_out, strategy, args.joint_attention_layers)
        if strategy in AGGREGATION:
            torch.testing.assert_close(encoder_out["joint_memory"][0], memories[0], atol=1e-10, rtol=0)
        elif strategy == "transparent":
            memory = encoder_out["joint_memory"][0]
            assert memory.shape[2] == len(model.decoder.layers)
            for j, expected in enumerate(memories):
                torch.testing.assert_close(memory[:, :, j], expected, atol=1e-6, rtol=0)
        elif strategy != "none":
            memory = encoder_out["joint_memory"][0]
            assert memory.shape[2] == n
            for i, f in enumerate(memories[0]):
                assert torch.equal(memory[:, :, i], f)
            assert torch.equal(memory[:, :, -1], encoder_out["encoder_out"][0])  # f^n = H^L
        features, _ = model.decoder(prev, encoder_out=encoder_out, features_only=True)
        expected = ref_decoder_features(model, strategy, n, encoder_out, prev)
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# 3. padding
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ALL_OPTIONS)
def test_padded_batch_equals_each_sentence_alone(strategy):
    model, _, dictionary = small_model(strategy)
    src, lengths, prev = random_batch(dictionary, bsz=3, src_len=7)
    assert src.eq(dictionary.pad()).any()
    with torch.no_grad():
        batched = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        for b in range(src.size(0)):
            alone = src[b : b + 1, src[b].ne(dictionary.pad())]
            single = model.get_normalized_probs(model(alone, lengths[b : b + 1], prev[b : b + 1]), log_probs=True)
            torch.testing.assert_close(batched[b : b + 1], single, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# 4. --mask-source-layer (thesis Table 3.5)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STACKED)
@pytest.mark.parametrize("mask", [1, 2, 3])
def test_masked_source_layer_is_zeros_in_the_stacked_memory(strategy, mask):
    model, _, dictionary = small_model(strategy, "--mask-source-layer", str(mask))
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        out = model.encoder(src, src_lengths=lengths)
    memory = out["joint_memory"][0]
    states = out["encoder_states"]
    for i in range(1, L_SMALL + 1):
        if i == mask:
            assert torch.count_nonzero(memory[:, :, i - 1]) == 0
        else:
            assert torch.equal(memory[:, :, i - 1], states[i])


@pytest.mark.parametrize("strategy", STACKED)
def test_masking_zeroes_the_layer_and_remove_takes_it_out(strategy):
    """--mask-source-mode zero (the default, the thesis' "replacing f^i with zeros"): the
    decoder of the masked model computes what the unmasked model's decoder computes from a
    memory whose f^i is zeros, biases of the key/value projections included; remove: the
    layer leaves the combination, which differs where those biases are not zero."""
    plain, _, dictionary = small_model(strategy)
    zero, _, _ = small_model(strategy, "--mask-source-layer", "2", dictionary=dictionary)
    remove, _, _ = small_model(strategy, "--mask-source-layer", "2", "--mask-source-mode", "remove",
                               dictionary=dictionary)
    for model in (zero, remove):
        model.load_state_dict(plain.state_dict())
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        encoder_out = plain.encoder(src, src_lengths=lengths)
        memory = encoder_out["joint_memory"][0].clone()
        memory[:, :, 1] = 0
        encoder_out["joint_memory"] = [memory]
        expected = plain.decoder(prev, encoder_out=encoder_out)[0]
        zeroed = zero(src, lengths, prev)[0]
        removed = remove(src, lengths, prev)[0]
    torch.testing.assert_close(zeroed, expected, atol=1e-10, rtol=0)
    assert (torch.abs(removed - zeroed).max() > 1e-3), "with biased projections, zeros are not removal"


@pytest.mark.parametrize("strategy", AGGREGATION)
def test_masked_source_layer_is_zeros_before_aggregation(strategy):
    masked, _, dictionary = small_model(strategy, "--mask-source-layer", "2", n=2)
    plain, _, _ = small_model(strategy, n=2, dictionary=dictionary)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        out = masked.encoder(src, src_lengths=lengths)
        states = out["encoder_states"]
        f1 = states[L_SMALL - 1]  # n = 2: f^1 = H^2, f^2 = H^3 (masked)
        expected = ref_aggregation(masked.encoder.layer_aggregation, strategy, [f1, torch.zeros_like(f1)])
        torch.testing.assert_close(out["joint_memory"][0], expected, atol=1e-10, rtol=0)
        unmasked = plain.encoder(src, src_lengths=lengths)["joint_memory"][0]
    assert not torch.allclose(out["joint_memory"][0], unmasked)


@pytest.mark.parametrize("strategy,n,mask", [("m-00", 3, 0), ("m-00", 3, 4), ("m-10", 2, 3), ("s-agg", 2, 3),
                                             ("serial", 1, 2), ("none", None, 1), ("transparent", None, 1)])
def test_mask_source_layer_out_of_range_fails_at_build(strategy, n, mask):
    flags = ("--mask-source-layer", str(mask))
    with pytest.raises(ValueError, match="--mask-source-layer"):
        small_model(strategy, *flags, n=n)


# ----------------------------------------------------------------------------------------
# 5. invalid settings fail at build, naming the option
# ----------------------------------------------------------------------------------------
def test_more_collected_layers_than_encoder_layers_fails_at_build():
    with pytest.raises(ValueError, match=r"--joint-attention-layers \(4\) exceeds --encoder-layers \(3\)"):
        small_model("m-00", n=4)
    with pytest.raises(ValueError, match="--joint-attention-layers"):
        small_model("c-agg", n=0)
    with pytest.raises(ValueError, match="--joint-attention-layers"):
        small_model("none", n=2)


def test_unknown_strategy_fails_at_build():
    args = parse_model_args("multilayer_transformer", *SMALL, "--joint-attention", "m-00")
    args.joint_attention = "m-22"
    with pytest.raises(ValueError, match="--joint-attention"):
        parse_options(args)
    dictionary = make_dictionary()
    task = type("Task", (), {"source_dictionary": dictionary, "target_dictionary": dictionary})()
    with pytest.raises(ValueError, match="--joint-attention"):
        MultilayerTransformerModel.build_model(args, task)
    with pytest.raises(ValueError, match="--joint-attention: invalid choice: 'm-22'"):  # argparse's choices
        parse_model_args("multilayer_transformer", *SMALL, "--joint-attention", "m-22")


def test_transparent_attention_rejects_a_number_of_collected_layers():
    with pytest.raises(ValueError, match="--joint-attention-layers"):
        small_model("transparent", n=2)


# ----------------------------------------------------------------------------------------
# 6. a short training run per strategy on a slice of Multi30k
# ----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ALL_OPTIONS)
def test_training_lowers_the_validation_loss(strategy, multi30k_bin, tmp_path, monkeypatch):
    """fairseq-train's own main, in-process: the validation loss after the last epoch is
    well below the one after the first epoch (35 updates: two epochs of the slice and one update,
    validated at the end; every row fell by more than 1.6 there, from about 9.3 to 7.5)."""
    extra = () if strategy == "none" else ("--joint-attention", strategy)
    losses = train_recording_validation(multi30k_bin, tmp_path, monkeypatch, *MULTI30K_TRAIN_FLAGS, "--no-save",
                                        "--max-update", "35", *extra)
    assert len(losses) >= 3, losses
    assert losses[-1] < losses[0] - 1.0, losses


# ----------------------------------------------------------------------------------------
# 7. the strategy table: one entry is all a new strategy needs
# ----------------------------------------------------------------------------------------
def test_every_strategy_choice_comes_from_the_table():
    from fairseq_ext.models.joint_attention_strategies import STRATEGIES
    from fairseq_ext.models.multilayer_transformer_config import MultilayerTransformerConfig

    choices = [c.value for c in MultilayerTransformerConfig.__dataclass_fields__["joint_attention"].type]
    assert choices == list(STRATEGIES)


def test_the_equation_families_are_rows_of_the_table():
    assert set(MLMHA + MULTI_SOURCE) <= set(STACKED) and set(NOT_STOCK_WITH_ONE_LAYER) <= set(STACKED)
    assert set(MLMHA) <= set(SHARES_STATIC_ROWS)


def test_a_new_table_entry_is_a_working_strategy(monkeypatch):
    """A strategy added as one table entry (here: the parallel combination with the
    stock cross-attention summed over the n layers, under a new name) builds, decodes
    incrementally and runs beam search, with nothing else changed."""
    entry = table.JointAttentionStrategy(
        "sum-of-layers", Memory.STACKED,
        build_cross_attention=lambda spec: ParallelCrossAttention(spec.embed_dim, spec.num_heads, spec.num_sources,
                                                                  spec.dropout))
    monkeypatch.setitem(table.STRATEGIES, entry.name, entry)
    args = parse_model_args("multilayer_transformer", *SMALL, "--joint-attention", "parallel")
    args.joint_attention = entry.name
    dictionary = make_dictionary()
    task = type("Task", (), {"source_dictionary": dictionary, "target_dictionary": dictionary})()
    model = MultilayerTransformerModel.build_model(args, task).eval()
    assert isinstance(model.decoder.layers[0].encoder_attn, ParallelCrossAttention)
    src, lengths, prev = random_batch(dictionary, beam=2)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    torch.testing.assert_close(full, incremental, rtol=0, atol=1e-5)
    src, lengths, _ = random_batch(dictionary, bsz=4, seed=3)
    beam_search_rescored(model, dictionary, src, lengths, beam_size=2, max_len_b=5)


# ----------------------------------------------------------------------------------------
# 8. a copy of a model is a model (copy.deepcopy: fairseq's EMA, distillation teachers)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [("--joint-attention", "serial"),
                                   ("--aux-decoder-layers", "1", "--aux-fusion")])
def test_a_deep_copy_computes_what_the_model_computes_with_its_own_weights(flags):
    import copy

    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, *flags, dictionary=dictionary)
    model.eval()
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        expected, _ = model(src, lengths, prev)
        clone = copy.deepcopy(model)
        perturb(model, seed=3)  # the original changes; the copy must not
        actual, _ = clone(src, lengths, prev)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------
# 9. every strategy's cross-attention reports its weights through the modules' contract
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ALL_OPTIONS)
def test_every_strategy_reports_its_attention_weights(strategy):
    """Recording (fairseq_ext.modules.attention_utils.record_attention_weights) every
    decoder layer's cross-attention part: each reports its per-head weights, batch-first,
    rows summing to 1 (flat: its per-source maps together), and the output is unchanged."""
    from fairseq_ext.modules.attention_utils import ReportsAttentionWeights, record_attention_weights

    model, args, dictionary = small_model(strategy)
    src, lengths, prev = random_batch(dictionary)
    parts = [m for layer in model.decoder.layers for m in (layer.serial_stack, layer.encoder_attn) if m is not None]
    assert all(isinstance(m, ReportsAttentionWeights) for m in parts)
    with torch.no_grad():
        plain, _ = model(src, lengths, prev)
        with record_attention_weights(parts) as recorder:
            recorded, _ = model(src, lengths, prev)
    torch.testing.assert_close(recorded, plain, atol=1e-6, rtol=0)
    bsz, heads, tgt_len = src.size(0), args.decoder_attention_heads, prev.size(1)
    for layer in model.decoder.layers:
        report = recorder.last(layer.encoder_attn)
        weights = report["attention"]
        assert weights.shape[:3] == (bsz, heads, tgt_len) and weights.size(-1) == src.size(1)
        per_source = dict(report.get("per_source", {}))
        if layer.serial_stack is not None:
            per_source.update(recorder.last(layer.serial_stack)["per_source"])
        if isinstance(layer.encoder_attn, FlatCrossAttention):
            total = sum(per_source.values()).sum(-1)
            torch.testing.assert_close(total, torch.ones(weights.shape[:-1], dtype=weights.dtype))
            continue
        for w in [weights, *per_source.values()]:
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1], dtype=w.dtype))
        if table.STRATEGIES[strategy].memory is Memory.STACKED and strategy not in ("m-00", "m-01"):
            assert sorted(per_source) == list(range(args.joint_attention_layers))  # U0 = 0: one joint map
