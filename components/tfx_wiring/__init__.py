"""What the TFX executors and components share: the custom artifact types and the executor base."""
