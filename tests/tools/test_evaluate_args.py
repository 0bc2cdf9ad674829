"""The argument handling of ``fairseq-ext evaluate`` (fairseq_ext/tools/evaluate.py) and
``fairseq-ext significance`` (fairseq_ext/tools/compare.py), up to the point where
fairseq-generate or the comparison would run."""
import pytest

from fairseq_ext.common import data_text
from fairseq_ext.errors import CommandError
from fairseq_ext.tools import compare, evaluate
from fairseq_ext.tools.evaluate import EvaluationError, generate_command, parse_args, plan


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "prep.env").write_text("# written by prepare-iwslt14.sh\nrecipe=iwslt14\nsrc=de\ntgt=en\nbpe=sentencepiece\n")
    (d / "test.de-en.de.idx").write_bytes(b"")
    ckpt = tmp_path / "ckpt" / "checkpoint_best.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"x")
    return d, ckpt


def test_our_options_and_their_aliases_everything_else_to_fairseq_generate(capsys):
    opts = parse_args(["--path", "a.pt", "--data", "d", "--gen-subset", "valid", "-s", "de", "-t", "en", "--beam",
                       "6", "--cpu", "--model-overrides", "{'x': 1}", "--", "--lenpen", "1.1", "--out", "x"])
    assert (opts.checkpoint, opts.data, opts.split, opts.src, opts.tgt, opts.out) == ("a.pt", "d", "valid", "de",
                                                                                       "en", "")
    # after a lone --, everything goes to fairseq-generate, ours included
    assert opts.generate_args == ["--beam", "6", "--cpu", "--model-overrides", "{'x': 1}", "--lenpen", "1.1",
                                  "--out", "x"]
    with pytest.raises(SystemExit) as e:
        parse_args(["--help"])
    assert e.value.code == 0 and "--shuffle-source" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--remove-bpe", "--user-dir"])
def test_flags_set_by_evaluate_itself_are_refused(flag):
    with pytest.raises(EvaluationError, match=f"^{flag} is set by fairseq-ext evaluate itself \\(use --bpe"):
        parse_args(["--checkpoint", "a.pt", flag, "x"])


def test_a_missing_value_and_missing_required_options():
    with pytest.raises(CommandError, match="^argument --split/--gen-subset: expected one argument$"):
        parse_args(["--gen-subset"])
    with pytest.raises(EvaluationError, match="^--checkpoint is required$") as e:
        plan(parse_args(["--data", "d"]))
    assert e.value.usage


def test_defaults_come_from_prep_env(data):
    d, ckpt = data
    p = plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d), "--max-tokens", "100"]))
    assert (p.src, p.tgt, p.headline, p.out) == ("de", "en", "tok-lc", str(ckpt.parent / "eval-test"))  # no test_set
    cmd = generate_command(p, "/pkg")
    assert cmd[:10] == ["fairseq-generate", str(d), "--user-dir", "/pkg", "--path", str(ckpt), "--gen-subset", "test",
                        "--source-lang", "de"]
    # the subword kind of prep.env; --beam 5 by default, no --batch-size beside --max-tokens
    assert cmd[10:] == ["--target-lang", "en", "--remove-bpe", "sentencepiece", "--beam", "5", "--max-tokens", "100"]
    p = plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d), "--bpe", "none", "--beam", "2",
                         "--headline", "detok-cased", "--tgt", "de", "--src", "en"]))
    assert p.headline == "detok-cased"
    assert generate_command(p, "/pkg")[10:] == ["--target-lang", "de", "--batch-size", "128", "--beam", "2"]


@pytest.mark.parametrize("recipe,pair,want", [("iwslt14", "de-en", "tok-lc"), ("iwslt14", "es-en", "tok-cased"),
                                              ("iwslt-fr-ro", "fr-ro", "tok-cased"),
                                              ("iwslt15-en-vi", "en-vi", "detok-cased"),
                                              ("wmt14-en-de", "en-de", "detok-cased"), ("", "en-de", "detok-cased")])
def test_the_reported_flavour_follows_the_recipe(recipe, pair, want):
    assert data_text.headline_for(recipe, *pair.split("-"))[0] == want


