#!/usr/bin/env python3
"""Run compare-mt (0.2.10) for fairseq-ext significance (compare.py): its ROUGE module imports
`six`, which compare-mt does not declare, so where `six` is missing this shim registers a minimal
stand-in (only what compare_mt/rouge uses) before compare-mt's own main() (docs/evaluation.md).

Usage: compare_mt_shim.py [compare-mt arguments]
"""
import importlib
import sys
import types


def _install_six_stub():
    try:
        importlib.import_module("six")
        return
    except ImportError:
        pass
    six = types.ModuleType("six")

    def ensure_str(s, encoding="utf-8", errors="strict"):
        return s.decode(encoding, errors) if isinstance(s, bytes) else s

    six.ensure_str = ensure_str
    six.iteritems = lambda d, **kw: iter(d.items(**kw))
    six.iterkeys = lambda d, **kw: iter(d.keys(**kw))
    six.itervalues = lambda d, **kw: iter(d.values(**kw))
    six.PY3 = True
    six.string_types = (str,)
    moves = types.ModuleType("six.moves")
    moves.map, moves.range, moves.xrange, moves.zip = map, range, range, zip
    six.moves = moves
    sys.modules["six"] = six
    sys.modules["six.moves"] = moves


def main():
    _install_six_stub()
    import matplotlib

    matplotlib.use("Agg")  # no display on servers/CI
    from compare_mt.compare_mt_main import main as compare_mt_main

    sys.argv[0] = "compare-mt"
    compare_mt_main()


if __name__ == "__main__":
    main()
