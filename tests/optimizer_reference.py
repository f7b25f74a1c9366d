"""The TPU embedding engine's update rule as TensorFlow documents it
(tensorflow/core/protobuf/tpu/optimization_parameters.proto and the CPU kernels it links to), in
float64: the reference tests/test_optimizer_rules.py holds the CPU path (Keras) to, and the one
rule tests/tpu_harness.py's CPU SparseCore step applies (`sparse_core_step`). A helper module,
not a test file."""
import numpy as np
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2


def optimization_parameters(tpu_opt) -> optimization_parameters_pb2.OptimizationParameters:
    """The `OptimizationParameters` proto the TPU embedding optimizer writes (what the TPU is sent)."""
    p = optimization_parameters_pb2.OptimizationParameters()
    tpu_opt._set_optimization_parameters(p)  # pylint: disable=protected-access  (what the TPU is sent)
    return p


def tpu_reference_step(p, lr: float, w, slots: dict, g_rows: np.ndarray, values: np.ndarray) -> None:
    """One TPU embedding update of table `w` ([rows, dim], float64, with its `slots`) as documented,
    in place: `p` the OptimizationParameters, `g_rows` / `values` the step's sparse gradient."""
    rows_in_table = w.shape[0]
    unique = np.unique(g_rows)
    g = np.zeros(w.shape)
    np.add.at(g, g_rows, values.astype(np.float64))  # gradient accumulation: a row's gradients summed
    lo = p.gradient_clipping_limits.lower.value if p.gradient_clipping_limits.HasField("lower") else -np.inf
    hi = p.gradient_clipping_limits.upper.value if p.gradient_clipping_limits.HasField("upper") else np.inf
    g = np.clip(g, lo, hi)
    kind = p.WhichOneof("parameters")
    if kind == "adam" and p.adam.use_non_lazy_adam:
        rows = np.arange(rows_in_table)  # every row, with a zero gradient where not looked up
    else:
        rows = unique
    gr = g[rows]
    if kind == "stochastic_gradient_descent":
        w[rows] -= lr * gr
    elif kind == "adagrad":
        a = slots["accumulators"]
        a[rows] += gr * gr
        w[rows] -= lr * gr / np.sqrt(a[rows])
    elif kind == "adam":
        b1, b2, eps = p.adam.beta1, p.adam.beta2, p.adam.epsilon
        m, v = slots["momenta"], slots["velocities"]
        m[rows] = b1 * m[rows] + (1 - b1) * gr
        v[rows] = b2 * v[rows] + (1 - b2) * gr * gr
        denom = np.sqrt(v[rows] + eps * eps) if p.adam.use_sum_inside_sqrt else np.sqrt(v[rows]) + eps
        w[rows] -= lr * m[rows] / denom
    elif kind == "ftrl":
        f = p.ftrl
        assert not f.multiply_linear_by_lr
        a, lin = slots["accumulators"], slots["linears"]
        power = f.lr_power
        new_a = a[rows] + gr * gr
        lin[rows] += gr - (new_a ** (-power) - a[rows] ** (-power)) / lr * w[rows]
        l2 = f.l2 + f.beta / (2 * lr)
        quadratic = new_a ** (-power) / lr + 2 * l2
        lr_lin = lin[rows]
        w[rows] = np.where(np.abs(lr_lin) > f.l1, (np.sign(lr_lin) * f.l1 - lr_lin) / quadratic, 0.0)
        a[rows] = new_a
    else:
        raise AssertionError(kind)


def sparse_core_parameters(tpu_opt) -> optimization_parameters_pb2.OptimizationParameters:
    """The parameters TF 2.16's SparseCore kernels get (tpu_embedding_v3.py, `apply_gradients`):
    the learning rate and the optimizer's own hyperparameters (Adam: beta1, beta2, epsilon,
    use_sum_inside_sqrt; FTRL: l1, l2, lr_power, beta, multiply_linear_by_lr); no gradient or
    weight clipping, no weight decay and no laziness flag (the kernels update the looked-up rows
    only). optimizers.check_sparsecore_optimizer refuses the settings dropped here."""
    p = optimization_parameters(tpu_opt)
    for field in ("gradient_clipping_limits", "clipping_limits", "weight_decay_factor"):
        p.ClearField(field)
    if p.WhichOneof("parameters") == "adam":
        p.adam.use_non_lazy_adam = False
    return p


def sparse_core_step(p, lr: float, w: np.ndarray, slots: dict, gradient: np.ndarray) -> None:
    """One SparseCore update, in place, of the touched rows `w` ([k, dim] float64) and their
    `slots` (by TPU slot name), `gradient` each row's gradient summed over the global batch: the
    documented rule (`tpu_reference_step`) with `p` from `sparse_core_parameters`."""
    tpu_reference_step(p, lr, w, slots, np.arange(len(w)), gradient)
