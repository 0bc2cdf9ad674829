"""``fairseq-ext selfcheck-pack`` says what it is doing, a line a step, and a pack without wheels
(``--no-wheels``) gets an install.sh and instructions that work without them."""
import os
import subprocess

from fairseq_ext.selfcheck import pack

RUN = subprocess.run  # the real one, for the shell that sources install.sh


def fake_run(cmd, **kwargs):
    """pip download writes a wheel into its -d folder; a recipe succeeds without running."""
    if "download" in cmd:
        open(os.path.join(cmd[cmd.index("-d") + 1], cmd[-1].split("==")[0] + ".whl"), "w").close()
    return subprocess.CompletedProcess(cmd, 0, "", "")


def test_the_pack_says_each_step_and_a_pack_without_wheels_installs_none(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pack.subprocess, "run", fake_run)
    data_only = tmp_path / "data-only"
    assert pack.main(["--out", str(data_only), "--no-wheels"]) == 0
    err = capsys.readouterr().err
    for i, folder in enumerate(pack.DATASETS, 1):
        assert f"fairseq-ext selfcheck-pack: data set {i} of 2: preparing {folder}" in err
    install = (data_only / "install.sh").read_text()
    assert "pip" not in install and "wheels/" not in install
    readme = (data_only / "README.md").read_text()
    assert "--no-wheels`: data only, for a Python with fairseq" in readme and "source PACK/install.sh" in readme
    # sourcing it in the checkout works and puts the checkout on PYTHONPATH (pip had no wheels/* to install)
    res = RUN(["bash", "-c", f"source {data_only / 'install.sh'} && echo \"$PYTHONPATH\""], cwd=tmp_path,
              capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert res.returncode == 0 and res.stdout.strip() == str(tmp_path), res.stderr

    full = tmp_path / "full"
    assert pack.main(["--out", str(full), "--no-data"]) == 0
    err = capsys.readouterr().err
    for i, spec in enumerate(pack.WHEELS, 1):
        assert f"fairseq-ext selfcheck-pack: wheel {i} of {len(pack.WHEELS)}: {spec} for Python 3.12" in err
    assert "--no-index" in (full / "install.sh").read_text()
    assert "On the machine without a registry" in (full / "README.md").read_text()
