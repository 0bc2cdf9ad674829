"""The ground floor of the package, torch-free: the Python helpers the bash recipes run as plain files (``python3
PATH/corpus.py ...``), so that a recipe's many small steps never load fairseq and torch, and that every command imports
as its bottom layer: corpus text filters, Moses, SentencePiece, sacreBLEU, the output-directory protocol, CPU thread
counts and the compare-mt shim. They import nothing of the package but each other."""
