"""The analysis registry (fairseq_ext/analysis/registry.py): every analysis module declares
itself, in the report's page order, with what it needs of a model read from the model's typed
options; and a new analysis, the worked example of docs/design.md ("Adding an analysis"), is
one module that ``fairseq-ext analyze`` and ``fairseq-ext report`` pick up with no other edit."""
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

import fairseq_ext.analysis as package
from fairseq_ext import cli
from fairseq_ext.analysis import registry, report
from fairseq_ext.common import checkpoints
from fairseq_ext.model_builder import parse_model_args
from fairseq_ext.models.multilayer_transformer_config import parse_options

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"

# the report's page before the registry: name, title, where in the papers, one checkpoint a run
PAGE = [
    ("length_buckets", "BLEU by source length", "thesis 3.5.1 / 4.5.1 / 5.6.4, MLMHA 7.1, MMA 5.2", False),
    ("attention_stats", "Encoder self-attention distance and entropy", "thesis 3.5.3, MLMHA 7.3 (Eq. 13-16)", False),
    ("layer_dependency", "Encoder-layer dependency (layer masking)", "thesis Table 3.5, MLMHA Table 7", False),
    ("decoders", "Main and auxiliary decoders", "thesis Table 4.7", False),
    ("aif_dependency", "AIF dependency", "thesis 4.5.5 (Eq. 4.4-4.7)", True),
    ("dc_divergence", "DC divergence", "thesis 5.6.2 (Fig. 5.4)", False),
    ("probing", "Linguistic probing", "thesis Tables 4.8, 5.5", False),
    ("word_translation", "Word-translation accuracy per layer", "Xu et al. 2020, Sec. 2-3, Tables 1, 3, 5", True),
    ("translate_from_layer", "Translating from an encoder layer", "Xu et al. 2020, Table 2", True),
    ("attention_maps", "Attention of one sentence", "MMA Fig. 3, multi-source Fig. 2 / App. A", True),
    ("word_order", "Word-order sensitivity", "MMA Table 3", False),
]


def test_every_analysis_declares_itself_in_page_order():
    found = registry.analyses()
    assert [(a.name, a.title, a.reference, a.single) for a in found.values()] == PAGE
    assert all(a.module == f"fairseq_ext.analysis.{a.name}" for a in found.values())
    assert registry.get("probing") is found["probing"]
    with pytest.raises(package.AnalysisError, match="no analysis 'nope'"):
        registry.get("nope")
    # the modules the analyses share are not analyses
    assert not {"command", "capture", "figures", "tables", "report", "registry"} & set(found)


def options(*flags):
    return parse_options(parse_model_args("multilayer_transformer", *flags))


@pytest.mark.parametrize("flags, runs", [
    ((), set()),
    (("--joint-attention", "m-00", "--joint-attention-layers", "3"), {"layer_dependency"}),
    (("--joint-attention", "transparent"), {"layer_dependency"}),
    (("--joint-attention", "hierarchical", "--joint-attention-layers", "1"), set()),
    (("--aux-decoder-layers", "1,2"), {"decoders"}),
    (("--aux-decoder-layers", "1", "--aux-fusion"), {"decoders", "aif_dependency"}),
    (("--encoder-self-attention", "dc", "--dc-encoder-layers", "2-3"), {"dc_divergence"}),
    (("--encoder-self-attention", "mma", "--encoder-attention-heads", "4", "--mma-heads", "G,L,F,B"), set()),
])
def test_what_an_analysis_needs_is_read_from_the_typed_options(flags, runs):
    """Of the analyses that need a technique, those a model of ``flags`` has; the others
    analyse every model."""
    model = options(*flags)
    needing = {a.name for a in registry.analyses().values() if a.needs is not None}
    assert needing == {"layer_dependency", "decoders", "aif_dependency", "dc_divergence"}
    assert {name for name in needing if registry.get(name).applies_to(model)} == runs
    assert all(a.applies_to(model) for a in registry.analyses().values() if a.needs is None)


def test_a_declaration_says_what_a_model_without_the_technique_lacks():
    with pytest.raises(package.AnalysisError, match="'needs' and 'lacks' go together"):
        registry.Analysis("x", "X", "", needs=lambda options: True)


@pytest.fixture
def twelfth(tmp_path, monkeypatch):
    """The worked example of docs/design.md as a module of the package (a folder added to the
    package's path), found by a fresh registry."""
    section = DESIGN.read_text(encoding="utf-8").split("## Adding an analysis", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "layer_norms.py").write_text(code, encoding="utf-8")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    registry._discover.cache_clear()
    yield "layer_norms"
    sys.modules.pop("fairseq_ext.analysis.layer_norms", None)
    registry._discover.cache_clear()
    registry._option_strings.cache_clear()


def test_a_new_analysis_is_one_module(twelfth, tiny_trained, tmp_path, capsys):
    """The example is listed by ``fairseq-ext analyze``, placed on the report's page by its
    order, runs through ``fairseq-ext analyze`` and the report, and its numbers are the mean
    norms of the encoder's layer outputs computed here, one sentence at a time."""
    bin_dir, ckpt = tiny_trained
    assert list(registry.analyses())[:3] == ["length_buckets", "attention_stats", twelfth]
    assert cli.main(["analyze", "--help"]) == 0
    assert twelfth in capsys.readouterr().out
    assert report.build_parser().parse_args(["--run", twelfth, "--out", "o"]).run == [twelfth]
    (argv, out), = report.analysis_commands(twelfth, [ckpt], ["tiny"], bin_dir, "valid", str(tmp_path / "r"),
                                            True, [])
    assert argv[1:3] == ["-m", "fairseq_ext.analysis.layer_norms"] and "--names" in argv and "--cpu" in argv
    assert report.applicable(twelfth, [ckpt], ["tiny"]) == ([ckpt], ["tiny"], "")

    assert cli.main(["analyze", twelfth, "--checkpoint", ckpt, "--names", "tiny", "--data", bin_dir, "--split",
                     "valid", "--out", str(tmp_path / "norms"), "--cpu"]) == 0
    rows = json.loads((tmp_path / "norms" / "norms.json").read_text())
    assert (tmp_path / "norms" / "norms.png").is_file()
    model, task = checkpoints.load_model(ckpt, bin_dir, split="valid", cpu=True)
    dataset, norm = task.dataset("valid"), model.encoder.layer_norm
    sums, tokens = {}, 0
    with torch.no_grad():
        for i in range(len(dataset)):
            src = dataset[i]["source"][None]
            states = model.encoder(src, src_lengths=torch.tensor([src.size(1)]),
                                   return_all_hiddens=True)["encoder_states"]
            for layer, state in enumerate(states):
                state = norm(state) if norm is not None else state
                sums[layer] = sums.get(layer, 0.0) + state[:, 0].norm(dim=-1).sum().item()
            tokens += src.size(1)
    assert [r["layer"] for r in rows] == list(range(len(model.encoder.layers) + 1))
    for row in rows:
        assert row["model"] == "tiny" and row["norm"] == pytest.approx(sums[row["layer"]] / tokens, rel=1e-5)
    assert os.path.basename(out) == twelfth
