"""`python -m components.tpu_smoke`: runs the smoke test's checks (cli.main) and exits with its status."""
import sys

from components.tpu_smoke.cli import main

if __name__ == "__main__":
    sys.exit(main())
