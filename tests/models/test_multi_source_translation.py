"""Multi-source translation over genuinely different source sentences (Libovický et al.
2018): the task's batching, the per-source padding masks, the memory of each source,
incremental decoding and beam search, and an end-to-end run with fairseq-train /
fairseq-generate."""
import os
import random
import subprocess
from types import SimpleNamespace

import pytest
import torch

from fairseq_ext.models.joint_attention_strategies import MULTI_SOURCE_STRATEGY_NAMES
from fairseq_ext.models.multi_source_encoder import MultiSourceEncoder
from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel
from model_utils import (
    SMALL,
    TINY_TRAIN_FLAGS,
    USER_DIR,
    beam_search_rescored,
    clean_env,
    full_and_incremental,
    make_dictionary,
    parse_model_args,
    preprocess_in_process,
    random_batch,
    train_in_process,
)

STRATEGIES = MULTI_SOURCE_STRATEGY_NAMES  # every row of the table that combines source sentences


def build_multi_source(strategy, *flags, num_sources=2, dictionary=None):
    dictionary = dictionary or make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary,
                           num_source_sentences=num_sources)
    torch.manual_seed(0)
    args = parse_model_args("multilayer_transformer", *SMALL, "--joint-attention", strategy, *flags)
    return MultilayerTransformerModel.build_model(args, task).eval()


def two_source_batch(dictionary, beam=1):
    src, lengths, prev = random_batch(dictionary, src_len=7, beam=beam, seed=1)
    extra, _, _ = random_batch(dictionary, src_len=5, beam=beam, seed=2)  # another length, other padding
    extra = extra.flip(0)  # padded rows differ from the primary's
    return src, lengths, extra.unsqueeze(1), prev


def test_forward_passes_expect_the_extra_sources():
    model = build_multi_source("serial")
    assert isinstance(model.encoder, MultiSourceEncoder) and len(model.encoder.encoders) == 2
    src, lengths, extra, prev = two_source_batch(model.decoder.dictionary)
    with pytest.raises(ValueError, match="multi_source_translation"):
        model(src, lengths, prev)
    shared = build_multi_source("serial", "--multi-source-shared-encoder")
    assert len(shared.encoder.encoders) == 1


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_incremental_equals_full_and_beam_search(strategy):
    model = build_multi_source(strategy)
    dictionary = model.decoder.dictionary
    src, lengths, extra, prev = two_source_batch(dictionary, beam=2)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2,
                                           extra_src_tokens=extra)
    assert torch.allclose(full, incremental, atol=1e-5)
    src, lengths, extra, _ = two_source_batch(dictionary)
    beam_search_rescored(model, dictionary, src, lengths, extra_src_tokens=extra)  # scores = teacher-forced


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_source_keeps_its_own_padding(strategy):
    """A batch equals each example alone: the extra source's padding (different from the
    primary's) is masked per source, and the memory is left-padded to one length."""
    model = build_multi_source(strategy)
    src, lengths, extra, prev = two_source_batch(model.decoder.dictionary)
    pad = model.decoder.dictionary.pad()
    with torch.no_grad():
        batch, _ = model(src, lengths, prev, extra_src_tokens=extra)
        for b in range(src.size(0)):
            s = src[b][src[b].ne(pad)].unsqueeze(0)
            e = extra[b, 0][extra[b, 0].ne(pad)].view(1, 1, -1)
            alone, _ = model(s, torch.tensor([s.size(1)]), prev[b:b + 1], extra_src_tokens=e)
            assert torch.allclose(batch[b], alone[0], atol=1e-5)


