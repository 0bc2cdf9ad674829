"""No sentence dropped by fairseq batch_by_size (issue 8 item 2)."""
