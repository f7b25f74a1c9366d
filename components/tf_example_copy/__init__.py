"""TFExampleCopy: chosen splits of an Examples artifact re-encoded as tf.Example TFRecords (what TFMA's
Evaluator needs to feed a TensorFlow model raw records; pipelines/evaluation.py says why)."""
