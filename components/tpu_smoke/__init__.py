"""TPU smoke test: what only a TPU can show, in one command on a single-host TPU VM.

    python -m components.tpu_smoke --rows 20000 --steps 200
    python -m components.tpu_smoke --dry-run    # any CPU machine: every step that needs no TPU

It ships in the package (the TPU image, docker/Dockerfile.tpu, installs it; its build imports this
package) and imports nothing from the repository's tests/ or bench/. Run it from a directory holding
the configs (the image's working directory does) or pass --config. Not run by CI (it has no TPU), so
a run on a TPU VM is the only TPU evidence. A package above the Trainer: it drives the Trainer's
own modules and preprocessing, and neither imports it. Its parts: scenario.py (the data and the
configurations), parity.py (the TPU-against-CPU comparison and its judge), cli.py (the checks in
order, their lines and the summary). Prints one `PASS name: detail` / `FAIL name: error` / `SKIP name: why` line per check,
then a summary, and exits 1 on any failure.

Checks (those marked TPU are skipped by --dry-run, which says so):
1. tpu_init (TPU): the TPU runtime initialises under TPUStrategy (class TPUStrategyV2 at runtime);
   the embedding hardware (V1 embedding engine or V2 SparseCore) and SparseCores per chip.
2. data: generated data preprocessed (config, generator, Beam preprocessing).
3. plan: the parity configuration's plan (`parity_raw_config`: the config with the wide part on,
   no dropout, no pipelining, and an Adagrad table beside the FTRL ones) has what the parity check
   must cover on this topology (--dry-run: --dry-replicas x --dry-sparse-cores-per-chip): an FTRL
   and an Adagrad TPU-embedding table, a SparseCore stack of several tables (rotations, row
   offsets), a one-dimensional wide table (padded to 8 columns; lazy Adam, the wide part's
   default optimizer), a TensorCore table (updated by the XLA row rules, xla_updates.py), and every
   placement and optimizer the given config's own plan trains.
4. sparsecore_optimizer: every TPU-embedding table's optimizer in that plan passes the project's
   SparseCore check (optimizers.check_sparsecore_optimizer: TF 2.16's TPUEmbeddingV2 ignores
   clipping), and Adagrad with clipvalue is refused there.
5. sparsecore_training (TPU): the core check (`sparsecore_training`). The Trainer's model,
   optimizers and train_step (model_building.build_model) trained for --parity-steps steps under
   TPUStrategy, and the same model trained on the host CPU (one variable per table, layout A) for
   the same steps on the same examples (the Trainer's input: the replicas' batches of a step are
   the CPU's global batch), both from the same tables, slots and dense weights (the Trainer's
   warm-start path places the CPU model's start into the SparseCore stacks). Each table is read
   back from the TPU run's checkpoint by the exporter's reader (layouts.CheckpointTables: layout B
   on SparseCore, A on TPU v2-v4) and compared row by row with the CPU run's, and the TPU-embedding
   tables' optimizer slots likewise (TensorFlow's own `unshuffle_from_sc_to_cpu`), the TensorCore
   tables' slots, and every other variable of the CPU run's checkpoint by its key (the dense
   network's weights, their optimizer slots, the optimizers' step counters; one the CPU run left
   at its start must stay there: `judge_variables`). What is compared
   is each table's and slot's change from the start, TPU against CPU, relative to the CPU run's
   largest change (3 steps move an Adagrad accumulator by about 3e-5: an absolute tolerance would
   pass one never written back). Each value's difference counts only beyond ROUNDING_STEPS float32
   steps at its magnitude (two summation orders round apart). FAILS on a difference above
   --parity-tolerance (1e-2 of the change), on a table or slot that did not move on either run
   (untrained, or not looked up: untested), and on one whose change float32 cannot resolve (the
   rounding allowance above MAX_ROUNDING of the change: not tested). tests/test_smoke_mutations.py
   breaks the harness's TPU step nine ways (seven in the SparseCore step, a TensorCore slot never
   written back, a dense optimizer step dropped) and requires this check to fail on each.
   Float32 matmuls run at full precision for this check (TensorFloat-32 / bfloat16 passes off).
6. trainer_tpu (TPU): the whole Trainer (`run_fn` with training.tpu = local) on the data with the
   given config: training ends at --steps under TPUStrategy, the artifact is complete, the recorded
   checkpoint layout (A on V1, B on SparseCore) matches the hardware, and the SavedModel (rebuilt
   for CPU from the TPU checkpoint) loads and scores. This shows the run completes; that it
   trains what the CPU trains is check 5.
Without a TPU, tests/test_sparsecore_training.py runs `sparsecore_training` itself with the test
harness's 2-replica strategy and a CPU SparseCore step in place of the TPU.
"""
