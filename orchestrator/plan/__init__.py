"""Analytic models of a trial, computed before launch (see ../shared/theory/)."""
