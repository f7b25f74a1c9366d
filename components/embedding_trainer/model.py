"""DLRM-style ranking model whose embeddings go through tensorflow-recommenders' TPUEmbedding.

The model is built from the preprocessing manifest (one source of truth for table rows, dims,
combiners and which features share a table) and the training config. Under `TPUStrategy` the
TFRS layer builds TF's `TPUEmbedding` (tables in TPU HBM); anywhere else it builds
`TPUEmbeddingForServing` (plain variables): the same model, checkpoint-compatible, as long as Keras
optimizers are used (the TFRS layer docstring explains why).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
import tensorflow_recommenders as tfrs

from components.config import OptimizerConfig, TrainingConfig

EMBEDDING_LAYER_NAME = "embedding"


def keras_optimizer(cfg: OptimizerConfig) -> tf.keras.optimizers.legacy.Optimizer:
    """Keras (legacy) optimizer for a config, with its clipping and learning-rate schedule (see
    `plan.keras_optimizer`); TFRS translates these to TPU embedding optimizers."""
    from components.embedding_trainer import plan

    return plan.keras_optimizer(plan.optimizer_spec(cfg))


def feature_configs(manifest: Dict[str, Any]) -> Dict[str, tf.tpu.experimental.embedding.FeatureConfig]:
    """One TableConfig per vocabulary (rows = vocabulary + OOV buckets), one FeatureConfig per feature."""
    tables = {}
    for name, v in manifest["vocabularies"].items():
        tables[name] = tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=v["rows"],
            dim=v["dim"],
            combiner=v["combiner"],
            initializer=tf.initializers.TruncatedNormal(stddev=1.0 / math.sqrt(v["dim"])),
            name=name,
        )
    return {
        f["name"]: tf.tpu.experimental.embedding.FeatureConfig(table=tables[f["table"]], name=f["name"])
        for f in manifest["categorical_features"]
    }


def _mlp(widths: List[int], name: str, last_activation: Optional[str] = "relu") -> tf.keras.Sequential:
    layers = [
        tf.keras.layers.Dense(w, activation="relu" if i < len(widths) - 1 else last_activation)
        for i, w in enumerate(widths)
    ]
    return tf.keras.Sequential(layers, name=name)


class RankingModel(tf.keras.Model):
    """DLRM: bottom MLP on dense features, TPU embeddings, dot interaction, top MLP -> click probability.

    Inputs: a dict with one float32 [batch, 1] tensor per dense feature and one int64 SparseTensor
    [batch, None] of embedding IDs per categorical feature. Output: probability [batch, 1].
    `embedding_optimizer=None` builds the serving variant (no optimizer slot variables).
    """

    def __init__(
        self,
        manifest: Dict[str, Any],
        training: TrainingConfig,
        embedding_optimizer: Optional[tf.keras.optimizers.legacy.Optimizer] = None,
        dense_optimizer: Optional[tf.keras.optimizers.legacy.Optimizer] = None,
    ):
        super().__init__(name="ranking_model")
        self.dense_names = [d["name"] for d in manifest["dense_features"]]
        self.categorical_names = [f["name"] for f in manifest["categorical_features"]]
        self._feature_config = feature_configs(manifest)
        self.embedding_optimizer = embedding_optimizer
        self.dense_optimizer = dense_optimizer
        self.embedding_layer = tfrs.layers.embedding.TPUEmbedding(
            self._feature_config, optimizer=embedding_optimizer
        )
        interaction_dim = training.bottom_mlp[-1]
        self.bottom_mlp = _mlp(training.bottom_mlp, "bottom_mlp")
        # DotInteraction needs one width: tables of another dim are projected (no bias).
        self.projections = {
            name: tf.keras.layers.Dense(interaction_dim, use_bias=False, name=f"project_{name}")
            for name, fc in self._feature_config.items()
            if fc.table.dim != interaction_dim
        }
        self.interaction = tfrs.layers.feature_interaction.DotInteraction(self_interaction=False)
        self.top_mlp = _mlp(list(training.top_mlp) + [1], "top_mlp", last_activation=None)

    def call(self, inputs: Dict[str, Any], training: bool = False) -> tf.Tensor:
        if self.dense_names:
            dense = tf.concat([tf.reshape(inputs[n], [-1, 1]) for n in self.dense_names], axis=1)
            # Counts are heavy-tailed: signed log1p, inside the model so serving does the same.
            dense = tf.sign(dense) * tf.math.log1p(tf.abs(dense))
        else:
            first = inputs[self.categorical_names[0]]
            dense = tf.zeros([tf.shape(first, out_type=tf.int64)[0], 1])
        bottom = self.bottom_mlp(dense)
        embedded = self.embedding_layer({n: inputs[n] for n in self.categorical_names})
        vectors = [bottom] + [
            self.projections[n](embedded[n]) if n in self.projections else embedded[n]
            for n in self.categorical_names
        ]
        interactions = self.interaction(vectors)
        logit = self.top_mlp(tf.concat([bottom, interactions], axis=1))
        return tf.sigmoid(logit)

    def embedding_variable_ids(self) -> set:
        return {id(v) for v in self.embedding_layer.trainable_variables}

    def train_step(self, data):
        """Separate optimizers for embeddings and the dense part (TFRS layer docstring pattern:
        works under TPUStrategy, where the layer exposes a stand-in trainable variable, and on CPU)."""
        features, labels = data
        with tf.GradientTape() as tape:
            probs = self(features, training=True)
            loss = self.compiled_loss(labels, probs, regularization_losses=self.losses)
        variables = self.trainable_variables
        grads = tape.gradient(loss, variables)
        emb_ids = self.embedding_variable_ids()
        dense_gv = [(g, v) for g, v in zip(grads, variables) if id(v) not in emb_ids and g is not None]
        emb_gv = [(g, v) for g, v in zip(grads, variables) if id(v) in emb_ids and g is not None]
        self.dense_optimizer.apply_gradients(dense_gv)
        if emb_gv:
            self.embedding_optimizer.apply_gradients(emb_gv)
        self.compiled_metrics.update_state(labels, probs)
        return {m.name: m.result() for m in self.metrics}
