#!/usr/bin/env python3
"""``timm-recursive-train`` as a script: see ``timm_recursive/cli/train.py``."""
import sys

from timm_recursive.cli.train import main

if __name__ == '__main__':
    sys.exit(main())