@pytest.mark.parametrize("argv,message", [
    (["--checkpoint", "missing.pt"], "checkpoint not found: missing.pt"),
    (["--data", "nowhere"], "data directory not found: nowhere"),
    (["--split", "valid"], "no binarized split 'valid' in "),
    (["--bpe", "wordpiece"], "--bpe must be subword_nmt, sentencepiece or none"),
    (["--headline", "chrf"], "--headline must be one of detok-cased, detok-lc, tok-cased, tok-lc, not 'chrf'"),
    (["--ref-tok", "missing.en"], "--ref-tok missing.en: no such file"),
    (["--shuffle-source", "fr"], "--shuffle-source fr: "),
    (["--unshuffled", "x"], "--unshuffled is for the adversarial evaluation (--shuffle-source L)"),
])
def test_errors_before_anything_runs(data, argv, message):
    d, ckpt = data
    with pytest.raises(EvaluationError) as e:
        plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d), *argv]))
    assert str(e.value).startswith(message), str(e.value)


def test_multi_source_data_sets_the_task_and_the_adversarial_output(data):
    d, ckpt = data
    with open(d / "prep.env", "a") as f:
        f.write("extra_src=fr,cs\n")
    p = plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d), "--shuffle-source", "fr"]))
    assert p.out == str(ckpt.parent / "eval-test-shuffle-fr") and p.shuffle_seed == "1" and not p.unshuffled
    cmd = generate_command(p, "/pkg")
    assert cmd[cmd.index("--task"):cmd.index("--task") + 4] == ["--task", "multi_source_translation",
                                                                "--extra-source-langs", "fr,cs"]


def test_main_is_one_error_line_with_status_1(data, capsys):
    d, ckpt = data
    assert evaluate.main(["--checkpoint", str(ckpt), "--data", str(d), "--split", "valid"]) == 1
    assert capsys.readouterr().err == f"fairseq-ext evaluate: error: no binarized split 'valid' in {d}\n"
    # a usage error: the usage, then the one error line, from main as from the plan
    assert evaluate.main(["--split"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("usage: fairseq-ext evaluate --checkpoint CKPT")
    assert err[-1] == "fairseq-ext evaluate: error: argument --split/--gen-subset: expected one argument"


@pytest.mark.parametrize("argv,message", [
    (["--ref", "r"], "--out DIR is required"),
    (["--out", "o", "--names", "one"], '--names takes two names, e.g. --names "baseline mlmha"'),
    (["--out", "o", "--samples", "many"], "--samples takes an integer, not 'many'"),
    (["--out", "o", "--samples", "-5"], "--samples must be at least 1, not -5"),
    (["--out", "o", "--seed", "-1"], "--seed must be at least 0, not -1"),
    (["--out", "o", "--level", "bpe"], "--level must be tok or detok"),
    (["--out", "o", "--eval-a", "a"], "give both --eval-a and --eval-b"),
    (["--out", "o", "--eval-a", "a", "--eval-b", "b", "--sys-a", "x"],
     "use either --eval-a/--eval-b or --sys-a/--sys-b, not both"),
    (["--out", "o", "--ref", "r"], "need --ref, --sys-a and --sys-b (or --eval-a/--eval-b)"),
])
def test_significance_options(argv, message):
    with pytest.raises(compare.CompareError) as e:
        compare.check(compare.parse_args(argv))
    assert str(e.value) == message
    with pytest.raises(CommandError, match="^unrecognized arguments: --bogus$"):
        compare.parse_args(["--bogus"])
    opts = compare.parse_args(["--lc", "--paired-ar", "--out", "o", "--", "--compare_word_accuracies"])
    assert (opts.lc, opts.method, opts.compare_mt_args) == (True, "ar", ["--compare_word_accuracies"])


def test_the_command_file_quotes_as_bash_printf_q():
    import subprocess

    for arg in ["fr,de", "{'max_source_positions': 1024}", "plain", "~x", "a=~b", "#c", "d#", "x y", ""]:
        want = subprocess.run(["bash", "-c", 'printf %q "$1"', "x", arg], capture_output=True, text=True).stdout
        assert evaluate.shell_quote(arg) == want, arg


@pytest.mark.parametrize("recipe,pair,want", [("multi30k", "de-en", "detok-lc"), ("iwslt14", "es-en", "tok-lc"),
                                              ("iwslt14", "de-en", "tok-lc"), ("wmt14-en-de", "en-de", "detok-lc")])
def test_lowercased_data_gets_a_lowercased_flavour_by_default(recipe, pair, want):
    """A lowercase system against cased references (1.95 where tok-lc says 4.18 on the same
    hypotheses) is not the score of the system: prep.env's lowercase=1 lowercases the default."""
    flavour, note = data_text.headline_for(recipe, *pair.split("-"), lowercase=True)
    assert flavour == want and "lowercased" in note


def test_prep_envs_lowercase_reaches_the_reported_flavour(data):
    d, ckpt = data
    (d / "prep.env").write_text("# written by prepare-multi30k.sh\nrecipe=multi30k\nsrc=de\ntgt=en\n"
                                "bpe=sentencepiece\n")
    assert plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d)])).headline == "detok-cased"
    with open(d / "prep.env", "a") as f:
        f.write("lowercase=1\n")
    assert plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d)])).headline == "detok-lc"
    # an explicit --headline still wins
    assert plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d), "--headline", "detok-cased"])).headline \
        == "detok-cased"


