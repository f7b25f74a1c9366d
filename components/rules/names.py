"""Names: which configured names are safe, and the serving input name of every raw column.

Two rules, each defined once here:

- **Safe names.** A feature's or table's name becomes a file name (a table's vocabulary file,
  `<table>.txt`), part of TensorFlow variable and layer names, and a key of the transformed
  examples; so it must be a plain identifier: `SAFE_NAME`, letters, digits and `_`, not starting
  with a digit (config loading refuses any other, `components.config.binding`). A column the
  configuration reads (`column:`, `label`, weight columns) may be any non-empty text.
- **Pipeline names.** The pipeline's `name` names its ML Metadata contexts, its Kubeflow
  pipeline and its registry entries, and may end up in a path: `PIPELINE_NAME`, letters, digits,
  `_`, `-` and `.`, not starting with a dot or a `-`, at most `PIPELINE_NAME_MAX` characters
  (`is_pipeline_name`). Neither rule lets a name hold a path separator or be `.` or `..`, so a
  path built from a name stays in its directory (`components.contracts.artifacts.named_file`).

The configuration checks its names by these rules, the contracts and the stages name files and
inputs by them: they import nothing of the project.
- **Serving input names** (`serving_input_names`): the serving model's JSON signatures
  (`serve_features`, `serve_typed_features`) take one input per raw column, and TensorFlow names
  a signature input like a Python parameter (a letter first, then letters, digits and `_`). The
  input of a raw column is the column itself when it is such a name (`is_serving_name`), else
  `serving_name(column)`: Unicode NFKD, then ASCII only (accents drop off their letters; a
  character without an ASCII decomposition, such as `ß`, is dropped), each run of characters
  other than letters, digits and `_` becomes `_`, leading and trailing `_` are stripped, `c_` is
  prefixed when it starts with a digit, and `column` is what an empty result becomes. Two raw
  columns of a model that get the same name: the later one (in the model's raw column order,
  `VocabularyManifest.raw_columns`) gets the first of `_2`, `_3`, ... not yet taken. The exporter
  records the mapping with the model (contracts.serving_inputs: `ServingInput`, `serving_inputs.json`);
  docs/export.md ("Serving input names") has the examples.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Any, Dict, Iterable, Mapping, Sequence, Union


# A feature's or table's name: letters, digits and _, not starting with a digit.
SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A serving input's name as TensorFlow keeps it: a letter first (TensorFlow renames a signature
# input that starts with `_` to `arg__...`, and a SavedModel with a renamed input fails to save).
SERVING_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
SAFE_NAME_RULE = "letters, digits and _, not starting with a digit"
# The pipeline's name: letters, digits, _, - and ., not starting with . or -.
PIPELINE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
PIPELINE_NAME_MAX = 128
PIPELINE_NAME_RULE = f"letters, digits, _, - and ., not starting with . or -, at most {PIPELINE_NAME_MAX} characters"
EMPTY_SERVING_NAME = "column"  # a column with no letter or digit left in ASCII
DIGIT_PREFIX = "c_"  # before a serving name that would start with a digit


def is_safe_name(name: Any) -> bool:
    """Whether a feature or table name is safe: a string matching `SAFE_NAME` in full."""
    return isinstance(name, str) and SAFE_NAME.fullmatch(name) is not None


def is_pipeline_name(name: Any) -> bool:
    """Whether a pipeline name is safe: a string matching `PIPELINE_NAME` in full, at most `PIPELINE_NAME_MAX` long."""
    return isinstance(name, str) and len(name) <= PIPELINE_NAME_MAX and PIPELINE_NAME.fullmatch(name) is not None


def is_serving_name(name: Any) -> bool:
    """Whether a raw column serves as its own serving input name: a string matching `SERVING_NAME` in full."""
    return isinstance(name, str) and SERVING_NAME.fullmatch(name) is not None


def serving_name(column: str) -> str:
    """A raw column's serving input name, before collisions with other columns are resolved.

    Args:
      column: the raw column, any text.

    Returns:
      `column` itself when `is_serving_name(column)`; else its NFKD form in ASCII, each run of
      other characters than letters, digits and `_` replaced by one `_`, stripped of leading and
      trailing `_`, with `c_` before a leading digit; `column` when nothing is left.
    """
    if is_serving_name(column):
        return column
    ascii_text = unicodedata.normalize("NFKD", column).encode("ascii", "ignore").decode("ascii")
    name = re.sub(r"[^A-Za-z0-9_]+", "_", ascii_text).strip("_")
    if not name:
        return EMPTY_SERVING_NAME
    return DIGIT_PREFIX + name if name[0].isdigit() else name


def serving_input_names(columns: Sequence[str]) -> Dict[str, str]:
    """Every raw column's serving input name: the one rule (module docstring).

    Args:
      columns: a model's raw columns, each once, in the model's raw column order.

    Returns:
      {column: serving input name}, in `columns`' order; the names are distinct: a column whose
      `serving_name` an earlier column took gets the first of `_2`, `_3`, ... not yet taken.
    """
    taken = set()
    out: Dict[str, str] = {}
    for column in columns:
        base = name = serving_name(column)
        k = 2
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        out[column] = name
    return out


def by_name(items: Union[Mapping[str, Any], Iterable[Any]], name: str, missing: str) -> Any:
    """The one look-up of a table (or any named entry) by its name, for the config, the manifest and the plan.

    Args:
      items: a mapping by name, or entries with a `.name`.
      name: the name looked up.
      missing: what a missing name means, for the message (e.g. "is not in the embedding plan").

    Returns:
      The entry called `name`.

    Raises:
      KeyError: none is; the message names it, says `missing` and lists the names there are.
    """
    if isinstance(items, Mapping):
        if name in items:
            return items[name]
        names = list(items)
    else:
        items = list(items)
        for item in items:
            if item.name == name:
                return item
        names = [item.name for item in items]
    raise KeyError(f"table {name!r} {missing} (tables: {', '.join(names) or 'none'})")
