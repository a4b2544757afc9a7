"""Tests of the README and docs/ (every path, command, block and number they show) and of the layering
docs/ARCHITECTURE.md states."""
