"""The names this plugin adds to fairseq's data structures, in one place.

fairseq passes the encoder output, the decoder's ``extra`` output and the batch's
``net_input`` around as dictionaries; these are the keys the plugin adds to them.
"""

# encoder_out (Dict[str, List[Tensor]]), built by the encoder, reordered with the beam
ENCODER_STATES = "encoder_states"  # fairseq's own key: [embeddings, layer 1, ..., layer L], T x B x C
JOINT_MEMORY = "joint_memory"  # the decoder's source memory of a --joint-attention strategy
JOINT_PADDING_MASK = "joint_padding_mask"  # multi-source translation: B x n x J, one row per source

# the decoder's extra output (net_output[1])
AUX_OUT = "aux_out"  # logits of each auxiliary decoder, B x Z x V (the multi-output loss reads them)
AUX_FEATURES = "aux_features"  # their final states, B x Z x C

# net_input of a multi_source_translation batch
EXTRA_SRC_TOKENS = "extra_src_tokens"  # B x (n-1) x J', the sources after the first
