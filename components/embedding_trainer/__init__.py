"""Training: the DLRM-style ranking model with TPU embeddings, run by TFX's standard Trainer."""
