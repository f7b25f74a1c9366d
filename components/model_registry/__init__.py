"""The model registry at the push destination (registry.py) and its two pipeline steps
(component.py: LastBlessedModel reads it, RegistryPusher writes it)."""