def test_the_memory_holds_each_sources_own_encoding():
    """The decoder's memory (J x B x n x C) holds, for source i, exactly encoder i's top layer
    for sentence i alone (left-padded to the longest source, masked there), and the decoder
    reads it: the parallel combination (Eq. 5) of the model equals the sum over sources of
    each source's cross-attention computed from these memories."""
    model = build_multi_source("parallel")
    dictionary = model.decoder.dictionary
    pad = dictionary.pad()
    src, lengths, extra, prev = two_source_batch(dictionary)
    with torch.no_grad():
        out = model.encoder(src, lengths, extra_src_tokens=extra)
        memory, mask = out["joint_memory"][0], out["joint_padding_mask"][0]
        length = memory.size(0)
        for b in range(src.size(0)):
            for i, tokens in enumerate((src[b], extra[b, 0])):
                alone = tokens[tokens.ne(pad)].unsqueeze(0)
                enc = model.encoder.encoder_for(i)(alone, torch.tensor([alone.size(1)]))["encoder_out"][0][:, 0]
                n = alone.size(1)
                torch.testing.assert_close(memory[length - n:, b, i], enc, atol=1e-5, rtol=1e-5)
                assert mask[b, i, length - n:].eq(False).all() and mask[b, i, :length - n].all()
        # the first decoder layer's cross-attention = sum_i A^h(Q, K_i, V_i) over these memories
        layer = model.decoder.layers[0]
        captured = {}
        handle = layer.encoder_attn.register_forward_hook(lambda m, a, k, o: captured.update(out=o[0]),
                                                          with_kwargs=True)
        inputs = {}
        pre = layer.encoder_attn.register_forward_pre_hook(lambda m, a, k: inputs.update(query=k.get("query", a[0] if a else None)),
                                                           with_kwargs=True)
        model(src, lengths, prev, extra_src_tokens=extra)
        handle.remove()
        pre.remove()
        query = inputs["query"]
        attn = layer.encoder_attn
        per_source = [attn.attentions[i](query=query, key=memory[:, :, i], value=memory[:, :, i],
                                         key_padding_mask=mask[:, i], need_weights=False)[0] for i in range(2)]
    torch.testing.assert_close(captured["out"], per_source[0] + per_source[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("strategy,message", [("m-00", "multi_source_translation"), ("c-agg", "multi_source_translation")])
def test_strategies_that_need_aligned_layers_are_refused(strategy, message):
    with pytest.raises(ValueError, match=message):
        build_multi_source(strategy)


def make_two_source_data(root):
    """Synthetic en+fr->de: fr is a word-by-word relabelling of en, the target the reversed en."""
    rng = random.Random(0)
    raw = os.path.join(root, "raw")
    os.makedirs(raw)
    for split, count in (("train", 300), ("valid", 30), ("test", 20)):
        lines = [[f"w{rng.randrange(20)}" for _ in range(rng.randint(3, 8))] for _ in range(count)]
        for lang, text in (("en", lines), ("fr", [[w.replace("w", "v") for w in s] for s in lines]),
                           ("de", [list(reversed(s)) for s in lines])):
            with open(f"{raw}/{split}.{lang}", "w") as f:
                f.writelines(" ".join(s) + "\n" for s in text)
    with open(f"{raw}/all.txt", "w") as f:
        for lang in ("en", "fr", "de"):
            f.write(open(f"{raw}/train.{lang}").read())
    bin_dir = os.path.join(root, "bin")
    preprocess_in_process(["--only-source", "--trainpref", f"{raw}/all.txt", "--destdir", f"{root}/dict",
                           "--workers", "1"])
    for src in ("en", "fr"):
        preprocess_in_process(["-s", src, "-t", "de", "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid",
                               "--testpref", f"{raw}/test", "--srcdict", f"{root}/dict/dict.txt",
                               "--tgtdict", f"{root}/dict/dict.txt", "--destdir", bin_dir, "--workers", "1"])
    return bin_dir


@pytest.fixture(scope="module")
def two_source_bin(tmp_path_factory):
    return make_two_source_data(str(tmp_path_factory.mktemp("two_sources")))


def test_task_batches_align_the_extra_source(two_source_bin):
    from fairseq_ext.tasks.multi_source_translation import MultiSourceTranslationConfig, MultiSourceTranslationTask

    bin_dir = two_source_bin
    task = MultiSourceTranslationTask.setup_task(MultiSourceTranslationConfig(
        data=bin_dir, source_lang="en", target_lang="de", extra_source_langs="fr", train_subset="train",
        dataset_impl=None, required_seq_len_multiple=1))
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    batch = dataset.collater([dataset[i] for i in range(8)])
    extra = batch["net_input"]["extra_src_tokens"]
    assert extra.shape[:2] == (8, 1)
    d = task.source_dictionary

    def text(tokens):
        return d.string(tokens[tokens.ne(d.pad())])

    for row, index in enumerate(batch["id"].tolist()):
        primary = text(batch["net_input"]["src_tokens"][row])
        relabelled = text(extra[row, 0])
        assert relabelled == primary.replace("w", "v")  # the same sentence, in the batch's order
        assert text(dataset[index]["source"]) == primary


@pytest.mark.slow
def test_train_and_generate_two_sources(two_source_bin, tmp_path):
    bin_dir = two_source_bin
    env = clean_env()
    common = ["--task", "multi_source_translation", "-s", "en", "-t", "de", "--extra-source-langs", "fr"]
    train_in_process([bin_dir, "--user-dir", USER_DIR, *common, "--arch", "multilayer_transformer",
                      "--joint-attention", "hierarchical", *TINY_TRAIN_FLAGS, "--max-update", "5",
                      "--save-dir", str(tmp_path / "ck")])
    result = subprocess.run(
        ["fairseq-generate", bin_dir, "--user-dir", USER_DIR, *common, "--path", str(tmp_path / "ck" / "checkpoint_last.pt"),
         "--beam", "3", "--cpu"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BLEU4" in result.stdout


def test_batching_and_filtering_count_every_source(tmp_path):
    """--max-tokens and --max-source-positions hold for the extra sources too: fairseq's
    wrapper would batch and filter by the primary source alone."""
    from fairseq.data import Dictionary, LanguagePairDataset, ListDataset

    from fairseq_ext.tasks.multi_source_translation import MultiSourceLanguagePairDataset

    d = Dictionary()
    for w in "abcdefgh":
        d.add_symbol(w)

    def sentences(lengths):
        return [torch.tensor([d.index("a")] * (n - 1) + [d.eos()]) for n in lengths]

    primary, extra, target = [4] * 13, [4, 30, 4, 4, 4, 4, 25, 4, 4, 4, 4, 4, 4], [5] * 13
    src = sentences(primary)
    pair = LanguagePairDataset(src, primary, d, sentences(target), target, d)
    extras = [ListDataset(sentences(extra), sizes=extra)]
    dataset = MultiSourceLanguagePairDataset(pair, extras, d.pad(), d.eos())
    assert dataset.num_tokens(1) == 30 and dataset.size(6) == (25, 5)
    indices = dataset.ordered_indices()
    batches = dataset.batch_by_size(indices, max_tokens=40)
    for batch in batches:  # padded to the longest of any source
        assert len(batch) * max(max(primary[i], extra[i], target[i]) for i in batch) <= 40, batch
    assert sorted(i for b in batches for i in b) == list(range(13))  # none dropped (13: not a multiple of 8)
    kept, dropped = dataset.filter_indices_by_size(indices, (20, 20))
    assert sorted(dropped) == [1, 6] and sorted(kept.tolist()) == [i for i in range(13) if i not in (1, 6)]
    # an adversarial evaluation that shuffles the extra source moves its lengths along
    shuffled = MultiSourceLanguagePairDataset(pair, extras, d.pad(), d.eos(), shuffled=1,
                                              permutation=[1, 0] + list(range(2, 13)))
    assert shuffled.num_tokens(0) == 30 and shuffled.num_tokens(1) == 5
