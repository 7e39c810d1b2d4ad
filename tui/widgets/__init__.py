"""Widgets of the operator client: they format what they are given and do no I/O."""
