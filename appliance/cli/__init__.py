"""The command-line interface (DESIGN.md, "CLI contract")."""
