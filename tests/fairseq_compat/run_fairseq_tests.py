#!/usr/bin/env python
"""``make test-fairseq``: a CPU selection of fairseq's own test suite, with fairseq_ext loaded
(``--plugin``, the default) or stock (``--stock``), checked against
``expected-failures.txt``.

fairseq's tests come from the sdist of ``--spec`` on the package index (the file ``make setup``
installs fairseq from), downloaded once into ``build/fairseq-sdist/``; its ``tests/`` is
unpacked into ``build/fairseq-tests/<sdist>/`` with what the sdist leaves out: an empty
``tests/__init__.py`` (the tests import each other as ``tests.*``) and ``tests/utils.py``,
which hands over to ``sdist_test_helpers.py`` beside this file. pytest runs there with
``--junitxml``; every test that fails (or a file that does not collect) and is not listed in
``expected-failures.txt`` fails the run, and so does every listed test that passes.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXPECTED = os.path.join(HERE, "expected-failures.txt")

# fairseq's test files run, and the tests among them left out (too slow for the CPU run, or
# needing what no CPU has); pytest node ids relative to the sdist's root
SELECTION = (
    "tests/test_binaries.py",
    "tests/test_train.py",
    "tests/test_checkpoint_utils.py",
    "tests/test_checkpoint_utils_for_task_level_attributes.py",
    "tests/test_sequence_generator.py",
    "tests/test_average_checkpoints.py",
    "tests/test_export.py",
    "tests/test_iterators.py",
    "tests/test_reproducibility.py",
    "tests/test_valid_subset_checks.py",
    "tests/test_inference_dropout.py",
    "tests/test_dictionary.py",
    "tests/test_data_utils.py",
    "tests/test_utils.py",
    "tests/test_metrics.py",
    "tests/test_ema.py",
    "tests/test_activation_checkpointing.py",
)
DESELECTED = (
    "tests/test_binaries.py::TestTranslation::test_insertion_transformer",  # 215 s alone
    "tests/test_data_utils.py::TestBatchBySizeVec::test_compare_with_baseline",  # 55 s
    "tests/test_data_utils.py::TestBatchBySizeFn::test_compare_with_baseline",  # 40 s
    # random: a draw that keeps no layer leaves the encoder output without a tensor (StopIteration)
    "tests/test_binaries.py::TestTranslation::test_multilingual_translation_latent_depth",
)

UTILS_PY = '''"""fairseq's sdist does not ship tests/utils.py: its command helpers, rewritten in
fairseq_ext's tests/fairseq_compat/sdist_test_helpers.py (written by run_fairseq_tests.py)."""
import sys

import sdist_test_helpers

