"""Functional ops of hybrid-zoo: one sub-package per op (reference + fast path + public entry)."""
