"""Custom artifact types obey the Kubeflow V2 rules (shared/notes/kubeflow.md)."""
import importlib
import re

import components

# tfx/orchestration/kubeflow/v2/compiler_utils.py: the schema title a custom type compiles to.
KFP_TITLE = re.compile(r"^[a-z][a-z0-9-_]{2,20}[.][A-Z][a-zA-Z0-9-_]{2,49}$")


def test_type_names_are_importable_kfp_titles():
    for name in components._ARTIFACT_TYPES:
        cls = getattr(components, name)
        assert KFP_TITLE.fullmatch(cls.TYPE_NAME), cls.TYPE_NAME
        module, _, attr = cls.TYPE_NAME.rpartition(".")
        assert getattr(importlib.import_module(module), attr) is cls  # how the V2 entrypoint finds it
        assert not cls.PROPERTIES  # custom types compile with an empty property schema
