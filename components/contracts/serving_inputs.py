"""The serving model's inputs as the exporter records them beside the model
(`artifacts.SERVING_INPUTS_FILE`): each JSON signature input, the raw column it carries, its
dtypes and the features that read it. Input names follow components.rules.names."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from components.contracts.artifacts import SERVING_INPUTS_FILE

SERVING_INPUTS_VERSION = 1


@dataclass(frozen=True)
class ServingInput:
    """One input of the serving model's JSON signatures, as recorded with the model.

    Attributes:
      input: its name in `serve_features` (and `serve_typed_features`).
      column: the raw column it carries (the key in a tf.Example for `serving_default`).
      dtype: its dtype in `serve_features`: `float32` (dense and weight columns) or `string`.
      typed_dtype: `int64` where `serve_typed_features` takes the column as numbers; None where
        that signature takes it as `dtype` or the model has no such signature.
      features: the features that read the column, in manifest order.
    """

    input: str
    column: str
    dtype: str
    typed_dtype: Optional[str]
    features: Tuple[str, ...]

    def to_dict(self) -> Dict[str, Any]:
        """The entry as `serving_inputs.json` holds it."""
        return {"input": self.input, "column": self.column, "dtype": self.dtype, "typed_dtype": self.typed_dtype,
                "features": list(self.features)}


def serving_inputs_record(inputs: Sequence[ServingInput]) -> Dict[str, Any]:
    """What the exporter writes beside the serving model (`artifacts.SERVING_INPUTS_FILE`).

    Args:
      inputs: the model's serving inputs, in raw column order.

    Returns:
      {"version", "serving_inputs": [each entry's `to_dict`], "renamed": {column: input} of the
      columns whose input name differs from the column}.
    """
    entries: List[Dict[str, Any]] = [i.to_dict() for i in inputs]
    return {
        "version": SERVING_INPUTS_VERSION,
        "serving_inputs": entries,
        "renamed": {i.column: i.input for i in inputs if i.column != i.input},
    }


def renamed_inputs_line(renamed: Dict[str, str], shown: int = 4) -> str:
    """The JSON signature inputs not named after their column, in one line (the pipeline's and the
    exporter's summaries).

    Args:
      renamed: {raw column: serving input name} (`serving_inputs_record`'s `renamed`).
      shown: how many to name; the rest are counted.

    Returns:
      e.g. `2 named apart from their column: 'Class Name' -> Class_Name, '1st order' ->
      c_1st_order (assets.extra/serving_inputs.json in the model)`.
    """
    pairs = [f"{c!r} -> {n}" for c, n in list(renamed.items())[:shown]]
    if len(renamed) > shown:
        pairs.append(f"{len(renamed) - shown} more")
    return f"{len(renamed)} named apart from their column: {', '.join(pairs)} ({SERVING_INPUTS_FILE} in the model)"