def test_the_default_output_is_keyed_by_the_test_set(data, tmp_path):
    """Every Multi30k test set binarizes to split 'test': the default directory is named after
    the set prep.env records, so scoring test_2017_mscoco keeps test_2016_flickr's result."""
    d, ckpt = data
    other = tmp_path / "mscoco"
    other.mkdir()
    for path, test_set in ((d, "test_2016_flickr"), (other, "test_2017_mscoco")):
        (path / "prep.env").write_text(f"# written by prepare-multi30k.sh\nrecipe=multi30k\nsrc=de\ntgt=en\n"
                                       f"valid_set=val\ntest_set={test_set}\n")
        (path / "test.de-en.de.idx").write_bytes(b"")
    first = plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d)])).out
    second = plan(parse_args(["--checkpoint", str(ckpt), "--data", str(other)])).out
    assert (first, second) == (str(ckpt.parent / "eval-test_2016_flickr"), str(ckpt.parent / "eval-test_2017_mscoco"))
    # odd characters of a set name stay out of the path; a split without a recorded set keeps its name
    assert evaluate.result_key({"test_set": "dev2010+tst2010/2012"}, "test") == "dev2010+tst2010_2012"
    assert evaluate.result_key({"test_set": "x"}, "test1") == "test1"


def test_a_default_output_holding_other_data_is_refused_not_replaced(data, tmp_path):
    d, ckpt = data
    out = ckpt.parent / "eval-test"
    out.mkdir()
    (out / ".evaluation-complete").write_text(f"checkpoint={ckpt}\ndata={tmp_path / 'elsewhere'}\nsplit=test\n")
    with pytest.raises(EvaluationError, match=f"^refusing to replace {out}: it holds the evaluation of 'test' of "
                                              f"{tmp_path / 'elsewhere'}, not of 'test' of {d.resolve()}; pass --out"):
        plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d)]))
    # the same data again is its own result to replace; an explicit --out is the user's choice
    (out / ".evaluation-complete").write_text(f"checkpoint={ckpt}\ndata={d.resolve()}\nsplit=test\n")
    assert plan(parse_args(["--checkpoint", str(ckpt), "--data", str(d)])).out == str(out)


def test_model_overrides_of_the_generate_args_and_of_the_caller_are_merged(monkeypatch):
    """An analysis' own overrides (layer masking) on top of a table's (more positions): one
    --model-overrides, since fairseq-generate would keep only the last of two."""
    from fairseq_ext.tools import evaluate as evaluation

    args, given = evaluation._without_overrides(
        ["--beam", "6", "--model-overrides", "{'max_source_positions': 1024}", "--lenpen", "1.1"])
    assert args == ["--beam", "6", "--lenpen", "1.1"] and given == {"max_source_positions": 1024}
    with pytest.raises(evaluation.EvaluationError, match="not a literal dict"):
        evaluation._without_overrides(["--model-overrides", "__import__('os')"])

    class Parsed(Exception):
        pass

    def parse_args(argv):
        raise Parsed(argv)

    monkeypatch.setattr(evaluation, "parse_args", parse_args)
    with pytest.raises(Parsed) as parsed:
        evaluation.evaluate("c.pt", "d", generate_args=["--model-overrides", "{'max_source_positions': 1024}"],
                            model_overrides={"mask_source_layer": 2})
    argv = parsed.value.args[0]
    assert argv.count("--model-overrides") == 1
    assert eval(argv[argv.index("--model-overrides") + 1]) == {"max_source_positions": 1024, "mask_source_layer": 2}
