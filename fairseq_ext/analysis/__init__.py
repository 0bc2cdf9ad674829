"""The analyses of the papers as commands, ``python -m fairseq_ext.analysis.NAME`` (one module
each, found by :mod:`fairseq_ext.analysis.registry`), and :class:`AnalysisError`, the error they
raise about what their user can fix."""
from fairseq_ext.errors import FairseqExtError


class AnalysisError(FairseqExtError):
    pass