sys.modules[__name__] = sdist_test_helpers
'''
PYTEST_INI = "[pytest]\n# written by fairseq_ext's tests/fairseq_compat/run_fairseq_tests.py\n"


def normalized(project):
    """A project name as sdist file names spell it (PEP 503, with ``_``)."""
    return re.sub(r"[-_.]+", "_", project).lower()


def sdist_name(filename):
    """(normalized project, version) of an sdist's file name: ``fairseq_fixed-0.12.3.1.tar.gz``
    -> ``("fairseq_fixed", "0.12.3.1")``."""
    project, _, version = filename[:-len(".tar.gz")].rpartition("-")
    return normalized(project), version


def sdist_path(spec, sdist_dir):
    """The sdist of ``spec`` (``name==version``) in ``sdist_dir``, downloaded with pip when
    it is not there yet."""
    match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([A-Za-z0-9_.+-]+)\s*", spec)
    if not match:
        raise SystemExit(f"--spec {spec!r}: give one pinned version, name==version")
    wanted = (normalized(match.group(1)), match.group(2))

    def found():
        return [path for path in sorted(glob.glob(os.path.join(sdist_dir, "*.tar.gz")))
                if sdist_name(os.path.basename(path)) == wanted]

    if not found():
        os.makedirs(sdist_dir, exist_ok=True)
        print(f"downloading the sdist of {spec} into {sdist_dir}", flush=True)
        # no build isolation: pip reads the sdist's metadata with the venv's own setuptools,
        # torch and cython instead of building numpy for an isolated environment
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "--no-build-isolation", spec, "-d", sdist_dir], check=True)
    paths = found()
    if not paths:
        raise SystemExit(f"pip left no sdist of {spec} in {sdist_dir}")
    return paths[0]


def unpack_tests(sdist, tests_dir):
    """The root folder holding ``tests/`` of ``sdist``, unpacked under ``tests_dir`` once,
    with ``tests/__init__.py``, ``tests/utils.py`` (when absent) and a ``pytest.ini``."""
    root = os.path.join(tests_dir, os.path.basename(sdist)[:-len(".tar.gz")])
    stamp = os.path.join(root, ".unpacked")
    if os.path.exists(stamp):
        return root
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.split("/")[1:2] == ["tests"]]
        for member in members:
            member.name = member.name.split("/", 1)[1]
        os.makedirs(root, exist_ok=True)
        tar.extractall(root, members=members, filter="data")
    for name, text in (("tests/__init__.py", ""), ("tests/utils.py", UTILS_PY), ("pytest.ini", PYTEST_INI)):
        path = os.path.join(root, name)
        if not os.path.exists(path):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    open(stamp, "w").close()
    return root


def node_id(classname, name):
    """The pytest node id of a junit ``testcase`` (``tests.test_x.TestY`` + ``test_z`` ->
    ``tests/test_x.py::TestY::test_z``); a file that did not collect has no classname."""
    if not classname:
        return name.replace(".", "/") + ".py"
    parts = classname.split(".")
    module = next((i for i, part in enumerate(parts) if part.startswith("test_") or part.endswith("_test")),
                  len(parts) - 1)
    return "::".join(["/".join(parts[:module + 1]) + ".py"] + parts[module + 1:] + [name])


def read_junit(path):
    """``{node id: "passed" | "failed" | "skipped"}`` of a pytest ``--junitxml`` file; an
    error (collection, setup, teardown) counts as failed."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        node = node_id(case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        if outcomes.get(node) != "failed":
            outcomes[node] = outcome
    return outcomes


def read_expected(path):
    """``{node id: cause}`` of ``expected-failures.txt``: one test a line, its node id then its
    cause; ``#`` starts a comment."""
    expected = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                node, _, cause = line.partition(" ")
                expected[node] = cause.strip()
    return expected


def compare(outcomes, expected):
    """The outcomes sorted against the list: a dict of ``passed``, ``skipped``,
    ``expected_failures``, ``unexpected_failures``, ``unexpected_passes`` (node ids) and
    ``not_run`` (listed ids with no outcome)."""
    result = {key: [] for key in ("passed", "skipped", "expected_failures", "unexpected_failures",
                                  "unexpected_passes", "not_run")}
    for node, outcome in sorted(outcomes.items()):
        if outcome == "skipped":
            result["skipped"].append(node)
        elif outcome == "failed":
            result["expected_failures" if node in expected else "unexpected_failures"].append(node)
        else:
            result["unexpected_passes" if node in expected else "passed"].append(node)
    result["not_run"] = sorted(set(expected) - set(outcomes))
    return result


def summary(result, label, seconds):
    """The closing lines, and the exit status: 1 on an unexpected failure or pass."""
    lines = []
    for key, title in (("unexpected_failures", "UNEXPECTED FAILURE"),
                       ("unexpected_passes", "UNEXPECTED PASS (remove it from expected-failures.txt)")):
        lines += [f"{title}: {node}" for node in result[key]]
    lines += [f"listed but not run: {node}" for node in result["not_run"]]
    lines.append(f"fairseq's tests, {label}: {len(result['passed'])} passed, "
                 f"{len(result['expected_failures'])} failed as expected, "
                 f"{len(result['unexpected_failures'])} unexpected failures, "
                 f"{len(result['unexpected_passes'])} unexpected passes, {len(result['skipped'])} skipped "
                 f"in {seconds:.0f} s")
    ran = sum(len(result[key]) for key in result if key != "not_run")
    if not ran:
        lines.append("no test ran")
    ok = ran and not result["unexpected_failures"] and not result["unexpected_passes"]
    return "\n".join(lines), 0 if ok else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--plugin", dest="plugin", action="store_true", default=True,
                      help="fairseq_ext imported and --user-dir added (default)")
    mode.add_argument("--stock", dest="plugin", action="store_false",
                      help="fairseq alone, with torch's weights_only check off as fairseq 0.12 needs it")
    parser.add_argument("--spec", default="fairseq-fixed==0.12.3.1", help="the fairseq release (name==version)")
    parser.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    parser.add_argument("--workers", default="2", help="pytest-xdist workers (0: one process)")
    parser.add_argument("--expected", default=EXPECTED)
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)

    sdist = sdist_path(args.spec, os.path.join(args.build_dir, "fairseq-sdist"))
    root = unpack_tests(sdist, os.path.join(args.build_dir, "fairseq-tests"))
    junit = os.path.join(root, "junit-plugin.xml" if args.plugin else "junit-stock.xml")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
               "-o", "junit_family=xunit2", "--continue-on-collection-errors"]
    if args.workers != "0":
        command += ["-n", args.workers, "--dist", "load"]  # test_binaries alone is most of the time
    if args.plugin:
        command += ["-p", "fairseq_ext_loaded"]
        env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin loads checkpoints safely itself
    else:
        env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # stock fairseq 0.12 cannot load under weights_only
    command += [f"--deselect={node}" for node in DESELECTED] + list(SELECTION) + args.pytest_args
    label = "fairseq_ext loaded" if args.plugin else "stock (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1)"
    print(f"{label}: running in {root}\n$ {' '.join(command)}", flush=True)
    if os.path.exists(junit):
        os.remove(junit)
    start = time.monotonic()
    subprocess.run(command, cwd=root, env=env)
    seconds = time.monotonic() - start
    if not os.path.exists(junit):
        print(f"pytest wrote no {junit}")
        return 1
    result = compare(read_junit(junit), read_expected(args.expected))
    text, status = summary(result, label, seconds)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
