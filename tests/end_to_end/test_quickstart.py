"""The newcomer's path of README: `make quickstart` (here with a tiny model and a slice of
Multi30k), then "Translate your own text" with fairseq-interactive and from_pretrained."""
import subprocess
import sys

import pytest

from script_utils import SCRIPTS, needs_multi30k, run

pytestmark = pytest.mark.slow

TINY = {"LAYERS": "1", "EMBED_DIM": "16", "FFN_DIM": "32", "HEADS": "2", "MAX_UPDATE": "6", "TRAIN_MINUTES": "5",
        "BPE_MERGES": "100", "MAX_TOKENS": "600", "BEAM": "2"}


@needs_multi30k
def test_quickstart_then_translate_your_own_text(m30k_small, tmp_path):
    data, save = tmp_path / "data-bin" / "m30k", tmp_path / "checkpoints" / "qs"
    env = {**TINY, "MULTI30K_FROM": str(m30k_small), "DATA_DIR": str(data), "SAVE_DIR": str(save)}
    res = run(["bash", SCRIPTS / "quickstart.sh"], env_extra=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "reported BLEU [detok-cased]" in res.stdout + res.stderr
    assert (save / "eval-test" / ".evaluation-complete").is_file()
    assert (save / ".fairseq_ext-output").is_file() and (data / ".fairseq_ext-output").is_file()
    # a rerun with the same settings reuses data and checkpoint
    again = run(["bash", SCRIPTS / "quickstart.sh"], env_extra=env)
    assert again.returncode == 0 and "reusing" in again.stderr

    sentence = "A man in a red shirt is riding a bike.\n"
    res = run(["fairseq-interactive", data, "--user-dir", SCRIPTS.parent / "fairseq_ext", "--path",
               save / "checkpoint_best.pt", "--source-lang", "en", "--target-lang", "de", "--tokenizer", "moses",
               "--bpe", "subword_nmt", "--bpe-codes", data / "code", "--beam", "2", "--cpu"], stdin=sentence)
    assert res.returncode == 0, res.stderr[-2000:]
    assert [line for line in res.stdout.splitlines() if line.startswith("D-0\t")]
    hub = ("from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel as M\n"
           f"m = M.from_pretrained({str(save)!r}, checkpoint_file='checkpoint_best.pt', "
           f"data_name_or_path={str(data)!r}, tokenizer='moses', bpe='subword_nmt', bpe_codes={str(data / 'code')!r}, "
           "source_lang='en', target_lang='de')\n"
           f"print('OUT', m.translate({sentence.strip()!r}, beam=2))\n")
    res = subprocess.run([sys.executable, "-c", hub], capture_output=True, text=True)
    assert res.returncode == 0 and "OUT " in res.stdout, res.stderr[-2000:]
