"""What resolution derives from a configuration, as frozen values (never filled into the schema).

`validation.resolve` binds every categorical feature to one table and attaches a `ResolvedConfig`
to the `PipelineConfig` it checked (`cfg.resolved`). It travels with the config's JSON (under
"resolved", see `serialization.config_to_dict`); `config_from_json` resolves again and gets the same one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple
from components.rules.names import by_name


@dataclass(frozen=True)
class ResolvedTable:
    """One embedding table as resolution bound it."""

    name: str
    features: Tuple[str, ...]  # the categorical features looking up this table, in config order
    dim_explicit: bool  # dim set on the table or one of its features (False: categorical_defaults.dim)
    # combiner set on the table, one of its features or categorical_defaults (False: the plan
    # chooses it from the statistics: contracts/plan.py, `combiner_source`)
    combiner_explicit: bool = True

    @property
    def shared(self) -> bool:
        """Whether more than one feature looks up this table."""
        return len(self.features) > 1


@dataclass(frozen=True)
class ResolvedConfig:
    """Every table's binding (in `PipelineConfig.tables` order) and where the config was read from."""

    tables: Tuple[ResolvedTable, ...]
    source_file: Optional[str] = None  # the YAML file, or "<serialized config>" / "<config>"; for messages

    def table(self, name: str) -> ResolvedTable:
        """One table's binding.

        Args:
          name: the table's name.

        Returns:
          Its `ResolvedTable`.

        Raises:
          KeyError: no table is named `name`.
        """
        return by_name(self.tables, name, "is not in the resolved configuration")

    def to_dict(self) -> Dict[str, Any]:
        """The derived bindings, as the config's JSON carries them under "resolved".

        Returns:
          {"tables": {name: {"features": [...], "dim_explicit": bool, "combiner_explicit": bool}}}; not
          `source_file`, since where a config was read from is not its content.
        """
        return {"tables": {t.name: {"features": list(t.features), "dim_explicit": t.dim_explicit,
                                    "combiner_explicit": t.combiner_explicit} for t in self.tables}}
