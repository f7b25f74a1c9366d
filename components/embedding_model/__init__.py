"""The ranking model and its checkpoints, below both the trainer and the exporter.

What both need and neither owns: the towers and embedding front-ends (model.py: TPU embedding,
TensorCore tables, serving tables), the model's input (input.py), the embedding optimizers and
their clipping rule (optimizers.py), the plan rendered into TensorFlow objects (tf_objects.py), the
checkpoint layouts and how tables are read from them (layouts.py, sparsecore_layout.py,
checkpoint_index.py), the CPU model rebuilt from a checkpoint (restore.py), and how a serving module
is saved (saving.py). The trainer and the exporter import this package and never each other.
"""
