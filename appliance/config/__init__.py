"""Typed job files: schema (pure data), YAML loading with located errors, outside-world checks."""

from appliance.config.schema import JobSpec

__all__ = ["JobSpec"]
