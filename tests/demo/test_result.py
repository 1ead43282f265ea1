"""A run's result as JSON, both ways."""

from __future__ import annotations
