"""Flower's configuration file (``--conf``), executed by Flower at start.

Basic auth comes from a secret file ("user:password", one pair per line) so the password is in
no environment variable and no command line. Without the file Flower does not start.
"""

import os

with open(os.environ["FLOWER_BASIC_AUTH_FILE"], encoding="utf-8") as _secret:
    basic_auth = [line.strip() for line in _secret if line.strip()]

if not basic_auth:
    raise SystemExit("flowerconfig: FLOWER_BASIC_AUTH_FILE holds no user:password")
