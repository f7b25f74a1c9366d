"""Imported by each Beam SDK worker process at its start (`--beam_plugins`, named by
`beam_runtime.add_worker_plugin`): the worker then reports every failed bundle to the runner,
even when its stderr sits on a full disk (`beam_runtime.report_bundle_failures`; without it such a
run hangs instead of failing), and works out each DoFn's state and timer specs once
(`beam_dofn_specs.cache_dofn_specs`). Importing it anywhere else applies the same, harmless, patches."""
from components.data_io.beam_dofn_specs import cache_dofn_specs
from components.data_io.beam_runtime import report_bundle_failures

report_bundle_failures()
cache_dofn_specs()
