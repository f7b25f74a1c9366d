"""tf.Transform baseline: the 26 exact vocabularies of the benchmark CSV with `tft.vocabulary` in
`tft_beam.AnalyzeDataset`, on the same DirectRunner settings as our component.

python bench/tft_vocab.py --input data.csv --output DIR --workers 2
Vocabularies land in DIR/transform_fn/assets/<column> ("<count> <token>" lines, store_frequency).
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import components  # noqa: E402,F401  (legacy Keras before TensorFlow)
import apache_beam as beam  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_transform.beam as tft_beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from tensorflow_transform.tf_metadata import schema_utils  # noqa: E402
from tfx_bsl.public import tfxio  # noqa: E402

from components.example_gen.synthetic_data import NUM_CATEGORICAL, column_names  # noqa: E402

CATEGORICAL = [f"C{c + 1}" for c in range(NUM_CATEGORICAL)]


def preprocessing_fn(inputs):
    # Self-contained: Beam workers unpickle this function without this module's globals.
    import tensorflow_transform as tft

    for c in [f"C{i + 1}" for i in range(26)]:
        tft.vocabulary(inputs[c], vocab_filename=c, store_frequency=True)
    return {"C1": inputs["C1"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    schema = schema_utils.schema_from_feature_spec({c: tf.io.VarLenFeature(tf.string) for c in CATEGORICAL})
    source = tfxio.CsvTFXIO(
        file_pattern=args.input, column_names=column_names(), schema=schema, skip_header_lines=1,
        telemetry_descriptors=["bench"],
    )
    options = PipelineOptions(
        ["--runner=DirectRunner", "--direct_running_mode=multi_processing", f"--direct_num_workers={args.workers}"]
    )
    with beam.Pipeline(options=options) as pipeline, tft_beam.Context(temp_dir=tempfile.mkdtemp()):
        raw = pipeline | "Read" >> source.BeamSource()
        transform_fn = (raw, source.TensorAdapterConfig()) | tft_beam.AnalyzeDataset(preprocessing_fn)
        _ = transform_fn | tft_beam.WriteTransformFn(args.output)


if __name__ == "__main__":
    main()
