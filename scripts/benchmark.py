#!/usr/bin/env python
"""``fairseq-ext benchmark`` from a checkout: see fairseq_ext/selfcheck/benchmark.py."""
from fairseq_ext.selfcheck.benchmark import main

if __name__ == "__main__":
    raise SystemExit(main())
