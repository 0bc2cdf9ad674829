"""pytest plugin (``-p fairseq_ext_loaded``) that runs fairseq's own tests with fairseq_ext
loaded, as a user's ``fairseq-train --user-dir fairseq_ext`` has it.

It imports ``fairseq_ext`` when pytest loads it, before any test file imports fairseq's
modules, so that the plugin's guards are installed for every test; and it makes
``fairseq.options.parse_args_and_arch``, through which fairseq's tests (and their helpers)
build every train, validate, generate and eval-lm argument list, add ``--user-dir <this
fairseq_ext>`` to an explicit argument list that has none. A test that names its own
``--user-dir`` (fairseq's examples) keeps it: fairseq takes one.
"""
import os

import fairseq_ext
from fairseq import options

USER_DIR = os.path.dirname(os.path.abspath(fairseq_ext.__file__))


def with_user_dir(input_args):
    """``input_args`` with ``--user-dir USER_DIR`` in front, unless it names one or is None
    (fairseq then reads ``sys.argv``, which is pytest's)."""
    if input_args is None:
        return None
    input_args = list(input_args)
    if any(arg == "--user-dir" or str(arg).startswith("--user-dir=") for arg in input_args):
        return input_args
    return ["--user-dir", USER_DIR] + input_args


def _adding_user_dir(original):
    def parse_args_and_arch(parser, input_args=None, *args, **kwargs):
        return original(parser, with_user_dir(input_args), *args, **kwargs)

    parse_args_and_arch.wrapped = original
    return parse_args_and_arch


if not hasattr(options.parse_args_and_arch, "wrapped"):
    options.parse_args_and_arch = _adding_user_dir(options.parse_args_and_arch)


def pytest_report_header(config):
    return f"fairseq_ext loaded from {USER_DIR}; --user-dir added to fairseq's argument lists"
