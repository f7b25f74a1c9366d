"""The ranking model and its checkpoints, below both the trainer and the exporter.

What both need and neither owns: the training model (model.py: TPU embedding and TensorCore tables)
and the serving model (serving_model.py: plain, stacked or compressed tables), the dense tower they
share (dense_tower.py) and their pooled lookups (lookups.py), the model's input (input.py), the
embedding optimizers and their clipping rule (optimizers.py), the plan rendered into TensorFlow
objects (tf_objects.py), where the model's variables are in a checkpoint (checkpoint_keys.py), the
checkpoint layouts and how tables are read from them (layouts.py, sparsecore_layout.py,
checkpoint_index.py, sparsecore_state.py), the CPU model rebuilt from a checkpoint (restore.py), and
how a serving module is saved (saving.py). The trainer and the exporter import this package and
never each other.
"""
