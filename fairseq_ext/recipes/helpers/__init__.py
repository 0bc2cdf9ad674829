"""The Python helpers the bash recipes run as plain files (``python3 PATH/corpus.py ...``), so
that a recipe's many small steps never load fairseq and torch: corpus text filters, SentencePiece,
the output-directory protocol, CPU thread counts and the compare-mt shim. They import nothing of
the package but each other; the package's commands import them as the bottom layer."""
