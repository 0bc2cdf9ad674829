"""``python -m fairseq_ext COMMAND ...``: the same as ``fairseq-ext COMMAND ...``."""
import sys

from fairseq_ext.cli import main

sys.exit(main())
