"""make test-fairseq's comparison of a pytest junit file with expected-failures.txt
(tests/fairseq_compat/run_fairseq_tests.py), on made-up files: no download, no fairseq test."""
import importlib.util
import os

import pytest

RUNNER = os.path.join(os.path.dirname(__file__), "..", "fairseq_compat", "run_fairseq_tests.py")

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="1" tests="6">
<testcase classname="tests.test_binaries.TestTranslation" name="test_fconv" time="3.1"/>
<testcase classname="tests.test_binaries.TestTranslation" name="test_laser_lstm" time="0.2">
  <failure message="NotImplementedError">...</failure></testcase>
<testcase classname="tests.test_train" name="test_load_partial_checkpoint" time="0.1"/>
<testcase classname="tests.test_export.TestExportModels" name="test_export_transformer" time="0.1">
  <skipped message="no jit"/></testcase>
<testcase classname="" name="tests.test_average_checkpoints" time="0.0">
  <error message="collection failure">ModuleNotFoundError</error></testcase>
{extra}
</testsuite></testsuites>
"""
EXPECTED = """# node id, then its cause
tests/test_binaries.py::TestTranslation::test_laser_lstm   examples/ is not in the sdist
tests/test_average_checkpoints.py  scripts/ is not in the sdist
"""


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("run_fairseq_tests", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outcome(runner, tmp_path, extra="", expected=EXPECTED):
    (tmp_path / "junit.xml").write_text(JUNIT.format(extra=extra))
    (tmp_path / "expected.txt").write_text(expected)
    result = runner.compare(runner.read_junit(tmp_path / "junit.xml"), runner.read_expected(tmp_path / "expected.txt"))
    return result, runner.summary(result, "stock", 12.0)


def test_node_ids_from_junit(runner):
    assert runner.node_id("tests.test_binaries.TestTranslation", "test_fconv") == \
        "tests/test_binaries.py::TestTranslation::test_fconv"
    assert runner.node_id("tests.test_train", "test_load_partial_checkpoint") == \
        "tests/test_train.py::test_load_partial_checkpoint"
    assert runner.node_id("", "tests.test_average_checkpoints") == "tests/test_average_checkpoints.py"


def test_expected_failures_pass_the_run(runner, tmp_path):
    result, (text, status) = outcome(runner, tmp_path)
    assert status == 0
    assert result["expected_failures"] == ["tests/test_average_checkpoints.py",
                                           "tests/test_binaries.py::TestTranslation::test_laser_lstm"]
    assert result["skipped"] == ["tests/test_export.py::TestExportModels::test_export_transformer"]
    assert text.splitlines()[-1] == ("fairseq's tests, stock: 2 passed, 2 failed as expected, 0 unexpected "
                                     "failures, 0 unexpected passes, 1 skipped in 12 s")


def test_an_unlisted_failure_fails_the_run(runner, tmp_path):
    failing = ('<testcase classname="tests.test_iterators.TestIterators" name="test_counting_iterator" time="0">'
               '<failure message="assert">x</failure></testcase>')
    result, (text, status) = outcome(runner, tmp_path, extra=failing)
    assert status == 1
    assert "UNEXPECTED FAILURE: tests/test_iterators.py::TestIterators::test_counting_iterator" in text


def test_a_listed_test_that_passes_fails_the_run(runner, tmp_path):
    expected = EXPECTED + "tests/test_binaries.py::TestTranslation::test_fconv  was broken once\n"
    result, (text, status) = outcome(runner, tmp_path, expected=expected)
    assert status == 1
    assert result["unexpected_passes"] == ["tests/test_binaries.py::TestTranslation::test_fconv"]
    assert "UNEXPECTED PASS (remove it from expected-failures.txt): " \
           "tests/test_binaries.py::TestTranslation::test_fconv" in text


def test_a_listed_test_not_run_is_reported(runner, tmp_path):
    expected = EXPECTED + "tests/test_binaries.py::TestTranslation::test_gone  renamed upstream\n"
    result, (text, status) = outcome(runner, tmp_path, expected=expected)
    assert result["not_run"] == ["tests/test_binaries.py::TestTranslation::test_gone"]
    assert "listed but not run: tests/test_binaries.py::TestTranslation::test_gone" in text


def test_no_test_at_all_fails_the_run(runner):
    result = runner.compare({}, {})
    assert runner.summary(result, "stock", 1.0)[1] == 1


def test_the_sdist_file_name_matches_the_spec(runner, tmp_path):
    (tmp_path / "fairseq_fixed-0.12.3.1.tar.gz").write_bytes(b"")
    assert runner.sdist_path("fairseq-fixed==0.12.3.1", str(tmp_path)) == str(tmp_path / "fairseq_fixed-0.12.3.1.tar.gz")
    with pytest.raises(SystemExit, match="name==version"):
        runner.sdist_path("fairseq-fixed>=0.12", str(tmp_path))
