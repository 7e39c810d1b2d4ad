"""Built-in environments: calculator (learnable on a CPU), email search over a synthetic mailbox, and 2048."""
