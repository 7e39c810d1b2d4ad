"""appliance-tui: the Textual operator client (talks only to the daemon's control API)."""
