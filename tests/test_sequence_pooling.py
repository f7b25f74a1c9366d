"""SequencePooling's attention in training: padding positions of a sequence feature change neither
the pooled vector nor any gradient (the keys' or the score network's), however far their keys and
scores lie from the real positions'. The forward rule (softmax over the real positions only, zeros
for an empty row) is checked by hand in tests/test_serving_tables.py; this file checks the backward
pass, which is what training sees."""
import numpy as np
import tensorflow as tf

import components  # noqa: F401

from components.embedding_model.dense_tower import SequencePooling


def _pooled_and_gradients(layer, keys, mask, query):
    keys = tf.constant(keys)
    with tf.GradientTape() as tape:
        tape.watch(keys)
        pooled = layer(keys, mask, query=query)
        # a fixed projection of the output, so that every output component has its own gradient
        loss = tf.reduce_sum(pooled * tf.constant([[1.0, -2.0], [0.5, 3.0]]))
    grads = tape.gradient(loss, [keys] + layer.trainable_variables)
    return pooled.numpy(), [g.numpy() for g in grads]


def _layer():
    """Attention whose score is relu(w . [query, key, query - key, query * key]) for the hand-set
    `w` below (one hidden unit, output weight 1): a key of 1000 in its first component scores about
    950, far enough above the real positions' scores (about 1) that exp(real - 950) underflows."""
    layer = SequencePooling("attention", "a", hidden=1)
    layer(tf.zeros([1, 1, 2]), tf.ones([1, 1]), query=tf.zeros([1, 2]))  # builds the score network
    hidden, out = layer.score.layers
    w = np.array([0.1, -0.2, 1.0, 0.3, 0.2, 0.1, 0.5, -0.4], np.float32)
    hidden.set_weights([w[:, None], np.array([0.5], np.float32)])
    out.set_weights([np.ones([1, 1], np.float32), np.zeros([1], np.float32)])
    return layer


def test_padding_changes_neither_the_output_nor_any_gradient():
    """Two rows of three positions: row 0 has two real positions, row 1 one. The same batch with
    the padding keys at 0 (what the sequence lookup writes) and at 1000 (scores far above the real
    ones): the pooled vectors, the keys' gradients and the score network's weight gradients are
    equal, every gradient is finite, and a padding key's gradient is exactly zero."""
    layer = _layer()
    mask = tf.constant([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    query = tf.constant([[0.3, -0.7], [1.0, 0.2]])
    real = np.array([[[0.5, 1.0], [-1.0, 0.25], [0.0, 0.0]], [[2.0, -0.5], [0.0, 0.0], [0.0, 0.0]]], np.float32)
    padded = real.copy()
    padded[0, 2] = [1000.0, 0.0]
    padded[1, 1:] = [[1000.0, 0.0], [1000.0, 1000.0]]
    out_zero, grads_zero = _pooled_and_gradients(layer, real, mask, query)
    out_far, grads_far = _pooled_and_gradients(layer, padded, mask, query)
    np.testing.assert_allclose(out_far, out_zero, rtol=1e-6)
    np.testing.assert_allclose(out_zero[1], real[1, 0], rtol=1e-6)  # one real position: its key
    for far, zero in zip(grads_far, grads_zero):
        assert np.isfinite(far).all()
        np.testing.assert_allclose(far, zero, rtol=1e-5, atol=1e-7)
    keys_grad = grads_far[0]
    np.testing.assert_array_equal(keys_grad[0, 2], 0.0)
    np.testing.assert_array_equal(keys_grad[1, 1:], 0.0)
    assert np.abs(keys_grad[0, :2]).sum() > 0 and np.abs(keys_grad[1, 0]).sum() > 0
