"""Reading and writing examples: Examples splits (examples_io), TFRecord framing (tfrecords), and the Beam local-runner fix (beam_runtime)."""
