"""The Trainer's and the Tuner's executors: TFX's own, passing the transformed examples' artifact URI.

TFX 1.16's FnArgs carries the split files (`<uri>/Split-train/*`) but not the Examples artifact they
belong to, whose root holds preprocessing's manifest and statistics. Rather than guess that root
from the shape of a file path, these subclasses of TFX's executors add the artifact's URI to the
custom_config that run_fn and tuner_fn receive (component_keys.EXAMPLES_URI_KEY); everything else
is TFX's. The Vertex AI variants (vertex.py) add it before the job is launched, so the
job's own TFX executor passes it on unchanged.
"""
from __future__ import annotations

from typing import Any, Dict, List

from tfx.components.trainer import executor as trainer_executor
from tfx.components.tuner import executor as tuner_executor
from tfx.types import standard_component_specs
from tfx.utils import json_utils

from components.reporting import progress
from components.tfx_wiring.component_keys import EXAMPLES_KEY, EXAMPLES_URI_KEY, TUNING_RECORD_URI_KEY


def with_examples_uri(input_dict: Dict[str, List[Any]], exec_properties: Dict[str, Any]) -> Dict[str, Any]:
    """`exec_properties` with the Examples input's URI added to its custom_config.

    Args:
      input_dict: the executor's inputs; `examples` holds one artifact (the pipeline wires one).
      exec_properties: the execution properties, custom_config as TFX's JSON (or a dict).

    Returns:
      A copy of `exec_properties` whose custom_config holds EXAMPLES_URI_KEY.

    Raises:
      ValueError: the Examples input is not exactly one artifact.
    """
    examples = input_dict.get(EXAMPLES_KEY) or []
    if len(examples) != 1:
        raise ValueError(f"the {EXAMPLES_KEY!r} input holds {len(examples)} artifacts; this Trainer and Tuner "
                         "read one transformed-examples artifact (EmbeddingPreprocess's transformed_examples)")
    key = standard_component_specs.CUSTOM_CONFIG_KEY
    given = exec_properties.get(key)
    custom = dict((json_utils.loads(given) if isinstance(given, str) else given) or {})
    custom[EXAMPLES_URI_KEY] = examples[0].uri
    return {**exec_properties, key: json_utils.dumps(custom)}


class PassesExamplesUri:
    """Mixin, first among an executor's bases: runs the executor with `with_examples_uri`'s properties."""

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802  (TFX's name)
        return super().Do(input_dict, output_dict, with_examples_uri(input_dict, exec_properties))


class TrainerExecutor(PassesExamplesUri, trainer_executor.GenericExecutor):
    """TFX's generic Trainer executor (run_fn), passing the examples' URI."""


class TunerExecutor(PassesExamplesUri, tuner_executor.Executor):
    """TFX's Tuner executor (tuner_fn), passing the examples' URI and where the search writes its
    record (its `tuner_results` artifact), with the stage's live progress."""

    @progress.staged(progress.TUNER)
    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802  (TFX's name)
        results = output_dict.get(standard_component_specs.TUNER_RESULTS_KEY) or []
        if results:
            key = standard_component_specs.CUSTOM_CONFIG_KEY
            given = exec_properties.get(key)
            custom = dict((json_utils.loads(given) if isinstance(given, str) else given) or {})
            custom[TUNING_RECORD_URI_KEY] = results[0].uri
            exec_properties = {**exec_properties, key: json_utils.dumps(custom)}
        return super().Do(input_dict, output_dict, exec_properties)
