"""Analytic models of a trial, computed before launch (docs/theory.md says what each rests on)."""
