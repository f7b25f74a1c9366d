"""The dense serving model: the ranking model without its embedding tables, for tables served from a store.

A stock-TF SavedModel (no custom ops) whose signature `serve_vectors` takes:

- every dense column as the full model's `serve_features` takes it (float32 [batch], NaN =
  missing; the dense rules D1-D5 and the dense features' bucket embeddings stay inside: they are
  small and keyed by value, not by a vocabulary);
- every categorical feature's pooled vector, float32 [batch, dim], and every wide feature's pooled
  dim-1 weight, float32 [batch, 1]. The wide part's dim-1 tables are served from the store too: each
  is as long as its feature's vocabulary, and keeping it inside would ship that whole vocabulary in
  the model, which is what the store is for;
- a sequence feature (pooled by attention or by mean over its positions) takes its per-position
  vectors, float32 [batch, max_sequence_length, dim] (zeros after a row's last token; its wide
  part [batch, length, 1]), and its positions' count under `<input>__length`, int64 [batch]: the
  pooling layer is trained and stays inside, so the store returns one row per position.

It returns {"probabilities": float32 [batch, 1]}, the full model's output for the same rows.
`store_inputs.json` beside it says, for every input, its feature, raw column, table, separator,
max_length, weight column, combiner and sequence length: how a client turns a request's raw values
into the store keys and the pooled inputs (store_client.py does it, rule for rule).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.contracts.manifest import VocabularyManifest
from components.embedding_model.dense_tower import BATCH_KEY
from components.embedding_model.input import length_key
from components.embedding_exporter.serving import RawFeatureTransform
from components.rules.names import serving_input_names

STORE_INPUTS_FILE = "store_inputs.json"
STORE_MODEL_DIR = "dense_model"
LENGTH_SUFFIX = "__length"


def vector_inputs(model, manifest: VocabularyManifest) -> List[Dict[str, Any]]:
    """Every pooled-vector input of the dense model, in the model's feature order, with the rules
    a client applies to fill it.

    Args:
      model: the serving ranking model (its `model_features`).
      manifest: the vocabulary manifest.

    Returns:
      One record per categorical and wide feature: input, feature, table, dim, combiner, column,
      kind (the column's raw kind, how a request's string is read: rulebook J1-J3), separator, max_length, weight_column, sequence_length (0: pooled), wide_of (the feature whose
      tokens a wide feature reads).
    """
    f = model.model_features
    by_name = {c.name: c for c in manifest.categorical_features}
    features = list(f.categorical_names) + [w for w in f.wide_features if w not in f.categorical_names]
    names = serving_input_names([f"{n}__vector" for n in features])
    out = []
    for n in features:
        base = f.wide_features.get(n, n)
        c = by_name[base]
        table = f.feature_table[n]
        out.append({
            "input": names[f"{n}__vector"], "feature": n, "table": table, "dim": int(f.feature_dim[n]),
            "combiner": (f.wide_combiner[n] if n in f.wide_features else manifest.vocabularies[c.table].combiner),
            "column": c.column, "kind": manifest.raw_feature_kinds.get(c.column, "bytes"),
            "separator": c.separator, "max_length": c.max_length,
            "weight_column": c.weight_column, "sequence_length": int(f.sequence_length.get(base, 0)),
            "wide_of": f.wide_features.get(n),
        })
    return out


class VectorServingModule(tf.Module):
    """The dense tower of a serving ranking model, fed pooled vectors instead of IDs.

    Only the dense tower's layers are tracked: the saved model holds no embedding table and no
    vocabulary (a table reached by the function would fail the save, untracked).

    Args:
      model: the serving ranking model (ServingRankingModel), its dense tower restored.
      transform: the raw-feature transform of its manifest (for the dense columns' rules).
      manifest: the vocabulary manifest.
    """

    def __init__(self, model, transform: RawFeatureTransform, manifest: VocabularyManifest):
        super().__init__(name="vector_serving_module")
        tower = model.dense_tower
        self.dense_layers = {k: v for k, v in tower.checkpoint_parts().items()}
        self._inputs = self._no_dependency(vector_inputs(model, manifest))
        self._dense = self._no_dependency([i for i in transform.serving_inputs()
                                           if i.column in {d.column for d in manifest.dense_features}])
        f = model.model_features
        spec = {d.input: tf.TensorSpec([None], tf.float32, name=d.input) for d in self._dense}
        for i in self._inputs:
            seq = i["sequence_length"]
            width = 1 if i["wide_of"] else i["dim"]
            shape = [None, seq, width] if seq else [None, width]
            spec[i["input"]] = tf.TensorSpec(shape, tf.float32, name=i["input"])
            if seq and not i["wide_of"]:
                spec[i["input"] + LENGTH_SUFFIX] = tf.TensorSpec([None], tf.int64, name=i["input"] + LENGTH_SUFFIX)
        column_of = {d.input: d.column for d in self._dense}

        @tf.function(input_signature=[spec], autograph=False)
        def serve_vectors(inputs):
            dense_columns = {column_of[k]: v for k, v in inputs.items() if k in column_of}
            some = next(iter(inputs.values()))
            batch = tf.shape(some, out_type=tf.int64)[0]
            dense_in = transform.dense_from_feature_tensors(dense_columns, batch)
            dense, buckets, bottom = tower.bottom(dict(dense_in, **{BATCH_KEY: batch}))
            out, seq_in = {}, {}
            for i in self._inputs:
                out[i["feature"]] = inputs[i["input"]]
                if i["sequence_length"] and not i["wide_of"]:
                    seq_in[i["feature"]] = None
                    seq_in[length_key(i["feature"])] = inputs[i["input"] + LENGTH_SUFFIX]
            pooled = tower.pool_sequences(out, seq_in) if f.sequence_length else out
            return {"probabilities": tower.top(bottom, dense, buckets, pooled)}

        self.serve_vectors = serve_vectors

    def inputs_record(self) -> Dict[str, Any]:
        """`store_inputs.json`: the dense columns' inputs and every vector input's rules."""
        return {"format": 1, "signature": "serve_vectors",
                "dense_inputs": [{"input": d.input, "column": d.column} for d in self._dense],
                "vector_inputs": list(self._inputs), "length_suffix": LENGTH_SUFFIX}


def save_dense_model(model, transform: RawFeatureTransform, manifest: VocabularyManifest, out_dir: str) -> Dict[str, Any]:
    """Saves the dense model and its `store_inputs.json` under `out_dir`.

    Returns:
      The inputs record.
    """
    module = VectorServingModule(model, transform, manifest)
    tf.saved_model.save(module, out_dir, signatures={"serve_vectors": module.serve_vectors,
                                                     "serving_default": module.serve_vectors})
    record = module.inputs_record()
    with tf.io.gfile.GFile(os.path.join(out_dir, STORE_INPUTS_FILE), "w") as fh:
        fh.write(json.dumps(record, indent=2, sort_keys=True))
    return record


def read_inputs(model_dir: str) -> Dict[str, Any]:
    """A dense model's `store_inputs.json`."""
    with tf.io.gfile.GFile(os.path.join(model_dir, STORE_INPUTS_FILE)) as fh:
        return json.load(fh)
