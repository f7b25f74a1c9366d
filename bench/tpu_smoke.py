"""The TPU smoke test's old path, kept for existing commands: the test itself ships in the package
(components/tpu_smoke/) so that it runs in the TPU image, where bench/ is not
copied. From a checkout:

    python bench/tpu_smoke.py --rows 20000 --steps 200    # = python -m components.tpu_smoke ...
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.tpu_smoke.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
