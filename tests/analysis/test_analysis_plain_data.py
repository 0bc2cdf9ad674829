"""The analyses on any fairseq data directory: plain ``fairseq-preprocess`` output, without
the recipes' prep.env and text/. The languages come from the checkpoint or the binarized
files' names, the subword kind from the data, the reference from fairseq's T- lines, and
attention_maps picks its sentence itself."""
import json
import os
import subprocess
import sys

import pytest

from fairseq_ext.analysis import AnalysisError, attention_maps
from fairseq_ext.common import checkpoints, data_text
from fairseq_ext.errors import DataError
from model_utils import clean_env, make_tiny_parallel_data, train_tiny

def _touch(path, text=""):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def test_languages_prep_env_then_checkpoint_then_file_names(tmp_path, monkeypatch):
    data = tmp_path / "bin"
    data.mkdir()
    for name in ("test.de-en.de.idx", "test.de-en.en.idx", "valid.fr-en.fr.idx", "dict.en.txt"):
        _touch(data / name)
    task = {"source_lang": "it", "target_lang": "es"}
    monkeypatch.setattr(checkpoints, "checkpoint_config", lambda checkpoint, part: type("Task", (), task)())
    assert checkpoints.languages("ck.pt", str(data), "test") == ("it", "es")  # the checkpoint's task
    _touch(data / "prep.env", "recipe=x\nsrc=ro\ntgt=fr\nbpe=none\n")
    assert checkpoints.languages("ck.pt", str(data), "test") == ("ro", "fr")  # prep.env first
    assert checkpoints.languages("ck.pt", str(data), "test", "a", "b") == ("a", "b")  # the options win
    os.remove(data / "prep.env")
    task.update(source_lang=None, target_lang=None)
    assert checkpoints.languages("ck.pt", str(data), "test") == ("de", "en")  # the split's files
    assert checkpoints.languages("ck.pt", str(data), "valid") == ("fr", "en")
    _touch(data / "test.fr-en.fr.idx")
    with pytest.raises(DataError, match=r"split 'test' has the language pairs de-en, fr-en; "
                                                   r"pass --src L --tgt L$"):
        checkpoints.languages("ck.pt", str(data), "test")
    with pytest.raises(DataError, match="split 'train' has no language pair"):
        checkpoints.languages("ck.pt", str(data), "train")


def test_subword_kind_from_the_model_file_or_the_dictionary(tmp_path):
    words = [f"w{i} 5" for i in range(300)]
    _touch(tmp_path / "dict.de.txt", "\n".join(words + ["stray@@ 1"]) + "\n")
    assert checkpoints.subword_kind(str(tmp_path), "de") == "none"  # one "@@" word in 301: not BPE
    _touch(tmp_path / "dict.de.txt", "\n".join(words + [f"w{i}@@ 3" for i in range(50)]) + "\n")
    assert checkpoints.subword_kind(str(tmp_path), "de") == "subword_nmt"
    _touch(tmp_path / "dict.de.txt", "\n".join(f"\u2581w{i} 5" for i in range(30)) + "\n")
    assert checkpoints.subword_kind(str(tmp_path), "de") == "sentencepiece"
    _touch(tmp_path / "code")
    assert checkpoints.subword_kind(str(tmp_path), "de") == "subword_nmt"


def test_attention_maps_picks_the_first_sentence_of_readable_length():
    class Pair:
        def __init__(self, sizes):
            self.src_sizes = sizes

        def __len__(self):
            return len(self.src_sizes)

    class Task:
        def __init__(self, sizes):
            self.pair = Pair(sizes)

        def dataset(self, split):
            return self.pair

    assert attention_maps.default_sentence(Task([5, 30, 14, 13]), "test") == 2  # 13 tokens + EOS
    assert attention_maps.default_sentence(Task([5, 9, 30, 9, 23]), "test") == 4  # 22 tokens: 2 from 20
    assert attention_maps.default_sentence(Task([5, 9, 9]), "test") == 1  # the lowest of the closest
    with pytest.raises(AnalysisError, match="--split test: no sentence"):
        attention_maps.default_sentence(Task([]), "test")


@pytest.mark.slow
def test_report_on_plain_fairseq_preprocess_output(tmp_path):
    """The report command on data binarized with fairseq-preprocess alone: every analysis
    succeeds and writes its tables and figures."""
    bin_dir = make_tiny_parallel_data(str(tmp_path), num_train=61)
    assert not os.path.exists(os.path.join(bin_dir, "prep.env"))
    assert not os.path.exists(os.path.join(bin_dir, "text"))
    # joint attention over both encoder layers: layer_dependency has two layers to mask
    ckpt = train_tiny(bin_dir, tmp_path / "ck", "--joint-attention", "hierarchical", max_update=3)
    out = tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "fairseq_ext.analysis.report", "--checkpoint", ckpt,
                           "--data", bin_dir, "--split", "test", "--run", "length_buckets", "attention_stats",
                           "attention_maps", "layer_dependency", "--out", str(out)],
                          capture_output=True, text=True, env=clean_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'class="failed"' not in page
    for name, files in (("length_buckets", ["buckets.json", "buckets.png"]),
                        ("attention_stats", ["per_layer.json", "layers.png", "heatmaps_ck.png"]),
                        ("attention_maps/ck", ["attention_maps.json", "ck_encoder_self_attention_L1.png",
                                               "ck_decoder_attention_L1.png"]),
                        ("layer_dependency", ["masking.json", "masking.png"])):
        for f in files:
            assert (out / name / f).is_file(), f"{name}/{f} missing"
    assert len(json.loads((out / "layer_dependency" / "masking.json").read_text())) == 3  # full, f^1, f^2
    buckets = json.loads((out / "length_buckets" / "buckets.json").read_text())
    assert sum(r["sentences"] for r in buckets) == 20
    maps = json.loads((out / "attention_maps" / "ck" / "attention_maps.json").read_text())
    assert maps["sentence_picked"] and maps["split"] == "test" and 0 <= maps["sentence"] < 20
    assert f"sentence {maps['sentence']} of 'test'" in (out / "attention_maps" / "ck" / "log.txt").read_text()
    # the languages from the checkpoint, no subword removal on word-level data, and the
    # reference is fairseq's T- lines: here the test targets themselves (no <unk>)
    evaluation = out / "layer_dependency" / "ck" / "full"
    generate = (evaluation / "generate-test.cmd").read_text()
    assert "--source-lang src --target-lang tgt" in generate and "--remove-bpe" not in generate
    with open(os.path.join(str(tmp_path), "raw", "test.tgt"), encoding="utf-8") as f:
        targets = sorted(f.read().splitlines())
    assert sorted(data_text.read_lines(str(evaluation / "ref.tok"))) == targets
