"""The box side of an air-gapped bundle: verify it before any of its code runs, then install, upgrade,
roll back or uninstall the appliance. Standard library only: it ships in the client wheel, which the
administrator installs from a verified source (docs/operator-guide.md section 2)."""
