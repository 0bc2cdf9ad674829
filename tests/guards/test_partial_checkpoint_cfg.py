"""The save-dir lock and the resume checks (fairseq_ext/guards/resume.py) on the partial
configs that fairseq's own tests give ``checkpoint_utils.load_checkpoint`` (tests/test_train.py's
``get_mock_cfg``, tests/test_checkpoint_utils_for_task_level_attributes.py): no ``no_save``
key, ``save_dir`` None. There is nothing to lock, and fairseq's load goes on as without the plugin."""
from omegaconf import OmegaConf

from fairseq_ext.guards import resume


def test_a_config_without_save_dir_or_no_save_takes_no_lock():
    before = dict(resume._HELD)
    for checkpoint in ({"save_dir": None, "restore_file": "checkpoint_last.pt"},
                       {"save_dir": None, "no_save": False}):
        resume.hold_save_dir(OmegaConf.create({"checkpoint": checkpoint}).checkpoint)
    assert resume._HELD == before


def test_a_config_without_no_save_still_locks_its_save_dir(tmp_path):
    cfg = OmegaConf.create({"checkpoint": {"save_dir": str(tmp_path / "run")}}).checkpoint
    resume.hold_save_dir(cfg)
    key = str((tmp_path / "run").resolve())
    try:
        assert key in resume._HELD
    finally:
        resume._HELD.pop(key).release()


def test_a_config_without_save_dir_has_nothing_to_resume_from():
    cfg = OmegaConf.create({"checkpoint": {"save_dir": None, "restore_file": "checkpoint_last.pt",
                                           "finetune_from_model": "/temp/checkpoint_pretrained.pt"}}).checkpoint
    assert resume.check_restore(cfg) is None
