"""The analyses of the papers as commands, ``python -m fairseq_ext.analysis.NAME``: one module
an analysis, each declaring its ``ANALYSIS`` (:mod:`fairseq_ext.analysis.registry` finds
them), on the pieces they share (command, capture, decoding, figures).

:class:`AnalysisError` is the error every one of them raises about what its user can fix.
"""
from fairseq_ext.errors import FairseqExtError


class AnalysisError(FairseqExtError):
    pass
