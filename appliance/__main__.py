"""`python -m appliance` is the `appliance` command."""

import sys

from appliance.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
